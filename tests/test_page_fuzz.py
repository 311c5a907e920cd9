"""The page's handlers fuzzed in-process (issue 38, item 2): odd images (a pixel, a strip, a
20000x100 photo whose working copy is 1024x5, grey, transparent, flat), clicks and boxes
anywhere, "Find the object", Undo, Clear, Generate, Bake and "Fit the camera" with odd values,
in any order. Each event is called as Gradio calls it (the wired function, with a request), and
each must end with a reason on the page: a refusal the handler foresaw, never a fault caught
by the safety net (``event_fn``'s ``fallback``, which logs ``FAULT_LOG``) and never an exception
that Gradio would show as a bare "Error" badge.

Kept to a few seconds for CI: the examples are bounded and the images small but for the strips."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

gr = pytest.importorskip("gradio", reason="the page's tests need gradio, which is not installed")
hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in the test extra: pip install -e .[test]")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from gradio import helpers  # noqa: E402

from app.web.bake import bake_handlers as baking  # noqa: E402
from app.web.bake import fit_handlers as fitting  # noqa: E402
from app.web.bake.bake_form import BakeForm, FitForm  # noqa: E402
from app.web.page.layout import layout  # noqa: E402
from app.web.page.wiring import wire  # noqa: E402
from app.web.photo import generate_handlers as job  # noqa: E402
from app.web.photo import image_handlers as image  # noqa: E402
from app.web.photo.form import GenerateForm  # noqa: E402
from app.web.server.requestinfo import FAULT_LOG  # noqa: E402
from kiln.settings import Settings  # noqa: E402
from page_helpers import ALICE, FakeSup, make_context, named, png_file, request  # noqa: E402
from synthetic import make_object_image  # noqa: E402

FUZZ = settings(max_examples=20, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class Faults(logging.Handler):
    """Counts what reached the safety net (``FAULT_LOG``)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record):
        if FAULT_LOG in record.getMessage():
            self.seen.append(f"{record.getMessage()}: {record.exc_info[1] if record.exc_info else ''}")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("page-fuzz")
    ctx = make_context(tmp, Settings(), FakeSup(tmp / "jobs"))
    page = layout(ctx.settings)
    wire(page, ctx)
    fns = {}
    for block_fn in page.demo.fns.values():
        handler = getattr(block_fn.fn, "handler", None)
        if handler is not None:
            fns.setdefault(handler, block_fn.fn)
    faults = Faults()
    logging.getLogger("kiln.app").addHandler(faults)
    try:
        yield SimpleNamespace(ctx=ctx, page=page, tmp=tmp, fns=fns, faults=faults, tabs=iter(range(10 ** 6)),
                              files={})
    finally:
        logging.getLogger("kiln.app").removeHandler(faults)
        ctx.shutdown()


def call(app, handler, tab: str, *inputs, evt=None) -> dict:
    """The event as Gradio runs it: the wired function, its inputs and the request (and the
    select data of a click). A ``gr.Error`` (a refused press) goes on to the caller."""
    fn = app.fns[handler]
    args, _, _, _ = helpers.special_args(fn, list(inputs), request=request(ALICE, tab), event_data=evt)
    with warnings.catch_warnings(record=True) as said:   # gr.Warning outside a server: a warning
        warnings.simplefilter("always")
        out = fn(*args)
    answer = _named(app.page, out) if isinstance(out, dict) else out
    pops = [str(w.message) for w in said if w.category is UserWarning]
    return {"answer": answer, "warned": pops}


def _named(page, out: dict) -> dict:
    """{field name: value} over the page's and the bake tab's components."""
    tab = page.bake_tab
    names = {id(getattr(tab, f)): f for f in tab.__dataclass_fields__ if f not in ("form", "fit_form")}
    names.update({id(c): n for n, c in named({c: c for c in out if id(c) not in names}, page).items()})
    return {names[id(c)]: v for c, v in out.items()}


