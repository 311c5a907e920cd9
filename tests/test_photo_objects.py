"""Several objects on the "Photo to 3D" tab, through its handlers without a server
(``app.web.photo.objects``): "Add another object" keeps the selection and starts a new one;
Generate makes one job per object with the built-in reconstruction (each its own model, every
GLB downloadable, the page saying what a scene needs), and one scene job with SAM 3D Objects."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

gr = pytest.importorskip("gradio", reason="the page's tests need gradio, which is not installed")

from app.web.page.layout import layout  # noqa: E402
from app.web.page.wiring import wire  # noqa: E402
from app.web.photo import generate_handlers as job  # noqa: E402
from app.web.photo import image_handlers as image  # noqa: E402
from app.web.photo.form import GenerateForm  # noqa: E402
from kiln.settings import Settings  # noqa: E402

from page_helpers import ALICE, FakeSup, caller, make_context, png_file, wired_outputs  # noqa: E402
from test_page_handlers import _checked, _select, answer, stream  # noqa: E402

FORM = GenerateForm(False, 0.95, 512, 8, "fast", 0, False)
A1 = caller(ALICE, "tab1")


def two_boxes() -> np.ndarray:
    """A photo of two objects on a plain grey backdrop: a red square left, a blue one right."""
    rgb = np.full((200, 300, 3), 200, np.uint8)
    rgb[60:140, 30:110] = (200, 40, 30)
    rgb[50:150, 170:270] = (30, 60, 200)
    return rgb


def _app(tmp_path, backend: str):
    sup = FakeSup(tmp_path / "jobs")
    ctx = make_context(tmp_path, Settings().override({"reconstruct.backend": backend}), sup)
    page = layout(ctx.settings)
    wire(page, ctx)
    return SimpleNamespace(ctx=ctx, page=page, sup=sup, tmp=tmp_path, outputs=wired_outputs(page.demo))


@pytest.fixture
def builtin_app(tmp_path):
    app = _app(tmp_path, "builtin")
    yield app
    app.ctx.shutdown()


@pytest.fixture
def sam3d_app(tmp_path):
    app = _app(tmp_path, "sam3d")
    yield app
    app.ctx.shutdown()


def _two_selected(app) -> dict:
    """Upload the photo, click the red square, keep it, click the blue one: the answers of the
    keep and of the second click."""
    answer(app, image.on_upload, A1, png_file(app.tmp, "boxes.png", two_boxes()))
    answer(app, image.on_click, A1, False, _select(70, 100))
    kept = answer(app, image.on_keep, A1)
    answer(app, image.on_click, A1, False, _select(220, 100))
    return kept


def _generate(app) -> tuple[dict, str]:
    """Generate pressed and followed: (the outcome shown, every progress bar streamed, joined)."""
    answer(app, job.on_generate, A1, FORM)
    steps = stream(app, job.run_job, A1, FORM)
    assert steps[-1] == {"progress": gr.skip()}
    bars = " ".join(s["progress"] for s in steps if s["progress"] != gr.skip())
    return answer(app, job.show_outcome, A1), bars


def test_add_another_object_keeps_the_selection_and_starts_a_new_one(builtin_app):
    app = builtin_app
    answer(app, image.on_upload, A1, png_file(app.tmp, "boxes.png", two_boxes()))
    refused = answer(app, image.on_keep, A1)
    assert "Select object 1 first" in refused["mask_info"]
    answer(app, image.on_click, A1, False, _select(70, 100))
    kept = answer(app, image.on_keep, A1)
    st = app.ctx.sessions.get(A1.session)
    assert len(st.kept) == 1 and st.mask is None and st.clicks == ()
    red = st.kept[0].mask
    assert red[100, 70] and not red[100, 220] and 0.08 < red.mean() < 0.14, red.mean()
    assert "**Kept:** object 1" in kept["mask_info"] and "object 2" in kept["mask_info"]
    # with the built-in reconstruction the page says at once what Generate will make, and why
    assert "each its own model" in kept["mask_info"] and "reconstruct.backend = sam3d" in kept["mask_info"]
    assert kept["drop_kept"]["visible"] is True
    # the kept object's outline is drawn on the canvas in its own colour (cyan)
    canvas = np.asarray(kept["canvas"]) if not isinstance(kept["canvas"], str) else None
    if canvas is None:
        from PIL import Image
        canvas = np.asarray(Image.open(kept["canvas"]).convert("RGB"))
    cyan = (canvas[..., 0] < 90) & (canvas[..., 1] > 150) & (canvas[..., 2] > 200)
    assert cyan[:, :150].sum() > 100 and cyan[:, 150:].sum() == 0
    dropped = answer(app, image.on_drop_kept, A1)
    assert app.ctx.sessions.get(A1.session).kept == () and "Kept" not in dropped["mask_info"]
    assert dropped["drop_kept"]["visible"] is False
    # a new image starts without kept objects
    answer(app, image.on_click, A1, False, _select(70, 100))
    answer(app, image.on_keep, A1)
    answer(app, image.on_upload, A1, png_file(app.tmp, "again.png", two_boxes()))
    assert app.ctx.sessions.get(A1.session).kept == ()


def test_builtin_makes_one_model_per_object_and_says_what_a_scene_needs(builtin_app):
    app = builtin_app
    _two_selected(app)
    out, bars = _generate(app)
    assert "Object 1 of 2: " in bars and "Object 2 of 2: " in bars, bars
    jobs = app.sup.jobs()
    assert len(jobs) == 2, "one job per object"
    first, second = (app.sup.masks[st.id] for st in jobs)
    assert len(first) == len(second) == 1
    assert first[0][100, 70] and not first[0][100, 220], "object 1 is the red square"
    assert second[0][100, 220] and not second[0][100, 70], "object 2 is the blue one"
    assert first[0].shape == (200, 300)
    names = sorted(Path(p).name for p in out["more_files"]["value"])
    assert names == ["boxes-1.glb", "boxes-2.glb"], names
    assert Path(out["model"]).name == "boxes-2.glb"
    assert "2 of 2 objects made" in out["progress"] and "reconstruct.backend = sam3d" in out["progress"]
    assert "no depth of its own" in out["progress"]
    # a reloaded page shows the same outcome: every object's model
    steps = list(job.follow_on_load(app.page, app.ctx, A1))
    assert steps
    again = _checked(app, job.show_followed_outcome, job.show_followed_outcome(app.page, app.ctx, A1))
    assert sorted(Path(p).name for p in again["more_files"]["value"]) == ["boxes-1.glb", "boxes-2.glb"]


def test_a_refused_object_is_named_and_nothing_is_submitted(builtin_app):
    app = builtin_app
    answer(app, image.on_upload, A1, png_file(app.tmp, "boxes.png", two_boxes()))
    answer(app, image.on_click, A1, False, _select(70, 100))
    answer(app, image.on_keep, A1)
    answer(app, image.on_click, A1, False, _select(220, 100))
    app.ctx.settings = app.ctx.settings.override({"worker.max_queue": 1})
    with pytest.raises(gr.Error, match="room for 1 more job and these 2 objects make 2"):
        job.on_generate(app.page, app.ctx, A1, FORM)
    assert app.sup.jobs() == []


def test_sam3d_makes_one_scene_job_of_every_object(sam3d_app):
    app = sam3d_app
    kept = _two_selected(app)
    assert "one scene" in kept["mask_info"] and "SAM 3D Objects" in kept["mask_info"]
    _, bars = _generate(app)
    assert "Object 1 of" not in bars
    jobs = app.sup.jobs()
    assert len(jobs) == 1, "one scene job"
    masks = app.sup.masks[jobs[0].id]
    assert len(masks) == 2 and masks[0][100, 70] and masks[1][100, 220]


def test_an_objects_full_size_mask_is_refused_by_the_single_jobs_rule_naming_it():
    """Generate's objects go through the one full-size mask rule a single job's selection
    does (``form.checked_full_mask``), each refusal naming its object and saying what to do."""
    import io

    from PIL import Image

    from app.web.photo import form
    from app.web.server.usertext import UIError
    from app.web.state.uploads import KeptObject, SessionState, WorkImage

    rgb = two_boxes()
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    img = WorkImage(name="boxes.png", work=rgb, work_alpha=None, key="k", size=rgb.shape[:2],
                    source=buf.getvalue())
    left = np.zeros(rgb.shape[:2], bool)
    left[60:140, 30:110] = True
    everything = np.ones(rgb.shape[:2], bool)
    state = SessionState(image=img, mask=left, kept=(KeptObject(mask=everything),))
    with pytest.raises(UIError) as whole:
        form.objects_request(state, Settings(), FORM)
    with pytest.raises(UIError) as single:
        form.job_inputs(SessionState(image=img, mask=everything))
    assert str(whole.value) == f"object 1: {single.value}"
    assert "add a background click" in str(whole.value)
    rgb_out, masks, _ = form.objects_request(SessionState(image=img, mask=left, kept=(KeptObject(mask=left),)),
                                             Settings(), FORM)
    assert rgb_out.shape == rgb.shape and len(masks) == 2 and np.array_equal(masks[1], left)
