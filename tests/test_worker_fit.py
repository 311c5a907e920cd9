"""Fit jobs (the bake tab's "Fit the camera to the photo", ``/fit_camera``): the photo's camera
fitted in a worker process like every stage that renders, its camera and picture left in the
job's folder and its figures in the job's status; then a bake given that camera as fitted uses
it as it is (no second fit) and gates the photo by the fit's IoU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fit_helpers import fit_scene, rotation_error_deg
from kiln.records import CameraFitReport
from pipeline.raster.rasterize import available_backends
from worker.jobs.bakeinputs import BakeFiles, check_bake, check_fit, fit_key
from worker.jobs.inputs import InputProblem
from worker.pool.supervisor import Supervisor
from worker_helpers import small_settings

gl_only = pytest.mark.skipif("moderngl" not in available_backends(), reason="no EGL OpenGL context on this machine")
JOB_TIMEOUT = 180


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("fit-jobs")
    sup = Supervisor(small_settings(), root / "jobs", root / "cache")
    try:
        sup.start()
        yield sup, root
    finally:
        sup.shutdown()


def test_a_fit_needs_the_photo_and_no_camera_of_its_own(tmp_path):
    mesh = tmp_path / "m.obj"
    mesh.write_text("v 0 0 -2\nv 1 0 -2\nv 0 1 -2\nf 1 2 3\n")
    with pytest.raises(InputProblem, match="fitting the camera needs the photo"):
        check_fit(BakeFiles(mesh=mesh), small_settings())
    photo = tmp_path / "p.png"
    Image.fromarray(np.zeros((64, 64, 4), np.uint8)).save(photo)
    with pytest.raises(InputProblem, match="camera is given already"):
        check_fit(BakeFiles(mesh=mesh, image=photo, focal=300.0), small_settings())


@gl_only
@pytest.mark.slow
def test_a_fit_job_finds_the_camera_and_a_bake_uses_it_without_fitting_again(env):
    sup, root = env
    scene = fit_scene(root / "scene")
    settings = small_settings()
    checked = check_fit(BakeFiles(mesh=scene.mesh, image=scene.photo, mask=scene.mask), settings)
    assert checked.request.fit_camera and checked.request.camera is None
    job = sup.submit_fit(checked, settings, session="fit")
    seen = [ev.stage for ev in job.follow(timeout=JOB_TIMEOUT)]
    st = job.status()
    assert st.state == "done", st.error
    assert st.kind == "fit" and "read" in seen and "fit" in seen
    assert set(st.outputs) == {"camera", "camera_fit"} and "glb" not in st.outputs
    fit = st.stats.camera_fit
    assert isinstance(fit, CameraFitReport) and fit.case == "canonical"
    assert fit.iou > 0.95 and fit.coverage > 0.95 and fit.seconds > 0
    assert rotation_error_deg(fit.source_camera["viewmat"], scene.camera.viewmat) < 3.0
    # the camera file is the fit's report, in the form --camera reads
    camera = Path(st.outputs["camera"])
    assert CameraFitReport.from_dict(json.loads(camera.read_text())) == fit
    picture = np.asarray(Image.open(st.outputs["camera_fit"]))
    assert picture.shape == (240, 320, 3)
    assert set(st.timings) >= {"read", "fit", "total_s"}

    # the bake, given that camera as fitted: no fit of its own, the photo gated by the fit's IoU
    bake = check_bake(BakeFiles(mesh=scene.mesh, image=scene.photo, mask=scene.mask, camera=camera,
                                camera_fitted=True), settings)
    assert bake.request.camera_fitted and not bake.request.fit_camera
    assert fit_key(bake) == fit_key(checked), "the same mesh, photo and mask: the same fit"
    done = sup.submit_bake(bake, settings, session="fit").wait(timeout=JOB_TIMEOUT)
    assert done.state == "done", done.error
    model = done.stats.pipeline.model
    assert model.camera == "fitted before"
    # the fit's own figures (its time too): carried over, not measured by a second fit
    assert model.camera_fit == {k: v for k, v in fit.to_dict().items() if k != "source_camera"}
    assert done.stats.pipeline.bake.texels_from["photo"] > 0.1
    assert not any("not projected" in w for w in model.warnings)
    assert Path(done.outputs["glb"]).is_file()


def test_the_fit_key_follows_the_photo_mask_and_model(tmp_path):
    mesh = tmp_path / "m.obj"
    mesh.write_text("v 0 0 -2\nv 1 0 -2\nv 0 1 -2\nv 1 1 -2.5\nf 1 2 3\nf 2 4 3\n")
    rgb = np.full((80, 80, 3), 120, np.uint8)
    mask = np.zeros((80, 80), bool)
    mask[20:60, 20:60] = True
    s = small_settings()
    key = fit_key(check_fit(BakeFiles(mesh=mesh), s, photo_pixels=(rgb, mask)))
    assert key == fit_key(check_fit(BakeFiles(mesh=mesh), s, photo_pixels=(rgb, mask.copy())))
    other = mask.copy()
    other[20:25] = False
    assert key != fit_key(check_fit(BakeFiles(mesh=mesh), s, photo_pixels=(rgb, other)))
    assert key != fit_key(check_fit(BakeFiles(mesh=mesh, source="sam3d"), s, photo_pixels=(rgb, mask)))
    mesh.write_text(mesh.read_text().replace("-2.5", "-2.6"))
    assert key != fit_key(check_fit(BakeFiles(mesh=mesh), s, photo_pixels=(rgb, mask)))