def _image(h: int, w: int, kind: str) -> np.ndarray:
    rng = np.random.default_rng(h * 7 + w)
    if kind == "blob" and min(h, w) >= 16:
        import cv2

        rgb, _ = make_object_image(128, "blob", seed=1)
        return np.ascontiguousarray(cv2.resize(rgb, (w, h), interpolation=cv2.INTER_AREA))
    if kind == "flat":
        return np.full((h, w, 3), 200, np.uint8)
    if kind == "grey":
        return rng.integers(0, 256, (h, w), dtype=np.uint8)
    if kind == "rgba-clear":
        return np.dstack([rng.integers(0, 256, (h, w, 3), dtype=np.uint8), np.zeros((h, w), np.uint8)])
    if kind == "rgba-half":
        a = np.zeros((h, w), np.uint8)
        a[: max(1, h // 2)] = 255
        return np.dstack([rng.integers(0, 256, (h, w, 3), dtype=np.uint8), a])
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def image_file(app, h: int, w: int, kind: str) -> str:
    key = (h, w, kind)
    if key not in app.files:
        app.files[key] = png_file(app.tmp, f"fuzz-{h}x{w}-{kind}.png", _image(h, w, kind))
    return app.files[key]


SIDES = st.sampled_from([1, 5, 15, 16, 17, 40, 96])
KINDS = st.sampled_from(["noise", "blob", "flat", "grey", "rgba-clear", "rgba-half"])
COORD = st.one_of(st.floats(-50, 1100, allow_nan=False), st.sampled_from([0.0, -1.0, 1e9, 4.5]))
BOX_TEXT = st.one_of(
    st.tuples(COORD, COORD, COORD, COORD).map(lambda b: ",".join(f"{v:g}" for v in b)),
    st.sampled_from(["", "1,2,3", "a,b,c,d", "nan,nan,nan,nan", "inf,0,5,5", "0,0,0,0", "1e308,1e308,-1e308,0"]))
FORMS = st.builds(GenerateForm, st.booleans(), st.sampled_from([0.95, 0.0, 1.0, -1, "x", None, float("nan")]),
                  st.sampled_from([512, 1024, 3, "auto", "big", None, 0]), st.sampled_from([8, 0, 1, 999, None, "x"]),
                  st.sampled_from(["fast", "opt", "best", ""]), st.sampled_from([0, -1, 2 ** 40, "x", None, 3.7]),
                  st.booleans())
ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("click"), COORD, COORD, st.booleans()),
    st.tuples(st.just("box"), BOX_TEXT),
    st.tuples(st.just("find")), st.tuples(st.just("undo")), st.tuples(st.just("clear")),
    st.tuples(st.just("alpha"), st.booleans()), st.tuples(st.just("show"), st.booleans()),
    st.tuples(st.just("generate"), FORMS),
    st.tuples(st.just("upload"), SIDES, SIDES, KINDS),
), max_size=6)


def _reason_shown(app, tab: str, step: tuple, got: dict) -> None:
    """What every answer must carry: a pop-up's words also under the image, a refused press's
    words on the progress line after it."""
    out = got["answer"]
    assert isinstance(out, dict) and out, f"{step}: answered {out!r}"
    info = out.get("mask_info")
    for said in got["warned"]:
        assert info is not None and said[:60].rstrip(".")[1:] in info.replace("\\", ""), \
            f"{step}: the pop-up {said!r} is not under the image: {info!r}"


def run_step(app, tab: str, step: tuple) -> None:
    name = step[0]
    if name == "upload":
        got = call(app, image.on_upload, tab, image_file(app, *step[1:]))
        assert got["answer"]["mask_info"], step
    elif name == "click":
        got = call(app, image.on_click, tab, step[3], evt=gr.SelectData(None, {"index": [step[1], step[2]],
                                                                                "value": None}))
    elif name == "box":
        got = call(app, image.on_box, tab, step[1])
    elif name in ("find", "undo", "clear"):
        got = call(app, {"find": image.on_find, "undo": image.on_undo, "clear": image.on_clear}[name], tab)
    elif name in ("alpha", "show"):
        got = call(app, image.on_alpha if name == "alpha" else image.on_show_mask, tab, step[1])
    else:
        press(app, job.on_generate, job.show_refusal, tab, *step[1].__dict__.values())
        return
    _reason_shown(app, tab, step, got)


def press(app, handler, show_refusal, tab: str, *values) -> None:
    """A job's button: refused with its reason (kept for the progress line), or let through
    (then the press is let go again, so the next one is checked, not refused as busy)."""
    try:
        call(app, handler, tab, *values)
    except gr.Error as e:
        assert str(e.message).strip(), f"{handler.__name__} refused without a reason"
        bar = call(app, show_refusal, tab)["answer"]["progress"]
        assert 'data-state="refused"' in bar and "Not started:" in bar
        return
    from app.web.server.requestinfo import caller_of

    app.ctx.active.end_pending(caller_of(request(ALICE, tab)).session)


@FUZZ
@given(h=SIDES, w=SIDES, kind=KINDS, actions=ACTIONS)
@example(h=100, w=20000, kind="noise", actions=[("find",), ("click", 500.0, 2.0, False), ("box", "0,0,1023,4"),
                                                ("generate", GenerateForm(False, 0.95, 512, 8, "fast", 0, False))])
@example(h=20000, w=16, kind="blob", actions=[("find",), ("click", 3.0, 900.0, False), ("undo",),
                                              ("box", "0,0,15,1023")])
