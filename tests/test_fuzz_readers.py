"""Every reader of untrusted bytes keeps its promise on mutated input (issue 24, section 3).

Hypothesis mutates seed files (bit flips, truncation, splices, insertions, interesting integers
over binary headers, huge / negative / NaN numbers in text headers) and calls each reader of
``tests/fuzz_targets.py``: it must return a valid result or raise its documented error with a
message naming the problem, within ``TIME_LIMIT_S`` (10 s) and ``MEMORY_LIMIT_BYTES`` (512 MiB).
Settings, ``--set`` strings and the API's parameter checks are fuzzed with value strategies.
Inputs that once broke a reader are kept at the bottom as regression tests.

Seeds are written by the tests themselves (so this runs in CI); the real files in
``../shared/fixtures/`` are added when present, and their own truncation test skips without them.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in the test extra: pip install -e .[test]")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import fuzz_targets as ft  # noqa: E402

# run alone (the timing mark, docs/testing.md): a wall-clock bound on every reader
pytestmark = pytest.mark.timing(reason="each reader must finish within fuzz_targets.TIME_LIMIT_S")

FIXTURES = Path(__file__).parent.parent.parent / "shared" / "fixtures"
# Sized so the whole file runs in well under a minute on a 2-core machine.
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TARGETS = ft.targets()


@functools.lru_cache(maxsize=None)
def _seeds(name: str) -> tuple[ft.Seed, ...]:
    return tuple(TARGETS[name].seeds())


# --------------------------------------------------------------------------- mutation strategies

_at = st.floats(0, 1, allow_nan=False)
OPS = st.one_of(
    st.tuples(st.just("flip"), _at, st.integers(0, 7)),
    st.tuples(st.just("byte"), _at, st.integers(0, 255)),
    st.tuples(st.just("truncate"), _at),
    st.tuples(st.just("insert"), _at, st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("delete"), _at, st.integers(1, 256)),
    st.tuples(st.just("int"), _at, st.integers(0, 63), st.sampled_from([1, 2, 4, 8]),
              st.sampled_from(["little", "big"])),
    st.tuples(st.just("number"), _at, st.integers(0, 999), st.integers(0, 63)),
    st.tuples(st.just("splice"), _at, _at, st.integers(1, 512)),
)


def _fuzz_reader(name: str, data: st.DataObject) -> None:
    """Mutate one of ``name``'s seeds (splicing from another) and check the property."""
    seeds = _seeds(name)
    seed = data.draw(st.sampled_from(seeds), label="seed")
    other = data.draw(st.sampled_from(seeds), label="splice from")
    ops = data.draw(st.lists(OPS, min_size=1, max_size=6), label="ops")
    ft.run_reader(TARGETS[name], seed, ft.mutate(seed.data, ops, other.data))


@pytest.mark.parametrize("name", sorted(TARGETS))
@FUZZ
@given(data=st.data())
def test_mutated_files(name: str, data: st.DataObject) -> None:
    _fuzz_reader(name, data)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_seed_is_read(name: str) -> None:
    """The unmutated seeds are valid files (so the mutations start from something the reader
    takes); the fixture mask paired with the small photo is refused for its size, as it should be."""
    for seed in _seeds(name):
        out = ft.run_reader(TARGETS[name], seed, seed.data)
        if seed.name == "focal_length.json":     # a focal length alone is not a camera file
            assert out.error is not None and "needs K, viewmat" in str(out.error)
        elif name == "run-inputs" and seed.name in ("bench_mask.png", "human_mask.png"):
            assert out.error is not None and "they must match" in str(out.error)
        else:
            assert out.error is None, str(out.error)


@pytest.mark.parametrize("rel, name", [("sam3d-human-object/image.png", "image"),
                                       ("sam3d-human-object/bench_mask.png", "mask"),
                                       ("sam3d-human-object/bench_sam3d.glb", "mesh"),
                                       ("sam3d-human-object/human_sam3d_body.ply", "mesh"),
                                       ("splats/train-1000.ply", "splat"),
                                       ("sam3d-human-object/focal_length.json", "camera")])
