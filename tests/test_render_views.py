"""Gaussian rendering: the own (CPU) renderer against analytic footprints, a
brute-force re-implementation of gsplat's per-pixel loop, and gsplat itself
where CUDA is available."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipeline.camera.cameras import intrinsics, look_at, project, sphere_cameras
from pipeline.views.gaussian_math import covariance_3d, quat_to_rotmat
from pipeline.views import render_views
from pipeline.views.render_views import _render_cpu, render_gaussians
from pipeline.types import Cameras, Gaussians, Views
from pipeline.validate import StageInputError

EPS2D = 0.3


def make_gaussians(means, scales, opacities, colors, quats=None) -> Gaussians:
    means = np.asarray(means, np.float32).reshape(-1, 3)
    n = len(means)
    scales = np.broadcast_to(np.asarray(scales, np.float32), (n, 3)).copy()
    if quats is None:
        quats = np.tile(np.float32([1, 0, 0, 0]), (n, 1))
    return Gaussians(means=means, scales=scales, quats=np.asarray(quats, np.float32),
                     opacities=np.broadcast_to(np.asarray(opacities, np.float32), (n,)).copy(),
                     colors=np.broadcast_to(np.asarray(colors, np.float32), (n, 3)).copy())


def front_camera(size=(64, 48), fov=40.0, eye=(0.0, 0.0, 2.4)) -> Cameras:
    w, h = size
    return Cameras(viewmats=look_at(eye)[None], Ks=intrinsics(fov, w, h)[None], width=w, height=h)


def random_scene(n, seed, spread=0.6, scale=(0.01, 0.08)) -> Gaussians:
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n, 4))
    return Gaussians(
        means=rng.uniform(-spread, spread, (n, 3)).astype(np.float32),
        scales=np.exp(rng.uniform(np.log(scale[0]), np.log(scale[1]), (n, 3))).astype(np.float32),
        quats=(q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32),
        opacities=rng.uniform(0.05, 1.0, n).astype(np.float32),
        colors=rng.uniform(0, 1, (n, 3)).astype(np.float32))


# ---------------------------------------------------------------- brute-force reference


def reference_render(g: Gaussians, viewmat, K, width, height, clamp_jacobian=True):
    """gsplat's classic rasterizer written the slow, obvious way, in float64:
    every Gaussian is evaluated at every pixel, front to back.
    Returns (premultiplied rgb (H, W, 3), alpha (H, W))."""
    R, t = viewmat[:3, :3].astype(np.float64), viewmat[:3, 3].astype(np.float64)
    fx, fy, cx, cy = (float(K[0, 0]), float(K[1, 1]), float(K[0, 2]), float(K[1, 2]))
    items = []
    for i in range(len(g)):
        x, y, z = R @ g.means[i].astype(np.float64) + t
        if z < 0.01:
            continue
        w_, qx, qy, qz = g.quats[i].astype(np.float64) / np.linalg.norm(g.quats[i])
        rot = np.array([
            [1 - 2 * (qy * qy + qz * qz), 2 * (qx * qy - w_ * qz), 2 * (qx * qz + w_ * qy)],
            [2 * (qx * qy + w_ * qz), 1 - 2 * (qx * qx + qz * qz), 2 * (qy * qz - w_ * qx)],
            [2 * (qx * qz - w_ * qy), 2 * (qy * qz + w_ * qx), 1 - 2 * (qx * qx + qy * qy)]])
        cov_c = R @ rot @ np.diag(g.scales[i].astype(np.float64) ** 2) @ rot.T @ R.T
        tx, ty = x, y
        if clamp_jacobian:
            limx_p = (width - cx) / fx + 0.3 * 0.5 * width / fx
            limx_n = cx / fx + 0.3 * 0.5 * width / fx
            limy_p = (height - cy) / fy + 0.3 * 0.5 * height / fy
            limy_n = cy / fy + 0.3 * 0.5 * height / fy
            tx = z * min(limx_p, max(-limx_n, x / z))
            ty = z * min(limy_p, max(-limy_n, y / z))
        J = np.array([[fx / z, 0, -fx * tx / z ** 2], [0, fy / z, -fy * ty / z ** 2]])
        cov2 = J @ cov_c @ J.T + EPS2D * np.eye(2)
        items.append((z, i, np.array([fx * x / z + cx, fy * y / z + cy]), np.linalg.inv(cov2)))
    items.sort(key=lambda it: (it[0], it[1]))
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float64) + 0.5
    T = np.ones((height, width))
    out = np.zeros((height, width, 3))
    done = np.zeros((height, width), bool)
    for _, i, m, conic in items:
        dx, dy = m[0] - xs, m[1] - ys
        sigma = 0.5 * (conic[0, 0] * dx * dx + conic[1, 1] * dy * dy) + conic[0, 1] * dx * dy
        alpha = np.minimum(0.999, g.opacities[i] * np.exp(-sigma))
        use = (alpha >= 1 / 255) & ~done
        next_t = T * (1 - alpha)
        stop = use & (next_t <= 1e-4)
        done |= stop
        use &= ~stop
        out += np.where(use[..., None], g.colors[i] * (alpha * T)[..., None], 0)
        T = np.where(use, next_t, T)
    return out, 1 - T


def premultiplied(views):
    return views.rgb * views.alpha[..., None]


# ---------------------------------------------------------------- geometry of one Gaussian


def test_single_gaussian_lands_on_projected_pixel_with_analytic_footprint():
    cams = front_camera((96, 80))
    point = np.array([0.31, -0.22, 0.12])
    s, op = 0.012, 0.8
    g = make_gaussians(point, s, op, [0.2, 0.6, 0.9])
    v = render_gaussians(g, cams)

    uv, z = project(point[None], cams.viewmats[0].astype(np.float64), cams.Ks[0].astype(np.float64))
    peak = np.unravel_index(np.argmax(v.alpha[0]), v.alpha[0].shape)
    assert (peak[1], peak[0]) == (int(uv[0, 0]), int(uv[0, 1]))

    # Analytic: isotropic 3D covariance s^2 I projects to s^2 J J^T, then the eps2d blur.
    x, y, zc = cams.viewmats[0, :3, :3].astype(np.float64) @ point + cams.viewmats[0, :3, 3]
    f = float(cams.Ks[0, 0, 0])
    J = np.array([[f / zc, 0, -f * x / zc ** 2], [0, f / zc, -f * y / zc ** 2]])
    ys, xs = np.mgrid[0:80, 0:96] + 0.5
    d = np.stack([uv[0, 0] - xs, uv[0, 1] - ys], -1)

    def profile(cov):
        q = np.einsum("hwi,ij,hwj->hw", d, np.linalg.inv(cov), d)
        a = np.minimum(0.999, op * np.exp(-0.5 * q))
        return np.where(a >= 1 / 255, a, 0.0)

    expected = profile(s * s * J @ J.T + EPS2D * np.eye(2))
    np.testing.assert_allclose(v.alpha[0], expected, atol=2e-4)
    assert np.abs(profile(s * s * J @ J.T) - v.alpha[0]).max() > 0.05  # the blur is visible
    covered = v.alpha[0] > 0
    np.testing.assert_allclose(v.rgb[0][covered], np.broadcast_to([0.2, 0.6, 0.9], v.rgb[0][covered].shape),
                               atol=1e-5)
    assert (v.rgb[0][~covered] == 0).all()


def test_nearer_gaussian_dominates_regardless_of_input_order():
    cams = front_camera()
    red = ([0.0, 0.0, 0.2], [1, 0, 0])   # nearer to the camera at z = 2.4
    blue = ([0.0, 0.0, -0.2], [0, 0, 1])
    centre = (24, 32)
    for first, second in [(red, blue), (blue, red)]:
        g = make_gaussians([first[0], second[0]], 0.08, 0.95, [first[1], second[1]])
        rgb = render_gaussians(g, cams).rgb[0][centre]
        assert rgb[0] > 0.85 and rgb[2] < 0.15
    g = make_gaussians([blue[0], [0.0, 0.0, 0.4]], 0.08, 0.95, [blue[1], [0, 1, 0]])
    assert render_gaussians(g, cams).rgb[0][centre][1] > 0.85   # now green is in front

    scene = random_scene(60, seed=3)
    perm = np.random.default_rng(4).permutation(60)
    shuffled = Gaussians(*(a[perm] for a in (scene.means, scene.scales, scene.quats,
                                             scene.opacities, scene.colors)))
    a, b = render_gaussians(scene, cams), render_gaussians(shuffled, cams)
    assert a.alpha.max() > 0.5
    np.testing.assert_array_equal(a.alpha, b.alpha)
    np.testing.assert_array_equal(a.rgb, b.rgb)


def test_compositing_stops_before_transmittance_reaches_threshold():
    cams = front_camera((65, 49))                     # odd size: the Gaussians' centre is a pixel centre
    red = make_gaussians([0.0, 0.0, 0.1], 0.5, 1.0, [1, 0, 0])
    blue = make_gaussians([0.0, 0.0, -0.1], 0.5, 1.0, [0, 0, 1])
    both = make_gaussians([[0.0, 0.0, 0.1], [0.0, 0.0, -0.1]], 0.5, 1.0, [[1, 0, 0], [0, 0, 1]])
    a_r = render_gaussians(red, cams).alpha[0].astype(np.float64)
    a_b = render_gaussians(blue, cams).alpha[0].astype(np.float64)
    v = render_gaussians(both, cams)
    stopped = (1 - a_r) * (1 - a_b) <= 1e-4
    assert stopped.sum() >= 4 and (~stopped & (a_r > 0)).sum() > 100
    # Where blue would take T to <= 1e-4 it is not composited at all ...
    np.testing.assert_allclose(v.alpha[0][stopped], a_r[stopped], atol=1e-6)
    assert (v.rgb[0][stopped][:, 2] == 0).all()
    assert v.alpha[0][24, 32] == pytest.approx(0.999, abs=1e-6)   # not 1 - 0.001 * 0.001
    # ... elsewhere both are.
    np.testing.assert_allclose(v.alpha[0][~stopped], (1 - (1 - a_r) * (1 - a_b))[~stopped], atol=1e-5)


def test_opaque_wall_covers_the_view_but_never_reaches_alpha_one():
    cams = front_camera((48, 48))
    xs = np.arange(-1.0, 1.01, 0.04)
    grid = np.stack(np.meshgrid(xs, xs), -1).reshape(-1, 2)
    layers = [np.column_stack([grid, np.full(len(grid), z)]) for z in (0.1, 0.0, -0.1)]
    colors = np.repeat(np.eye(3), len(grid), axis=0)
    g = make_gaussians(np.concatenate(layers), [0.04, 0.04, 0.004], 1.0, colors)
    v = render_gaussians(g, cams)
    # The torch fragments in small chunks (a GPU without gsplat) give the tiles' picture:
    # finished pixels stay finished, spans over them are skipped without losing the
    # unfinished pixels they also cover.
    chunked = _render_gaussians_budget(g, cams, 1500, "fragments")
    np.testing.assert_allclose(chunked.alpha, v.alpha, atol=1e-6)
    np.testing.assert_allclose(chunked.rgb, v.rgb, atol=1e-5)
    assert np.median(v.alpha[0]) > 0.999
    # A Gaussian that would take T to <= 1e-4 ends compositing without being added,
    # so a pixel can stop at T ~ 0.02 when the next one is nearly opaque (gsplat does this).
    assert v.alpha[0].min() > 0.98
    assert v.alpha[0].max() < 1 - 1e-4 + 1e-6        # T stops above 1e-4, so alpha < 0.9999
    assert v.rgb[0][..., 2].max() == 0                # the third layer never shows
    assert v.rgb[0][..., 0].min() > 0.9               # the front layer does


def test_gaussians_behind_camera_or_before_near_plane_render_nothing():
    cams = front_camera()                             # camera at z = 2.4 looking towards -z
    for z in (3.0, 2.6, 2.395):                       # behind; behind; 5 mm in front (near plane is 1 cm)
        v = render_gaussians(make_gaussians([0.0, 0.0, z], 0.05, 1.0, [1, 1, 1]), cams)
        assert (v.alpha == 0).all() and (v.rgb == 0).all(), z
    v = render_gaussians(make_gaussians([0.0, 0.0, 2.3], 0.005, 1.0, [1, 1, 1]), cams)
    assert v.alpha.max() > 0.5                        # 10 cm in front: visible


def test_outputs_shapes_types_and_ranges():
    g = random_scene(300, seed=1)
    g.colors[:10] = 1.0
    g.opacities[:10] = 1.0
    cams = sphere_cameras(3, 1.6, 50.0, 40)
    calls = []
    v = render_gaussians(g, cams, progress=lambda f, m="": calls.append(f))
    assert v.rgb.shape == (3, 40, 40, 3) and v.rgb.dtype == np.float32
    assert v.alpha.shape == (3, 40, 40) and v.alpha.dtype == np.float32
    assert v.cameras is cams
    assert 0 <= v.alpha.min() and v.alpha.max() <= 1 and v.alpha.max() > 0.9
    assert 0 <= v.rgb.min() and v.rgb.max() <= 1 and v.rgb.max() > 0.9
    assert np.isfinite(v.rgb).all() and np.isfinite(v.alpha).all()
    assert calls == pytest.approx([1 / 3, 2 / 3, 1.0])


# ---------------------------------------------------------------- against the brute-force loop


@pytest.mark.parametrize("engine,budget,span_budget", [("tiles", 1 << 19, None), ("fragments", 1 << 19, None),
                                                        ("fragments", 300, 50)])
def test_matches_bruteforce_gsplat_loop(engine, budget, span_budget, monkeypatch):
    # Some Gaussians sit far outside the view so the clamped Jacobian matters; for the
    # torch fragments (a GPU without gsplat), tiny budgets force many chunks, carried
    # transmittance and span culling.
    if span_budget is not None:
        monkeypatch.setattr(render_views, "SPAN_BUDGET", span_budget)
    g = random_scene(120, seed=7, spread=0.5)
    rng = np.random.default_rng(8)
    # an opaque clump, so that many pixels finish early
    clump = make_gaussians(rng.uniform(-0.15, 0.15, (40, 3)), [0.08, 0.08, 0.02], 1.0,
                           rng.uniform(0, 1, (40, 3)))
    g = Gaussians(*(np.concatenate([getattr(g, k), getattr(clump, k)]) for k in
                    ("means", "scales", "quats", "opacities", "colors")))
    far = make_gaussians(rng.uniform([2.0, -0.3, 0.0], [2.4, 0.3, 0.5], (6, 3)), [0.5, 0.4, 0.05],
                         0.95, rng.uniform(0, 1, (6, 3)))
    g = Gaussians(*(np.concatenate([getattr(g, k), getattr(far, k)]) for k in
                    ("means", "scales", "quats", "opacities", "colors")))
    cams = Cameras(viewmats=np.stack([look_at((0.3, 0.4, 2.0)), look_at((-1.5, 0.2, -1.2))]),
                   Ks=np.stack([intrinsics(45.0, 56, 40)] * 2), width=56, height=40)
    v = _render_gaussians_budget(g, cams, budget, engine)
    for c in range(2):
        ref_rgb, ref_alpha = reference_render(g, cams.viewmats[c], cams.Ks[c], 56, 40)
        np.testing.assert_allclose(v.alpha[c], ref_alpha, atol=2e-4)
        np.testing.assert_allclose(premultiplied(v)[c], ref_rgb, atol=2e-4)
    _, no_clamp = reference_render(g, cams.viewmats[0], cams.Ks[0], 56, 40, clamp_jacobian=False)
    assert np.abs(no_clamp - v.alpha[0]).max() > 0.05


def _render_gaussians_budget(g, cams, budget, engine):
    """engine "tiles": the host renderer; "fragments": the torch one (a GPU without gsplat),
    run on the host with ``budget`` fragments at a time."""
    from pipeline.types import Views

    if engine == "tiles":
        rgb, alpha = render_views._render_tiles(g, cams, None)
    else:
        rgb, alpha = _render_cpu(g, cams, torch.device("cpu"), None, fragment_budget=budget)
    return Views(rgb=rgb, alpha=alpha, cameras=cams)


def test_quat_to_rotmat_and_covariance():
    half = math.radians(90) / 2
    q = np.array([[math.cos(half), 0, 0, math.sin(half)], [2.0, 0, 0, 0]], np.float32)   # 90 deg about z; unnormalised identity
    R = quat_to_rotmat(q)
    assert R.dtype == np.float32
    np.testing.assert_allclose(R[0] @ np.array([1.0, 0, 0]), [0.0, 1, 0], atol=1e-6)
    np.testing.assert_array_equal(R[1], np.eye(3))
    s = np.array([[0.1, 0.2, 0.3], [0.1, 0.2, 0.3]], np.float32)
    cov = covariance_3d(q, s)
    np.testing.assert_allclose(cov[0], np.diag([0.04, 0.01, 0.09]), atol=1e-7)
    np.testing.assert_allclose(cov[1], np.diag(s[1] ** 2), rtol=1e-6)


# ---------------------------------------------------------------- validation


def test_invalid_inputs_are_refused_with_clear_messages():
    cams = front_camera()
    good = make_gaussians([[0.0, 0.0, 0.0], [0.1, 0.0, 0.0]], 0.05, 0.5, [1, 0, 0])
    bad = make_gaussians([[0.0, 0.0, 0.0], [0.1, 0.0, 0.0]], 0.05, 0.5, [1, 0, 0])
    bad.means[1, 0] = np.nan
    with pytest.raises(StageInputError, match="means.*non-finite"):
        render_gaussians(bad, cams)
    with pytest.raises(StageInputError, match="unknown render backend 'vulkan'"):
        render_gaussians(good, cams, backend="vulkan")
    with pytest.raises(StageInputError, match="CUDA"):
        render_gaussians(good, cams, backend="gsplat", device="cpu")
    opaque = make_gaussians([0.0, 0.0, 0.0], 0.05, 1.5, [1, 0, 0])
    with pytest.raises(StageInputError, match="opacities"):
        render_gaussians(opaque, cams)
    zero_q = make_gaussians([0.0, 0.0, 0.0], 0.05, 0.5, [1, 0, 0], quats=[[0, 0, 0, 0]])
    with pytest.raises(StageInputError, match="quats"):
        render_gaussians(zero_q, cams)
    skewed = Cameras(cams.viewmats, cams.Ks.copy(), cams.width, cams.height)
    skewed.Ks[0, 0, 1] = 3.0
    with pytest.raises(StageInputError, match="skew"):
        render_gaussians(good, skewed)
    with pytest.raises(StageInputError, match="not a torch device"):
        render_gaussians(good, cams, device="gpu0")


def test_absurd_sizes_are_refused_before_anything_is_allocated():
    g = make_gaussians([0.0, 0.0, 0.0], 0.05, 0.5, [1, 0, 0])
    # 64 views of 8192^2 would be a 51 GB output
    huge = Cameras(np.repeat(front_camera().viewmats, 64, 0), np.repeat(front_camera().Ks, 64, 0),
                   8192, 8192)
    with pytest.raises(StageInputError, match="pixels, more than the limit"):
        render_gaussians(g, huge)
    with pytest.raises(StageInputError, match="whole pixels"):
        render_gaussians(g, Cameras(huge.viewmats[:1], huge.Ks[:1], 64.5, 48))
    n = 10_000_001     # broadcast views: the test allocates nothing
    many = Gaussians(means=np.broadcast_to(np.float32([0, 0, 0]), (n, 3)),
                     scales=np.broadcast_to(np.float32(0.05), (n, 3)),
                     quats=np.broadcast_to(np.float32([1, 0, 0, 0]), (n, 4)),
                     opacities=np.broadcast_to(np.float32(0.5), (n,)),
                     colors=np.broadcast_to(np.float32(0.5), (n, 3)))
    with pytest.raises(StageInputError, match="more than the limit"):
        render_gaussians(many, front_camera((8, 8)))
    with pytest.raises(StageInputError, match="chunk_scale"):
        render_gaussians(g, front_camera(), chunk_scale=float("nan"))


def test_wrong_dtype_shape_or_nan_is_refused():
    good = make_gaussians([[0.0, 0.0, 0.0], [0.1, 0.0, 0.0]], 0.05, 0.5, [1, 0, 0])
    cams = front_camera()
    f64 = Gaussians(good.means.astype(np.float64), good.scales, good.quats, good.opacities, good.colors)
    with pytest.raises(StageInputError, match="means.*float32"):
        render_gaussians(f64, cams)
    flat = Gaussians(good.means, good.scales[:, :2].copy(), good.quats, good.opacities, good.colors)
    with pytest.raises(StageInputError, match="scales.*shape"):
        render_gaussians(flat, cams)
    nan_cam = Cameras(cams.viewmats.copy(), cams.Ks, cams.width, cams.height)
    nan_cam.viewmats[0, 0, 3] = np.nan
    with pytest.raises(StageInputError, match="viewmats.*non-finite"):
        render_gaussians(good, nan_cam)


@pytest.mark.parametrize("cams, n, size, budget", [
    (16, 40_000, 512, 1 << 30), (7, 1000, 64, 3 * (1000 * 64 + 64 * 64 * 64)), (5, 10 ** 7, 2048, 1),
    (1, 10, 8, 1 << 30)])
def test_camera_batches_cover_every_camera_in_order_within_the_budget(cams, n, size, budget):
    batches = render_views.camera_batches(cams, n, size, size, budget)
    assert batches[0].start == 0 and batches[-1].stop == cams
    assert all(a.stop == b.start for a, b in zip(batches, batches[1:]))
    lengths = [b.stop - b.start for b in batches]
    assert min(lengths) >= 1 and max(lengths) - min(lengths) <= 1
    assert lengths == sorted(lengths, reverse=True)
    per_camera = n * render_views.GSPLAT_PAIR_BYTES + size * size * render_views.GSPLAT_PIXEL_BYTES
    assert max(lengths) == 1 or max(lengths) * per_camera <= budget
    # no more calls than the budget needs
    assert len(batches) == -(-cams // max(1, min(cams, budget // per_camera)))


def test_views_can_stay_on_the_render_device_and_equal_the_numpy_ones():
    g = random_scene(300, seed=4)
    cams = sphere_cameras(3, 2.4, 40.0, 48)
    host = render_gaussians(g, cams)
    kept = render_gaussians(g, cams, as_tensors=True)
    assert kept.on_device and not host.on_device
    assert isinstance(kept.rgb, torch.Tensor) and kept.rgb.shape == (3, 48, 48, 3)
    assert kept.alpha.shape == (3, 48, 48) and kept.rgb.dtype == kept.alpha.dtype == torch.float32
    back = kept.to_numpy()
    np.testing.assert_array_equal(back.rgb, host.rgb)
    np.testing.assert_array_equal(back.alpha, host.alpha)
    assert host.to_numpy() is host and host.alpha.max() > 0.5


@pytest.mark.parametrize("budget_cameras, expected_calls", [(3, [3, 2, 2]), (100, [7]), (1, [1] * 7)])
@pytest.mark.parametrize("as_tensors", [False, True])
def test_gsplat_batches_are_assembled_in_camera_order(monkeypatch, budget_cameras, expected_calls,
                                                      as_tensors):
    """The gsplat path's batching and assembly, run on the CPU: a stand-in for
    gsplat.rasterization with its batched signature (viewmats [B, 4, 4], Ks [B, 3, 3] ->
    colours [B, H, W, 3], alphas [B, H, W, 1]) that renders each camera with the CPU twin.
    The views must be the CPU twin's, bit for bit, however the cameras are batched."""
    from pipeline.views.gaussian_math import covariance_3d

    g = random_scene(400, seed=6)
    cams = sphere_cameras(7, 2.4, 40.0, 32)
    calls = []

    def rasterization(means, quats, scales, opacities, colors, viewmats, Ks, width, height, **kw):
        assert kw["packed"] is False and kw["rasterize_mode"] == "classic"
        calls.append(len(viewmats))
        g_ = Gaussians(means=means.numpy(), scales=scales.numpy(), quats=quats.numpy(),
                       opacities=opacities.numpy(), colors=colors.numpy())
        covars = covariance_3d(g_.quats, g_.scales)
        out = [render_views.render_view_tiles(g_, covars, v.numpy(), k.numpy(), width, height)
               for v, k in zip(viewmats, Ks)]
        return (torch.from_numpy(np.stack([p for p, _ in out])),
                torch.from_numpy(np.stack([a for _, a in out]))[..., None], {})

    monkeypatch.setattr(render_views, "load_gsplat", lambda: rasterization)
    per_camera = len(g) * render_views.GSPLAT_PAIR_BYTES + 32 * 32 * render_views.GSPLAT_PIXEL_BYTES
    monkeypatch.setattr(render_views, "GSPLAT_BATCH_BYTES", budget_cameras * per_camera)
    fractions = []
    rgb, alpha = render_views._render_gsplat(g, cams, torch.device("cpu"),
                                             lambda f, m="": fractions.append(f), 1.0, as_tensors)
    assert calls == expected_calls
    assert fractions[-1] == 1.0 and fractions == sorted(fractions) and len(fractions) == len(calls)
    got = Views(rgb, alpha, cams).to_numpy()
    twin = render_gaussians(g, cams)
    np.testing.assert_array_equal(got.rgb, twin.rgb)
    np.testing.assert_array_equal(got.alpha, twin.alpha)


