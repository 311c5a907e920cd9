"""Built-in reconstruction: watertight, outward, in the unit cube, coloured like the photo."""

from __future__ import annotations

import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import trimesh

from kiln.settings import ReconstructSettings
from pipeline.recon import builtin as B
from pipeline.recon import reconstruct as R
from pipeline.types import ImageInput, Reconstruction
from pipeline.validate import StageInputError
from synthetic import make_object_image, object_colors

SMALL = ReconstructSettings(resolution=80, num_gaussians=4000)


def _trimesh(mesh) -> trimesh.Trimesh:
    return trimesh.Trimesh(mesh.vertices, mesh.faces, process=False)


@pytest.fixture(scope="module")
def ellipse():
    rgb, mask = make_object_image(256, "ellipse")
    return rgb, mask, R.reconstruct(ImageInput(rgb, mask), SMALL, seed=0)


@pytest.fixture(scope="module")
def blob():
    rgb, mask = make_object_image(256, "blob", seed=3)
    return rgb, mask, R.reconstruct(ImageInput(rgb, mask), SMALL, seed=0)


def _world_to_pixels(recon: Reconstruction, xy: np.ndarray) -> np.ndarray:
    """(N, 2) world x, y -> (N, 2) continuous image (column, row), per meta."""
    m = recon.meta["world_to_pixels"]
    p = xy.astype(np.float64) * m["extent"] + np.asarray(m["center"][:2])
    return np.stack([p[:, 0], -p[:, 1]], axis=1)


@pytest.mark.parametrize("which", ["ellipse", "blob"])
def test_mesh_is_closed_outward_and_normalised(which, request):
    _, _, recon = request.getfixturevalue(which)
    mesh = recon.mesh.validate()
    assert mesh.vertices.dtype == np.float32 and mesh.faces.dtype == np.int32
    tm = _trimesh(mesh)
    assert tm.is_watertight
    assert tm.is_winding_consistent
    assert tm.volume > 0.05                      # positive: faces wound outward
    assert len(tm.split(only_watertight=False)) == 1
    lo, hi = mesh.vertices.min(0), mesh.vertices.max(0)
    assert lo.min() >= -0.5 - 1e-6 and hi.max() <= 0.5 + 1e-6
    assert np.isclose((hi - lo).max(), 1.0, atol=1e-5)
    assert np.allclose((hi + lo) / 2, 0.0, atol=1e-5)
    # symmetric front/back inflation: the photo plane z=0 halves the depth
    assert np.isclose(hi[2], -lo[2], atol=1e-3)


def test_silhouette_matches_mask(ellipse):
    _, mask, recon = ellipse
    v = recon.mesh.vertices
    ext = v.max(0) - v.min(0)
    rows, cols = np.nonzero(mask)
    want = (rows.max() - rows.min() + 1) / (cols.max() - cols.min() + 1)
    assert abs(ext[1] / ext[0] - want) < 0.02
    # thickness 0.6: depth is 0.6 of the ellipse's width for a disc; an ellipse lies
    # between its minor and major axis
    assert 0.6 * ext[1] * 0.9 < ext[2] < 0.6 * ext[0] * 1.1
    # vertices on the rim plane project inside the mask's (slightly dilated) area
    pix = _world_to_pixels(recon, v[:, :2])
    c = np.clip(pix[:, 0].astype(int), 0, mask.shape[1] - 1)
    r = np.clip(pix[:, 1].astype(int), 0, mask.shape[0] - 1)
    from scipy import ndimage
    near = ndimage.binary_dilation(mask, iterations=2)
    assert near[r, c].mean() > 0.999


