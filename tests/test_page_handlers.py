"""The page's handlers without a server: each is called with plain values (the page's
components, an app context around a supervisor stand-in, the caller, the inputs) and its
answer is read by component. Every answer is checked against the outputs the wiring
declares for that handler: a handler names its outputs, and may name only those."""

from __future__ import annotations

import inspect
from dataclasses import astuple, replace
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

# a required dependency; absent only on the offline GPU image, which runs `pytest -m gpu`
gr = pytest.importorskip("gradio", reason="the page's tests need gradio, which is not installed")

from app.web.photo import image_handlers as image  # noqa: E402
from app.web.photo import generate_handlers as job
from app.web.photo.form import GenerateForm  # noqa: E402
from app.web.page import page_handlers as around  # noqa: E402
from app.web.page import status_line as statusview  # noqa: E402
from app.web.state.job_outcome import not_started  # noqa: E402
from app.web.page.layout import layout  # noqa: E402
from app.web.server.requestinfo import Caller, caller_of, event_fn  # noqa: E402
from app.web.page.wiring import wire  # noqa: E402
from app.web.state.job_outcome import page_bytes  # noqa: E402
from kiln.settings import Settings  # noqa: E402
from worker.jobs.jobstore import JobStatus  # noqa: E402
from page_helpers import ALICE, BOB, FakeSup, caller, make_context, named, png_file, request, wired_outputs, wired_page  # noqa: E402
from synthetic import make_object_image  # noqa: E402

# the form's values in GenerateForm's order: bake_texture, simplify, texture, views, mode, seed, ply
FORM = GenerateForm(False, 0.95, 512, 8, "fast", 0, False)
A1, A2, A3 = caller(ALICE, "tab1"), caller(ALICE, "tab2"), caller(ALICE, "tab3")
B1 = caller(BOB, "tab1")


@pytest.fixture(scope="module")
def wired(tmp_path_factory):
    """The page, built and wired once for the module (``page_helpers.wired_page``)."""
    return wired_page(tmp_path_factory.mktemp("wired-page"))


@pytest.fixture
def app(tmp_path, wired):
    """Each test's own app context around its own supervisor stand-in; the module's page."""
    sup = FakeSup(tmp_path / "jobs")
    ctx = make_context(tmp_path, Settings(), sup)
    try:
        yield SimpleNamespace(ctx=ctx, page=wired.page, sup=sup, tmp=tmp_path, outputs=wired.outputs)
    finally:
        ctx.shutdown()


@pytest.fixture(scope="module")
def blob():
    return make_object_image(256, "blob", seed=3)


def _checked(app, handler, out: dict) -> dict:
    assert out, f"{handler.__name__} answered {{}}, which Gradio takes for a value"
    for outputs in app.outputs[handler]:
        undeclared = [c for c in out if all(c is not o for o in outputs)]
        assert not undeclared, f"{handler.__name__} sets outputs its event does not declare: {undeclared}"
    return named(out, app.page)


def answer(app, handler, who: Caller, *inputs) -> dict:
    """``handler``'s answer to ``who`` as {Page field: value}."""
    return _checked(app, handler, handler(app.page, app.ctx, who, *inputs))


def stream(app, handler, who: Caller, *inputs) -> list[dict]:
    """Every answer a generator handler yields, as ``answer`` reads them."""
    return [_checked(app, handler, out) for out in handler(app.page, app.ctx, who, *inputs)]


def _select(x, y):
    return gr.SelectData(None, {"index": [x, y], "value": None})


def _ready(app, blob, who=A1, name="blob.png"):
    """``who``'s tab with the blob uploaded and clicked."""
    answer(app, image.on_upload, who, png_file(app.tmp, name, blob[0]))
    out = answer(app, image.on_click, who, False, _select(128, 128))
    assert "Mask:" in out["mask_info"]


def _is_update(update, **props) -> bool:
    return isinstance(update, dict) and update.get("__type__") == "update" and \
        all(update.get(k) == v for k, v in props.items())


# -- the image and its selection ---------------------------------------------------------

def test_upload_shows_the_image_and_a_refused_file_says_why(app, blob):
    rgb, _ = blob
    out = answer(app, image.on_upload, A1, png_file(app.tmp, "blob.png", rgb))
    assert out["canvas"].shape == (256, 256, 3) and np.abs(out["canvas"].astype(int) - rgb).mean() < 1
    assert "blob.png" in out["mask_info"] and _is_update(out["use_alpha"], visible=False)
    # a new image clears the last job's result (text, model, downloads) and the mask file; the
    # upload box keeps the file (only its own label back, after a reload named another image)
    assert out["progress"] == statusview.progress_html() and out["mask_file"] is None
    assert _is_update(out["upload"], label=app.page.upload.label) and "value" not in out["upload"]
    assert out["model"] is None and _is_update(out["glb_download"], visible=False)
    assert _is_update(out["ply_download"], visible=False)
    assert app.ctx.sessions.get(A1.session).image.name == "blob.png"

    bad = Path(app.tmp) / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really" * 20)
    with pytest.warns(UserWarning):
        out = answer(app, image.on_upload, A1, str(bad))
    assert out["canvas"] is None and out["mask_info"].startswith("**Cannot use this file:**")
    assert out["upload"] is None, "the refused file must leave the box so the drop zone is back"
    assert _is_update(out["use_alpha"], visible=False, value=False)
    assert app.ctx.sessions.get(A1.session).image is None

    # while the tab's job runs, a new image leaves its progress bar alone
    assert app.ctx.active.press(A1.session)
    out = answer(app, image.on_upload, A1, png_file(app.tmp, "blob.png", rgb))
    assert "progress" not in out and "model" not in out and out["canvas"] is not None
    # no file: the tab's image is gone
    out = answer(app, image.on_upload, A1, None)
    assert out["canvas"] is None and "Upload an image" in out["mask_info"]
    assert app.ctx.sessions.get(A1.session).image is None


