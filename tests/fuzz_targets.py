"""The readers of untrusted bytes, their seed files and the property each must keep, shared by
``tests/test_fuzz_readers.py`` (hypothesis) and ``bench/fuzz.py`` (atheris).

The property (issue 24, section 3): whatever bytes a person sends, a reader returns a valid
result (the shapes, dtypes and finiteness it promises) or raises its documented error type
with a message that names the problem, within ``TIME_LIMIT_S`` seconds and without
allocating more than ``MEMORY_LIMIT_BYTES``. Anything else (another exception type, an empty
message, a traceback in the text, a hang, a blow-up) is a bug in the reader.

Seeds: small files written here (so the fuzzing runs in CI, which has no fixtures) plus the
real files in ``../shared/fixtures/`` when that folder is present.
"""

from __future__ import annotations

import io
import json
import random
import re
import resource
import signal
import tempfile
import time
import tracemalloc
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent.parent.parent / "shared" / "fixtures"

# A reader that takes longer than this on any input hangs, as far as a person is concerned.
TIME_LIMIT_S = 10.0
# The most one call may allocate (numpy/Python allocations traced by tracemalloc, and growth of
# the process's peak resident size for what C libraries allocate). The seeds are < 5 MB, so a
# reader that needs more believed a count in a header instead of checking it against the file.
MEMORY_LIMIT_BYTES = 512 * 1024 * 1024
# The pixel limit the image readers are called with (the app's default is 40 MP; smaller here
# so a header that claims a big image is refused, and an admitted one decodes quickly).
MAX_PIXELS = 4_000_000


class Hang(Exception):
    """A reader ran past ``TIME_LIMIT_S`` (raised from a SIGALRM handler)."""


@dataclass(frozen=True)
class Seed:
    """A file to mutate (``data``, written as ``name``) and the files beside it that it refers to
    (an OBJ's MTL and texture), written unchanged."""

    name: str
    data: bytes
    companions: dict[str, bytes] = field(default_factory=dict)

    def __repr__(self) -> str:   # hypothesis prints the draws: a name, not megabytes of bytes
        return f"Seed({self.name!r}, {len(self.data)} bytes)"

    def _repr_pretty_(self, printer, cycle) -> None:   # hypothesis's own printer asks for this
        printer.text(repr(self))


@dataclass(frozen=True)
class Target:
    """A reader: ``read(path)`` of the mutated file; ``errors`` the types it promises to raise;
    ``check(result)`` raises AssertionError when a result breaks the reader's promise."""

    name: str
    seeds: Callable[[], list[Seed]]
    read: Callable[[Path], Any]
    errors: tuple[type[BaseException], ...]
    check: Callable[[Any], None]


@dataclass
class Outcome:
    """What one call did: ``result`` or the expected ``error``; its time and memory."""

    result: Any = None
    error: Optional[BaseException] = None
    seconds: float = 0.0
    traced_bytes: int = 0
    rss_growth_bytes: int = 0


class PropertyBroken(AssertionError):
    """A reader broke the property; the message says how (and ``cause`` is the exception)."""

    def __init__(self, message: str, cause: Optional[BaseException] = None):
        super().__init__(message)
        self.cause = cause


# --------------------------------------------------------------------------- seeds written here

def _png(arr: np.ndarray, **save) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, **save)
    return buf.getvalue()


def _photo(h: int = 40, w: int = 48) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([xx * 5 % 256, yy * 6 % 256, (xx + yy) * 3 % 256], -1).astype(np.uint8)


def _disc_mask(h: int = 40, w: int = 48) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return (((yy - h / 2) ** 2 + (xx - w / 2) ** 2) < (min(h, w) / 3) ** 2).astype(np.uint8) * 255


def image_seeds() -> list[Seed]:
    """One small image per format and mode the image reader admits (PNG RGB/RGBA/grey/16-bit/
    palette, JPEG, WebP, TIFF, BMP, GIF), and the fixture photo."""
    rgb, mask = _photo(), _disc_mask()
    rgba = np.dstack([rgb, mask])
    seeds = [Seed("rgb.png", _png(rgb, format="PNG")),
             Seed("rgba.png", _png(rgba, format="PNG")),
             Seed("grey16.png", _png((mask.astype(np.uint16) * 257), format="PNG")),
             Seed("palette.png", _png(rgb, format="PNG", optimize=True, bits=4)),
             Seed("photo.jpg", _png(rgb, format="JPEG", quality=80)),
             Seed("photo.webp", _png(rgba, format="WEBP", lossless=True)),
             Seed("photo.tif", _png(rgb, format="TIFF", compression="tiff_lzw")),
             Seed("photo.bmp", _png(rgb, format="BMP")),
             Seed("photo.gif", _png(rgb, format="GIF"))]
    return seeds + _fixture_seeds("sam3d-human-object/image.png")