def test_front_is_coloured_like_the_photo_and_faces_the_camera(blob):
    rgb, mask, recon = blob
    mesh = recon.mesh
    normals = _trimesh(mesh).vertex_normals
    front = normals[:, 2] > 0.8
    assert front.sum() > 100
    pix = _world_to_pixels(recon, mesh.vertices[front, :2])
    # independent of the photo's pixels: compare with the texture it was drawn from
    texture = object_colors(rgb.shape[0]).astype(np.float32) / 255.0
    c = np.clip(pix[:, 0].astype(int), 0, rgb.shape[1] - 1)
    r = np.clip(pix[:, 1].astype(int), 0, rgb.shape[0] - 1)
    err = np.abs(mesh.vertex_colors[front] - texture[r, c]).mean()
    assert err < 0.03
    # mirrored left-right would not match: red grows with image column -> +x
    red = mesh.vertex_colors[front, 0]
    assert np.corrcoef(mesh.vertices[front, 0], red)[0, 1] > 0.5
    # green grows with image row -> -y
    green = mesh.vertex_colors[front, 1]
    assert np.corrcoef(mesh.vertices[front, 1], green)[0, 1] < -0.5
    # the photo's background never leaks in at the rim: rim vertices carry the colour
    # of the nearest object pixel (times 0.9, halfway to the darker back)
    rim = np.abs(mesh.vertices[:, 2]) < 0.01
    assert rim.sum() > 50
    pix = _world_to_pixels(recon, mesh.vertices[rim, :2])
    c = np.clip(pix[:, 0].astype(int), 0, rgb.shape[1] - 1)
    r = np.clip(pix[:, 1].astype(int), 0, rgb.shape[0] - 1)
    from scipy import ndimage
    _, (ri, ci) = ndimage.distance_transform_edt(~mask, return_indices=True)
    ref = 0.9 * texture[ri[r, c], ci[r, c]]
    assert np.abs(mesh.vertex_colors[rim] - ref).max(axis=1).mean() < 0.03


def test_back_is_a_darker_mirror_of_the_front(blob):
    _, _, recon = blob
    mesh = recon.mesh
    n = _trimesh(mesh).vertex_normals
    front, back = n[:, 2] > 0.8, n[:, 2] < -0.8
    lum_front = mesh.vertex_colors[front].mean()
    lum_back = mesh.vertex_colors[back].mean()
    assert 0.6 * lum_front < lum_back < 0.95 * lum_front
    # same hue pattern: red still follows x on the back
    assert np.corrcoef(mesh.vertices[back, 0], mesh.vertex_colors[back, 0])[0, 1] > 0.5


def test_gaussians_lie_on_the_surface_as_flat_disks(ellipse):
    _, _, recon = ellipse
    g = recon.gaussians.validate()
    assert len(g) == SMALL.num_gaussians
    for a in (g.means, g.scales, g.quats, g.opacities, g.colors):
        assert a.dtype == np.float32
    assert np.allclose(np.linalg.norm(g.quats, axis=1), 1.0, atol=1e-5)
    assert ((g.opacities > 0) & (g.opacities <= 1)).all()
    assert (g.scales[:, 2] < 0.3 * g.scales[:, 0]).all()
    assert ((g.colors >= 0) & (g.colors <= 1)).all()

    tm = _trimesh(recon.mesh)
    idx = np.random.default_rng(0).choice(len(g), 500, replace=False)
    _, dist, tri = trimesh.proximity.closest_point(tm, g.means[idx])
    assert dist.max() < 1e-4
    # the disk's thin axis (local z rotated by the quaternion) is the surface normal
    from scipy.spatial.transform import Rotation
    rot = Rotation.from_quat(g.quats[idx], scalar_first=True).as_matrix()
    thin_axis = rot[:, :, 2]
    dots = np.abs(np.einsum("nd,nd->n", thin_axis, tm.face_normals[tri]))
    assert np.median(dots) > 0.99 and dots.min() > 0.8
    # colours come from the surface they sit on
    nearest = np.argmin(np.linalg.norm(recon.mesh.vertices[None] - g.means[idx[:50], None], axis=2), axis=1)
    assert np.abs(g.colors[idx[:50]] - recon.mesh.vertex_colors[nearest]).mean() < 0.05
    # spread over the whole body: both front and back hold about half of them
    assert 0.4 < (g.means[:, 2] > 0).mean() < 0.6