def test_views_are_checked_the_same_on_the_host_and_on_the_device():
    g = random_scene(50, seed=5)
    cams = sphere_cameras(2, 2.4, 40.0, 16)
    host = render_gaussians(g, cams).validate()
    kept = render_gaussians(g, cams, as_tensors=True).validate()
    nan = kept.rgb.clone()
    nan[1, 3, 4, 2] = float("nan")
    with pytest.raises(StageInputError, match="views.rgb contains 1 non-finite"):
        Views(nan, kept.alpha, cams).validate()
    with pytest.raises(StageInputError, match="views.alpha must have dtype float32, got float64"):
        Views(kept.rgb, kept.alpha.double(), cams).validate()
    with pytest.raises(StageInputError, match=r"views.rgb must have shape \(2, 16, 16, 3\)"):
        Views(host.rgb[:1], host.alpha, cams).validate()
    with pytest.raises(StageInputError, match="one device"):
        Views(kept.rgb, host.alpha, cams).validate()
    with pytest.raises(StageInputError, match="numpy array or torch tensor"):
        Views(host.rgb.tolist(), host.alpha, cams).validate()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_gsplat_without_cuda_says_so():
    g = make_gaussians([0.0, 0.0, 0.0], 0.05, 0.5, [1, 0, 0])
    with pytest.raises(StageInputError, match="CUDA is not available"):
        render_gaussians(g, front_camera(), backend="gsplat", device="cuda")