def test_clicks_box_undo_and_clear_change_only_the_callers_tab(app, blob):
    rgb, gt = blob
    _ready(app, blob)
    st = app.ctx.sessions.get(A1.session)
    assert st.clicks == ((128.0, 128.0, 1),) and (st.mask & gt).sum() / (st.mask | gt).sum() > 0.8
    ys, xs = np.nonzero(gt)
    out = answer(app, image.on_click, A1, True, _select(int(xs.min()) + 3, int(ys.min()) + 3))
    assert app.ctx.sessions.get(A1.session).clicks[-1][2] == 0 and "1 background" in out["mask_info"]
    answer(app, image.on_undo, A1)
    assert len(app.ctx.sessions.get(A1.session).clicks) == 1
    # a click outside the image is refused in a pop-up and changes nothing
    with pytest.warns(UserWarning, match="outside"):
        answer(app, image.on_click, A1, False, _select(900, 10))
    assert len(app.ctx.sessions.get(A1.session).clicks) == 1
    # the drag script's text: anything but four numbers changes nothing
    assert answer(app, image.on_box, A1, "not,a,box") == {"canvas": gr.skip()}
    box = f"{xs.min() - 6},{ys.min() - 6},{xs.max() + 6},{ys.max() + 6}"
    out = answer(app, image.on_box, A1, box)
    assert "1 object / 0 background clicks and a box" in out["mask_info"]
    # "Show selection" off: the photo alone; on: the selection again
    out = answer(app, image.on_show_mask, A1, False)
    assert np.abs(out["canvas"].astype(int) - rgb).mean() < 1
    out = answer(app, image.on_show_mask, A1, True)
    assert out["canvas"][~gt].mean() < 0.6 * rgb[~gt].mean()
    # another browser naming the same tab lands in a session of its own: empty
    out = answer(app, image.on_clear, B1)
    assert out["canvas"] is None and "Upload an image" in out["mask_info"]
    assert len(app.ctx.sessions.get(A1.session).clicks) == 1
    out = answer(app, image.on_clear, A1)
    assert app.ctx.sessions.get(A1.session).clicks == () and app.ctx.sessions.get(A1.session).mask is None
    assert "click the object" in out["mask_info"]


def test_transparency_and_mask_files(app, blob):
    rgb, gt = blob
    rgba = np.dstack([rgb, gt.astype(np.uint8) * 255])
    out = answer(app, image.on_upload, A1, png_file(app.tmp, "cut.png", rgba))
    assert _is_update(out["use_alpha"], visible=True, value=True)
    out = answer(app, image.on_alpha, A1, False)
    assert _is_update(out["use_alpha"], visible=True, value=False)
    assert not app.ctx.sessions.get(A1.session).use_alpha

    answer(app, image.on_upload, A1, png_file(app.tmp, "photo.png", rgb))
    noise = np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    out = answer(app, image.on_mask_file, A1, png_file(app.tmp, "m.png", np.dstack([noise, gt.astype(np.uint8) * 255])))
    assert "from mask file" in out["mask_info"] and "alpha channel" in out["mask_info"] and "mask_file" not in out
    with pytest.warns(UserWarning):
        out = answer(app, image.on_mask_file, A1, png_file(app.tmp, "wrong.png", np.zeros((50, 60), np.uint8)))
    assert out["mask_info"].startswith("**Cannot use this mask:**") and "wrong.png is 60x50 pixels" in out["mask_info"]
    assert out["mask_file"] is None and out["canvas"] is not None
    assert app.ctx.sessions.get(A1.session).mask_file is not None    # the earlier file stays
    # the box cleared: back to clicks
    out = answer(app, image.on_mask_file, A1, None)
    assert app.ctx.sessions.get(A1.session).mask_file is None and "mask_file" not in out


def test_a_cleared_upload_is_dropped_and_a_loaded_page_takes_over_the_browsers_image(app, blob):
    _ready(app, blob)
    around.on_unload(app.ctx, A1)      # the tab closed (a reload): its image is parked
    out = answer(app, image.on_restore, A2)
    assert "Mask:" in out["mask_info"] and out["canvas"].shape == (256, 256, 3)
    assert _is_update(out["show_mask"], value=True)
    assert "Image: blob.png, from before the reload" in out["upload"]["label"]   # the upload box names it
    image.prepare_restored(app.ctx, A2)
    # another browser takes over nothing
    assert answer(app, image.on_restore, B1) == {"canvas": gr.skip()}
    out = answer(app, image.on_upload_cleared, A2)
    assert out["canvas"] is None and app.ctx.sessions.get(A2.session).image is None
    assert out["model"] is None and _is_update(out["glb_download"], visible=False)   # the old image's result goes
    assert answer(app, image.on_restore, A3) == {"canvas": gr.skip()}, "a removed image must not come back"


