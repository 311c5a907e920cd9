"""The script API's endpoints without a server (app/web/api/photo.py): each handler called with plain
values, the endpoint table against the handlers' parameters, and the registration against
what gradio_client lists. tests/test_api.py runs the same endpoints against a live server."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

# a required dependency; absent only on the offline GPU image, which runs `pytest -m gpu`
gr = pytest.importorskip("gradio", reason="the page's tests need gradio, which is not installed")

from app.web.api import photo as api  # noqa: E402
from app.web.api import endpoints as api_endpoints
from app.web.server.requestinfo import event_fn  # noqa: E402
from app.web.page.ui import build_ui  # noqa: E402
from kiln.settings import Settings  # noqa: E402
from page_helpers import ALICE, BOB, FakeSup, caller, make_context, png_file  # noqa: E402
from synthetic import make_object_image  # noqa: E402

A, B = caller(ALICE, "script-a"), caller(BOB, "script-b")


@pytest.fixture
def app(tmp_path):
    sup = FakeSup(tmp_path / "jobs")
    ctx = make_context(tmp_path, Settings(), sup)
    rgb, mask = make_object_image(160, "blob", seed=1)
    files = SimpleNamespace(
        photo=png_file(tmp_path, "photo.png", rgb),
        cutout=png_file(tmp_path, "cutout.png", np.dstack([rgb, mask.astype(np.uint8) * 255])),
        mask=png_file(tmp_path, "mask.png", mask.astype(np.uint8) * 255),
        wrong=png_file(tmp_path, "wrong-size-mask.png", np.zeros((90, 120), np.uint8)))
    try:
        yield SimpleNamespace(ctx=ctx, sup=sup, files=files, mask=mask)
    finally:
        ctx.shutdown()


def _refused(fn, *args, **kw) -> str:
    with pytest.raises(gr.Error) as e:
        out = fn(*args, **kw)
        if inspect.isgenerator(out):
            list(out)
    return e.value.message


def _no_progress(*_, **__):
    pass


def test_the_endpoint_table_matches_its_handlers_and_is_what_clients_see(app):
    assert api_endpoints.ENDPOINTS == ("upload_image", "select", "generate", "bake", "fit_camera", "status",
                                       "result", "cancel")
    demo = build_ui(app.ctx)
    for ep in api_endpoints.ENDPOINT_TABLE:
        params = [p for p in list(inspect.signature(ep.handler).parameters.values())[2:] if p.name != "progress"]
        fn = next(f for f in demo.fns.values() if f.api_name == ep.name)
        assert fn.fn.handler is ep.handler and fn.api_visibility != "private"
        # one input component per parameter, named as the parameter, in its order
        assert [c.label for c in fn.inputs] == [p.name for p in params], ep.name
        assert [c.label for c in fn.outputs] == list(ep.outputs), ep.name
        # the request sits before the first optional parameter, as clients expect
        names = list(inspect.signature(ep.handler).parameters)[2:]
        required = [p for p in params if p.default is p.empty]
        assert list(inspect.signature(event_fn(ep.handler, app.ctx)).parameters) == \
            [*names[:len(required)], "request", *names[len(required):]], ep.name
    # the page's own events are hidden from the API listing
    public = sorted(f.api_name for f in demo.fns.values() if f.api_visibility == "public")
    assert public == sorted(api_endpoints.ENDPOINTS), public


def test_upload_image_keeps_the_image_and_its_mask_for_the_callers_session(app):
    f = app.files
    info = api.upload_image(app.ctx, A, f.cutout)
    assert info["image"] == "cutout.png" and info["width"] == 160 and info["mask"]["source"] == "alpha"
    info = api.upload_image(app.ctx, A, f.cutout, None, False)
    assert info["mask"] is None and info["has_alpha"] is True
    info = api.upload_image(app.ctx, A, f.photo, f.mask)
    assert info["mask"]["source"] == "file" and 0.2 < info["mask"]["share"] < 0.4
    assert _refused(api.upload_image, app.ctx, A, "") == "image: no file was given"
    assert "wrong-size-mask.png is 120x90 pixels but the image is 160x160" in \
        _refused(api.upload_image, app.ctx, A, f.photo, f.wrong)
    assert app.ctx.sessions.get(A.session).image is None, "a refused upload leaves the session empty"
    # another client's session is its own
    api.upload_image(app.ctx, A, f.photo)
    assert app.ctx.sessions.get(B.session).image is None


def test_select_takes_points_and_a_box_in_the_images_pixels(app):
    assert "upload an image first" in _refused(api.select, app.ctx, A, [[80, 80, 1]])
    api.upload_image(app.ctx, A, app.files.photo)
    picked = api.select(app.ctx, A, [[80, 80, 1]])
    assert picked["mask"]["source"] == "prompt" and 0.2 < picked["mask"]["share"] < 0.4
    st = app.ctx.sessions.get(A.session)
    assert (st.mask & app.mask).sum() / (st.mask | app.mask).sum() > 0.8
    assert _refused(api.select, app.ctx, A, [[80, 80, 3]]) == "points: a label is 1 (object) or 0 (background)"
    assert _refused(api.select, app.ctx, A, [["x"]]).startswith("points: give [[x, y, label], ...]")
    assert _refused(api.select, app.ctx, A, None, [1, 2, 3]) == "box: give [x0, y0, x1, y1]"
    assert _refused(api.select, app.ctx, A) == "points or box: give at least one"
    boxed = api.select(app.ctx, A, None, [20, 20, 140, 140])
    assert boxed["mask"]["source"] == "prompt" and app.ctx.sessions.get(A.session).box is not None


def test_generate_refuses_with_what_to_fix(app):
    assert "upload an image first" in _refused(api.generate, app.ctx, A, progress=_no_progress)
    api.upload_image(app.ctx, A, app.files.photo)
    assert "select the object first" in _refused(api.generate, app.ctx, A, progress=_no_progress)
    api.select(app.ctx, A, [[80, 80, 1]])
    for kw, message in [({"seed": -1}, r"seed: -1 is out of range.*\(setting 'seed'\)"),
                        ({"views": 0}, r"views: 0 is out of range; allowed 1 to 64 \(setting 'views.count'\)"),
                        ({"texture_size": 777}, r"texture_size: 777 must be a power of two"),
                        ({"bake_mode": "best"}, r"bake_mode: 'best' is not allowed; choose one of fast, opt")]:
        with pytest.raises(gr.Error, match=message):
            list(api.generate(app.ctx, A, progress=_no_progress, **kw))
    app.ctx.sup_error = "worker pool failed to start: see /srv/var/workers/worker-0.log"
    assert _refused(api.generate, app.ctx, A, progress=_no_progress).endswith("see worker-0.log")
    app.ctx.sup_error = None
    assert app.sup.jobs() == [] and not app.ctx.active.busy(A.session)


def test_generate_follows_the_job_and_answers_its_files_for_this_client_only(app):
    api.upload_image(app.ctx, A, app.files.cutout)
    seen = []
    answers = list(api.generate(app.ctx, A, views=4, seed=7, gaussians_ply=True,
                                progress=lambda p, desc="": seen.append((p, desc))))
    assert all(isinstance(a, api.JobAnswer) for a in answers)
    *running, last = answers
    assert running and all(a.info["state"] == "running" and a.glb is None for a in running)
    assert last.info["state"] == "done" and last.info["outputs"] == ["glb", "ply"]
    assert Path(last.glb).name == "cutout-1.glb" and Path(last.ply).name == "cutout-1.ply"
    assert Path(last.glb).read_bytes() == b"glTFjob0"
    assert any(d == "Simplifying mesh" for _, d in seen) and not app.ctx.active.busy(A.session)
    assert [j["job"] for j in api.status(app.ctx, A)["jobs"]] == ["job0"]
    again = api.result(app.ctx, A, "job0")
    assert again.info["job"] == "job0" and Path(again.glb).read_bytes() == Path(last.glb).read_bytes()
    # another client: none of it
    assert api.status(app.ctx, B) == {"jobs": [], "running": []}
    assert _refused(api.result, app.ctx, B, "job0") == "job: no job 'job0' of this client"
    assert api.cancel(app.ctx, B) == {"cancelled": []}


def test_one_job_at_a_time_per_session_cancel_and_a_failed_job(app):
    api.upload_image(app.ctx, A, app.files.cutout)
    app.sup.hold = True
    steps = api.generate(app.ctx, A, progress=_no_progress)
    assert next(steps).info["state"] == "running"
    assert api.status(app.ctx, A)["running"] == ["job0"]
    assert _refused(api.generate, app.ctx, A, progress=_no_progress) == \
        "this session already has a job running; wait for it or call /cancel"
    assert _refused(api.result, app.ctx, A, "job0") == "job job0 is running"
    assert api.cancel(app.ctx, A) == {"cancelled": ["job0"]}
    with pytest.raises(gr.Error, match="job job0 cancelled: cancelled by user"):
        list(steps)
    assert not app.ctx.active.busy(A.session)
    app.sup.hold, app.sup.fail_with = False, "stage 'uv' failed: ValueError: at /srv/x/mesh.npz"
    assert _refused(api.generate, app.ctx, A, progress=_no_progress) == \
        "job job1 failed: stage 'uv' failed: ValueError: at mesh.npz"


def _coloured_mesh(path: Path) -> str:
    import trimesh

    tm = trimesh.creation.icosphere(subdivisions=2, radius=0.5)
    tm.vertices[:, 2] -= 3.0   # in front of an OpenGL camera at the origin
    tm.visual.vertex_colors = np.full((len(tm.vertices), 4), 200, np.uint8)
    tm.export(path)
    return str(path)


def test_bake_checks_the_files_before_a_job_is_queued(app, tmp_path):
    from app.web.api import bake as api_bake

    mesh = _coloured_mesh(tmp_path / "ball.ply")
    assert _refused(api_bake.bake, app.ctx, A, "", progress=_no_progress) == "mesh: no file was given"
    points = tmp_path / "points.ply"
    points.write_text("ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\n"
                      "property float z\nend_header\n0 0 0\n")
    assert "points.ply has no faces: this looks like a splat" in \
        _refused(api_bake.bake, app.ctx, A, str(points), progress=_no_progress)
    assert "source must be one of auto" in _refused(api_bake.bake, app.ctx, A, mesh, source="blender",
                                                      progress=_no_progress)
    assert "a camera is only used to project the photo" in \
        _refused(api_bake.bake, app.ctx, A, mesh, focal=300.0, progress=_no_progress)
    assert "texture_size: 777 must be a power of two" in \
        _refused(api_bake.bake, app.ctx, A, mesh, texture_size=777, progress=_no_progress)
    assert "upload an image first" in _refused(api_bake.bake, app.ctx, A, mesh, session_image=True,
                                               progress=_no_progress)
    assert app.sup.jobs() == [] and not app.ctx.active.busy(A.session)


def test_bake_runs_a_job_with_the_sessions_photo_and_publishes_its_glb(app, tmp_path):
    from app.web.api import bake as api_bake

    mesh = _coloured_mesh(tmp_path / "ball.ply")
    api.upload_image(app.ctx, A, app.files.cutout)
    answers = list(api_bake.bake(app.ctx, A, mesh, session_image=True, focal=300.0, progress=_no_progress))
    info, glb, ply, files, camera_fit = answers[-1]
    assert info["state"] == "done" and glb.endswith(".glb") and ply is None
    assert camera_fit is None and "camera_fit" not in info, "a given camera is not fitted: no picture"
    (job_id, checked), = app.sup.bakes.items()
    assert checked.request.photo and checked.request.focal == 300.0 and checked.rgb.shape == (160, 160, 3)
    assert checked.request.names["mesh"] == "ball.ply"
    assert app.sup.statuses[job_id].kind == "bake"
    # a bake keeps the mesh's faces unless a simplify ratio is asked
    assert json.loads((app.sup.dirs[job_id] / "settings.json").read_text())["mesh"]["simplify_ratio"] == 0.0
    # the job is the client's, as /generate's are
    assert api.status(app.ctx, B)["jobs"] == [] and len(api.status(app.ctx, A)["jobs"]) == 1


def test_generate_takes_formats_and_answers_every_file_with_its_size_for_this_client_only(app):
    import zipfile

    from pipeline.io.texture_file import sniff

    api.upload_image(app.ctx, A, app.files.cutout)
    *_, last = api.generate(app.ctx, A, views=4, formats=["obj", "stl", "ply"], texture_format="jpeg",
                            units="mm", progress=_no_progress)
    assert last.info["outputs"] == ["glb", "mesh_ply", "obj", "stl"]
    assert [Path(p).name for p in last.files] == ["cutout-1.obj.zip", "cutout-1.stl", "cutout-1.mesh.ply"]
    with zipfile.ZipFile(last.files[0]) as z:   # named as the download, its texture a JPEG
        assert sorted(z.namelist()) == ["cutout-1.jpg", "cutout-1.mtl", "cutout-1.obj"]
        assert sniff(z.read("cutout-1.jpg")) == "jpeg"
    # the status says each file's size (no server paths), and the STL's units and scale
    sizes = {f["format"]: f for f in last.info["files"]}
    assert list(sizes) == ["glb", "obj", "stl", "ply"] and "name" not in sizes["stl"]
    assert sizes["stl"]["units"] == "mm" and sizes["stl"]["scale"] == 1000.0
    for fmt, path in zip(("glb", "obj", "stl", "ply"), [last.glb, *last.files]):
        assert sizes[fmt]["bytes"] == Path(path).stat().st_size
        # published for this client's browser only, as the GLB is
        assert app.ctx.publisher.owner(path) == A.session
    settings = json.loads((app.sup.dirs["job0"] / "settings.json").read_text())["export"]
    assert settings == {**settings, "formats": ["glb", "obj", "stl", "ply"], "texture_format": "jpeg", "units": "mm"}
    # /result answers the same files; another client gets none of them
    again = api.result(app.ctx, A, "job0")
    assert again.files == last.files
    assert "no job" in _refused(api.result, app.ctx, B, "job0")
    # a comma-separated text works too; only the GLB when none is asked for
    *_, plain = api.generate(app.ctx, A, formats="", progress=_no_progress)
    assert plain.files is None and plain.info["outputs"] == ["glb"]


@pytest.mark.parametrize("values,needle", [
    ({"formats": ["fbx"]}, "formats: 'fbx' is not one of glb, obj, stl, ply"),
    ({"units": "km"}, "units: 'km' is not allowed; choose one of m, mm (setting 'export.units')"),
    ({"texture_format": "gif"}, "texture_format: 'gif' is not allowed"),
])
def test_a_bad_format_unit_or_texture_format_is_refused_before_a_job(app, values, needle):
    api.upload_image(app.ctx, A, app.files.cutout)
    assert needle in _refused(api.generate, app.ctx, A, progress=_no_progress, **values)
    assert app.sup.jobs() == []


def test_bake_takes_formats_too(app, tmp_path):
    from app.web.api import bake as api_bake

    mesh = _coloured_mesh(tmp_path / "ball.ply")
    api.upload_image(app.ctx, A, app.files.cutout)
    *_, last = api_bake.bake(app.ctx, A, mesh, session_image=True, focal=300.0, formats="stl", units="mm",
                             progress=_no_progress)
    assert [Path(p).name for p in last.files] == ["ball-1.stl"]
    assert json.loads((app.sup.dirs["job0"] / "settings.json").read_text())["export"]["units"] == "mm"


def test_fit_camera_answers_the_camera_file_its_figures_and_its_picture_for_this_client_only(app, tmp_path):
    """/fit_camera: a fit job (no bake); its camera file in the form /bake's camera (and kiln
    bake --camera) reads, its figures, whether a bake will project the photo, and the picture;
    then /bake with that camera as fitted bakes without fitting again and answers the picture."""
    from app.web.api import bake as api_bake
    from app.web.api import fit as api_fit
    from app.web.server.browser import browser_of
    from pipeline.io.camera_file import read_camera

    mesh = _coloured_mesh(tmp_path / "ball.ply")
    assert "fitting the camera needs the photo" in _refused(api_fit.fit_camera, app.ctx, A, mesh,
                                                            progress=_no_progress)
    api.upload_image(app.ctx, A, app.files.cutout)
    answers = list(api_fit.fit_camera(app.ctx, A, mesh, session_image=True, progress=_no_progress))
    assert all(isinstance(a, api_fit.FitAnswer) for a in answers)
    *running, (info, camera, picture) = answers
    assert running and all(a.camera is None for a in running)
    assert info["state"] == "done" and info["camera_fit"]["silhouette_iou"] == 0.93
    assert "source_camera" not in info["camera_fit"]
    assert info["photo_projection"] == {"projected": True, "min_iou": 0.6,
                                        "why": "silhouette IoU 0.93 is at least 0.60 (bake.fit_min_iou)"}
    assert Path(camera).name == "ball.camera.json" and Path(picture).name == "ball.camera_fit.png"
    assert read_camera(camera).width == 160 and json.loads(Path(camera).read_text())["silhouette_iou"] == 0.93
    assert Image.open(picture).size == (160, 160)
    assert app.ctx.owned.owners(picture) == {browser_of(A.session)} == app.ctx.owned.owners(camera)
    (job_id, checked), = app.sup.bakes.items()
    assert app.sup.statuses[job_id].kind == "fit" and checked.request.fit_camera

    # /bake with it as fitted: no refit (camera_fitted, not fit_camera), and the picture comes back
    *_, last = api_bake.bake(app.ctx, A, mesh, session_image=True, camera=camera, camera_fitted=True,
                             progress=_no_progress)
    req = app.sup.bakes[sorted(app.sup.bakes)[-1]].request
    assert req.camera_fitted and not req.fit_camera
    assert isinstance(last, api_bake.BakeAnswer) and last.camera_fit is None, \
        "the stand-in's bake reports no fit: no picture"
    assert "camera_fitted says the camera file is a fitted one" in _refused(
        api_bake.bake, app.ctx, A, mesh, session_image=True, camera_fitted=True, progress=_no_progress)


def test_a_bake_that_fitted_its_camera_answers_the_fits_picture_and_figures(app, tmp_path, monkeypatch):
    from dataclasses import replace

    from app.web.api import bake as api_bake
    from kiln.records import JobStats, ModelStats, PipelineStats
    from worker.jobs.bakejob import FIT_IMAGE

    fit = {"silhouette_iou": 0.7, "silhouette_coverage": 0.99, "silhouette_inside": 0.7, "fit_seconds": 2.0}
    end = app.sup._end

    def fitted(st):
        png_file(app.sup.dirs[st.id] / "outputs", FIT_IMAGE, np.full((20, 30, 3), 200, np.uint8))
        return replace(end(st), stats=JobStats(pipeline=PipelineStats(model=ModelStats(camera="fitted",
                                                                                       camera_fit=fit))))

    monkeypatch.setattr(app.sup, "_end", fitted)
    mesh = _coloured_mesh(tmp_path / "ball.ply")
    api.upload_image(app.ctx, A, app.files.cutout)
    info, glb, _, _, picture = list(api_bake.bake(app.ctx, A, mesh, session_image=True, progress=_no_progress))[-1]
    assert info["camera_fit"] == fit
    assert Path(glb).name == "ball-1.glb" and Path(picture).name == "ball-1.camera_fit.png"
    assert Image.open(picture).size == (30, 20)


def test_a_scene_bake_answers_the_picture_of_its_placed_objects(app, tmp_path, monkeypatch):
    """/bake with scene and a given camera (focal): no camera was fitted, yet the picture of the
    placed objects over the photo comes back as camera_fit (it was None before)."""
    from dataclasses import replace

    from app.web.api import bake as api_bake
    from kiln.records import JobStats, PipelineStats, SceneObjectStats
    from scene_helpers import write_ball_before_board
    from worker.jobs.bakejob import FIT_IMAGE

    files = write_ball_before_board(tmp_path / "scene")
    end = app.sup._end

    def placed(st):
        png_file(app.sup.dirs[st.id] / "outputs", FIT_IMAGE, np.full((24, 32, 3), 90, np.uint8))
        objects = (SceneObjectStats(name="ball", placement={"how": "kept"}),
                   SceneObjectStats(name="board", placement={"how": "kept"}))
        return replace(end(st), stats=JobStats(pipeline=PipelineStats(scene=objects)))

    monkeypatch.setattr(app.sup, "_end", placed)
    info, glb, _, _, picture = list(api_bake.bake(
        app.ctx, A, str(files["ball"]), image=str(files["photo"]), mask=str(files["ball_mask"]), focal=300.0,
        camera_frame="opengl", scene=True, more_meshes=[str(files["board"])],
        more_object_masks=[str(files["board_mask"])], progress=_no_progress))[-1]
    assert app.sup.bakes[info["job"]].request.scene
    assert "camera_fit" not in info, "no camera was fitted: no fit figures"
    assert Path(picture).name == f"{Path(glb).stem}.camera_fit.png"
    assert Image.open(picture).size == (32, 24)