# ---------------------------------------------------------------- gsplat itself


def _need_gsplat() -> None:
    """Skip, saying why, where CUDA is here but gsplat cannot load."""
    try:
        render_views.load_gsplat()
    except StageInputError as e:
        pytest.skip(str(e))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="gsplat needs CUDA; this machine has none")
def test_gsplat_matches_cpu_renderer():
    _need_gsplat()
    g = random_scene(3000, seed=11, spread=0.5, scale=(0.004, 0.04))
    cams = sphere_cameras(4, 2.0, 45.0, 128)
    ref = render_gaussians(g, cams, backend="cpu")
    got = render_gaussians(g, cams, backend="gsplat", device="cuda")
    assert ref.alpha.max() > 0.9
    # Same math; differences come from float32 order of operations and gsplat's fast exp.
    assert np.abs(got.alpha - ref.alpha).mean() < 1e-4
    assert np.abs(premultiplied(got) - premultiplied(ref)).mean() < 1e-4
    assert np.quantile(np.abs(got.alpha - ref.alpha), 0.999) < 1e-2
    cpu_on_gpu = render_gaussians(g, cams, backend="cpu", device="cuda")
    np.testing.assert_allclose(cpu_on_gpu.alpha, ref.alpha, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="gsplat needs CUDA; this machine has none")