def test_a_file_given_to_the_filled_upload_box_replaces_the_image(app, blob, tmp_path):
    """The page's script hands a file dropped on the filled upload box to the hidden
    ``replace`` box: its upload replaces the image and its selection, shows the new file in
    the upload box (from where it lies, not a copy) and empties the hidden box for the next."""
    _ready(app, blob)
    rgb2, _ = make_object_image(192, "ellipse", seed=9)
    second = png_file(tmp_path, "second.png", rgb2)
    out = answer(app, image.on_replace, A1, second)
    assert out["canvas"].shape == (192, 192, 3) and "second.png" in out["mask_info"]
    assert "Mask:" not in out["mask_info"]
    assert _is_update(out["upload"], value=second, label=app.page.upload.label)
    assert out["replace"] is None and out["mask_file"] is None and out["model"] is None
    st = app.ctx.sessions.get(A1.session)
    assert st.image.name == "second.png" and not st.clicks
    # the same outputs as a drop on the empty box, plus the hidden box
    (replaced,), dropped = app.outputs[image.on_replace], app.outputs[image.on_upload][0]
    assert [id(c) for c in replaced] == [id(c) for c in [*dropped, app.page.replace]]

    bad = Path(tmp_path) / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really" * 20)
    with pytest.warns(UserWarning):
        out = answer(app, image.on_replace, A1, str(bad))
    assert out["upload"] is None and out["replace"] is None and out["canvas"] is None
    assert "broken.png" in out["mask_info"] and app.ctx.sessions.get(A1.session).image is None
    assert answer(app, image.on_replace, A1, None) == {"replace": gr.skip()}


# -- Generate, its job, its outcome ----------------------------------------------------------

def test_generate_refuses_what_cannot_run_and_says_why(app, blob, monkeypatch):
    with pytest.raises(gr.Error, match="Upload an image first"):
        job.on_generate(app.page, app.ctx, A1, FORM)
    answer(app, image.on_upload, A1, png_file(app.tmp, "blob.png", blob[0]))
    with pytest.raises(gr.Error, match="select the object first"):
        job.on_generate(app.page, app.ctx, A1, FORM)
    answer(app, image.on_click, A1, False, _select(128, 128))
    bad_seed = replace(FORM, seed=-3)
    with pytest.raises(gr.Error, match=r"Seed: -3 is out of range"):
        job.on_generate(app.page, app.ctx, A1, bad_seed)
    app.ctx.sup_error = "worker pool failed to start: see /srv/kiln/var/workers/worker-0.log"
    with pytest.raises(gr.Error) as e:
        job.on_generate(app.page, app.ctx, A1, FORM)
    assert "worker-0.log" in str(e.value) and "/srv" not in str(e.value)
    app.ctx.sup_error = None
    limit = app.ctx.settings.worker.max_queue
    monkeypatch.setattr(job.jobs, "queue_load", lambda ctx: (1, limit))
    with pytest.raises(gr.Error, match=rf"The job queue is full \({limit} waiting\)"):
        job.on_generate(app.page, app.ctx, A1, FORM)
    assert not app.ctx.active.busy(A1.session), "a refused press must not leave the tab waiting"
    monkeypatch.setattr(job.jobs, "queue_load", lambda ctx: (1, 2))
    out = answer(app, job.on_generate, A1, FORM)
    assert "Waiting for a free worker (2 other jobs waiting)…" in out["progress"]
    with pytest.raises(gr.Error, match="still running; wait for it or press Cancel"):
        job.on_generate(app.page, app.ctx, A1, FORM)


def test_a_refusal_stays_on_the_progress_line_until_the_next_action(app, blob):
    """The pop-up goes after seconds; the progress line keeps why nothing started."""
    assert answer(app, job.show_refusal, A1) == {"progress": gr.skip()}     # nothing refused
    with pytest.raises(gr.Error, match="Upload an image first"):
        job.on_generate(app.page, app.ctx, A1, FORM)
    bar = answer(app, job.show_refusal, A1)["progress"]
    assert 'data-state="refused"' in bar and "Not started: Upload an image first." in bar
    assert answer(app, job.show_refusal, A1) == {"progress": gr.skip()}     # shown once
    answer(app, image.on_upload, A1, png_file(app.tmp, "blob.png", blob[0]))
    with pytest.raises(gr.Error, match="select the object first"):
        job.on_generate(app.page, app.ctx, A1, FORM)
    bar = answer(app, job.show_refusal, A1)["progress"]
    assert "Not started:" in bar and "select the object first" in bar
    # another tab's refusal is its own
    with pytest.raises(gr.Error):
        job.on_generate(app.page, app.ctx, A2, FORM)
    assert answer(app, job.show_refusal, A1) == {"progress": gr.skip()}
    assert 'data-state="refused"' in answer(app, job.show_refusal, A2)["progress"]
    # the tab's own job running: its bar stays, "still running" is not kept
    _ready(app, blob)
    app.sup.hold = True
    answer(app, job.on_generate, A1, FORM)
    with pytest.raises(gr.Error, match="still running"):
        job.on_generate(app.page, app.ctx, A1, FORM)
    assert answer(app, job.show_refusal, A1) == {"progress": gr.skip()}