@example(h=1, w=1, kind="rgba-half", actions=[("alpha", True), ("find",), ("box", "0,0,0,0")])
def test_every_event_on_the_photo_tab_ends_with_a_reason(app, h, w, kind, actions):
    tab = f"fuzz-{next(app.tabs)}"
    before = len(app.faults.seen)
    run_step(app, tab, ("upload", h, w, kind))
    for step in actions:
        run_step(app, tab, step)
    assert app.faults.seen[before:] == [], "faults no check foresaw (the page said only that they failed)"


def _model_files(app) -> dict:
    if "model" not in app.files:
        from fuzz_targets import _textured_box, splat_ply

        mesh = _textured_box()
        path = Path(app.tmp) / "box.glb"
        mesh.export(path)
        app.files["model"] = str(path)
        splat = Path(app.tmp) / "splat.ply"
        splat.write_bytes(splat_ply())
        app.files["splat"] = str(splat)
        junk = Path(app.tmp) / "junk.glb"
        junk.write_bytes(b"glTF" + bytes(40))
        app.files["junk"] = str(junk)
        empty = Path(app.tmp) / "empty.ply"
        empty.write_bytes(b"")
        app.files["empty"] = str(empty)
    return app.files


@FUZZ
@given(mesh=st.sampled_from(["model", "junk", "empty", "photo", None, "missing"]),
       splat=st.sampled_from(["splat", "junk", None]), photo=st.sampled_from(["photo", "tiny", "strip", None]),
       mask=st.sampled_from([None, "photo", "tiny"]), camera=st.sampled_from([None, "junk", "photo"]),
       focal=st.sampled_from([None, 0, -5, 500, "x", float("nan"), 1e12]),
       frame=st.sampled_from(["opengl", "opencv", "sideways"]), fit=st.booleans(),
       texture=st.sampled_from([1024, 3, "auto", None, "x"]), simplify=st.sampled_from([0.0, 0.5, 2, "x", None]),
       source=st.sampled_from(["auto", "photo", "splat", "mesh", "nonsense"]), reuse=st.booleans())
def test_bake_and_fit_refuse_odd_inputs_with_a_reason(app, mesh, splat, photo, mask, camera, focal, frame, fit,
                                                      texture, simplify, source, reuse):
    files = dict(_model_files(app))
    files["photo"] = image_file(app, 40, 48, "blob")
    files["tiny"] = image_file(app, 5, 5, "noise")
    files["strip"] = image_file(app, 100, 20000, "noise")
    files["missing"] = str(Path(app.tmp) / "gone.glb")
    pick = files.get
    tab = f"fuzz-{next(app.tabs)}"
    before = len(app.faults.seen)
    fit_form = FitForm(pick(mesh) if mesh else None, pick(splat) if splat else None, pick(photo) if photo else None,
                       pick(mask) if mask else None, reuse, source, pick(camera) if camera else None, focal)
    press(app, fitting.on_fit, fitting.show_fit_refusal, tab, *fit_form.__dict__.values())
    bake_form = BakeForm(*fit_form.__dict__.values(), frame=frame, fit=fit, texture=texture, simplify=simplify)
    press(app, baking.on_bake, baking.show_bake_refusal, tab, *bake_form.__dict__.values())
    assert app.faults.seen[before:] == [], "faults no check foresaw (the page said only that they failed)"


def test_a_fault_no_check_foresaw_is_a_sentence_under_the_control(app, monkeypatch):
    """The safety net itself: a handler's exception becomes a sentence where its refusals
    go (under the image; on the progress line), never Gradio's bare badge."""
    tab = f"fuzz-{next(app.tabs)}"
    call(app, image.on_upload, tab, image_file(app, 40, 48, "blob"))

    def broken(*a, **k):
        raise RuntimeError("the segmenter fell over at /srv/kiln/var/x.bin")

    monkeypatch.setattr(image.selection, "add_click", broken)
    out = call(app, image.on_click, tab, False, evt=gr.SelectData(None, {"index": [5, 5], "value": None}))
    assert "The click failed: the segmenter fell over at x.bin" in out["answer"]["mask_info"]
    assert "/srv" not in out["answer"]["mask_info"] and out["warned"]
    from dataclasses import replace

    monkeypatch.setattr(job, "GENERATE", replace(job.GENERATE, check=broken))
    with pytest.raises(gr.Error, match="the check before the job failed: the segmenter fell over at x.bin"):
        call(app, job.on_generate, tab, *GenerateForm(False, 0.95, 512, 8, "fast", 0, False).__dict__.values())
    assert "Not started: the check before the job failed" in call(app, job.show_refusal, tab)["answer"]["progress"]
    monkeypatch.setattr(job.jobs, "cancel_jobs", broken)
    bar = call(app, job.on_cancel, tab)["answer"]["progress"]
    assert "Generate failed: the segmenter fell over at x.bin" in bar and 'data-state="refused"' in bar
    app.faults.seen.clear()
