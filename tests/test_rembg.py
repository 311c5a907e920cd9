"""rembg as ``--mask auto``'s third method (app.segment.rembg_auto, issue 23 item 1).

No real rembg weights can be downloaded here, so each test writes its own small ONNX model
(``write_test_model``, with the ``onnx`` package) in the layout rembg's "u2net_custom"
session reads: one input of (1, 3, 320, 320), the mask as the first output's channel 0.
Its rule is simple and not learned: a pixel's colour distance from the image border's mean
colour, smoothed, over a threshold. It runs through rembg's real session (onnxruntime,
rembg's resizing and normalisation, its min-max scaling of the answer), so what is checked
here is Kiln's path through rembg, not how well real weights find objects. The network is
closed to every test that loads it (any socket connect or pooch download fails the test),
and rembg's own home folder must stay empty.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from composites import as_jpeg, composite
from test_automask import NEGATIVES, SMALL, ScriptedSam2, _logits, _save, _workdirs, iou

pytest.importorskip("onnxruntime", reason="rembg's tests need onnxruntime (pip install 'kiln3d[rembg]')")
pytest.importorskip("rembg", reason="rembg is not installed (pip install 'kiln3d[rembg]'; it needs Python >= 3.11)")
onnx = pytest.importorskip("onnx", reason="the tests write their model with onnx (the test extra)")

from app.segment.automask import CHOICES, ORDER, Finder, find_object  # noqa: E402
from app.segment.rembg_auto import (  # noqa: E402
    RembgLoadError,
    choose_rembg,
    load_rembg,
    rembg_problem,
)
from kiln import models  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIDE = 320


def write_test_model(path: Path, threshold: float = 0.3, gain: float = 4.0) -> Path:
    """An ONNX model rembg's u2net_custom session can run: mask = clip(gain x (d - threshold),
    0, 1), d the 5x5 mean of each pixel's distance (in rembg's normalised units) from the
    mean colour of the image's two outermost rows and columns."""
    from onnx import TensorProto, helper, numpy_helper

    ints = {"zero_i": [0], "two": [2], "minus_two": [-2], "end": [SIDE], "rows": [2], "cols": [3], "chan": [1]}
    floats = {"quarter": 0.25, "threshold": threshold, "gain": gain, "lo": 0.0, "hi": 1.0}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items()]
    inits += [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in floats.items()]
    edges = {"top": ("zero_i", "two", "rows"), "bottom": ("minus_two", "end", "rows"),
             "left": ("zero_i", "two", "cols"), "right": ("minus_two", "end", "cols")}
    nodes = [helper.make_node("Slice", ["input.1", *args], [name]) for name, args in edges.items()]
    nodes += [helper.make_node("ReduceMean", [name], [name + "_mean"], axes=[2, 3], keepdims=1) for name in edges]
    nodes += [
        helper.make_node("Sum", [name + "_mean" for name in edges], ["edge_sum"]),
        helper.make_node("Mul", ["edge_sum", "quarter"], ["background"]),
        helper.make_node("Sub", ["input.1", "background"], ["diff"]),
        helper.make_node("Mul", ["diff", "diff"], ["diff2"]),
        helper.make_node("ReduceSum", ["diff2", "chan"], ["dist2"], keepdims=1),
        helper.make_node("Sqrt", ["dist2"], ["dist"]),
        helper.make_node("AveragePool", ["dist"], ["smooth"], kernel_shape=[5, 5], pads=[2, 2, 2, 2],
                         count_include_pad=0),
        helper.make_node("Sub", ["smooth", "threshold"], ["over"]),
        helper.make_node("Mul", ["over", "gain"], ["scaled"]),
        helper.make_node("Clip", ["scaled", "lo", "hi"], ["d0"]),
    ]
    graph = helper.make_graph(nodes, "kiln-test-masker",
                              [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 3, SIDE, SIDE])],
                              [helper.make_tensor_value_info("d0", TensorProto.FLOAT, [1, 1, SIDE, SIDE])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


class NoNetwork:
    """Fails (and records) any attempt to open a connection or to download with pooch."""

    def __init__(self, monkeypatch):
        import pooch

        self.attempts: list[str] = []

        def refuse(what):
            def fn(*args, **kwargs):
                self.attempts.append(f"{what} {args[1:2] or args[:1]}")
                raise OSError(f"the tests allow no network ({what})")
            return fn

        monkeypatch.setattr(socket.socket, "connect", refuse("socket.connect"))
        monkeypatch.setattr(socket.socket, "connect_ex", refuse("socket.connect_ex"))
        monkeypatch.setattr(socket, "create_connection", refuse("socket.create_connection"))
        monkeypatch.setattr(pooch, "retrieve", refuse("pooch.retrieve"))


@pytest.fixture
def rembg_home(tmp_path, monkeypatch):
    """rembg's own folders, pointed at an empty one that must stay empty."""
    home = tmp_path / "rembg-home"
    home.mkdir()
    for var in ("U2NET_HOME", "REMBG_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(var, str(home))
    yield home
    assert not any(home.iterdir()), f"rembg wrote to its home folder: {list(home.iterdir())}"


@pytest.fixture
def models_dir(tmp_path, monkeypatch, rembg_home):
    """Kiln's models folder ($KILN_MODELS_DIR) with the test-made u2net.onnx in it."""
    folder = tmp_path / "models"
    write_test_model(folder / models.REMBG_FILE)
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(folder))
    return folder


@pytest.fixture
def offline(monkeypatch):
    guard = NoNetwork(monkeypatch)
    yield guard
    assert not guard.attempts, guard.attempts


@pytest.fixture
def model(models_dir, offline):
    return load_rembg()


# -- found ------------------------------------------------------------------------------

@pytest.mark.parametrize("bg", ["grey", "white"])
@pytest.mark.parametrize("kind", ["toy", "pebble", "blob"])
def test_rembg_finds_the_object_on_a_jpeg_composite(model, kind, bg):
    photo, truth = composite(kind, bg, seed=3)
    got = find_object(photo, None, model)          # auto: no SAM 2 here, so rembg answers
    assert got.found and got.method == "rembg", got.problem
    assert got.mask.shape == truth.shape and got.mask.dtype == bool
    assert iou(got.mask, truth) >= 0.9, (kind, bg, iou(got.mask, truth))
    assert 0.5 <= got.score <= 1.0 and got.describe().startswith("found by rembg (score ")
    assert "rembg (u2net.onnx)" in got.detail


def test_rembg_runs_on_a_work_copy_of_a_large_photo_and_scales_the_mask_back(model):
    photo, truth = composite("blob", "white", size=400, canvas=(700, 1000), seed=1)
    got = find_object(photo, None, model, "rembg")
    assert got.found and got.mask.shape == (700, 1000) and iou(got.mask, truth) >= 0.9
    assert "640x448 copy" in got.detail


# -- refused ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, reason", [
    ("empty backdrop", "rembg's mask is empty: nothing stands out"),
    ("two objects", "rembg's mask holds 2 separate things of similar size, not one object"),
    ("random shapes", "rembg's object runs off the image along"),
])
def test_rembg_alone_refuses_what_is_not_one_object(model, name, reason):
    got = find_object(as_jpeg(NEGATIVES[name][0](360, 480)), None, model, "rembg")
    assert not got.found and got.method == "rembg" and got.problem.startswith(reason), got.problem
    assert not got.mask.any(), "a refusal carries no mask to misuse"
    assert got.describe().startswith("rembg found no single object: ")