def test_generate_runs_the_job_and_the_outcome_shows_its_result(app, blob):
    _ready(app, blob)
    app.ctx.active.keep_outcome(A1.session, not_started("an old outcome"))
    form = GenerateForm(False, 0.95, 512, 8, "fast", 3, True)    # Gradio rounds 2.6 in the seed box to 3
    out = answer(app, job.on_generate, A1, form)
    assert "Starting…" in out["progress"] and out["model"] is None
    assert _is_update(out["glb_download"], visible=False) and _is_update(out["ply_download"], visible=False)
    assert _is_update(out["generate"], value="Running…", interactive=False)
    assert _is_update(out["cancel"], interactive=True)
    assert (out["seed"], out["views"], out["simplify"]) == (3, 8, 0.95)    # as the job uses them
    assert app.ctx.active.pending_since(A1.session) is not None
    assert app.ctx.active.take_outcome(A1.session) is None, "a new press drops the outcome not shown"

    steps = stream(app, job.run_job, A1, form)
    assert all(set(s) == {"progress"} for s in steps)
    bars = [s["progress"] for s in steps if s["progress"] != gr.skip()]
    assert bars and all('data-state="running"' in b and "Simplifying mesh" in b for b in bars)
    assert steps[-1] == {"progress": gr.skip()}
    assert not app.ctx.active.busy(A1.session)
    assert app.sup.jobs()[0].session == A1.session

    out = answer(app, job.show_outcome, A1)
    assert 'data-state="done"' in out["progress"] and "Done in" in out["progress"]
    glb = Path(out["model"])
    assert glb.name == "blob-1.glb" and glb.read_bytes() == b"glTFjob0"
    assert _is_update(out["glb_download"], value=str(glb), visible=True)
    assert _is_update(out["ply_download"], visible=True) and out["ply_download"]["value"].endswith("blob-1.ply")
    assert "job0" in out["history"] and "blob.png" in out["history"]
    assert sorted(Path(p).name for p in out["history_files"]) == ["blob-1.glb", "blob-1.ply"]
    assert _is_update(out["generate"], value="Generate", interactive=True) and _is_update(out["cancel"], interactive=False)
    # shown once; afterwards only the buttons go back to idle
    assert set(answer(app, job.show_outcome, A1)) == {"generate", "cancel"}
    # another browser's page never sees it
    assert "job0" not in answer(app, around.on_load, B1)["history"]


def test_a_press_that_never_becomes_a_job_says_why(app, blob):
    _ready(app, blob)
    app.sup.refuse = RuntimeError("queue is full (see /srv/secret/var/jobs)")
    answer(app, job.on_generate, A1, FORM)
    steps = stream(app, job.run_job, A1, FORM)
    assert steps[-1] == {"progress": gr.skip()} and not app.ctx.active.busy(A1.session)
    out = answer(app, job.show_outcome, A1)
    assert "Could not start the job: queue is full (see jobs)" in out["progress"] and "/srv" not in out["progress"]
    assert "model" not in out and _is_update(out["glb_download"], visible=False)
    assert _is_update(out["generate"], value="Generate", interactive=True)
    # the image went away between the check and the slot: the job cannot start
    app.sup.refuse = None
    answer(app, job.on_generate, A1, FORM)
    app.ctx.sessions.drop(A1.session)
    stream(app, job.run_job, A1, FORM)
    assert "Cannot start: upload an image first" in answer(app, job.show_outcome, A1)["progress"]
    assert app.sup.jobs() == []


def test_cancel_stops_the_tabs_job_or_its_waiting_press(app, blob):
    out = answer(app, job.on_cancel, A1)
    assert "Nothing to cancel." in out["progress"] and _is_update(out["generate"], interactive=True)
    assert app.ctx.active.press(A1.session)
    out = answer(app, job.on_cancel, A1)
    assert "Cancelled before it started." in out["progress"] and not app.ctx.active.busy(A1.session)

    _ready(app, blob)
    app.sup.hold = True
    answer(app, job.on_generate, A1, FORM)
    steps = job.run_job(app.page, app.ctx, A1, FORM)
    while 'data-state="running"' not in str(next(steps).get(app.page.progress)):
        pass
    out = answer(app, job.on_cancel, A1)
    assert 'data-state="cancelled"' in out["progress"] and "Cancelled by user" in out["progress"]
    assert _is_update(out["generate"], value="Generate", interactive=True) and _is_update(out["cancel"], interactive=False)
    assert app.sup.cancelled == ["job0"] and not app.ctx.active.busy(A1.session)
    steps.close()