def test_truncated_fixtures(rel: str, name: str) -> None:
    """Every real file cut at 24 places (a download that stopped) gives a result or a clear error."""
    path = FIXTURES / rel
    if not path.is_file():
        pytest.skip(f"fixture {path} is missing (CI clones without ../shared/fixtures)")
    data = path.read_bytes()
    seed = ft.Seed(path.name, data)
    for k in range(24):
        ft.run_reader(TARGETS[name], seed, data[:len(data) * k // 24])


# --------------------------------------------------------------------------- settings and --set

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10 ** 400), max_value=10 ** 400)
    | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12)
KNOWN_KEYS = [key for key, _, _ in __import__("kiln.settings", fromlist=["describe"]).describe()]
KEYS = st.sampled_from(KNOWN_KEYS) | st.text(max_size=24) | st.sampled_from(["bake", "app.", ".", "bake.mode.x"])
NUMBER_TEXT = st.sampled_from(["nan", "inf", "-inf", "1e999", "-1", "0", "1e-400", "2147483648", "0x10",
                               "99999999999999999999999999", "1.5", "auto", "true", " ", ""])
VALUES = JSONISH | NUMBER_TEXT


def _settings_call(call) -> Any:
    from kiln.settings import SettingsError

    out = ft.measured(call, (SettingsError,))
    ft.check_outcome(ft.Target("settings", list, lambda p: None, (SettingsError,), ft.check_settings), out)
    return out


@FUZZ
@given(items=st.lists(st.text(max_size=40) | st.builds("{}={}".format, KEYS, NUMBER_TEXT | st.text(max_size=12)),
                      max_size=5))
def test_set_strings(items: list[str]) -> None:
    """``--set KEY=VALUE`` strings as the CLI takes them: parsed, then loaded over the defaults."""
    from kiln.settings import load, parse_set

    _settings_call(lambda: load(None, parse_set(items)))


@FUZZ
@given(changes=st.dictionaries(KEYS, VALUES, max_size=4))
def test_override_values(changes: dict[str, Any]) -> None:
    """``Settings.override`` with any JSON value (what the API and the page pass through)."""
    from kiln.settings import Settings

    _settings_call(lambda: Settings().override(changes))


@FUZZ
@given(data=JSONISH)
def test_settings_from_any_structure(data: Any) -> None:
    """``from_dict`` on any JSON structure (a YAML file's content, a job's settings.json)."""
    from kiln.settings import from_dict

    _settings_call(lambda: from_dict(data if isinstance(data, dict) else {"bake": data}))


# --------------------------------------------------------------------------- camera JSON structure

@FUZZ
@given(K=JSONISH, viewmat=JSONISH, width=JSONISH, height=JSONISH, extra=st.booleans())
def test_camera_fields(K, viewmat, width, height, extra) -> None:
    """A camera JSON whose fields hold any JSON value (written with Python's json, so NaN and
    Infinity appear as a browser's JSON.stringify never would, but Python's writer does)."""
    cam = ft.camera_dict()
    cam.update(K=K, viewmat=viewmat) if extra else cam.update(width=width, height=height)
    seed = ft.Seed("camera.json", json.dumps(cam).encode())
    ft.run_reader(TARGETS["camera"], seed, seed.data)


# --------------------------------------------------------------------------- API parameters

@FUZZ
@given(values=st.fixed_dictionaries({}, optional={k: VALUES for k in
                                                  ("bake", "simplify_ratio", "texture_size", "views", "bake_mode",
                                                   "seed", "gaussians_ply")}))
def test_generate_parameters(values: dict[str, Any]) -> None:
    """/generate's settings parameters: a Settings or a UIError naming the parameter."""
    from app.web.api.photo import api_settings
    from app.web.server.usertext import UIError
    from kiln.settings import Settings

    out = ft.measured(lambda: api_settings(Settings(), values), (UIError,))
    ft.check_outcome(ft.Target("generate", list, lambda p: None, (UIError,), ft.check_settings), out)