def mask_seeds() -> list[Seed]:
    """Masks in the forms people send: grey 0/255, 0/1, soft edges, RGBA by alpha; the fixtures'."""
    mask = _disc_mask()
    soft = np.clip(mask.astype(np.int32) // 2 + _photo()[..., 0] // 4, 0, 255).astype(np.uint8)
    rgba = np.dstack([_photo(), mask])
    return ([Seed("mask.png", _png(mask, format="PNG")),
             Seed("mask01.png", _png(mask // 255, format="PNG")),
             Seed("soft.jpg", _png(soft, format="JPEG")),
             Seed("alpha.png", _png(rgba, format="PNG"))]
            + _fixture_seeds("sam3d-human-object/bench_mask.png", "sam3d-human-object/human_mask.png"))


def _textured_box():
    """A trimesh box with UVs, a 16x16 texture and a PBR material (what a GLB carries)."""
    import trimesh
    from PIL import Image

    box = trimesh.creation.box()
    uv = (box.vertices[:, :2] + 0.5).clip(0, 1)
    tex = Image.fromarray(_photo(16, 16))
    box.visual = trimesh.visual.TextureVisuals(uv=uv, image=tex)
    return box


def _coloured_box():
    import trimesh

    box = trimesh.creation.box()
    box.visual.vertex_colors = np.tile(np.array([[200, 120, 40, 255]], np.uint8), (len(box.vertices), 1))
    return box


def mesh_seeds() -> list[Seed]:
    """A box in every format the mesh reader takes (PLY binary and ASCII with colours, OBJ with
    its MTL and texture, GLB and glTF with a texture, STL binary and ASCII), and the fixtures'."""
    import trimesh

    coloured, textured = _coloured_box(), _textured_box()
    obj_files = trimesh.exchange.obj.export_obj(textured, include_texture=True, return_texture=True,
                                                mtl_name="box.mtl")
    obj_text, textures = obj_files
    gltf = trimesh.Scene(textured).export(file_type="gltf", embed_buffers=True)
    seeds = [Seed("box.ply", coloured.export(file_type="ply", encoding="binary")),
             Seed("ascii.ply", coloured.export(file_type="ply", encoding="ascii")),
             Seed("box.obj", obj_text.encode(), {k: bytes(v) for k, v in textures.items()}),
             Seed("box.glb", trimesh.Scene(textured).export(file_type="glb")),
             Seed("box.gltf", bytes(gltf["model.gltf"])),
             Seed("box.stl", coloured.export(file_type="stl")),
             Seed("ascii.stl", coloured.export(file_type="stl_ascii").encode())]
    return seeds + _fixture_seeds("sam3d-human-object/human_sam3d_body.ply",
                                  "sam3d-human-object/bench_sam3d.glb")


def splat_ply(n: int = 24, sh_degree: int = 0) -> bytes:
    """A splat PLY in the INRIA 3DGS layout, written with plyfile as 3DGS writes it."""
    from plyfile import PlyData, PlyElement

    rest = {0: 0, 1: 9, 2: 24, 3: 45}[sh_degree]
    names = (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
             + [f"f_rest_{i}" for i in range(rest)]
             + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"])
    rng = np.random.default_rng(n + sh_degree)
    rec = np.zeros(n, dtype=[(k, "<f4") for k in names])
    for k in names:
        rec[k] = rng.normal(size=n) * (0.3 if k[0] in "xyz" else 1.0)
    for k in ("scale_0", "scale_1", "scale_2"):
        rec[k] = rng.uniform(-5, -2, n)
    buf = io.BytesIO()
    PlyData([PlyElement.describe(rec, "vertex")], byte_order="<").write(buf)
    return buf.getvalue()


def splat_seeds() -> list[Seed]:
    return ([Seed("splat.ply", splat_ply(24, 0)), Seed("sh1.ply", splat_ply(8, 1))]
            + _fixture_seeds("splats/train-1000.ply"))


def camera_dict() -> dict:
    """A source camera as ``kiln run --report`` writes it."""
    view = np.eye(4)
    view[2, 3] = 2.5
    return {"projection": "perspective", "width": 64, "height": 48, "viewmat": view.tolist(),
            "K": [[80.0, 0.0, 32.0], [0.0, 80.0, 24.0], [0.0, 0.0, 1.0]]}


def camera_seeds() -> list[Seed]:
    cam = camera_dict()
    return ([Seed("camera.json", json.dumps(cam).encode()),
             Seed("report.json", json.dumps({"stats": {"source_camera": cam}}, indent=1).encode()),
             Seed("top.json", json.dumps({"source_camera": cam, "glb": "x.glb"}).encode())]
            + _fixture_seeds("sam3d-human-object/focal_length.json"))


def settings_seeds() -> list[Seed]:
    return [Seed("default.yaml", (REPO / "configs" / "default.yaml").read_bytes()),
            Seed("small.yaml", b"bake:\n  mode: fast\n  texture_size: auto\nviews:\n  count: 8\n"
                               b"app:\n  trusted_proxies: [10.0.0.0/8, '::1']\n")]


def _fixture_seeds(*names: str) -> list[Seed]:
    """The fixture files that are present (none in CI, which clones without them)."""
    return [Seed(Path(n).name, (FIXTURES / n).read_bytes()) for n in names if (FIXTURES / n).is_file()]


# --------------------------------------------------------------------------- mutations

# Values that break parsers: zero, -1, the integer limits, a count far beyond any file.
INTERESTING_INTS = (0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
                    2 ** 63 - 1, 2 ** 64 - 1)
# Words that break text parsers where a number belongs.
INTERESTING_WORDS = (b"-1", b"0", b"99999999999999999999", b"1e999", b"-1e999", b"nan", b"inf",
                     b"NaN", b"Infinity", b"0x10", b"", b"1.5", b"2147483648", b"null", b"[]", b"{}")
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def mutate(data: bytes, ops: list[tuple], splice_from: bytes = b"") -> bytes:
    """Apply mutation ``ops`` (tuples from ``random_ops`` or hypothesis) to ``data``. Positions
    are fractions of the current length, so the same ops fit any seed."""
    buf = bytearray(data)
    for op in ops:
        kind = op[0]
        at = int(op[1] * len(buf)) if buf else 0
        if kind == "flip" and buf:
            buf[min(at, len(buf) - 1)] ^= 1 << (op[2] % 8)
        elif kind == "byte" and buf:
            buf[min(at, len(buf) - 1)] = op[2] % 256
        elif kind == "truncate":
            del buf[at:]
        elif kind == "insert":
            buf[at:at] = op[2]
        elif kind == "delete":
            del buf[at:at + op[2]]
        elif kind == "int":   # an interesting integer over 1, 2, 4 or 8 bytes, little or big endian
            value, width, order = INTERESTING_INTS[op[2] % len(INTERESTING_INTS)], op[3], op[4]
            buf[at:at + width] = (value % 2 ** (8 * width)).to_bytes(width, order)
        elif kind == "number":   # the k-th decimal number in the text (a header count, a size)
            found = list(_NUMBER.finditer(bytes(buf)))
            if found:
                m = found[op[2] % len(found)]
                buf[m.start():m.end()] = INTERESTING_WORDS[op[3] % len(INTERESTING_WORDS)]
        elif kind == "splice" and splice_from:
            start = int(op[2] * len(splice_from))
            buf[at:at + op[3]] = splice_from[start:start + op[3]]
    return bytes(buf)


def random_ops(rng: random.Random, n: int) -> list[tuple]:
    """``n`` random mutation ops (the fallback fuzzer's, when atheris is not installed)."""
    ops: list[tuple] = []
    for _ in range(n):
        kind = rng.choice(("flip", "byte", "truncate", "insert", "delete", "int", "number", "splice"))
        at = rng.random()
        if kind in ("flip", "byte"):
            ops.append((kind, at, rng.randrange(256)))
        elif kind == "truncate":
            ops.append((kind, at))
        elif kind == "insert":
            ops.append((kind, at, rng.randbytes(rng.randrange(1, 64))))
        elif kind == "delete":
            ops.append((kind, at, rng.randrange(1, 256)))
        elif kind == "int":
            ops.append((kind, at, rng.randrange(64), rng.choice((1, 2, 4, 8)), rng.choice(("little", "big"))))
        elif kind == "number":
            ops.append((kind, at, rng.randrange(1000), rng.randrange(64)))
        else:
            ops.append((kind, at, rng.random(), rng.randrange(1, 512)))
    return ops


# --------------------------------------------------------------------------- the guard

@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise ``Hang`` in the main thread once ``seconds`` have passed (between bytecodes: a
    native call that never returns is still caught by the time check after it)."""
    def fire(signum, frame):
        raise Hang(f"still running after {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        # None: a handler installed from C (libFuzzer's, under atheris); the timer is off, so default is safe
        signal.signal(signal.SIGALRM, old if old is not None else signal.SIG_DFL)


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measured(call: Callable[[], Any], errors: tuple[type[BaseException], ...],
             trace_memory: bool = True) -> Outcome:
    """Run ``call`` under the time and memory guard. An exception of ``errors`` is kept in the
    outcome; any other propagates (the caller decides how to report it)."""
    out = Outcome()
    rss0 = _maxrss_bytes()
    if trace_memory:
        tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with _alarm(TIME_LIMIT_S):
            out.result = call()
    except errors as e:
        out.error = e
    finally:
        out.seconds = time.perf_counter() - t0
        if trace_memory:
            out.traced_bytes = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        out.rss_growth_bytes = _maxrss_bytes() - rss0
    return out


def check_outcome(target: Target, out: Outcome) -> None:
    """Raise ``PropertyBroken`` when an outcome breaks the property."""
    if out.seconds > TIME_LIMIT_S:
        raise PropertyBroken(f"{target.name}: took {out.seconds:.1f} s (limit {TIME_LIMIT_S:.0f} s)")
    for what, n in (("traced allocations", out.traced_bytes), ("peak RSS growth", out.rss_growth_bytes)):
        if n > MEMORY_LIMIT_BYTES:
            raise PropertyBroken(f"{target.name}: {what} {n / 2 ** 20:.0f} MiB "
                                 f"(limit {MEMORY_LIMIT_BYTES / 2 ** 20:.0f} MiB)")
    if out.error is not None:
        text = str(out.error)
        if not text.strip() or "Traceback" in text:
            raise PropertyBroken(f"{target.name}: {type(out.error).__name__} with an unclear message {text!r}",
                                 out.error)
        return
    target.check(out.result)


def run_reader(target: Target, seed: Seed, data: bytes, trace_memory: bool = True) -> Outcome:
    """Write ``data`` as ``seed``'s file (with its companions) in a fresh folder, read it with
    ``target`` under the guard and check the outcome. Raises ``PropertyBroken``."""
    with tempfile.TemporaryDirectory(prefix="kiln-fuzz-") as tmp:
        folder = Path(tmp)
        for name, blob in seed.companions.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(blob)
        path = folder / seed.name
        path.write_bytes(data)
        try:
            out = measured(lambda: target.read(path), target.errors, trace_memory)
        except Hang as e:
            raise PropertyBroken(f"{target.name}: {e}", e) from None
        except Exception as e:   # noqa: BLE001 - the property: nothing but the documented type
            raise PropertyBroken(f"{target.name}: unexpected {type(e).__name__}: {e}", e) from e
        check_outcome(target, out)   # inside: a result may name the files it read
    return out


# --------------------------------------------------------------------------- result checks

def _is(arr: Any, dtype, shape: tuple) -> bool:
    return (isinstance(arr, np.ndarray) and arr.dtype == np.dtype(dtype) and arr.ndim == len(shape)
            and all(s is None or a == s for a, s in zip(arr.shape, shape)))


def check_image(result: Any) -> None:
    rgb, alpha = result
    assert _is(rgb, np.uint8, (None, None, 3)) and rgb.size > 0, f"rgb {getattr(rgb, 'shape', rgb)}"
    assert rgb.shape[0] * rgb.shape[1] <= MAX_PIXELS
    assert alpha is None or _is(alpha, np.uint8, rgb.shape[:2]), "alpha does not match rgb"


def check_mask(result: Any) -> None:
    assert _is(result.mask, np.bool_, (None, None)) and result.mask.size > 0
    assert result.channel in ("alpha", "grey") and 1 <= result.levels <= 256
    assert result.describe("m").startswith("m: read by")


def check_camera(cam: Any) -> None:
    assert _is(cam.K, np.float32, (3, 3)) and _is(cam.viewmat, np.float32, (4, 4))
    assert np.isfinite(cam.K).all() and np.isfinite(cam.viewmat).all()
    assert cam.width >= 1 and cam.height >= 1 and cam.K[0, 0] > 0 and cam.K[1, 1] > 0


def check_mesh(mf: Any) -> None:
    m = mf.mesh
    assert _is(m.vertices, np.float32, (None, 3)) and np.isfinite(m.vertices).all()
    assert _is(m.faces, np.int32, (None, 3)) and len(m.faces) > 0
    assert m.faces.min() >= 0 and m.faces.max() < len(m.vertices)
    assert m.uvs is None or (_is(m.uvs, np.float32, (len(m.vertices), 2)) and np.isfinite(m.uvs).all())
    assert m.vertex_colors is None or _is(m.vertex_colors, np.float32, (len(m.vertices), 3))
    assert mf.texture is None or _is(mf.texture, np.uint8, (None, None, 3))


def check_splat(sf: Any) -> None:
    g = sf.gaussians
    n = len(g)
    assert n > 0 and 0 <= sf.sh_degree <= 3
    for arr, k in ((g.means, 3), (g.scales, 3), (g.quats, 4), (g.colors, 3)):
        assert _is(arr, np.float32, (n, k)) and np.isfinite(arr).all()
    assert (g.scales > 0).all() and ((g.opacities >= 0) & (g.opacities <= 1)).all()
    assert ((g.colors >= 0) & (g.colors <= 1)).all()


def check_settings(s: Any) -> None:
    from kiln.settings import from_dict

    assert from_dict(s.to_dict()) == s, "settings do not survive their own round trip"


def check_loaded(got: Any) -> None:
    assert _is(got.rgb, np.uint8, (None, None, 3))
    assert _is(got.mask, np.bool_, got.rgb.shape[:2]) and got.mask.any() and not got.mask.all()


def check_bake_result(checked: Any) -> None:
    from kiln.bakerequest import BakeRequest

    assert BakeRequest.from_dict(checked.request.to_dict()) == checked.request
    assert all(p.is_file() for p in checked.copies.values())


# --------------------------------------------------------------------------- readers

def _load_image(path: Path):
    from kiln.imageio import load_image

    return load_image(path, max_pixels=MAX_PIXELS)


def _load_mask(path: Path):
    from kiln.maskfile import load_mask

    return load_mask(path, max_pixels=MAX_PIXELS)


def _load_settings(path: Path):
    from kiln.settings import load

    return load(path)


def _read_photo_mask(path: Path):
    """``kiln run``'s check of a photo with a mutated mask beside it (worker.jobs.inputs)."""
    from worker.jobs.inputs import read_photo

    photo = path.parent / "photo.png"
    return read_photo(photo, path, MAX_PIXELS)


def _check_bake_mesh(path: Path):
    """``kiln bake``'s checks (worker.jobs.bakeinputs) of a mutated mesh with a small splat."""
    from kiln.settings import Settings
    from worker.jobs.bakeinputs import BakeFiles, check_bake

    return check_bake(BakeFiles(mesh=path, splat=path.parent / "splat.ply"), Settings())


def _photo_companion(seed: Seed) -> Seed:
    return Seed(seed.name, seed.data, {**seed.companions, "photo.png": _png(_photo(), format="PNG")})


def _splat_companion(seed: Seed) -> Seed:
    return Seed(seed.name, seed.data, {**seed.companions, "splat.ply": splat_ply(24, 0)})


def _errors(*paths: str) -> tuple[type[BaseException], ...]:
    """The documented error types, imported by 'module:Name'."""
    import importlib

    out = []
    for p in paths:
        mod, name = p.split(":")
        out.append(getattr(importlib.import_module(mod), name))
    return tuple(out)


def targets() -> dict[str, Target]:
    """Every reader of untrusted files, by name."""
    stage = "pipeline.validate:StageInputError"
    return {t.name: t for t in (
        Target("image", image_seeds, _load_image, _errors("kiln.imageio:ImageError"), check_image),
        Target("mask", mask_seeds, _load_mask, _errors("kiln.imageio:ImageError"), check_mask),
        Target("settings", settings_seeds, _load_settings, _errors("kiln.settings:SettingsError"), check_settings),
        Target("camera", camera_seeds, _read_camera, _errors(stage), check_camera),
        Target("mesh", mesh_seeds, _read_mesh, _errors(stage), check_mesh),
        Target("splat", splat_seeds, _read_splat, _errors(stage), check_splat),
        Target("run-inputs", lambda: [_photo_companion(s) for s in mask_seeds()], _read_photo_mask,
               _errors("worker.jobs.inputs:InputProblem"), check_loaded),
        Target("bake-inputs", lambda: [_splat_companion(s) for s in mesh_seeds()[:3]], _check_bake_mesh,
               _errors("worker.jobs.inputs:InputProblem"), check_bake_result),
    )}


def _read_camera(path: Path):
    from pipeline.io.camera_file import read_camera

    return read_camera(path)


def _read_mesh(path: Path):
    from pipeline.io.mesh_file import read_mesh

    return read_mesh(path)


def _read_splat(path: Path):
    from pipeline.io.splat_ply import read_splat

    return read_splat(path)