@pytest.mark.parametrize("seed", [0, 1])
def test_far_side_does_not_show_through_the_near_side(blob, seed):
    """Independently drawn disk centres clump and leave holes through which the
    darker back surface showed as specks; evenly spread ones close the front."""
    from scipy import ndimage
    from scipy.spatial.transform import Rotation

    from pipeline.camera.cameras import intrinsics, look_at
    from pipeline.views.render_views import render_gaussians
    from pipeline.types import Cameras, Gaussians

    _, _, recon = blob
    g = B.sample_surface_gaussians(recon.mesh, SMALL.num_gaussians, seed)
    eye = np.array([0.0, 0.0, 2.4])
    normal = Rotation.from_quat(g.quats, scalar_first=True).as_matrix()[:, :, 2]
    facing = np.einsum("nd,nd->n", eye - g.means, normal) > 0
    # white near side, black far side: the red channel's deficit is the far side's share
    white = np.repeat(facing[:, None], 3, axis=1).astype(np.float32)
    cams = Cameras(look_at(eye)[None], intrinsics(40.0, 128, 128)[None], 128, 128)
    v = render_gaussians(Gaussians(g.means, g.scales, g.quats, g.opacities, white), cams)
    alpha = v.alpha[0]
    far_share = (1.0 - v.rgb[0, :, :, 0]) * alpha
    inside = ndimage.binary_erosion(alpha > 0.99, iterations=2)
    assert inside.sum() > 2000
    assert (far_share[inside] > 0.1).mean() < 0.01     # independent draws: 2-4 %
    assert far_share[inside].max() < 0.3               # independent draws: 0.4-0.5


def test_seed_controls_gaussians_only():
    rgb, mask = make_object_image(128, "ellipse")
    s = replace(SMALL, resolution=64, num_gaussians=1000)
    a = R.reconstruct(ImageInput(rgb, mask), s, seed=1)
    b = R.reconstruct(ImageInput(rgb, mask), s, seed=1)
    c = R.reconstruct(ImageInput(rgb, mask), s, seed=2)
    assert np.array_equal(a.mesh.vertices, b.mesh.vertices)
    assert np.array_equal(a.gaussians.means, b.gaussians.means)
    assert np.array_equal(a.mesh.vertices, c.mesh.vertices)
    assert not np.allclose(a.gaussians.means, c.gaussians.means)


def test_thickness_scales_depth():
    rgb, mask = make_object_image(128, "ellipse")
    depths = []
    for t in (0.3, 1.2):
        r = R.reconstruct(ImageInput(rgb, mask), replace(SMALL, resolution=64, thickness=t,
                                                          num_gaussians=1000), seed=0)
        v = r.mesh.vertices
        ext = v.max(0) - v.min(0)
        depths.append(ext[2] / ext[0])
    assert 3.0 < depths[1] / depths[0] < 5.0


def test_holes_stay_unless_tiny_and_stray_bits_are_dropped():
    yy, xx = np.mgrid[0:200, 0:200]
    r = np.hypot(yy - 100, xx - 100)
    ring = (r < 80) & (r > 35)
    rgb = np.full((200, 200, 3), 180, np.uint8)
    s = replace(SMALL, resolution=64, num_gaussians=1000)
    tm = _trimesh(R.reconstruct(ImageInput(rgb, ring), s, seed=0).mesh)
    assert tm.is_watertight and tm.euler_number == 0          # a torus: the hole is kept

    pinhole = (r < 80)
    pinhole[100:102, 100:102] = False                          # 4-pixel hole: segmentation noise
    pinhole[5:9, 5:9] = True                                   # a stray speck far away
    tm = _trimesh(R.reconstruct(ImageInput(rgb, pinhole), s, seed=0).mesh)
    assert tm.is_watertight and tm.euler_number == 2          # one closed sphere-like body
    assert len(tm.split(only_watertight=False)) == 1


def test_large_images_are_downscaled_first():
    rgb, mask = make_object_image(1200, "blob")
    s = replace(SMALL, resolution=64, num_gaussians=1000, max_image_side=300)
    recon = R.reconstruct(ImageInput(rgb, mask), s, seed=0)
    assert recon.meta["image_scale"] == pytest.approx(300 / 1200)
    assert recon.meta["image_size"] == [300, 300]
    assert _trimesh(recon.mesh).is_watertight


@pytest.mark.parametrize("case, words", [
    ("empty", ["mask", "empty"]),
    ("full", ["mask", "whole"]),
    ("one_pixel", ["mask", "1 object pixel"]),
])
def test_bad_masks_are_refused(case, words):
    rgb = np.zeros((64, 64, 3), np.uint8)
    mask = np.zeros((64, 64), bool)
    if case == "full":
        mask[:] = True
    elif case == "one_pixel":
        mask[30, 30] = True
    with pytest.raises(StageInputError) as e:
        R.reconstruct(ImageInput(rgb, mask), SMALL, seed=0)
    for w in words:
        assert w in str(e.value)