@FUZZ
@given(points=JSONISH, box=JSONISH)
def test_select_parameters(points: Any, box: Any) -> None:
    """/select's points and box: parsed prompts or a refusal (gr.Error) that says what to give."""
    import gradio as gr

    from app.web.api.photo import _prompts

    def check(result) -> None:
        pts, bx = result
        assert pts or bx is not None
        assert all(lb in (0, 1) for _, _, lb in pts) and (bx is None or len(bx) == 4)

    out = ft.measured(lambda: _prompts(points, box), (gr.Error,), trace_memory=False)
    ft.check_outcome(ft.Target("select", list, lambda p: None, (gr.Error,), check), out)


@FUZZ
@given(settings_dict=JSONISH)
def test_form_values_of_any_record(settings_dict: Any) -> None:
    """A reloaded page shows its last job's settings from a record: any record gives the form's
    values or None, never an exception."""
    from app.web.photo.form import GenerateForm, form_values
    from kiln.settings import Settings

    for record in (settings_dict, {**Settings().to_dict(), "seed": settings_dict}):
        got = form_values(record)
        assert got is None or isinstance(got, GenerateForm)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(focal=VALUES, principal=VALUES, camera_frame=VALUES, source=VALUES, uvs=VALUES, fit=JSONISH)
def test_bake_parameters(focal, principal, camera_frame, source, uvs, fit) -> None:
    """/bake's parameters with a valid mesh and splat: a checked bake or a UIError."""
    from app.web.bake.bake_form import bake_request
    from app.web.server.usertext import UIError
    from kiln.settings import Settings

    seed = ft._splat_companion(_seeds("mesh")[0])

    def read(path: Path):
        ctx = SimpleNamespace(settings=Settings())
        return bake_request(ctx, "s", str(path), str(path.parent / "splat.ply"), None, None, None, focal,
                            principal, camera_frame, fit, source, uvs, False, {})[0]

    ft.run_reader(ft.Target("bake-parameters", list, read, (UIError,), ft.check_bake_result), seed, seed.data)


def test_bake_request_round_trip() -> None:
    """The job's bake.json (written by Kiln, read by the worker) survives its own round trip."""
    from kiln.bakerequest import BakeRequest

    req = BakeRequest(mesh="mesh/m.obj", splat="splat.ply", photo=True, focal=1623.09,
                      principal=(800.0, 449.0), names={"mesh": "m.obj"})
    assert BakeRequest.from_dict(json.loads(json.dumps(req.to_dict()))) == req
    assert math.isclose(BakeRequest.from_dict({"mesh": "m", "focal": "12.5"}).focal, 12.5)


# --------------------------------------------------------------------------- regressions
# Inputs that broke a reader (found by the tests above or by bench/fuzz.py), kept as generators.

def _glb_with(change) -> bytes:
    """The generated box GLB with ``change(bytearray)`` applied."""
    data = bytearray(next(s for s in _seeds("mesh") if s.name == "box.glb").data)
    change(data)
    return bytes(data)


def _bin_chunk_length(data: bytearray, value: int) -> None:
    json_len = int.from_bytes(data[12:16], "little")
    at = 20 + json_len
    data[at:at + 4] = value.to_bytes(4, "little")


