"""Texture baking: recovery of a known texture, render-back, inpainting, gutter, input checks.

The reference scene is a cube whose six sides each own one square UV chart of
a 3 x 2 atlas. "Views" are that cube rendered (render_textured) with a known
texture, so a correct bake has a known answer.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from kiln.settings import BakeSettings
from pipeline.texture import bake
from pipeline.texture.opt.schedule import StallSchedule
from pipeline.camera.cameras import look_at, sphere_cameras
from kiln.limits import MAX_RASTER_SIDE
from pipeline.types import Cameras, Mesh, Texture, Views
from pipeline.validate import StageInputError

from pipeline.raster.rasterize import available_backends
from raster_helpers import gl_context
from synthetic import object_colors

# one moderngl context for the module (None without EGL: the GL tests skip)
RASTER = gl_context() if "moderngl" in available_backends() else None
TEX = 128
HALF = 0.4


# --------------------------------------------------------------------------- scene

def cube_mesh(n: int = 4) -> Mesh:
    """Cube of side 2*HALF, each side an n x n grid in its own UV chart.

    Side k sits in cell (k % 3, k // 3) of a 3 x 2 atlas, as a square of
    0.3 x 0.3 in uv with a margin, so charts are separated by gutter texels.
    """
    h = HALF
    sides = [  # origin, u axis, v axis; u x v points outwards
        ((-h, -h, h), (1, 0, 0), (0, 1, 0)),     # +z (front)
        ((h, -h, -h), (-1, 0, 0), (0, 1, 0)),    # -z
        ((h, -h, h), (0, 0, -1), (0, 1, 0)),     # +x
        ((-h, -h, -h), (0, 0, 1), (0, 1, 0)),    # -x
        ((-h, h, h), (1, 0, 0), (0, 0, -1)),     # +y
        ((-h, -h, -h), (1, 0, 0), (0, 0, 1)),    # -y
    ]
    verts, uvs, faces = [], [], []
    a, b = np.meshgrid(np.linspace(0, 1, n + 1), np.linspace(0, 1, n + 1), indexing="xy")
    a, b = a.ravel(), b.ravel()
    for k, (o, du, dv) in enumerate(sides):
        base = k * (n + 1) ** 2
        o, du, dv = (np.array(x, np.float64) for x in (o, du, dv))
        verts.append(o + 2 * h * (a[:, None] * du + b[:, None] * dv))
        cell = np.array([(k % 3) / 3.0 + 0.02, (k // 3) / 2.0 + 0.1])
        uvs.append(cell + 0.3 * np.stack([a, b], 1))
        for j in range(n):
            for i in range(n):
                q = base + j * (n + 1) + i
                faces += [(q, q + 1, q + n + 2), (q, q + n + 2, q + n + 1)]
    return Mesh(vertices=np.concatenate(verts).astype(np.float32),
                faces=np.array(faces, np.int32),
                uvs=np.concatenate(uvs).astype(np.float32))


def truth_texture(size: int = TEX) -> Texture:
    return Texture(image=object_colors(size), seen=np.ones((size, size), bool))


def views_of(mesh: Mesh, texture: Texture, cameras: Cameras) -> Views:
    """Views of the textured mesh: colour where covered, alpha 1 there, 0 elsewhere."""
    rgb, covered = bake.render_textured(mesh, texture, cameras, RASTER)
    return Views(rgb=rgb, alpha=covered.astype(np.float32), cameras=cameras)


def chart_mask(mesh: Mesh, size: int) -> np.ndarray:
    from pipeline.raster.rasterize import rasterize_uv

    return rasterize_uv(RASTER, mesh, size).tri_id[0] >= 0


def texel_psnr(a: Texture, b: Texture, mask: np.ndarray) -> float:
    return bake.masked_psnr(a.image / 255.0, b.image / 255.0, mask)


def settings(mode: str, **kw) -> BakeSettings:
    base = dict(mode=mode, texture_size=TEX, steps=150, lr=0.03, tv_weight=0.0)
    base.update(kw)
    return BakeSettings(**base)


@pytest.fixture(scope="module")
def scene():
    mesh = cube_mesh()
    cams = sphere_cameras(10, radius=2.4, fov_deg=40.0, resolution=128)
    truth = truth_texture()
    return mesh, cams, truth, views_of(mesh, truth, cams)


@pytest.fixture(scope="module")
def fast_bake(scene):
    mesh, _, _, views = scene
    return bake.bake_texture(mesh, views, settings("fast"), RASTER, "cpu", seed=0)


PROGRESS: list = []


@pytest.fixture(scope="module")
def opt_bake(scene):
    mesh, _, _, views = scene
    return bake.bake_texture(mesh, views, settings("opt"), RASTER, "cpu", seed=0,
                             progress=lambda f, m: PROGRESS.append((f, m)))


def interior(mask: np.ndarray, margin: int) -> np.ndarray:
    """``mask`` shrunk by ``margin`` texels: chart borders mix in gutter under bilinear sampling."""
    from scipy import ndimage

    return ndimage.binary_erosion(mask, iterations=margin)


# --------------------------------------------------------------------------- sampling and rendering

def test_bilinear_taps_match_grid_sample():
    rng = np.random.default_rng(0)
    size = 16
    image = rng.random((size, size, 3)).astype(np.float32)
    uv = rng.uniform(-0.05, 1.05, size=(500, 2)).astype(np.float32)
    ours = bake.sample_texture(image, uv)
    tex = torch.from_numpy(image).permute(2, 0, 1)[None]
    # texture row 0 is v = 1, grid_sample's y = -1 is row 0
    grid = torch.from_numpy(np.stack([2 * uv[:, 0] - 1, 1 - 2 * uv[:, 1]], 1))[None, None]
    ref = torch.nn.functional.grid_sample(tex, grid, mode="bilinear", padding_mode="border",
                                          align_corners=False)[0, :, 0].T.numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-5)


def test_render_textured_orientation():
    """The front side's chart, top-left texel region, appears at the top-left of the front view."""
    mesh = cube_mesh(2)
    size = 64
    image = np.zeros((size, size, 3), np.uint8)
    image[:] = (0, 0, 255)
    # front chart: uv cell (0.02..0.32, 0.1..0.4); its top-left quarter (low u, high v) red
    u0, u1, v0, v1 = 0.02, 0.32, 0.1, 0.4
    rows = slice(int((1 - v1) * size), int((1 - (v0 + v1) / 2) * size))
    cols = slice(int(u0 * size), int((u0 + u1) / 2 * size))
    image[rows, cols] = (255, 0, 0)
    cams = sphere_cameras(1, radius=2.4, fov_deg=40.0, resolution=96)
    rgb, covered = bake.render_textured(mesh, Texture(image, np.ones((size, size), bool)), cams, RASTER)
    assert rgb.shape == (1, 96, 96, 3) and covered.shape == (1, 96, 96)
    assert covered[0, 48, 48] and not covered[0, 2, 2]
    ys, xs = np.nonzero(covered[0])
    top, left, bottom, right = ys.min(), xs.min(), ys.max(), xs.max()
    q = lambda y, x: rgb[0, int(top + y * (bottom - top)), int(left + x * (right - left))]
    np.testing.assert_allclose(q(0.2, 0.2), (1, 0, 0), atol=0.02)   # top-left red
    np.testing.assert_allclose(q(0.8, 0.8), (0, 0, 1), atol=0.02)   # bottom-right blue
    np.testing.assert_allclose(q(0.2, 0.8), (0, 0, 1), atol=0.02)
    np.testing.assert_allclose(q(0.8, 0.2), (0, 0, 1), atol=0.02)


def test_masked_psnr_known_values():
    a = np.zeros((4, 4, 3), np.float32)
    b = a.copy()
    b[0, 0] = 0.1   # mse over the one masked pixel = 0.01 -> 20 dB
    mask = np.zeros((4, 4), bool)
    mask[0, 0] = True
    assert bake.masked_psnr(a, b, mask) == pytest.approx(20.0)
    mask[:] = True
    assert bake.masked_psnr(a, b, mask) == pytest.approx(20.0 + 10 * np.log10(16))
    assert bake.masked_psnr(a, a, mask) == bake.PSNR_CAP_DB
    with pytest.raises(ValueError):
        bake.masked_psnr(a, b, np.zeros((4, 4), bool))


# --------------------------------------------------------------------------- recovery of a known texture

def test_fast_bake_recovers_known_texture(scene, fast_bake):
    mesh, _, truth, _ = scene
    texture, stats = fast_bake
    assert texture.image.shape == (TEX, TEX, 3) and texture.image.dtype == np.uint8
    assert stats.mode == "fast"
    chart = chart_mask(mesh, TEX)
    # every side is seen by some of the 10 views
    assert stats.texels_seen_fraction > 0.99
    assert texture.seen[chart].mean() > 0.99
    assert texel_psnr(texture, truth, interior(chart, 2)) > 24.0
    assert stats.psnr_db > 24.0


def test_opt_bake_recovers_known_texture(scene, fast_bake, opt_bake):
    mesh, _, truth, _ = scene
    texture, stats = opt_bake
    chart = chart_mask(mesh, TEX)
    seen_inside = interior(chart, 2) & texture.seen
    assert seen_inside.sum() > 0.9 * interior(chart, 2).sum()
    assert texel_psnr(texture, truth, seen_inside) > 30.0
    assert stats.psnr_db > 35.0
    # optimisation starts from the fast bake and must improve on it
    assert stats.fast_psnr_db == pytest.approx(fast_bake[1].psnr_db, abs=1.0)
    assert stats.psnr_db > stats.fast_psnr_db + 3.0


def test_baked_texture_renders_back_to_views(scene, opt_bake):
    mesh, cams, _, views = scene
    texture, stats = opt_bake
    rgb, covered = bake.render_textured(mesh, texture, cams, RASTER)
    mask = covered & (views.alpha > bake.ALPHA_MIN)
    for c in (0, 5):
        assert bake.masked_psnr(rgb[c], views.rgb[c], mask[c]) > 33.0
    # the stage's own figure is this same measurement over all views
    assert stats.psnr_db == pytest.approx(bake.masked_psnr(rgb, views.rgb, mask), abs=0.05)


def test_opt_reports_monotonic_progress(opt_bake):
    fractions = [f for f, _ in PROGRESS]
    assert len(fractions) >= 20                      # at least one report per 5 % of the steps
    assert fractions == sorted(fractions)
    assert fractions[0] == 0.0 and fractions[-1] == 1.0
    steps = opt_bake[1].opt_steps
    assert steps is not None and steps <= 150
    assert any(f"step {steps}/{steps}" in m for _, m in PROGRESS)


def test_stall_schedule_ends_after_a_stalled_loss_with_the_lr_annealed():
    sch = StallSchedule(120, window=12, drop=0.005, tail=8)
    losses = {12: 0.0146, 24: 0.0131, 36: 0.0124, 48: 0.01225, 60: 0.0121, 72: 0.01208}
    step = 0
    while step < sch.end:
        if sch.wants_loss(step):
            sch.observe(step, losses[step])
        step += 1
    # 60 -> 72 dropped 0.17 %, under 0.5 %: a stall at 72, 8 steps of tail, not 120 steps
    assert (sch.stalled_at, sch.end, step) == (72, 80, 80)
    # the cosine runs on from where it was to its end within the tail
    assert sch.fraction(71) == pytest.approx(71 / 119)
    assert sch.fraction(72) == pytest.approx(72 / 119)
    assert sch.fraction(79) == pytest.approx(1.0)
    # a loss that keeps dropping by more than 0.5 % a window runs every step
    sch = StallSchedule(120, window=12, drop=0.005, tail=8)
    for step in range(120):
        if sch.wants_loss(step):
            sch.observe(step, 1.0 - 0.01 * step)
    assert (sch.stalled_at, sch.end) == (0, 120)
    # a stall in the last tail's worth of steps changes nothing
    sch = StallSchedule(40, window=12, drop=0.005, tail=8)
    for step in (12, 24, 36):
        sch.observe(step, 0.5)
    assert (sch.stalled_at, sch.end) == (24, 32)


def test_opt_stops_early_on_a_stalled_loss_and_runs_on_while_it_drops(scene):
    """Views with strong noise of their own (sigma 0.25, independent per view) leave opt a
    floor it reaches within a few windows: its L1 stalls and it ends after the tail, not
    after 400 steps. The clean views keep its L1 dropping (to 0): it runs every step."""
    mesh, cams, _, views = scene
    rng = np.random.default_rng(0)
    noisy = Views(np.clip(views.rgb + rng.normal(0, 0.25, views.rgb.shape), 0, 1).astype(np.float32),
                  views.alpha, cams)
    msgs: list = []
    _, stats = bake.bake_texture(mesh, noisy, settings("opt", steps=400), RASTER, "cpu", seed=0,
                                 progress=lambda f, m: msgs.append(m))
    assert stats.opt_steps is not None and stats.opt_steps < 100
    assert any(f"stalled at step {stats.opt_steps - bake.STALL_TAIL}" in m for m in msgs)
    assert stats.psnr_db >= stats.fast_psnr_db     # no worse than where it started
    # bake.stop_when_stalled false: the same noisy views run every step
    _, every = bake.bake_texture(mesh, noisy, settings("opt", steps=150, stop_when_stalled=False), RASTER, "cpu",
                                 seed=0)
    assert every.opt_steps == 150
    _, clean = bake.bake_texture(mesh, views, settings("opt", steps=400), RASTER, "cpu", seed=0)
    assert clean.opt_steps == 400 and clean.psnr_db > clean.fast_psnr_db + 3.0


def test_opt_pixel_subset_is_seeded(scene, monkeypatch):
    """Above MAX_OPT_PIXELS, opt fits a random subset chosen by the seed."""
    mesh, _, _, views = scene
    monkeypatch.setattr(bake, "MAX_OPT_PIXELS", 2000)
    run = lambda seed: bake.bake_texture(mesh, views, settings("opt", steps=5, lr=0.1), RASTER,
                                         "cpu", seed=seed)[0].image
    first, again, other = run(1), run(1), run(2)
    np.testing.assert_array_equal(first, again)
    assert (first != other).any()


def test_bake_ignores_transparent_view_pixels(scene):
    """Pixels with low alpha carry no colour: garbage there must not reach the texture."""
    mesh, cams, truth, views = scene
    rng = np.random.default_rng(1)
    noisy = views.rgb.copy()
    faint = rng.random(views.alpha.shape) < 0.3
    noisy[faint] = rng.random((int(faint.sum()), 3)).astype(np.float32)
    alpha = np.where(faint, 0.0, views.alpha).astype(np.float32)
    texture, stats = bake.bake_texture(mesh, Views(noisy, alpha, cams), settings("opt", steps=60),
                                       RASTER, "cpu", seed=0)
    chart = interior(chart_mask(mesh, TEX), 2)
    assert texel_psnr(texture, truth, chart & texture.seen) > 35.0   # ~25 dB if the noise got in


def test_fast_bake_respects_occlusion():
    """A small cube in front of the big one hides part of its front: those texels stay unseen."""
    big, small = cube_mesh(), cube_mesh()
    small.vertices = (small.vertices * (0.15 / HALF) + np.array([0, 0, 0.7])).astype(np.float32)
    # big cube's charts in the lower half of the atlas, the small cube's in the upper half
    uvs = np.concatenate([big.uvs * [1, 0.5], small.uvs * [1, 0.5] + [0, 0.5]]).astype(np.float32)
    mesh = Mesh(np.concatenate([big.vertices, small.vertices]),
                np.concatenate([big.faces, small.faces + big.num_vertices]).astype(np.int32), uvs=uvs)
    truth = truth_texture()
    cams = sphere_cameras(1, radius=2.4, fov_deg=40.0, resolution=128)
    texture, _ = bake.bake_texture(mesh, views_of(mesh, truth, cams), settings("fast"), RASTER,
                                   "cpu", seed=0)
    # texel centres of the big cube's front chart (u 0.02..0.32, v 0.05..0.2) in world x, y
    rows, cols = np.mgrid[0:TEX, 0:TEX]
    u, v = (cols + 0.5) / TEX, 1 - (rows + 0.5) / TEX
    a, b = (u - 0.02) / 0.3, (v / 0.5 - 0.1) / 0.3
    front = (a > 0.02) & (a < 0.98) & (b > 0.02) & (b < 0.98)
    x, y = -HALF + 2 * HALF * a, -HALF + 2 * HALF * b
    hidden = front & (np.abs(x) < 0.15) & (np.abs(y) < 0.15)      # the shadow is ~0.19 wide
    open_ = front & ((np.abs(x) > 0.25) | (np.abs(y) > 0.25))
    assert hidden.sum() > 50 and open_.sum() > 200
    assert not texture.seen[hidden].any()
    assert texture.seen[open_].all()
    assert texel_psnr(texture, truth, interior(open_, 1)) > 24.0


@pytest.mark.parametrize("chunk", [bake.FAST_CHUNK, 1000])
def test_fast_bake_kernel_matches_torch(scene, chunk):
    """The numba back-projection (the CPU's) is the torch one (any device's), view by view
    summed in the same order: the same texels seen, the same colours to float32 round-off."""
    from pipeline.raster import rasterize as rz

    mesh, cams, _, views = scene
    tex = bake._texels(RASTER, mesh, TEX)
    view_raster = rz.rasterize_views(RASTER, mesh, cams)
    dev = torch.device("cpu")
    c_k, s_k = bake._fast_bake(tex.positions, tex.normals, view_raster, views, dev, chunk, engine="kernel")
    c_t, s_t = bake._fast_bake(tex.positions, tex.normals, view_raster, views, dev, chunk, engine="torch")
    assert s_t.mean() > 0.99
    np.testing.assert_array_equal(s_k, s_t)
    np.testing.assert_allclose(c_k, c_t, rtol=0, atol=1e-5)


# --------------------------------------------------------------------------- unseen texels and gutter

@pytest.fixture(scope="module")
def one_sided_bake(scene):
    """One camera in front, one 45 degrees to its right: only the +z and +x sides are seen."""
    mesh, _, truth, _ = scene
    cams = sphere_cameras(1, radius=2.4, fov_deg=40.0, resolution=128)
    side = sphere_cameras(1, radius=2.4, fov_deg=40.0, resolution=128)
    side.viewmats[0] = look_at((1.7, 0.0, 1.7))
    cams = Cameras(np.concatenate([cams.viewmats, side.viewmats]),
                   np.concatenate([cams.Ks, side.Ks]), 128, 128)
    views = views_of(mesh, truth, cams)
    return bake.bake_texture(mesh, views, settings("fast"), RASTER, "cpu", seed=0)


def test_unseen_texels_are_inpainted(scene, one_sided_bake):
    mesh, _, truth, _ = scene
    texture, stats = one_sided_bake
    chart = chart_mask(mesh, TEX)
    unseen = chart & ~texture.seen
    assert 0.3 < stats.texels_seen_fraction < 0.4      # front and +x: two of six sides
    assert unseen.sum() > 0.6 * chart.sum()
    # no black holes: inpainted colours come from the seen texels' range (Telea may overshoot a little)
    seen = texture.image[chart & texture.seen].astype(int)
    filled = texture.image[unseen].astype(int)
    assert (filled.max(1) > 20).all()
    assert ((filled >= seen.min(0) - 8) & (filled <= seen.max(0) + 8)).all()


def test_gutter_copies_nearest_chart_texel(scene, one_sided_bake):
    from scipy.spatial import cKDTree

    mesh, _, _, _ = scene
    texture, _ = one_sided_bake
    chart = chart_mask(mesh, TEX)
    assert not texture.seen[~chart].any()       # fast mode only colours chart texels
    inside = np.argwhere(chart)
    outside = np.argwhere(~chart)
    tree = cKDTree(inside)
    dist, _ = tree.query(outside)
    # ties: any chart texel at the nearest distance is a valid source
    candidates = tree.query_ball_point(outside, dist + 1e-6)
    img = texture.image.astype(int)
    for (r, c), cand in zip(outside, candidates):
        src = img[inside[cand, 0], inside[cand, 1]]
        assert (np.abs(src - img[r, c]).max(1) == 0).any(), (r, c)


def test_fill_texture_directly():
    """Holes inside a chart are filled from around them; outside copies the chart edge."""
    size = 32
    chart = np.zeros((size, size), bool)
    chart[8:24, 8:24] = True
    image = np.zeros((size, size, 3), np.float32)
    image[chart] = (0.2, 0.6, 0.9)
    seen = chart.copy()
    seen[14:18, 14:18] = False          # a hole in the middle of the chart
    image[~seen] = 0.0
    out = bake.fill_texture(image, seen, chart)
    expect = np.round(np.array([0.2, 0.6, 0.9]) * 255)
    # Telea's gradient term wobbles by a few levels even on a flat field
    assert np.abs(out.reshape(-1, 3) - expect).max() <= 3


# --------------------------------------------------------------------------- input checks

def test_rejects_mesh_without_uvs(scene):
    mesh, _, _, views = scene
    bare = Mesh(vertices=mesh.vertices, faces=mesh.faces)
    with pytest.raises(StageInputError, match="no UVs"):
        bake.bake_texture(bare, views, settings("fast"), RASTER, "cpu", seed=0)


def test_rejects_nan_views(scene):
    mesh, _, _, views = scene
    rgb = views.rgb.copy()
    rgb[0, 10, 10, 1] = np.nan
    with pytest.raises(StageInputError, match="views.rgb contains 1 non-finite"):
        bake.bake_texture(mesh, Views(rgb, views.alpha, views.cameras), settings("fast"),
                          RASTER, "cpu", seed=0)


def test_rejects_views_not_matching_cameras(scene):
    mesh, _, _, views = scene
    with pytest.raises(StageInputError, match="views.rgb must have shape"):
        bake.bake_texture(mesh, Views(views.rgb[:3], views.alpha[:3], views.cameras),
                          settings("fast"), RASTER, "cpu", seed=0)


# past the capability limit: the raster side limit (the settings' own range is checked when
# settings are built)
@pytest.mark.parametrize("size", [100, 8, 2 * MAX_RASTER_SIDE])
def test_rejects_bad_texture_size(scene, size):
    mesh, _, _, views = scene
    with pytest.raises(StageInputError, match="power of two"):
        bake.bake_texture(mesh, views, settings("fast", texture_size=size), RASTER, "cpu", seed=0)


def test_rejects_uvs_outside_unit_square(scene):
    mesh, _, _, views = scene
    bad = Mesh(mesh.vertices, mesh.faces, uvs=mesh.uvs * 2.0)
    with pytest.raises(StageInputError, match=r"uvs must lie in \[0, 1\]"):
        bake.bake_texture(bad, views, settings("fast"), RASTER, "cpu", seed=0)


def test_rejects_views_that_miss_the_mesh(scene):
    mesh, cams, _, views = scene
    away = Views(views.rgb, np.zeros_like(views.alpha), cams)
    with pytest.raises(StageInputError, match="no view sees the mesh"):
        bake.bake_texture(mesh, away, settings("fast"), RASTER, "cpu", seed=0)


# --------------------------------------------------------------------------- views on the device

def as_tensor_views(views: Views, device: str) -> Views:
    """``views`` as the renderer leaves them with ``as_tensors=True``: torch tensors on ``device``."""
    return Views(rgb=torch.as_tensor(views.rgb, device=device),
                 alpha=torch.as_tensor(views.alpha, device=device), cameras=views.cameras)


def _bake_both(scene, bake_settings, device, **kw):
    mesh, _, _, views = scene
    a, sa = bake.bake_texture(mesh, views, bake_settings, RASTER, device, seed=0, **kw)
    b, sb = bake.bake_texture(mesh, as_tensor_views(views, device), bake_settings, RASTER, device,
                              seed=0, **kw)
    return (a, sa), (b, sb)


@pytest.mark.parametrize("mode, kw", [("fast", {}),
                                      # a small chunk_scale takes the seeded pixel subset and
                                      # the coarse correction: the paths that index the targets
                                      ("opt", {"chunk_scale": 1e-3})])
def test_tensor_views_bake_like_numpy_views(scene, mode, kw, monkeypatch):
    # both through the torch back-projection (views on a device take it): the same numbers
    # to the bit; the CPU's numba twin is compared with it below
    monkeypatch.setattr(bake, "_fast_bake", functools.partial(bake._fast_bake, engine="torch"))
    (a, sa), (b, sb) = _bake_both(scene, settings(mode, steps=30), "cpu", **kw)
    assert np.abs(a.image / 255.0 - b.image / 255.0).max() <= 1e-5
    assert np.array_equal(a.seen, b.seen)
    for k in ("psnr_db", "l1", "texels_seen_fraction", "pixels"):
        assert getattr(sa, k) == pytest.approx(getattr(sb, k), abs=1e-5), k
    if mode == "opt":
        assert sa.opt_texture_size == sb.opt_texture_size < TEX


@pytest.mark.parametrize("mode, kw", [("fast", {}), ("opt", {}), ("opt", {"chunk_scale": 1e-3})])
def test_bake_with_the_kernel_is_the_bake_with_torch(scene, mode, kw, monkeypatch):
    """The whole bake with the CPU's numba back-projection against the torch one. Fast: the
    same uint8 texture. Opt fits an L1 loss by its sign: a round-off difference in its start
    flips some residuals' signs, which moves texels by a step or three of 1/255 (0.5 % of the
    values at full size, 3 % through the coarse correction, which spreads each over 2x2):
    the same texture to the eye and to the PSNR, as the CUDA bake is to the CPU's."""
    mesh, _, _, views = scene
    a, sa = bake.bake_texture(mesh, views, settings(mode, steps=30), RASTER, "cpu", seed=0, **kw)
    monkeypatch.setattr(bake, "_fast_bake", functools.partial(bake._fast_bake, engine="torch"))
    b, sb = bake.bake_texture(mesh, views, settings(mode, steps=30), RASTER, "cpu", seed=0, **kw)
    assert np.array_equal(a.seen, b.seen)
    diff = np.abs(a.image.astype(int) - b.image.astype(int))
    assert diff.max() <= (0 if mode == "fast" else 3)
    assert (diff > 0).mean() <= 0.05
    assert texel_psnr(a, b, np.ones((TEX, TEX), bool)) > 50.0
    assert sa.psnr_db == pytest.approx(sb.psnr_db, abs=0.05)   # of ~62 dB


def test_tensor_views_are_checked_like_numpy_views(scene):
    mesh, _, _, views = scene
    rgb = views.rgb.copy()
    rgb[0, 10, 10, 1] = np.nan
    with pytest.raises(StageInputError, match="views.rgb contains 1 non-finite"):
        bake.bake_texture(mesh, as_tensor_views(Views(rgb, views.alpha, views.cameras), "cpu"),
                          settings("fast"), RASTER, "cpu", seed=0)
    half = Views(torch.as_tensor(views.rgb).half(), torch.as_tensor(views.alpha), views.cameras)
    with pytest.raises(StageInputError, match="views.rgb must have dtype float32"):
        bake.bake_texture(mesh, half, settings("fast"), RASTER, "cpu", seed=0)
    with pytest.raises(StageInputError, match="views.rgb must have shape"):
        bake.bake_texture(mesh, as_tensor_views(Views(views.rgb[:3], views.alpha[:3], views.cameras),
                                                "cpu"), settings("fast"), RASTER, "cpu", seed=0)


# --------------------------------------------------------------------------- GPU path

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bake_matches_cpu(scene, opt_bake):
    """Same code on the GPU: same quality, nearly the same texels (float order differs)."""
    mesh, _, _, views = scene
    texture, stats = bake.bake_texture(mesh, views, settings("opt"), RASTER, "cuda", seed=0)
    cpu_texture, cpu_stats = opt_bake
    assert abs(stats.psnr_db - cpu_stats.psnr_db) < 0.5
    assert texel_psnr(texture, cpu_texture, np.ones((TEX, TEX), bool)) > 35.0
    fast_gpu = bake.bake_texture(mesh, views, settings("fast"), RASTER, "cuda", seed=0)[0]
    fast_cpu = bake.bake_texture(mesh, views, settings("fast"), RASTER, "cpu", seed=0)[0]
    assert np.abs(fast_gpu.image.astype(int) - fast_cpu.image.astype(int)).max() <= 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="views left on a CUDA device need one; the CPU-tensor test covers the code")