def test_a_loaded_page_follows_its_browsers_job_and_then_shows_how_it_ended(app, blob):
    _ready(app, blob)
    form = GenerateForm(True, 0.9, 1024, 12, "opt", 7, False)
    app.sup.hold = True
    answer(app, job.on_generate, A1, form)
    steps = job.run_job(app.page, app.ctx, A1, form)
    while 'data-state="running"' not in str(next(steps).get(app.page.progress)):
        pass
    steps.close()                      # the page went away (a reload) ...
    around.on_unload(app.ctx, A1)
    assert app.sup.cancelled == [] and app.sup.jobs()[0].state == "running"    # ... the job did not

    follow = job.follow_on_load(app.page, app.ctx, A2)
    first = _checked(app, job.follow_on_load, next(follow))
    assert 'data-state="running"' in first["progress"] and 'data-job="job0"' in first["progress"]
    assert _is_update(first["generate"], value="Running…", interactive=False) and _is_update(first["cancel"], interactive=True)
    assert "job0" in first["history"]
    assert [first[k] for k in ("bake_texture", "simplify", "texture", "views", "mode", "seed", "ply")] == list(astuple(form))[:7]
    app.sup.hold = False
    rest = [_checked(app, job.follow_on_load, u) for u in follow]
    assert rest[-1] == {"progress": gr.skip()}
    out = answer(app, job.show_followed_outcome, A2)
    assert 'data-state="done"' in out["progress"] and Path(out["model"]).name == "blob-1.glb"
    assert _is_update(out["generate"], value="Generate", interactive=True)

    # another browser: neither the job nor its settings
    (only,) = stream(app, job.follow_on_load, B1)
    assert set(only) == {"history", "history_files"} and "job0" not in only["history"]
    assert answer(app, job.show_followed_outcome, B1) == {"progress": gr.skip()}
    # a page loaded after it ended: the form and the outcome as they were
    (only,) = stream(app, job.follow_on_load, A3)
    assert "progress" not in only and only["seed"] == 7 and only["history_files"]
    out = answer(app, job.show_followed_outcome, A3)
    assert 'data-job="job0"' in out["progress"] and Path(out["model"]).name == "blob-1.glb"


def test_a_loaded_page_waits_for_the_pool_and_leaves_a_busy_tab_to_its_own_generate(app, blob, tmp_path):
    starting = make_context(tmp_path / "starting", Settings(), start=False)
    follow = job.follow_on_load(app.page, starting, A1)
    assert next(follow) == {app.page.progress: gr.skip()}   # a beat while the workers start
    starting.sup_error = "worker pool failed to start: RuntimeError: no worker"
    starting.sup_ready.set()
    assert list(follow) == [{app.page.progress: gr.skip()}]     # no pool: nothing to follow
    # its own Generate shows this tab's job: the page does not follow or fill the form
    _ready(app, blob)
    answer(app, job.on_generate, A1, FORM)
    stream(app, job.run_job, A1, FORM)
    answer(app, job.show_outcome, A1)
    assert app.ctx.active.press(A1.session)
    (only,) = stream(app, job.follow_on_load, A1)
    assert set(only) == {"history", "history_files"}
    assert app.ctx.active.take_outcome(A1.session) is None


# -- around them ---------------------------------------------------------------------------

def test_a_waiting_job_exists_shows_its_place_and_a_reload_finds_it(app, blob):
    """Generate with the workers busy: the job is submitted at once and waits in the
    supervisor's queue, the bar says its place and the wait to expect; the page reloads and
    the next page follows the same job, place and settings included, until it is done."""
    _ready(app, blob)
    app.ctx.typical_job_s["image"] = (time.monotonic(), 10.0)   # jobs took 10 s here lately
    app.sup.waiting, app.sup.ahead = True, 1
    # the one worker is busy with another client's job that has just started (no time so far)
    app.sup.busy = [JobStatus(id="other", session="x", state="running", started=None)]
    form = GenerateForm(True, 0.9, 1024, 12, "opt", 7, False)
    assert "Waiting for a free worker (1 other job waiting)…" in answer(app, job.on_generate, A1, form)["progress"]
    steps = job.run_job(app.page, app.ctx, A1, form)
    bar = ""
    while 'data-state="queued"' not in bar:
        bar = str(next(steps).get(app.page.progress))
    assert "Waiting for a free worker: 2nd in line, about 20 s" in bar and 'data-job="job0"' in bar
    steps.close()                      # a reload: the press's follower goes away ...
    around.on_unload(app.ctx, A1)
    assert [st.state for st in app.sup.jobs()] == ["queued"] and app.sup.cancelled == []   # ... the job stays

    follow = job.follow_on_load(app.page, app.ctx, A2)
    first = _checked(app, job.follow_on_load, next(follow))
    assert 'data-state="queued"' in first["progress"] and "2nd in line" in first["progress"]
    assert _is_update(first["generate"], value="Running…", interactive=False) and _is_update(first["cancel"], interactive=True)
    assert [first[k] for k in ("bake_texture", "simplify", "texture", "views", "mode", "seed", "ply")] == list(astuple(form))[:7]
    app.sup.ahead = 0                  # the job ahead got a worker: this one is next
    assert "1st in line, about 10 s" in _checked(app, job.follow_on_load, next(follow))["progress"]
    app.sup.waiting = False
    rest = [_checked(app, job.follow_on_load, u) for u in follow]
    assert any('data-state="running"' in str(u.get("progress")) for u in rest)
    assert 'data-state="done"' in answer(app, job.show_followed_outcome, A2)["progress"]