def test_auto_says_every_method_it_tried_when_none_found_one(model):
    got = find_object(as_jpeg(NEGATIVES["two objects"][0](360, 480)), None, model)
    assert not got.found and got.method == "rembg"
    assert got.problem == ("rembg's mask holds 2 separate things of similar size, not one object; and the "
                           "border model: 2 separate things of similar size stand out from the background, "
                           "not one object")


# -- the order, and choosing a method ----------------------------------------------------

def test_the_order_is_sam2_then_rembg_then_the_border_model(model):
    assert ORDER == ("sam2", "rembg", "border-model") and CHOICES == ("auto",) + ORDER
    from dataclasses import fields

    from kiln.settings import AppSettings

    [auto_mask] = [f for f in fields(AppSettings) if f.name == "auto_mask"]
    assert auto_mask.default == "auto" and auto_mask.metadata["choices"] == CHOICES

    photo, truth = composite("pebble", "grey", size=300, canvas=(360, 480))
    # SAM 2 that finds nothing (its only candidate runs along the border): rembg answers, and says so
    edge = np.zeros((360, 480), bool)
    edge[:, :100] = True
    got = find_object(photo, ScriptedSam2([(_logits(edge), 0.95)]), model)
    assert got.found and got.method == "rembg" and iou(got.mask, truth) >= 0.9
    assert got.detail.startswith("SAM 2 found none (none of SAM 2's candidates")
    # SAM 2 that finds the object answers first
    got = find_object(photo, ScriptedSam2([(_logits(truth), 0.9)]), model)
    assert got.found and got.method == "sam2"
    # one method by name: that one alone
    assert find_object(photo, ScriptedSam2([(_logits(truth), 0.9)]), model, "rembg").method == "rembg"
    assert find_object(photo, None, model, "border-model").method == "border-model"
    assert Finder(None, model, "border-model").find(photo).method == "border-model"


