"""The "Bake a model" tab's handlers without a server (app/web/bake/bake_handlers.py): bad files are
refused at once saying what is wrong, a good bake runs through the job queue's stand-in and
its outcome shows the model, the download and the history; Cancel stops it. Every answer is
checked against the outputs the wiring declares for its handler."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

# a required dependency; absent only on the offline GPU image, which runs `pytest -m gpu`
gr = pytest.importorskip("gradio", reason="the page's tests need gradio, which is not installed")

from app.web.bake import bake_handlers as baking
from app.web.bake.bake_form import BakeForm  # noqa: E402
from app.web.photo import image_handlers as image  # noqa: E402
from kiln.settings import Settings  # noqa: E402
from page_helpers import ALICE, FakeSup, caller, make_context, png_file, wired_page  # noqa: E402
from synthetic import make_object_image  # noqa: E402

A1 = caller(ALICE, "tab1")


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


def _names(page) -> dict:
    out = {id(getattr(page.bake_tab, f)): f for f in page.bake_tab.__dataclass_fields__}
    out.update({id(getattr(page, f)): f for f in page.__dataclass_fields__
                if f not in ("demo", "examples", "bake_tab")})
    return out


def _checked(app, handler, out: dict) -> dict:
    assert out, f"{handler.__name__} answered {{}}"
    for outputs in app.outputs[handler]:
        undeclared = [c for c in out if all(c is not o for o in outputs)]
        assert not undeclared, f"{handler.__name__} sets outputs its event does not declare: {undeclared}"
    names = _names(app.page)
    return {names[id(c)]: v for c, v in out.items()}


def answer(app, handler, *inputs) -> dict:
    return _checked(app, handler, handler(app.page, app.ctx, A1, *inputs))


def stream(app, handler, *inputs) -> list[dict]:
    return [_checked(app, handler, out) for out in handler(app.page, app.ctx, A1, *inputs)]


def _is_update(update, **props) -> bool:
    return isinstance(update, dict) and update.get("__type__") == "update" and \
        all(update.get(k) == v for k, v in props.items())


def form(mesh, splat=None, photo=None, mask=None, reuse=False, source="auto", camera=None, focal=0,
         frame="opengl", fit=False, uvs="auto", texture=1024, simplify=0.0) -> BakeForm:
    return BakeForm(mesh, splat, photo, mask, reuse, source, camera, focal, frame=frame, fit=fit, uvs=uvs,
                    texture=texture, simplify=simplify)


def _ball(path: Path) -> str:
    import trimesh

    tm = trimesh.creation.icosphere(subdivisions=2, radius=0.5)
    tm.vertices[:, 2] -= 3.0   # in front of an OpenGL camera at the origin
    tm.visual.vertex_colors = np.full((len(tm.vertices), 4), 180, np.uint8)
    tm.export(path)
    return str(path)


def _refused(app, *inputs) -> str:
    with pytest.raises(gr.Error) as e:
        baking.on_bake(app.page, app.ctx, A1, *inputs)
    return e.value.message


def test_the_texture_size_starts_at_the_configured_one(wired):
    """As `kiln bake` takes it: 1024 by default, the configured size when one is set (the
    browser tests' small settings bake at 256), 1024 for "auto" (the box offers sizes only)."""
    from app.web.page.layout import layout

    assert wired.page.bake_tab.texture.value == 1024
    for size, shown in ((256, 256), ("auto", 1024)):
        page = layout(Settings().override({"bake.texture_size": size}))
        assert page.bake_tab.texture.value == shown


def test_bad_files_are_refused_at_once_saying_what_is_wrong(app):
    t = app.tmp
    bare = t / "bare.obj"
    bare.write_text("v 0 0 -3\nv 1 0 -3\nv 0 1 -3\nf 1 2 3\n")
    assert _refused(app, form(None)) == "mesh: no file was given"
    assert "nothing to take colour from: bare.obj has no colours" in _refused(app, form(str(bare)))
    assert "cannot bake into the mesh's own UVs: the mesh has no UVs" in _refused(app, form(str(bare), uvs="keep"))
    assert "a camera is only used to project the photo" in _refused(app, form(str(bare), focal=300))
    assert "upload an image first" in _refused(app, form(str(bare), reuse=True))
    assert app.sup.jobs() == [] and not app.ctx.active.busy(A1.session)
    # the last refusal stays on the tab's progress line (the pop-up goes), once
    out = _checked(app, baking.show_bake_refusal, baking.show_bake_refusal(app.page, app.ctx, A1))
    assert 'data-state="refused"' in out["progress"] and "Not started:" in out["progress"]
    assert "upload an image first" in out["progress"] and 'id="kiln-bake-progress"' in out["progress"]
    again = baking.show_bake_refusal(app.page, app.ctx, A1)
    assert again == {app.page.bake_tab.progress: gr.skip()}


def test_a_bake_runs_and_its_outcome_shows_the_model_and_the_download(app):
    values = form(_ball(app.tmp / "ball.ply"))
    out = answer(app, baking.on_bake, values)
    assert "Starting…" in out["progress"] and 'id="kiln-bake-progress"' in out["progress"]
    assert "mesh ball.ply: PLY, 320 faces, no UVs, vertex colours" in out["notes"] and out["model"] is None
    assert _is_update(out["bake_button"], value="Baking…", interactive=False) and _is_update(out["cancel"], interactive=True)
    steps = stream(app, baking.run_bake, values)
    assert all(set(s) == {"progress"} for s in steps) and steps[-1] == {"progress": gr.skip()}
    out = answer(app, baking.show_bake_outcome)
    glb = Path(out["model"])
    assert glb.name == "ball-1.glb" and 'data-state="done"' in out["progress"]
    assert _is_update(out["download"], value=str(glb), visible=True)
    assert "ball.ply" in out["history"] and _is_update(out["bake_button"], value="Bake", interactive=True)
    (job_id, checked), = app.sup.bakes.items()
    assert checked.request.uvs == "new" and app.sup.statuses[job_id].kind == "bake"


def test_the_first_tab_s_photo_and_selection_can_be_the_photo(app):
    rgb, mask = make_object_image(160, "blob", seed=1)
    cutout = png_file(app.tmp, "cutout.png", np.dstack([rgb, mask.astype(np.uint8) * 255]))
    image.on_upload(app.page, app.ctx, A1, cutout)
    values = form(_ball(app.tmp / "ball.ply"), reuse=True, focal=300)
    answer(app, baking.on_bake, values)
    list(baking.run_bake(app.page, app.ctx, A1, values))
    (_, checked), = app.sup.bakes.items()
    assert checked.request.photo and checked.request.camera_given and checked.mask.shape == (160, 160)


def test_cancel_stops_the_tabs_bake(app):
    out = answer(app, baking.on_bake_cancel)
    assert "Nothing to cancel." in out["progress"]
    app.sup.hold = True
    values = form(_ball(app.tmp / "ball.ply"))
    answer(app, baking.on_bake, values)
    steps = baking.run_bake(app.page, app.ctx, A1, values)
    while 'data-state="running"' not in str(next(steps).get(app.page.bake_tab.progress)):
        pass
    out = answer(app, baking.on_bake_cancel)
    assert 'data-state="cancelled"' in out["progress"] and _is_update(out["bake_button"], value="Bake")
    assert app.sup.cancelled == ["job0"]
    steps.close()


def test_a_reloaded_page_follows_its_bake_on_this_tab_and_the_image_tab_leaves_it(app):
    from app.web.photo import generate_handlers as job

    app.sup.hold = True
    values = form(_ball(app.tmp / "ball.ply"))
    answer(app, baking.on_bake, values)
    steps = baking.run_bake(app.page, app.ctx, A1, values)
    while 'data-state="running"' not in str(next(steps).get(app.page.bake_tab.progress)):
        pass
    steps.close()                       # the page went away; its job goes on
    app.ctx.active.drop_session(A1.session)
    A2 = caller(ALICE, "tab2")          # the reloaded page: same browser, new tab session
    first = _checked(app, job.follow_on_load, next(job.follow_on_load(app.page, app.ctx, A2)))
    assert "progress" not in first and "history" in first, "the image tab does not follow a bake"
    follow = baking.follow_bake_on_load(app.page, app.ctx, A2)
    out = _checked(app, baking.follow_bake_on_load, next(follow))
    assert 'data-state="running"' in out["progress"] and _is_update(out["cancel"], interactive=True)
    app.sup.hold = False
    for step in follow:
        _checked(app, baking.follow_bake_on_load, step)
    assert app.ctx.active.take_outcome(A2.session) is None, "no image outcome for a bake"
    out = _checked(app, baking.show_followed_bake, baking.show_followed_bake(app.page, app.ctx, A2))
    assert out["model"].endswith("ball-1.glb") and 'data-state="done"' in out["progress"]


def test_a_fitted_camera_shows_its_silhouette_over_the_photo_before_the_bake_ends(app, monkeypatch):
    """The worker draws the fitted silhouette over the photo as soon as it has fitted the
    camera (worker.jobs.bakejob.FIT_IMAGE); the running bake's stream shows it once, as a file only
    this browser may fetch, while the job still runs; the outcome says how well it fits."""
    from dataclasses import replace

    from app.web.bake import fit_picture as fitview
    from app.web.server.browser import browser_of
    from kiln.records import JobStats, ModelStats, PipelineStats
    from worker.jobs.bakejob import FIT_IMAGE

    app.sup.hold = True
    values = form(_ball(app.tmp / "ball.ply"), fit=True)
    out = answer(app, baking.on_bake, values)
    assert _is_update(out["fit_view"], value=None, visible=False)
    steps = baking.run_bake(app.page, app.ctx, A1, values)
    while 'data-state="running"' not in str(next(steps).get(app.page.bake_tab.progress)):
        pass
    job_id = "job0"
    picture = np.zeros((30, 40, 3), np.uint8)
    picture[10:20, 10:30] = (60, 120, 255)
    png_file(app.sup.dirs[job_id] / "outputs", FIT_IMAGE, picture)
    shown = _checked(app, baking.run_bake, next(steps))
    update = shown["fit_view"]
    assert _is_update(update, visible=True) and app.sup.statuses[job_id].state == "running"
    assert app.ctx.owned.owners(update["value"]) == {browser_of(A1.session)}, "only this browser may fetch it"
    shown_px = np.asarray(Image.open(update["value"]), np.int16)   # a JPEG: its colours near the PNG's
    assert shown_px.shape == (30, 40, 3) and np.abs(shown_px[15, 20] - (60, 120, 255)).max() <= 16
    fit = {"silhouette_iou": 0.68, "silhouette_coverage": 0.96, "fit_seconds": 2.1,
           "tie_break": {"decided_by": "photo", "tied": 2, "photo_error": {"chosen": 0.004, "runner_up": 0.237},
                         "photo_margin": 0.233}}
    end = app.sup._end
    monkeypatch.setattr(app.sup, "_end", lambda st: replace(end(st), stats=JobStats(
        pipeline=PipelineStats(model=ModelStats(camera="fitted", camera_fit=fit)))))
    app.sup.hold = False
    rest = [_checked(app, baking.run_bake, s) for s in steps]
    assert all("fit_view" not in s for s in rest), "shown once"
    out = answer(app, baking.show_bake_outcome)
    assert "Camera fitted to the mask in 2.1 s: silhouette IoU 0.68, covering 96 % of the mask" in out["notes"]
    assert "the photo's colours chose one (colour error 0.004 against 0.237)" in out["notes"]
    # a ball looks the same from every side: no clear choice, and the notes say so
    alike = dict(fit, tie_break={"decided_by": "photo", "tied": 4, "photo_margin": 0.0,
                                 "photo_error": {"chosen": 0.002, "runner_up": 0.002}})
    assert "4 views fit the silhouette alike and look alike in colour too" in fitview.fit_summary(alike)


def test_every_bake_handler_is_wired(app):
    handlers = [f for name, f in vars(baking).items() if inspect.isfunction(f) and f.__module__ == baking.__name__
                and name.startswith(("on_", "show_", "run_", "follow_"))]
    assert len(handlers) == 7
    assert [h.__name__ for h in handlers if h not in app.outputs] == []


def test_a_bake_s_download_choices_give_each_format_its_file_and_size(app):
    values = replace(form(_ball(app.tmp / "ball.ply")), formats=["stl"], texture_format="jpeg", units="mm")
    out = answer(app, baking.on_bake, values)
    assert _is_update(out["more_files"], value=None, visible=False) and out["file_sizes"] == ""
    stream(app, baking.run_bake, values)
    export = app.sup.export["job0"]
    assert (export.formats, export.texture_format, export.units) == (("glb", "stl"), "jpeg", "mm")
    out = answer(app, baking.show_bake_outcome)
    (stl,) = [Path(p) for p in out["more_files"]["value"]]
    assert stl.name == "ball-1.stl" and _is_update(out["more_files"], visible=True)
    assert app.ctx.publisher.owner(str(stl)) == A1.session
    assert "`ball-1.glb`" in out["file_sizes"] and "`ball-1.stl`" in out["file_sizes"]


def test_a_bake_takes_more_photos_each_with_its_own_mask(app):
    """The tab's "More photos of the object": photo 2 with its mask reaches the job's request
    as a photo of its own (fitted in the worker, having no camera); a mask without its photo
    is refused with the photo's number."""
    rgb, mask = make_object_image(160, "blob", seed=3)
    first, second = png_file(app.tmp, "front.png", rgb), png_file(app.tmp, "side.png", rgb[:, ::-1].copy())
    white = (mask * 255).astype(np.uint8)
    first_mask = png_file(app.tmp, "front_mask.png", white)
    second_mask = png_file(app.tmp, "side_mask.png", white[:, ::-1].copy())
    ball = _ball(app.tmp / "ball.ply")
    values = replace(form(ball, photo=first, mask=first_mask), photo_2=second, mask_2=second_mask)
    out = answer(app, baking.on_bake, values)
    assert "Starting…" in out["progress"]
    stream(app, baking.run_bake, values)
    (_, checked), = app.sup.bakes.items()
    more = checked.request.more_photos
    assert len(more) == 1 and more[0].mask is not None and more[0].camera is None
    assert _refused(app, replace(form(ball, photo=first, mask=first_mask), mask_3=second_mask)) == \
        "photo 3: a mask or camera was given without its photo"


def test_the_api_pairs_more_photos_by_position_and_says_what_does_not_pair():
    from app.web.bake.bake_form import listed_photos
    from app.web.server.usertext import UIError

    assert listed_photos(["b.png", "c.png"], ["b_mask.png"], None) == \
        (("b.png", "b_mask.png", None), ("c.png", None, None))
    assert listed_photos(None) == () and listed_photos("b.png") == (("b.png", None, None),)
    with pytest.raises(UIError, match="more_masks: 2 given for 1 more_images"):
        listed_photos(["b.png"], ["m1.png", "m2.png"])
    with pytest.raises(UIError, match="more_images: a list of files"):
        listed_photos(7)


def test_a_bake_takes_more_objects_of_the_photo_as_one_scene(app):
    """The tab's "More objects of this photo": object 2's mesh and mask reach the job's request
    as a scene (one GLB, a node per object, named after the mesh files); a mask without its
    mesh, or a mesh without its mask, is refused at once."""
    rgb, mask = make_object_image(160, "blob", seed=3)
    photo = png_file(app.tmp, "photo.png", rgb)
    white = (mask * 255).astype(np.uint8)
    first_mask, second_mask = png_file(app.tmp, "ball_mask.png", white), png_file(app.tmp, "cup_mask.png", white)
    ball, cup = _ball(app.tmp / "ball.ply"), _ball(app.tmp / "cup.ply")
    values = replace(form(ball, photo=photo, mask=first_mask, focal=300.0), object_mesh_2=cup,
                     object_mask_2=second_mask)
    assert "Starting…" in answer(app, baking.on_bake, values)["progress"]
    stream(app, baking.run_bake, values)
    (_, checked), = app.sup.bakes.items()
    req = checked.request
    assert req.scene and req.names["node"] == "ball" and [o.names["node"] for o in req.objects] == ["cup"]
    assert _refused(app, replace(form(ball, photo=photo, mask=first_mask), object_mask_3=second_mask)) == \
        "object 3: a splat or mask was given without its mesh"
    assert "one mask for each mesh" in _refused(app, replace(form(ball, photo=photo, mask=first_mask),
                                                             object_mesh_2=cup))