def test_progress_says_place_elapsed_and_what_is_left():
    queued = JobStatus(id="j", session="s", state="queued", message="queued (3 ahead)")
    assert "Waiting for a free worker: 4th in line, about 20 s" in statusview.progress_html(
        queued, place=4, workers=2, typical_s=10.0)
    assert "Waiting for a free worker: 11th in line<" in statusview.progress_html(queued, place=11)
    assert "Queued (3 ahead)" in statusview.progress_html(queued)      # no place known: the supervisor's words
    running = JobStatus(id="j", session="s", state="running", stage="bake", progress=0.6, started=1000.0)
    html_ = statusview.progress_html(running, typical_s=12.0, now=1008.4)
    assert "Baking texture — 60% — 8 s so far, about 4 s left" in html_ and 'data-state="running"' in html_
    assert "— 20 s so far<" in statusview.progress_html(running, typical_s=12.0, now=1020.0)   # over the typical
    assert [statusview.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st"]
    assert statusview.about(0.2) == "about 1 s" and statusview.about(150) == "about 2 min"


def test_the_wait_in_line_counts_what_the_running_jobs_have_left():
    """Jobs take 10 s here lately. A worker is free when its running job ends (10 s less its
    time so far), then every job ahead takes 10 s on the first worker free."""
    wait = statusview.queue_wait_s
    assert wait(1, 1, 10.0, [10.0]) == 10.0       # the running job has just started
    assert wait(1, 1, 10.0, [3.0]) == 3.0         # ... it has run 7 s
    assert wait(2, 1, 10.0, [3.0]) == 13.0        # one job ahead: it starts in 3 s and takes 10
    assert wait(1, 2, 10.0, [8.0, 2.0]) == 2.0    # the first of two workers to end
    assert wait(3, 2, 10.0, [8.0, 2.0]) == 12.0   # ahead: one at 2 s (ends 12), one at 8 s (ends 18)
    assert wait(4, 2, 10.0, [8.0, 2.0]) == 18.0
    assert wait(1, 2, 10.0, [4.0]) == 0.0         # a worker without a job is free now
    assert wait(2, 1, 10.0, [0.0]) == 10.0        # a job past its usual time: taken to end now
    # nothing known of the running jobs: every worker has just started one (2 workers, 3 ahead)
    assert wait(4, 2, 10.0) == 20.0 and wait(2, 2, 10.0) == 10.0

    queued = JobStatus(id="j", session="s", state="queued")
    assert "1st in line, about 3 s<" in statusview.progress_html(queued, place=1, typical_s=10.0, running_left=[3.0])
    assert "2nd in line, about 13 s<" in statusview.progress_html(queued, place=2, typical_s=10.0, running_left=[3.0])
    # what it waits for is past the usual time: no figure, and why
    assert ("1st in line, when a running job ends (it is taking longer than usual)<"
            in statusview.progress_html(queued, place=1, typical_s=10.0, running_left=[0.0]))
    assert ("1st in line, when a running job ends (they are taking longer than usual)<"
            in statusview.progress_html(queued, place=1, workers=2, typical_s=10.0, running_left=[0.0, 0.0]))


def test_running_jobs_have_left_what_their_kind_takes_less_their_time_so_far():
    from app.web.state.browser_jobs import running_left_s

    now = 5000.0
    running = [JobStatus(id="a", session="s", state="running", started=now - 4.0),             # image: 10 s
               JobStatus(id="b", session="s", state="running", kind="bake", started=now - 25.0),  # bake: 20 s
               JobStatus(id="c", session="s", state="running", kind="bake", started=now - 5.0)]
    ctx = SimpleNamespace(sup=SimpleNamespace(running=lambda: running),
                          typical_job_s={"image": (time.monotonic(), 10.0), "bake": (time.monotonic(), 20.0)},
                          cost_models={"image": (time.monotonic(), None), "bake": (time.monotonic(), None)})
    assert running_left_s(ctx, 10.0, now) == [6.0, 0.0, 15.0]
    ctx.typical_job_s["bake"] = (time.monotonic(), None)   # no bake done yet: the waiting job's kind's
    assert running_left_s(ctx, 10.0, now) == [6.0, 0.0, 5.0]


def test_status_line_history_on_load_and_the_settings_baking_enables(app, blob, tmp_path):
    assert answer(app, around.on_load, A1)["history_files"] is None
    out = around.on_status(app.page, app.ctx)
    assert set(out) == {app.page.status} and "CPU only: no model timed on this server yet" in out[app.page.status]
    _ready(app, blob)
    list(job.run_job(app.page, app.ctx, A1, FORM))
    app.ctx.typical_job_s.clear()       # what the last 30 s kept
    assert "a model took about 2 s here lately" in around.on_status(app.page, app.ctx)[app.page.status]
    on, off = around.on_bake_texture(app.page, True), around.on_bake_texture(app.page, False)
    assert all(_is_update(on[c], interactive=True) for c in (app.page.texture, app.page.mode, app.page.views))
    assert all(_is_update(off[c], interactive=False) for c in (app.page.texture, app.page.mode, app.page.views))
    # while the workers start (or after they failed to): the status says so, the history is empty
    starting = make_context(tmp_path / "starting", Settings(), start=False)
    out = around.on_load(app.page, starting, A1)
    assert "workers starting" in out[app.page.status] and out[app.page.history_files] is None
    assert "No results yet" in out[app.page.history]


def test_a_closed_tab_is_forgotten_but_its_image_parked(app, blob):
    _ready(app, blob)
    assert app.ctx.active.press(A1.session)
    app.ctx.active.keep_outcome(A1.session, not_started("x"))
    around.on_unload(app.ctx, A1)
    assert not app.ctx.active.busy(A1.session) and app.ctx.active.take_outcome(A1.session) is None
    assert app.ctx.sessions.adopt(A2.session, A2.client).image is not None


# -- the wiring ----------------------------------------------------------------------------

def test_every_handler_is_wired_and_events_call_it_with_the_caller_from_the_request(app):
    handlers = [f for m in (image, job, around) for name, f in vars(m).items()
                if inspect.isfunction(f) and f.__module__ == m.__name__
                and (name.startswith(("on_", "show_", "follow_", "run_", "prepare_")))]
    assert len(handlers) >= 20
    missing = [h.__name__ for h in handlers if h not in app.outputs]
    assert missing == [], f"handlers the wiring never connects: {missing}"
    # no event of the page runs an anonymous function
    for block_fn in app.page.demo.fns.values():
        assert getattr(block_fn.fn, "__name__", "") != "<lambda>", block_fn.name


def test_an_example_runs_the_upload_handler_as_a_drop_would(app, blob, tmp_path):
    example = png_file(tmp_path, "toy.png", blob[0])
    page = layout(app.ctx.settings, [Path(example)])
    wire(page, app.ctx)
    runs = wired_outputs(page.demo)[image.on_upload]
    assert len(runs) == 2 and runs[0] == runs[1], "the example and a drop set the same outputs"
    assert page.examples is not None and page.examples.dataset.samples


def test_event_fn_hands_the_handler_the_caller_the_server_derives(app, blob):
    from gradio import helpers, utils

    seen = []

    def handler(page, ctx, who: Caller, background: bool, evt: gr.SelectData) -> dict:
        seen.append((who, background, evt.index))
        return {page.canvas: gr.skip()}

    fn = event_fn(handler, app.page, app.ctx)
    assert str(inspect.signature(fn)).startswith("(background: 'bool', evt: 'gr.SelectData', request:")
    assert utils.get_function_params(fn) == [("background", False, None, bool)]
    # the same tab hash from two browsers: two sessions
    for token in (ALICE, BOB):
        args, _, _, _ = helpers.special_args(fn, [True], request=request(token, "tab1"),
                                             event_data=_select(5, 6))
        fn(*args)
    assert [w for w, _, _ in seen] == [caller_of(request(ALICE, "tab1")), caller_of(request(BOB, "tab1"))]
    assert seen[0][0] == A1 and seen[1][0] == B1 and seen[0][1:] == (True, [5, 6])
    # a generator stays one (Gradio streams it)
    follow = event_fn(job.follow_on_load, app.page, app.ctx)
    assert inspect.isgeneratorfunction(follow) and follow.handler is job.follow_on_load


def test_find_the_object_selects_it_without_clicks_and_clicks_correct_it(app, tmp_path):
    """"Find the object" on a photo without transparency: the object on a plain background is
    selected (the border model here: no SAM 2), and a click afterwards re-segments within
    the box around it; a busy photo is refused, saying why, under the image as well."""
    from composites import composite

    photo, truth = composite("blob", "grey", size=180, canvas=(240, 320))
    answer(app, image.on_upload, A1, png_file(tmp_path, "shot.png", photo))
    out = answer(app, image.on_find, A1)
    st = app.ctx.sessions.get(A1.session)
    iou = (st.mask & truth).sum() / (st.mask | truth).sum()
    assert iou >= 0.9, iou
    assert "found automatically by the background model" in out["mask_info"] and st.box is not None
    out = answer(app, image.on_click, A1, False, _select(160, 120))
    after = app.ctx.sessions.get(A1.session)
    assert after.clicks and after.box == st.box and after.mask.any()
    assert "found automatically" not in out["mask_info"]

    noise = np.random.default_rng(0).integers(0, 256, (240, 320, 3), dtype=np.uint8)
    answer(app, image.on_upload, A2, png_file(tmp_path, "noise.png", noise))
    out = answer(app, image.on_find, A2)
    assert "No single object found automatically: the background" in out["mask_info"]
    assert app.ctx.sessions.get(A2.session).mask is None


def test_the_download_choices_give_each_format_its_file_with_its_size_for_this_browser_only(app, blob):
    """Ticked formats become the job's settings; the outcome offers each file (published for
    the browser that made it: another browser's request for it is refused) with its size; a
    reloaded page shows the choices its last job used."""
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route, Router
    from starlette.testclient import TestClient

    from app.web.server import browser
    from app.web.server.launch import RequestGuard

    _ready(app, blob)
    form = GenerateForm(True, 0.95, 512, 8, "fast", 0, False, ["stl", "obj", "ply"], "webp", "mm")
    out = answer(app, job.on_generate, A1, form)
    assert _is_update(out["more_files"], value=None, visible=False) and out["file_sizes"] == ""
    stream(app, job.run_job, A1, form)
    export = app.sup.export["job0"]
    assert (export.formats, export.texture_format, export.units) == (("glb", "obj", "stl", "ply"), "webp", "mm")

    out = answer(app, job.show_outcome, A1)
    assert _is_update(out["glb_download"], visible=True)
    assert _is_update(out["more_files"], visible=True)
    files = [Path(p) for p in out["more_files"]["value"]]
    assert [p.name for p in files] == ["blob-1.obj.zip", "blob-1.stl", "blob-1.mesh.ply"]
    for p in [Path(out["model"]), *files]:   # each file's name and its size, as a person reads it
        assert f"`{p.name}` {page_bytes(p.stat().st_size)}" in out["file_sizes"]
    assert sorted(Path(p).name for p in out["history_files"]) == \
        ["blob-1.glb", "blob-1.mesh.ply", "blob-1.obj.zip", "blob-1.stl"]

    # served only to this browser, as the GLB is (the server's guard asks the publisher)
    async def serve(request):
        return PlainTextResponse("the file")

    guard = RequestGuard(Router(routes=[Route("/{path:path}", serve)]), owner_of=app.ctx.publisher.owner,
                         max_upload_bytes=10_000)
    alice = TestClient(guard, cookies={browser.BROWSER_COOKIE: ALICE})
    bob = TestClient(guard, cookies={browser.BROWSER_COOKIE: BOB})
    for p in files:
        url = f"/gradio_api/file={p}"
        assert alice.get(url).status_code == 200, p.name
        assert bob.get(url).status_code == 403 and TestClient(guard).get(url).status_code == 403, p.name

    # a reload shows what the last job used (the GLB is not a choice: it is always made)
    shown = stream(app, job.follow_on_load, A2)
    assert (shown[-1]["formats"], shown[-1]["texture_format"], shown[-1]["units"]) == \
        (["obj", "stl", "ply"], "webp", "mm")
    # a bad value is refused naming the box, before a job
    with pytest.raises(gr.Error, match="STL units: 'km' is not allowed"):
        answer(app, job.on_generate, A1, replace(form, units="km"))
    # a new image takes the last result's files off the page
    out = answer(app, image.on_upload, A1, png_file(app.tmp, "blob.png", blob[0]))
    assert _is_update(out["more_files"], value=None, visible=False) and out["file_sizes"] == ""


def test_a_history_row_reopens_its_result_for_this_browser_only(app, blob):
    """Issue 38 item 4: a done row's job id (HISTORY_JS hands it over) shows that model in the
    viewer with its downloads; the row's main line leaves the id out; another browser's id or
    nonsense shows nothing of it."""
    _ready(app, blob)
    answer(app, job.on_generate, A1, FORM)
    stream(app, job.run_job, A1, FORM)
    done = answer(app, job.show_outcome, A1)
    import re

    main_line = re.sub(r"<[^>]+>", "", done["history"].split("<br>")[0])   # what it reads, not its attributes
    assert "job0" not in main_line and 'data-pick="1"' in done["history"] and "job job0" in done["history"]
    assert "Click a result to show it in the viewer" in done["history"]
    answer(app, image.on_upload, A1, png_file(app.tmp, "other.png", blob[0]))   # the viewer is cleared
    out = answer(app, job.on_history_pick, A1, "job0")
    assert Path(out["model"]).name == "blob-1.glb" and _is_update(out["glb_download"], visible=True)
    assert "shown from the history: blob.png" in out["progress"] and "Done in" in out["progress"]
    assert "blob-1.glb" in out["file_sizes"] and (" KB" in out["file_sizes"] or " B" in out["file_sizes"])
    for who, job_id in ((B1, "job0"), (A1, "nonsense"), (A1, "")):
        out = answer(app, job.on_history_pick, who, job_id)
        assert "model" not in out and "not in this browser&#x27;s history" in out["progress"]


def test_select_first_names_every_way_to_select_and_a_warning_bar_says_what_to_change(app, blob):
    answer(app, image.on_upload, A1, png_file(app.tmp, "rgb.png", blob[0]))
    with pytest.raises(gr.Error) as e:
        job.on_generate(app.page, app.ctx, A1, FORM)
    assert "Find the object" in str(e.value) and "box" in str(e.value) and "transparency" not in str(e.value)
    from app.web.photo.form import nothing_selected

    assert "Use transparency as mask" in nothing_selected(True)   # offered where the image has some
    assert "Find the object" in around.status_line(app.page, app.ctx)

    from kiln.records import ModelStats, PipelineStats, JobStats
    from app.web.state.job_outcome import photo_warning

    def done_bake(camera):
        model = ModelStats(camera=camera, warnings=("the photo was not projected: only 20 % ...",))
        stats = JobStats(pipeline=PipelineStats(model=model))
        return JobStatus(id="b1", session="s", state="done", kind="bake", stats=stats, timings={"total_s": 3.0})

    bar = statusview.progress_html(done_bake("focal"), warning=photo_warning(done_bake("focal")))
    assert 'data-warning="1"' in bar and "kiln-warning" in bar and "kiln-done" not in bar
    assert "another focal length" in bar and "leave the camera out" in bar
    assert "mask covers the whole object" in photo_warning(done_bake("fitted"))