def test_mask_lost_in_downscaling_is_refused():
    rgb = np.zeros((2048, 2048, 3), np.uint8)
    mask = np.zeros((2048, 2048), bool)
    mask[1000:1010, 1000:1010] = True                 # 100 pixels, ~1.5 after 8x downscale
    with pytest.raises(StageInputError, match="mask .*after downscaling"):
        R.reconstruct(ImageInput(rgb, mask), replace(SMALL, max_image_side=256), seed=0)


@pytest.mark.parametrize("change, words", [
    ({"num_gaussians": 10 ** 12}, "num_gaussians"),
    ({"num_gaussians": 0}, "num_gaussians"),
    ({"resolution": 10 ** 7}, "resolution"),
    ({"resolution": 80.5}, "resolution"),
    ({"thickness": 0.0}, "thickness"),
    ({"thickness": float("nan")}, "thickness"),
    ({"max_image_side": 0}, "max_image_side"),
])
def test_absurd_settings_are_refused_before_any_work(change, words):
    rgb, mask = make_object_image(64)
    with pytest.raises(StageInputError, match=words):
        R.reconstruct(ImageInput(rgb, mask), replace(SMALL, **change), seed=0)


def test_huge_image_is_refused_without_touching_its_pixels():
    # 20000 x 20000: broadcast views, so the test itself allocates nothing
    rgb = np.broadcast_to(np.zeros((1, 1, 3), np.uint8), (20000, 20000, 3))
    mask = np.broadcast_to(np.zeros((1, 1), bool), (20000, 20000))
    with pytest.raises(StageInputError, match="20000x20000"):
        R.reconstruct(ImageInput(rgb, mask), SMALL, seed=0)


def test_wrong_dtypes_are_refused():
    rgb, mask = make_object_image(64)
    with pytest.raises(StageInputError, match="mask"):
        R.reconstruct(ImageInput(rgb, mask.astype(np.uint8)), SMALL, seed=0)
    with pytest.raises(StageInputError, match="image"):
        R.reconstruct(ImageInput(rgb.astype(np.float32), mask), SMALL, seed=0)


def test_registered_backend_gets_the_downscaled_image(monkeypatch):
    seen = {}

    def fake(image, settings, seed, progress):
        seen["shape"] = image.rgb.shape
        seen["seed"] = seed
        return B.reconstruct_builtin(image, replace(settings, resolution=64, num_gaussians=1000),
                                     seed, progress)

    monkeypatch.setitem(R.RECONSTRUCTORS, "sam3d", fake)
    rgb, mask = make_object_image(600)
    recon = R.reconstruct(ImageInput(rgb, mask), replace(SMALL, backend="sam3d", max_image_side=256),
                          seed=7)
    assert seen == {"shape": (256, 256, 3), "seed": 7}
    assert recon.meta["image_scale"] == pytest.approx(256 / 600)


def test_missing_sam3d_backend_is_a_clear_error(monkeypatch):
    monkeypatch.delitem(R.RECONSTRUCTORS, "sam3d", raising=False)
    monkeypatch.setitem(sys.modules, "pipeline.recon.sam3d", None)     # as if the module were absent
    rgb, mask = make_object_image(64)
    with pytest.raises(R.BackendUnavailable, match="sam3d.*builtin"):
        R.reconstruct(ImageInput(rgb, mask), replace(SMALL, backend="sam3d"), seed=0)
    with pytest.raises(StageInputError, match="'nope' is not available"):
        R.reconstruct(ImageInput(rgb, mask), replace(SMALL, backend="nope"), seed=0)


def test_progress_is_monotonic_and_finishes():
    rgb, mask = make_object_image(128, "blob")
    events = []
    R.reconstruct(ImageInput(rgb, mask), replace(SMALL, resolution=64, num_gaussians=1000), seed=0,
                  progress=lambda f, m="": events.append((f, m)))
    fractions = [f for f, _ in events]
    assert len(events) >= 4
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and fractions[0] >= 0.0
    assert all(isinstance(m, str) and m for _, m in events)


@pytest.mark.timing(reason="the reconstruction must take under 5 s")
def test_default_settings_are_fast():
    rgb, mask = make_object_image(512, "blob")
    settings = ReconstructSettings()
    t0 = time.perf_counter()
    recon = R.reconstruct(ImageInput(rgb, mask), settings, seed=0)
    elapsed = time.perf_counter() - t0
    assert len(recon.gaussians) == settings.num_gaussians == 40000
    assert elapsed < 5.0, f"default reconstruction took {elapsed:.1f} s"
