"""Kiln's gsplat call, run through gsplat 1.5.3's own pure-PyTorch rasterizer on CPU, against
Kiln's CPU compositor.

``gsplat.rendering._rasterization`` is gsplat's reference implementation in PyTorch. On a
machine without CUDA it cannot run as shipped: three steps inside it still call gsplat's
CUDA extension or nerfacc (building that extension here fails in torch's
``_get_cuda_arch_flags``: no GPU, no arch list):

* ``isect_tiles`` and ``isect_offset_encode`` (tile binning, CUDA): gsplat ships PyTorch
  twins of both (``gsplat.cuda._torch_impl._isect_tiles`` / ``_isect_offset_encode``),
  used here in their place;
* ``rasterize_to_indices_in_range`` (which Gaussian reaches which pixel, CUDA only, no
  PyTorch twin in gsplat) and ``accumulate`` (compositing, needs nerfacc's CUDA scans):
  replaced by the small functions below, written from the CUDA kernel's rules (skip
  alpha < 1/255, stop before transmittance reaches 1e-4, front to back within a tile).

Everything else is gsplat's own code: the quaternion/scale covariance, the world-to-camera
transform, the pinhole EWA projection with its clamped Jacobian and ``eps2d`` blur, the
culling, the tile binning and the depth sort. Those are exactly where Kiln's camera and
Gaussian conventions (wxyz quaternions, activated scales and opacities, OpenCV viewmats,
pixel centres at +0.5) could go wrong. ``docs/gpu-verification.md`` records this.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gsplat_rendering = pytest.importorskip("gsplat.rendering", reason="gsplat is not installed")

from gsplat.cuda import _torch_impl  # noqa: E402
from gsplat.cuda import _wrapper  # noqa: E402

from pipeline.camera.cameras import intrinsics, look_at  # noqa: E402
from pipeline.views.gaussian_math import ALPHA_MAX, ALPHA_MIN, EPS2D, FAR_PLANE, NEAR_PLANE, T_MIN  # noqa: E402
from pipeline.views.render_views import render_gaussians  # noqa: E402
from pipeline.types import Cameras, Gaussians  # noqa: E402

# float32 on both sides and the same front-to-back order per pixel; Kiln composites with a
# cumulative sum of log(1 - alpha), gsplat's rules with a running product: round-off only
COLOUR_TOL = 2e-5


def _sigma(means2d, conics, image_ids, gaussian_ids, pixel_ids, width):
    px = torch.stack([pixel_ids % width, pixel_ids // width], -1).to(means2d.dtype) + 0.5
    d = px - means2d[image_ids, gaussian_ids]
    c = conics[image_ids, gaussian_ids]
    return 0.5 * (c[:, 0] * d[:, 0] ** 2 + c[:, 2] * d[:, 1] ** 2) + c[:, 1] * d[:, 0] * d[:, 1]


def indices_in_range(range_start, range_end, transmittances, means2d, conics, opacities,
                     image_width, image_height, tile_size, isect_offsets, flatten_ids):
    """``rasterize_to_indices_in_range`` by the CUDA kernel's rules: per pixel, the Gaussians
    of its tile in depth order, from batch ``range_start`` to ``range_end`` (of tile_size^2),
    skipping alpha < 1/255 and stopping before the transmittance would reach 1e-4.
    Returns (gaussian ids, pixel ids, image ids), grouped by pixel, front to back."""
    n_images, n = means2d.shape[0], means2d.shape[1]
    th, tw = isect_offsets.shape[-2:]
    block = tile_size * tile_size
    offsets = torch.cat([isect_offsets.flatten(), torch.tensor([len(flatten_ids)])]).tolist()
    out_g, out_p, out_i = [], [], []
    for tile in range(n_images * th * tw):
        image, rest = divmod(tile, th * tw)
        ty, tx = divmod(rest, tw)
        lo = offsets[tile] + range_start * block
        hi = min(offsets[tile + 1], offsets[tile] + range_end * block)
        if lo >= hi:
            continue
        ids = flatten_ids[lo:hi].long() % n                                   # (G,) front to back
        ys, xs = torch.meshgrid(torch.arange(ty * tile_size, min((ty + 1) * tile_size, image_height)),
                                torch.arange(tx * tile_size, min((tx + 1) * tile_size, image_width)),
                                indexing="ij")
        pix = (ys * image_width + xs).flatten()                                # (P,)
        P, G = len(pix), len(ids)
        img = torch.full((P * G,), image)
        s = _sigma(means2d, conics, img, ids.repeat(P), pix.repeat_interleave(G), image_width).reshape(P, G)
        alpha = torch.clamp_max(opacities[image, ids][None] * torch.exp(-s), ALPHA_MAX).double()
        used = (s >= 0) & (alpha >= ALPHA_MIN)
        t_after = transmittances[image].flatten()[pix].double()[:, None] * \
            torch.cumprod(torch.where(used, 1 - alpha, torch.ones_like(alpha)), dim=1)
        stop = used & (t_after <= T_MIN)
        keep = used & (torch.cumsum(stop.int(), dim=1) == 0)                 # everything before the stop
        p_idx, g_idx = keep.nonzero(as_tuple=True)                             # row-major: by pixel, in order
        out_g.append(ids[g_idx]), out_p.append(pix[p_idx]), out_i.append(torch.full((len(p_idx),), image))
    if not out_g:
        return (torch.zeros(0, dtype=torch.long),) * 3
    return torch.cat(out_g), torch.cat(out_p), torch.cat(out_i)


def accumulate(means2d, conics, opacities, colors, gaussian_ids, pixel_ids, image_ids,
               image_width, image_height):
    """``accumulate`` without nerfacc: fragments grouped by pixel, front to back; weight =
    alpha times the product of (1 - alpha) of the fragments before it on its pixel."""
    n_images = means2d.shape[0]
    rays = n_images * image_height * image_width
    s = _sigma(means2d, conics, image_ids, gaussian_ids, pixel_ids, image_width)
    alpha = torch.clamp_max(opacities[image_ids, gaussian_ids] * torch.exp(-s), ALPHA_MAX).double()
    ray = image_ids * image_height * image_width + pixel_ids
    log_keep = torch.log1p(-alpha)
    before = torch.cumsum(log_keep, 0) - log_keep                      # over all earlier fragments
    first = torch.ones_like(ray, dtype=torch.bool)
    first[1:] = ray[1:] != ray[:-1]
    start = torch.cummax(torch.where(first, torch.arange(len(ray)), torch.zeros_like(ray)), 0).values
    weight = alpha * torch.exp(before - before[start])                   # only this pixel's earlier ones
    rgb = torch.zeros(rays, colors.shape[-1], dtype=torch.float64)
    acc = torch.zeros(rays, 1, dtype=torch.float64)
    rgb.index_add_(0, ray, weight[:, None] * colors[image_ids, gaussian_ids].double())
    acc.index_add_(0, ray, weight[:, None])
    return (rgb.float().reshape(n_images, image_height, image_width, -1),
            acc.float().reshape(n_images, image_height, image_width, 1))


@pytest.fixture
def gsplat_reference_on_cpu(monkeypatch):
    """gsplat's ``_rasterization`` with its CUDA-only steps replaced as the module says."""
    monkeypatch.setattr(gsplat_rendering, "isect_tiles",
                        lambda means2d, radii, depths, tile_size, tile_width, tile_height, **kw:
                        _torch_impl._isect_tiles(means2d, radii, depths, tile_size, tile_width, tile_height))
    monkeypatch.setattr(gsplat_rendering, "isect_offset_encode", _torch_impl._isect_offset_encode)
    monkeypatch.setattr(_wrapper, "rasterize_to_indices_in_range", indices_in_range)
    monkeypatch.setattr(_torch_impl, "accumulate", accumulate)
    return gsplat_rendering._rasterization