@pytest.mark.parametrize("data, words", [
    # a chunk length of ~4 GiB: trimesh allocated it (read(length)) before finding the file short
    (_glb_with(lambda d: _bin_chunk_length(d, 0xFFFFFFF0)), "runs past the end"),
    # bytes after the declared end: trimesh read them as another chunk (3.7 GB on the fixture)
    (_glb_with(lambda d: d.extend(b"\x00" * 3 + b"\xff" * 16)), "bytes after its end"),
    (_glb_with(lambda d: d.__delitem__(slice(len(d) // 2, None))), "truncated"),
])
def test_glb_lengths_are_checked_before_reading(data: bytes, words: str) -> None:
    out = ft.run_reader(TARGETS["mesh"], ft.Seed("box.glb", b""), data)
    assert out.error is not None and words in str(out.error), out.error


@pytest.mark.parametrize("header, words", [
    (b"ply\nformat binary_little_endian 1.0\nelement vertex abc\nproperty float x\nend_header\n", "count"),
    (b"ply\nformat\nelement vertex 1\nproperty float x\nend_header\n", "format-less"),
    (b"ply\nformat binary_little_endian 1.0\nelement vertex 1\nproperty list\nend_header\n", "unsupported"),
    (b"ply\nformat binary_little_endian 1.0\nelement vertex 1\nproperty float x\nproperty float x\n"
     b"end_header\n", "more than once"),
])
def test_splat_header_lines(header: bytes, words: str) -> None:
    """Malformed PLY header lines raised ValueError / IndexError from int() and split()."""
    out = ft.run_reader(TARGETS["splat"], ft.Seed("s.ply", b""), header + b"\x00" * 64)
    assert out.error is not None and words in str(out.error), out.error


def test_splat_odd_sh_name() -> None:
    data = ft.splat_ply(4, 1).replace(b"f_rest_8", b"f_rest_x", 1)
    out = ft.run_reader(TARGETS["splat"], ft.Seed("s.ply", b""), data)
    assert out.error is not None and "f_rest_x" in str(out.error)


@pytest.mark.parametrize("text, words", [(b"\x80seed: 1\n", "not UTF-8"), (b"[" * 20000, "YAML")])
def test_settings_file_bytes(text: bytes, words: str) -> None:
    out = ft.run_reader(TARGETS["settings"], ft.Seed("s.yaml", b""), text)
    assert out.error is not None and words in str(out.error), out.error


@pytest.mark.parametrize("key", ["seed", "bake.lr", "views.count"])
def test_setting_beyond_any_float(key: str) -> None:
    """float(10**400) raised OverflowError; the API, the page and --set all reach this."""
    from kiln.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match="out of range"):
        Settings().override({key: 10 ** 400})


@pytest.mark.parametrize("change, words", [
    ({"viewmat": [10 ** 400]}, "matrices of numbers"),
    ({"width": float("inf")}, "whole numbers"),
])
def test_camera_numbers_beyond_float(change: dict, words: str) -> None:
    seed = ft.Seed("c.json", json.dumps({**ft.camera_dict(), **change}).encode())
    out = ft.run_reader(TARGETS["camera"], seed, seed.data)
    assert out.error is not None and words in str(out.error), out.error


def test_camera_nested_too_deeply() -> None:
    out = ft.run_reader(TARGETS["camera"], ft.Seed("c.json", b""), b"[" * 200000)
    assert out.error is not None and "cannot be read as JSON" in str(out.error) or "nested" in str(out.error)


@pytest.mark.parametrize("points, box", [([{}], None), ([[0, 0, float("inf")]], None), (None, [{}, 1, 2, 3])])
def test_select_malformed_prompts(points, box) -> None:
    import gradio as gr

    from app.web.api.photo import _prompts

    with pytest.raises(gr.Error, match="points: give"):
        _prompts(points, box)


@pytest.mark.parametrize("focal, principal", [(10 ** 400, None), (1000.0, {"a": 1})])
def test_bake_malformed_camera_parameters(focal, principal) -> None:
    from app.web.bake.bake_form import bake_request
    from app.web.server.usertext import UIError
    from kiln.settings import Settings

    with pytest.raises(UIError, match="focal is a number"):
        bake_request(SimpleNamespace(settings=Settings()), "s", "m.ply", None, None, None, None, focal,
                     principal, None, False, None, None, False, {})


def test_corrupt_texture_in_a_glb() -> None:
    """bench/fuzz.py found it: a GLB whose embedded PNG is broken loads (trimesh decodes
    textures lazily), then PIL's OSError came out of the scene's copy. Now a StageInputError."""
    data = bytearray(next(s for s in _seeds("mesh") if s.name == "box.glb").data)
    idat = data.find(b"IDAT")
    assert idat > 0, "the generated GLB embeds its texture as PNG"
    data[idat + 4:idat + 12] = b"\xff" * 8   # the compressed pixels' first bytes broken, lengths kept
    out = ft.run_reader(TARGETS["mesh"], ft.Seed("box.glb", b""), bytes(data))
    assert out.error is not None and "cannot be read as GLB" in str(out.error), out.error