@pytest.mark.parametrize("mode, kw", [("fast", {}), ("opt", {"chunk_scale": 1e-3})])
def test_cuda_tensor_views_bake_like_numpy_views(scene, mode, kw):
    """Views the renderer left on the GPU bake as the same views handed over as numpy."""
    (a, sa), (b, sb) = _bake_both(scene, settings(mode, steps=30), "cuda", **kw)
    assert np.abs(a.image / 255.0 - b.image / 255.0).max() <= 1e-5
    assert sa.psnr_db == pytest.approx(sb.psnr_db, abs=1e-3)


# --------------------------------------------------------------------------- end to end

def test_pipeline_bake_matches_gaussian_views():
    """reconstruct -> Gaussian views -> clean/simplify -> unwrap -> bake, at reduced sizes.

    The texture is judged against the Gaussian renders (not a known texture),
    which is what the stage reports to users as bake_psnr_db.
    """
    from kiln.settings import load
    from pipeline.meshing import mesh_ops
    from pipeline.unwrap import uv
    from pipeline.recon.reconstruct import reconstruct
    from pipeline.views.render_views import render_gaussians
    from pipeline.types import ImageInput
    from synthetic import make_object_image

    s = load(overrides={"reconstruct.resolution": 96, "reconstruct.num_gaussians": 15000,
                        "views.count": 8, "views.resolution": 192, "bake.texture_size": 512})
    rgb, mask = make_object_image(256, "blob")
    recon = reconstruct(ImageInput(rgb, mask), s.reconstruct, seed=0)
    v = s.views
    views = render_gaussians(recon.gaussians, sphere_cameras(v.count, v.radius, v.fov_deg, v.resolution),
                             backend="cpu")
    mesh = mesh_ops.clean_mesh(recon.mesh, s.mesh.min_component_fraction, s.mesh.fill_holes)
    mesh = mesh_ops.simplify_mesh(mesh, s.mesh.simplify_ratio)
    mesh = uv.unwrap(mesh, s.bake.texture_size, s.bake.gutter, s.mesh.max_faces_for_uv)
    results, l1 = {}, {}
    for mode in ("fast", "opt"):
        texture, stats = bake.bake_texture(mesh, views, s.override({"bake.mode": mode}).bake,
                                           RASTER, "cpu", seed=0)
        results[mode] = stats.psnr_db
        l1[mode] = stats.l1
        assert stats.texels_seen_fraction > 0.95
    print("bake PSNR against the Gaussian views:", results, "L1:", l1)
    assert results["opt"] >= 28.0
    assert results["fast"] >= 24.0
    # opt minimises L1 at the resolution the views determine; it used to "win" on PSNR by
    # fitting noise into underdetermined texels (the speckle test below)
    assert l1["opt"] < l1["fast"]