def test_a_method_asked_for_by_name_that_is_not_loaded_is_refused_saying_so():
    photo, _ = composite("toy", "white", size=200, canvas=(240, 320))
    got = find_object(photo, None, None, "rembg")
    assert not got.found and got.problem == "rembg is not available here (app.auto_mask is rembg)"
    got = find_object(photo, None, None, "sam2")
    assert not got.found and got.problem == "SAM 2 is not available here (app.auto_mask is sam2)"
    with pytest.raises(ValueError, match="unknown automatic mask method 'u2net'"):
        find_object(photo, None, None, "u2net")
    # auto without rembg: the border model, as before
    assert find_object(photo).method == "border-model"


# -- loading: only Kiln's models folder, never a download ----------------------------------

def test_without_its_model_file_rembg_is_not_loaded_and_nothing_is_downloaded(tmp_path, monkeypatch,
                                                                               rembg_home, offline):
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(tmp_path / "empty"))
    problem = rembg_problem()
    assert problem == f"no rembg model at {tmp_path / 'empty' / 'u2net.onnx'} (kiln models fetch rembg)"
    with pytest.raises(RembgLoadError, match="kiln models fetch rembg"):
        load_rembg()
    assert choose_rembg().model is None and choose_rembg().reason == ""   # absent: nothing to say


def test_a_damaged_model_file_is_a_clear_reason(tmp_path, monkeypatch, rembg_home, offline):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "u2net.onnx").write_bytes(b"not an onnx model")
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(tmp_path / "m"))
    choice = choose_rembg()
    assert choice.model is None and choice.reason.startswith(f"rembg cannot open {tmp_path / 'm' / 'u2net.onnx'}")
    assert "kiln models fetch rembg" in choice.reason


def test_rembg_not_installed_is_said_with_the_install_command(models_dir, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rembg" else real(name, *a))
    assert rembg_problem() == "rembg is not installed (pip install 'kiln3d[rembg]')"


def test_the_session_is_rembgs_own_on_the_cpu_reading_kilns_file(model, models_dir):
    from rembg.sessions.u2net_custom import U2netCustomSession

    assert isinstance(model.session, U2netCustomSession)
    assert model.session.inner_session.get_providers() == ["CPUExecutionProvider"]
    assert model.path == (models_dir / "u2net.onnx").resolve()


# -- the front ends: kiln run, the API, kiln models list ----------------------------------

def test_the_cli_finder_uses_rembg_and_refuses_it_by_name_when_it_cannot_run(models_dir, offline, tmp_path,
                                                                              monkeypatch):
    from app.cli.cliautomask import AutoMasker
    from app.cli.clirunner import CliError
    from kiln.settings import AppSettings

    photo, truth = composite("toy", "grey", seed=3)
    masker = AutoMasker(AppSettings(auto_mask="rembg"))
    mask, note = masker(photo, Path("shot.jpg"))
    assert iou(mask, truth) >= 0.9
    assert note.startswith("the object of shot.jpg was found automatically by rembg (score ")
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(tmp_path / "nothing-here"))
    with pytest.raises(CliError, match=r"app.auto_mask is rembg, but no rembg model at .*kiln models fetch rembg"):
        AutoMasker(AppSettings(auto_mask="rembg"))
    with pytest.raises(CliError, match=r"app.auto_mask is sam2, but no SAM 2 checkpoint .*kiln models fetch tiny"):
        AutoMasker(AppSettings(auto_mask="sam2"))


