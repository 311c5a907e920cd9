"""pipeline.camera.camera_fit: the photo's camera from the silhouette. Ground truth from synthetic
renders (asymmetric meshes, and meshes whose silhouettes have a twin, from random known
cameras); the real bench mesh against its mask (which leaves out the occluders in front); a
mask of another object as the negative control.

Rotation error is the angle between the fitted and the true world -> camera rotations alone:
the field of view and the distance trade off (a silhouette shows perspective only faintly), so
they are checked on their own (the focal length within 10 %), not folded into the rotation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pipeline.camera.camera_fit import fit_camera
from pipeline.camera.cameras import intrinsics, look_at
from pipeline.camera.fit_tiebreak import model_render
from pipeline.raster.rasterize import available_backends, rasterize_views
from pipeline.types import Cameras, Mesh, SourceCamera
from pipeline.validate import StageInputError
from raster_helpers import gl_context

gl_only = pytest.mark.skipif("moderngl" not in available_backends(), reason="no EGL OpenGL context on this machine")
HUMAN = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "sam3d-human-object"


def _mesh(parts, colour: bool = False) -> Mesh:
    """Boxes and spheres in one mesh; colours (when asked) vary along every axis, so no two
    sides of the object look alike."""
    import trimesh

    tm = trimesh.util.concatenate(parts)
    v = tm.vertices
    col = np.clip(np.stack([0.5 + 0.8 * v[:, 0], 0.5 + 0.5 * v[:, 1], 0.5 + 0.8 * v[:, 2]], 1), 0, 1)
    return Mesh(v.astype(np.float32), tm.faces.astype(np.int32),
                vertex_colors=col.astype(np.float32) if colour else None)


def _asymmetric() -> Mesh:
    import trimesh

    parts = [trimesh.creation.box(extents=(1.0, 0.3, 0.3)), trimesh.creation.box(extents=(0.3, 0.8, 0.3)),
             trimesh.creation.icosphere(radius=0.22)]
    parts[1].apply_translation((-0.35, 0.4, 0))
    parts[2].apply_translation((0.4, 0.1, 0.25))
    return _mesh(parts)


def _half_turn_symmetric(colour: bool = True) -> Mesh:
    """The same shape after a half turn about the vertical: from opposite sides the outlines
    are exactly alike, perspective and all."""
    import trimesh

    parts = [trimesh.creation.box(extents=(1.0, 0.3, 0.3)), trimesh.creation.box(extents=(0.2, 0.4, 0.2)),
             trimesh.creation.box(extents=(0.2, 0.4, 0.2))]
    parts[1].apply_translation((0.35, 0.3, 0.1))
    parts[2].apply_translation((-0.35, 0.3, -0.1))
    return _mesh(parts, colour)


def _mirror_symmetric() -> Mesh:
    """Left and right alike (a car's shape): a camera in front on the left and its twin behind
    on the left (pitch flipped) see the same outline, but for perspective."""
    import trimesh

    parts = [trimesh.creation.box(extents=(0.6, 0.3, 1.2)), trimesh.creation.box(extents=(0.5, 0.25, 0.5))]
    parts[1].apply_translation((0.0, 0.27, 0.2))
    return _mesh(parts, colour=True)


def _camera(yaw: float, pitch: float, fov: float, distance: float = 3.0) -> SourceCamera:
    y, p = math.radians(yaw), math.radians(pitch)
    eye = distance * np.array([math.cos(p) * math.sin(y), math.sin(p), math.cos(p) * math.cos(y)])
    return SourceCamera(look_at(eye), intrinsics(fov, 320, 240), 320, 240)


def _mask(mesh: Mesh, cam: SourceCamera) -> np.ndarray:
    return np.asarray(rasterize_views(gl_context(), mesh, cam.as_cameras()).tri_id[0]) >= 0


def _rotation_error_deg(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.spatial.transform import Rotation

    return float(np.degrees(Rotation.from_matrix(a[:3, :3].astype(float).T @ b[:3, :3].astype(float)).magnitude()))


def _random_cameras(seed: int, count: int):
    rng = np.random.default_rng(seed)
    return [tuple(round(float(rng.uniform(lo, hi)), 1) for lo, hi in ((0, 360), (-35, 35), (28, 55)))
            for _ in range(count)]


# ---------------------------------------------------------------------------- fast parts


def test_the_projection_jacobian_is_the_projections_derivative():
    from scipy.spatial.transform import Rotation

    from pipeline.camera.fit_pose import pose_from

    rng = np.random.default_rng(0)
    pose = pose_from(Rotation.random(random_state=1).as_matrix(), 40.0, 0.45, 0.6, 3.0)
    pts, centre = rng.normal(size=(20, 3)) * 0.5, np.array([0.1, -0.2, 0.05])
    px, jac = pose.project_jacobian(pts, centre, 320, 240)
    assert np.allclose(px, pose.project(pts, centre, 320, 240))
    for k in range(7):
        step = np.zeros(7)
        step[k] = 1e-6
        numeric = (pose.moved(step).project(pts, centre, 320, 240)
                   - pose.moved(-step).project(pts, centre, 320, 240)) / 2e-6
        assert np.allclose(jac[:, :, k], numeric, rtol=1e-5, atol=1e-4), k


def test_the_mask_field_is_signed_and_holes_are_filled():
    from pipeline.camera.fit_contour import MaskField, filled
    from pipeline.camera.fit_pose import FitView

    mask = np.zeros((40, 60), bool)
    mask[10:30, 10:50] = True
    mask[18:22, 20:40] = False      # a slit inside, like the gap between a bench's slats
    assert filled(mask)[18:22, 20:40].all() and not filled(mask)[:10].any()
    field = MaskField(FitView(mask, 64, np.zeros(3)))
    d, g = field.sample(np.array([[30.0, 5.0], [30.0, 16.0], [30.0, 10.0]]))
    assert d[0] == pytest.approx(5.0, abs=0.3)       # 5 px above the top edge: outside
    assert d[1] == pytest.approx(-6.0, abs=0.3)      # 6 px inside (the slit, 2 px away, filled)
    assert abs(d[2]) < 0.3                           # on the edge
    assert g[0, 1] < 0                               # the distance falls towards the mask


@gl_only
def test_an_empty_mask_or_a_photo_of_another_size_is_refused():
    mesh = _asymmetric()
    with pytest.raises(StageInputError, match="empty"):
        fit_camera(gl_context(), mesh, np.zeros((40, 40), bool), posed=False)
    with pytest.raises(StageInputError, match="differ in size"):
        fit_camera(gl_context(), mesh, np.ones((40, 40), bool), posed=False,
                   photo=np.zeros((30, 40, 3), np.uint8))


# ---------------------------------------------------------------------------- ground truth


@gl_only
@pytest.mark.slow
@pytest.mark.parametrize("yaw,pitch,fov", [(31.0, -16.0, 40.0), (210.0, -24.0, 40.0)] + _random_cameras(22, 4))
def test_a_canonical_mesh_seen_from_any_side_gets_its_camera_back(yaw, pitch, fov):
    mesh = _asymmetric()
    truth = _camera(yaw, pitch, fov)
    fit = fit_camera(gl_context(), mesh, _mask(mesh, truth), posed=False)
    assert fit.iou >= 0.97 and fit.coverage >= 0.98, fit.report()
    assert _rotation_error_deg(fit.camera.viewmat, truth.viewmat) <= 2.0, fit.report()
    assert fit.camera.K[0, 0] == pytest.approx(truth.K[0, 0], rel=0.1)
    # the true side won on its silhouette alone (the other candidates fit clearly worse)
    assert fit.tie_break["decided_by"] == "silhouette"
    assert fit.tie_break["silhouette"]["chosen"] > fit.tie_break["silhouette"]["runner_up"]


@gl_only
@pytest.mark.slow
def test_a_mesh_in_the_camera_frame_gets_its_focal_length():
    """SAM 3D's case: the mesh where the camera saw it (OpenGL axes), the intrinsics lost."""
    base = _asymmetric()
    truth = _camera(25.0, 15.0, 35.0)
    # the mesh moved into the camera's frame (OpenCV -> OpenGL axes: y and z flipped)
    vm = truth.viewmat.astype(np.float64)
    posed = np.diag([1.0, -1.0, -1.0]) @ (base.vertices @ vm[:3, :3].T + vm[:3, 3]).T
    mesh = Mesh(posed.T.astype(np.float32), base.faces)
    at_origin = SourceCamera(np.diag([1.0, -1.0, -1.0, 1.0]).astype(np.float32), truth.K, 320, 240)
    fit = fit_camera(gl_context(), mesh, _mask(mesh, at_origin), posed=True)
    assert fit.case == "posed" and fit.iou >= 0.97, fit.report()
    assert fit.camera.K[0, 0] == pytest.approx(truth.K[0, 0], rel=0.1)
    assert _rotation_error_deg(fit.camera.viewmat, at_origin.viewmat) <= 2.0


@gl_only
@pytest.mark.slow
@pytest.mark.parametrize("yaw,pitch", [(229.0, -16.0), (20.0, 22.0)])
def test_the_photo_tells_front_from_back_when_the_outlines_are_alike(yaw, pitch):
    """A half turn leaves the shape as it was: both sides' silhouettes tie; only the colours
    against the photo tell the true side (and the report says by how much)."""
    mesh = _half_turn_symmetric()
    truth = _camera(yaw, pitch, 40.0)
    render = model_render(gl_context(), mesh)
    rgb, _ = render(truth)
    photo = np.round(rgb * 255).astype(np.uint8)
    fit = fit_camera(gl_context(), mesh, _mask(mesh, truth), posed=False, render=render, photo=photo)
    tie = fit.tie_break
    assert tie["decided_by"] == "photo" and tie["tied"] >= 2, tie
    assert _rotation_error_deg(fit.camera.viewmat, truth.viewmat) <= 2.0, fit.report()
    # the twin is the other side, and it looks clearly wrong
    assert tie["runner_up_turn_deg"] > 150.0, tie
    assert tie["photo_error"]["chosen"] < 0.02 and tie["photo_margin"] > 0.1, tie


@gl_only
@pytest.mark.slow
def test_without_colours_a_tie_is_said_to_be_undecided():
    mesh = _half_turn_symmetric(colour=False)
    truth = _camera(229.0, -16.0, 40.0)
    fit = fit_camera(gl_context(), mesh, _mask(mesh, truth), posed=False, render=model_render(gl_context(), mesh))
    assert fit.tie_break["decided_by"] == "silhouette (no colours to compare)", fit.tie_break
    assert fit.iou >= 0.97
    # one of the two alike cameras, whichever
    err = _rotation_error_deg(fit.camera.viewmat, truth.viewmat)
    assert err <= 2.0 or abs(err - 180.0) <= 2.0, err


@gl_only
@pytest.mark.slow
def test_the_photo_tells_a_mirror_twin_apart():
    """Left and right alike, seen from afar (little perspective): the view from in front on
    the left and the one from behind on the left nearly tie; the colours decide."""
    mesh = _mirror_symmetric()
    truth = _camera(15.0, -34.0, 14.0, distance=8.0)
    render = model_render(gl_context(), mesh)
    rgb, _ = render(truth)
    fit = fit_camera(gl_context(), mesh, _mask(mesh, truth), posed=False, render=render,
                     photo=np.round(rgb * 255).astype(np.uint8))
    tie = fit.tie_break
    assert tie["decided_by"] == "photo", tie
    assert _rotation_error_deg(fit.camera.viewmat, truth.viewmat) <= 2.0, fit.report()
    assert tie["photo_margin"] > 0.1, tie


# ---------------------------------------------------------------------------- negative control


@gl_only
@pytest.mark.slow
def test_the_mask_of_another_object_fits_badly_and_the_photo_is_not_projected():
    import trimesh

    from kiln.settings import load
    from pipeline.io.mesh_file import MeshFile
    from pipeline.texture.model_bake import ModelInputs, _gated_photos
    from pipeline.types import ImageInput

    mesh = _asymmetric()
    ring = trimesh.creation.annulus(r_min=0.3, r_max=0.5, height=0.1)
    other = Mesh(ring.vertices.astype(np.float32), ring.faces.astype(np.int32))
    mask = _mask(other, SourceCamera(look_at((0.0, 0.0, 3.0)), intrinsics(40.0, 320, 240), 320, 240))
    fit = fit_camera(gl_context(), mesh, mask, posed=False)
    settings = load(None)
    assert fit.iou < settings.bake.fit_min_iou, fit.report()
    stats: dict = {"warnings": []}
    inputs = ModelInputs(MeshFile(mesh, None, "ply"), photo=ImageInput(np.zeros(mask.shape + (3,), np.uint8), mask),
                         camera=fit.camera, camera_fit=fit)
    assert _gated_photos(inputs, settings, gl_context(), stats) == []
    assert "the photo was not projected: the fitted camera's silhouette IoU" in stats["warnings"][0]


# ---------------------------------------------------------------------------- the real bench


@gl_only
@pytest.mark.slow
@pytest.mark.skipif(not HUMAN.is_dir(), reason=f"real SAM 3D fixtures missing: {HUMAN}")
def test_the_real_bench_mesh_fits_its_mask():
    from kiln.maskfile import load_mask
    from pipeline.io.mesh_file import read_mesh

    mesh = read_mesh(HUMAN / "bench_sam3d.glb").mesh
    mask = load_mask(HUMAN / "bench_mask.png", max_pixels=10 ** 8).mask
    fit = fit_camera(gl_context(), mesh, mask, posed=True)
    # the person's focal length gives coverage 0.33, IoU 0.27; the occluders cap IoU near 0.7
    assert fit.coverage >= 0.95 and fit.iou >= 0.65, fit.report()