def _scene(seed=0, n=300):
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=0.25, size=(n, 3)).astype(np.float32)
    scales = np.exp(rng.uniform(np.log(0.02), np.log(0.15), (n, 3))).astype(np.float32)
    quats = rng.normal(size=(n, 4)).astype(np.float32) * rng.uniform(0.5, 2.0, (n, 1)).astype(np.float32)
    opac = rng.uniform(0.2, 0.95, n).astype(np.float32)
    cols = rng.uniform(0, 1, (n, 3)).astype(np.float32)
    g = Gaussians(means=means, scales=scales, quats=quats, opacities=opac, colors=cols)
    w, h = 40, 32   # not square, not a multiple of the 16-pixel tile
    K = intrinsics(45.0, w, h)
    K2 = K.copy()
    K2[0, 2] += 3.25   # an off-centre principal point
    K2[1, 2] -= 1.5
    cams = Cameras(viewmats=np.stack([look_at((0.2, -0.4, 2.2)), look_at((-1.6, 0.5, 1.1))]),
                   Ks=np.stack([K, K2]), width=w, height=h)
    return g, cams


def test_kilns_conventions_through_gsplats_reference_match_kilns_compositor(gsplat_reference_on_cpu):
    g, cams = _scene()
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    # the same arguments Kiln's gsplat backend passes (pipeline.views.render_views._render_gsplat)
    premult, alphas, _ = gsplat_reference_on_cpu(
        t(g.means), t(g.quats), t(g.scales), t(g.opacities), t(g.colors), t(cams.viewmats), t(cams.Ks),
        cams.width, cams.height, near_plane=NEAR_PLANE, far_plane=FAR_PLANE, eps2d=EPS2D,
        sh_degree=None, render_mode="RGB", rasterize_mode="classic")
    ours = render_gaussians(g, cams, backend="cpu", device="cpu")
    ref_alpha = alphas[..., 0].numpy()
    ours_premult = ours.rgb * ours.alpha[..., None]
    assert ref_alpha.max() > 0.9 and (ref_alpha > 0.01).mean() > 0.3      # a scene worth comparing
    np.testing.assert_allclose(ours.alpha, ref_alpha, atol=COLOUR_TOL, rtol=0)
    np.testing.assert_allclose(ours_premult, premult.numpy(), atol=COLOUR_TOL, rtol=0)


def test_a_convention_error_shows(gsplat_reference_on_cpu):
    """The comparison sees a quaternion read as x,y,z,w instead of w,x,y,z."""
    g, cams = _scene(seed=1)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    _, alphas, _ = gsplat_reference_on_cpu(
        t(g.means), t(np.roll(g.quats, -1, axis=1)), t(g.scales), t(g.opacities), t(g.colors),
        t(cams.viewmats), t(cams.Ks), cams.width, cams.height, near_plane=NEAR_PLANE,
        far_plane=FAR_PLANE, eps2d=EPS2D, sh_degree=None, render_mode="RGB", rasterize_mode="classic")
    ours = render_gaussians(g, cams, backend="cpu", device="cpu")
    assert np.abs(ours.alpha - alphas[..., 0].numpy()).max() > 100 * COLOUR_TOL