def _kiln(*args, env_extra: dict, timeout=300):
    import os

    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-m", "app.cli.cli", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_kiln_run_mask_auto_through_rembg_end_to_end(models_dir, rembg_home, tmp_path):
    """``kiln run --mask auto`` in its own process, rembg found by $KILN_MODELS_DIR: the
    note and the report name rembg, the GLB is written, rembg's home stays empty."""
    env = {models.MODELS_DIR_ENV: str(models_dir), "U2NET_HOME": str(rembg_home),
           "REMBG_HOME": str(rembg_home), "XDG_DATA_HOME": str(rembg_home)}
    photo = _save(tmp_path / "shot.jpg", composite("pebble", "white", size=200, canvas=(240, 320))[0])
    out, report = tmp_path / "shot.glb", tmp_path / "report.json"
    r = _kiln("run", photo, "--mask", "auto", "-o", out, "--report", report, *SMALL, *_workdirs(tmp_path),
              "--in-process", env_extra=env)
    assert r.returncode == 0, r.stderr[-3000:]
    said = "the object of shot.jpg was found automatically by rembg (score "
    assert said in r.stderr and out.stat().st_size > 1000
    assert any(n.startswith(said) for n in json.loads(report.read_text())["mask_notes"])
    # rembg by name, where a busy photo is refused before anything starts
    busy = _save(tmp_path / "busy.jpg", as_jpeg(NEGATIVES["random shapes"][0](240, 320)))
    r = _kiln("run", busy, "--mask", "auto", "--set", "app.auto_mask=rembg", "-o", tmp_path / "b.glb",
              *_workdirs(tmp_path), env_extra=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "busy.jpg: no single object found automatically: rembg's " in r.stderr
    assert "and the border model" not in r.stderr   # rembg alone, as asked


def test_the_api_says_rembg_found_the_object(models_dir, offline, tmp_path):
    pytest.importorskip("gradio", reason="the page's tests need gradio, which is not installed")
    from app.segment.rembg_auto import RembgChoice
    from app.segment.segment import GrabCutSegmenter, SegmenterChoice
    from app.web.api import photo as api
    from app.web.server.context import AppContext
    from kiln.settings import Settings
    from page_helpers import ALICE, FakeSup, caller

    sup = FakeSup(tmp_path / "jobs")
    ctx = AppContext(Settings(), tmp_path / "gradio", supervisor_factory=lambda: sup,
                     segmenter_loader=lambda: SegmenterChoice(GrabCutSegmenter(), "GrabCut", "test"),
                     rembg_loader=lambda: RembgChoice(load_rembg()))
    ctx.start(wait=True)
    try:
        me = caller(ALICE, "script-r")
        photo, truth = composite("toy", "white", size=200, canvas=(240, 320))
        api.upload_image(ctx, me, str(_save(tmp_path / "shot.jpg", photo)))
        answers = list(api.generate(ctx, me, views=4, mask="auto", progress=lambda *a, **k: None))
        said = answers[-1].info["mask"]
        assert answers[-1].info["state"] == "done"
        assert said["source"] == "auto" and said["method"] == "rembg" and abs(said["share"] - truth.mean()) < 0.03
    finally:
        ctx.shutdown()


def test_kiln_models_list_and_fetch_know_the_rembg_model(tmp_path, capsys):
    from app.cli.cli import main

    m = models.lookup("rembg")
    assert m is models.lookup("u2net") is models.lookup("u2net.onnx") and m.kind == "rembg"
    assert m.url == "https://github.com/danielgatis/rembg/releases/download/v0.0.0/u2net.onnx"
    assert m.size == 175_997_641 and m.sha256 == "8d10d2f3bb75ae3b6d527c77944fc5e7dcd94b29809d47a739a7a728a912b491"
    dest = tmp_path / "d"
    assert main(["models", "list", "--dest", str(dest)]) == 0
    rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if ln.strip()}
    assert rows["u2net.onnx"].endswith("absent") and "176.0 MB" in rows["u2net.onnx"]
    write_test_model(dest / "u2net.onnx")   # present, but not the published file
    main(["models", "list", "--dest", str(dest)])
    out = capsys.readouterr().out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    assert rows["u2net.onnx"].endswith("CORRUPT") and "u2net.onnx: " in out and "download again" in out
    with pytest.raises(SystemExit) as e:
        main(["models", "fetch", "--help"])
    assert e.value.code == 0 and "rembg" in capsys.readouterr().out