def test_batched_gsplat_matches_cpu_twin_and_single_camera_calls(monkeypatch):
    """Several rasterization calls of several cameras each (7 cameras in batches of 3, 2, 2)
    give the CPU twin's views, the same views as one camera per call, and the same numbers
    whether they come back as numpy or stay on the GPU."""
    _need_gsplat()
    g = random_scene(3000, seed=12, spread=0.5, scale=(0.004, 0.04))
    cams = sphere_cameras(7, 2.0, 45.0, 96)
    per_camera = len(g) * render_views.GSPLAT_PAIR_BYTES + 96 * 96 * render_views.GSPLAT_PIXEL_BYTES
    calls = []
    real = render_views.load_gsplat()

    def counting(*args, **kwargs):
        calls.append(len(args[5]))
        return real(*args, **kwargs)

    monkeypatch.setattr(render_views, "load_gsplat", lambda: counting)
    monkeypatch.setattr(render_views, "GSPLAT_BATCH_BYTES", 3 * per_camera)
    batched = render_gaussians(g, cams, backend="gsplat", device="cuda")
    assert calls == [3, 2, 2]
    on_gpu = render_gaussians(g, cams, backend="gsplat", device="cuda", as_tensors=True)
    assert on_gpu.rgb.device.type == "cuda" and on_gpu.alpha.shape == (7, 96, 96)
    monkeypatch.setattr(render_views, "GSPLAT_BATCH_BYTES", per_camera)
    calls.clear()
    single = render_gaussians(g, cams, backend="gsplat", device="cuda")
    assert calls == [1] * 7
    ref = render_gaussians(g, cams, backend="cpu")

    np.testing.assert_allclose(batched.alpha, single.alpha, atol=1e-6)
    np.testing.assert_allclose(batched.rgb, single.rgb, atol=1e-6)
    np.testing.assert_array_equal(on_gpu.to_numpy().alpha, batched.alpha)
    np.testing.assert_array_equal(on_gpu.to_numpy().rgb, batched.rgb)
    assert ref.alpha.max() > 0.9
    # same tolerances as the one-batch comparison above
    assert np.abs(batched.alpha - ref.alpha).mean() < 1e-4
    assert np.abs(premultiplied(batched) - premultiplied(ref)).mean() < 1e-4
    assert np.quantile(np.abs(batched.alpha - ref.alpha), 0.999) < 1e-2
