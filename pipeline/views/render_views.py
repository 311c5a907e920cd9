"""Render Gaussians into RGBA views: gsplat on CUDA, or Kiln's own renderer.

The own renderer (``backend="cpu"``) computes what gsplat 1.5.3's
``rasterization`` computes in its default classic mode, so a job gives the same
views with or without a GPU:

* EWA projection with gsplat's clamped Jacobian and ``eps2d`` blur
  (``pipeline.views.gaussian_math.project_gaussians``);
* per pixel (centre at (col + 0.5, row + 0.5)), Gaussians front to back by
  camera depth, ``alpha = min(0.999, opacity * exp(-0.5 d^T conic d))``,
  fragments with alpha < 1/255 skipped;
* compositing stops *before* a Gaussian that would take the transmittance to
  1e-4 or below; colour = sum c_i alpha_i T_i, alpha = 1 - T.

On the host, ``pipeline.views.splat_tiles`` does this per 16 px tile, as gsplat does,
compiled by numba and run on every core, without torch (a CPU worker's start-up probe
renders through it, so the worker need not import torch to start). On a CUDA device
without gsplat, it is vectorised in torch rather than tiled: each view is turned into
fragments (pixel, Gaussian), one row span of a Gaussian's footprint at a time,
in depth order; fragments are sorted by pixel (stably, so depth order holds
within a pixel) and composited with a segmented cumulative sum of
log(1 - alpha). Work is done in bounded chunks of fragments, carrying each
pixel's transmittance and "done" flag from chunk to chunk; spans that only
cover finished pixels are dropped before any fragment is made, which skips
most of the hidden back of an object.

gsplat renders a batch of cameras per ``rasterization`` call (``camera_batches``
sizes the batches by memory). Both backends return straight (un-premultiplied)
colour, as numpy arrays or, with ``as_tensors=True``, as torch tensors left on
the render device for a stage that runs there too.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from kiln.limits import MAX_TOTAL_PIXELS

from pipeline.backends import check_backend, torch_device
from pipeline.types import Cameras, Gaussians, Views
from pipeline.validate import StageInputError

# Fragments handled at once by the CPU renderer (~60 bytes each in flight). Smaller
# chunks let finished pixels cull more of what lies behind them; 2^19 measured best.
DEFAULT_FRAGMENT_BUDGET = 1 << 19

# Row spans made at once (~150 bytes each while they are built).
SPAN_BUDGET = 1 << 20

# Pixels of margin around the exact footprint of a row span (float32 round-off).
SPAN_SLACK = 0.05

# gsplat renders a batch of cameras per call; its memory grows with cameras x Gaussians
# (packed=False keeps radii, means2d, depths, conics and tile counts per pair, ~48 bytes,
# plus the tile intersections) and cameras x pixels (colour, alpha, last ids and the
# straight-colour copy, ~48 bytes). Batches are sized to stay under this many bytes.
GSPLAT_BATCH_BYTES = 1 << 30
GSPLAT_PAIR_BYTES = 64
GSPLAT_PIXEL_BYTES = 64

ProgressFn = Callable[..., None]


def render_gaussians(g: Gaussians, cameras: Cameras, backend: str = "cpu", device: str = "cpu",
                     progress: Optional[ProgressFn] = None, chunk_scale: float = 1.0,
                     as_tensors: bool = False) -> Views:
    """Render ``g`` from every camera.

    g:       Gaussians (means [N, 3], scales [N, 3], quats [N, 4] wxyz, opacities [N],
             colors [N, 3], all float32; opacities and colours in [0, 1])
    cameras: Cameras (viewmats [C, 4, 4], Ks [C, 3, 3] without skew, width W, height H)
    backend: "cpu" (Kiln's renderer: compiled tiles on the host, torch fragments on a CUDA
             device) or "gsplat" (CUDA only; one ``gsplat.rasterization`` call per batch of
             cameras, batches sized by memory)
    device:  "cpu" or a torch device string "cuda[:n]"
    progress: optional ``progress(fraction, message)``, called after each view (gsplat: each batch)
    chunk_scale: multiplies the memory-bound block sizes (the torch renderer's fragment budget,
             gsplat's camera batch) (< 1 after an out-of-memory retry)
    as_tensors: return torch tensors left on ``device`` instead of numpy arrays, so a stage
             on the same device (the bake) takes them without a round trip through the host
    returns Views: rgb [C, H, W, 3] float32 straight colour in [0, 1] (0 where alpha is 0),
             alpha [C, H, W] float32 in [0, 1]; numpy, or torch on ``device`` with ``as_tensors``

    On the host (backend "cpu", device "cpu") torch is not imported unless ``as_tensors``
    asks for tensors: a CPU worker's start-up probe renders through here.
    """
    _validate(g, cameras, backend)
    if not (isinstance(chunk_scale, (int, float)) and 0 < chunk_scale <= 1e3):
        raise StageInputError(f"chunk_scale must be a positive number, got {chunk_scale!r}")
    if backend == "cpu" and device == "cpu":
        rgb, alpha = _render_tiles(g, cameras, progress)
        if as_tensors:
            import torch

            return Views(rgb=torch.from_numpy(rgb), alpha=torch.from_numpy(alpha),  # type: ignore[arg-type]  # tensors (as_tensors)
                         cameras=cameras)
        return Views(rgb=rgb, alpha=alpha, cameras=cameras)
    dev = torch_device(device, "render", backend)
    if backend == "gsplat":
        rgb, alpha = _render_gsplat(g, cameras, dev, progress, chunk_scale, as_tensors)
    else:
        budget = max(1 << 12, int(DEFAULT_FRAGMENT_BUDGET * chunk_scale))
        rgb, alpha = _render_cpu(g, cameras, dev, progress, fragment_budget=budget,
                                 as_tensors=as_tensors)
    return Views(rgb=rgb, alpha=alpha, cameras=cameras)


def _validate(g: Gaussians, cameras: Cameras, backend: str) -> None:
    check_backend("render", backend)
    if not isinstance(g, Gaussians):
        raise StageInputError(f"render_gaussians needs Gaussians, got {type(g).__name__}")
    if not isinstance(cameras, Cameras):
        raise StageInputError(f"render_gaussians needs Cameras, got {type(cameras).__name__}")
    g.validate()
    cameras.validate()
    if cameras.projection != "perspective":
        raise StageInputError(f"the Gaussian renderers take perspective cameras only, got "
                              f"{cameras.projection!r}")
    pixels = len(cameras) * cameras.width * cameras.height
    if pixels > MAX_TOTAL_PIXELS:
        raise StageInputError(f"{len(cameras)} views of {cameras.width}x{cameras.height} are {pixels} "
                              f"pixels, more than the limit {MAX_TOTAL_PIXELS}; use fewer views or a "
                              "lower resolution")
    if (g.opacities < 0).any() or (g.opacities > 1).any():
        raise StageInputError("gaussians.opacities must be in [0, 1] (activated, not logit)")
    if (g.colors < 0).any() or (g.colors > 1).any():
        raise StageInputError("gaussians.colors must be in [0, 1]")
    norms = np.linalg.norm(g.quats.astype(np.float64), axis=1)
    if (norms < 1e-8).any():
        raise StageInputError(f"gaussians.quats has {int((norms < 1e-8).sum())} zero-length quaternions")
    Ks = cameras.Ks
    if (Ks[:, 0, 0] <= 0).any() or (Ks[:, 1, 1] <= 0).any():
        raise StageInputError("cameras.Ks must have positive focal lengths fx, fy")
    if (Ks[:, 0, 1] != 0).any() or (Ks[:, 1, 0] != 0).any() or \
            not np.array_equal(Ks[:, 2], np.broadcast_to(np.array([0, 0, 1], np.float32), Ks[:, 2].shape)):
        raise StageInputError("cameras.Ks must be pinhole intrinsics [[fx,0,cx],[0,fy,cy],[0,0,1]] "
                              "(gsplat ignores skew)")


def _report(progress: Optional[ProgressFn], done: int, total: int) -> None:
    if progress is not None:
        progress(done / total, f"view {done}/{total}")


def _to_straight(premult, alpha):
    """Straight colour from premultiplied: (..., 3) / (...,), 0 where alpha is 0, clipped to [0, 1]."""
    import torch

    a = alpha[..., None]
    rgb = torch.where(a > 0, premult / torch.where(a > 0, a, torch.ones_like(a)), torch.zeros_like(premult))
    return rgb.clamp_(0.0, 1.0)


# ----------------------------------------------------------------------------- gsplat


def load_gsplat():
    """Import gsplat and build/load its CUDA extension now, so a broken install fails
    here with a clear message instead of deep inside the first kernel call.
    Returns ``gsplat.rasterization``."""
    try:
        from gsplat import rasterization
        from gsplat.cuda._backend import _C  # JIT-compiles on first import
    except Exception as e:  # ImportError, compiler errors, torch API mismatches
        raise StageInputError(f"render backend 'gsplat' is not usable here: {type(e).__name__}: {e}") from None
    if _C is None:
        raise StageInputError("render backend 'gsplat' is not usable here: its CUDA extension "
                              "failed to build or load (see gsplat's messages above)")
    return rasterization


def camera_batches(n_cameras: int, n_gaussians: int, width: int, height: int,
                   budget_bytes: int = GSPLAT_BATCH_BYTES) -> list[slice]:
    """Consecutive camera ranges for gsplat calls, each within ``budget_bytes`` of working
    memory by the per-pair and per-pixel estimates above; at least one camera a batch."""
    per_camera = n_gaussians * GSPLAT_PAIR_BYTES + width * height * GSPLAT_PIXEL_BYTES
    size = max(1, min(n_cameras, int(budget_bytes // max(per_camera, 1))))
    # even batches (7 cameras at 3 a batch -> 3, 2, 2), so no call is left nearly empty
    count = -(-n_cameras // size)
    base, extra = divmod(n_cameras, count)
    out, start = [], 0
    for i in range(count):
        stop = start + base + (1 if i < extra else 0)
        out.append(slice(start, stop))
        start = stop
    return out


def _render_gsplat(g: Gaussians, cameras: Cameras, dev, progress, chunk_scale: float = 1.0,
                   as_tensors: bool = False):
    """gsplat on ``dev``, one ``rasterization`` call per batch of cameras: for a batch of B
    cameras it takes viewmats [B, 4, 4] and Ks [B, 3, 3] and returns premultiplied colours
    [B, H, W, 3] and alphas [B, H, W, 1]; the Gaussians are uploaded once for all batches.
    Returns (rgb [C, H, W, 3], alpha [C, H, W]) float32: numpy, or tensors on ``dev``."""
    import torch

    from pipeline.views.gaussian_math import EPS2D, FAR_PLANE, NEAR_PLANE

    rasterization = load_gsplat()

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)

    means, quats, scales = t(g.means), t(g.quats), t(g.scales)
    opacities, colors = t(g.opacities), t(g.colors)
    viewmats, Ks = t(cameras.viewmats), t(cameras.Ks)
    C, H, W = len(cameras), cameras.height, cameras.width
    rgb_out, alpha_out = _view_buffers(C, H, W, dev, as_tensors)
    batches = camera_batches(C, len(g), W, H, int(GSPLAT_BATCH_BYTES * chunk_scale))
    # gsplat launches on the current device's stream: make that the tensors' device.
    # (A CPU device only reaches here in tests, with a stand-in for rasterization.)
    on_device = torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()
    with torch.no_grad(), on_device:
        for b in batches:
            premult, alphas, _meta = rasterization(
                means, quats, scales, opacities, colors, viewmats[b], Ks[b], W, H,
                near_plane=NEAR_PLANE, far_plane=FAR_PLANE, radius_clip=0.0, eps2d=EPS2D,
                sh_degree=None, packed=False, backgrounds=None, render_mode="RGB",
                rasterize_mode="classic", camera_model="pinhole")
            a = alphas[..., 0].float()
            rgb = _to_straight(premult.float(), a)
            a = a.clamp(0.0, 1.0)
            _store(rgb_out, alpha_out, b, rgb, a)
            del premult, alphas, _meta, rgb, a
            _report(progress, b.stop, C)
    return rgb_out, alpha_out


def _view_buffers(C: int, H: int, W: int, dev, as_tensors: bool):
    """Empty (rgb [C, H, W, 3], alpha [C, H, W]) float32 outputs: tensors on ``dev`` or numpy."""
    if as_tensors:
        import torch

        return (torch.empty((C, H, W, 3), dtype=torch.float32, device=dev),
                torch.empty((C, H, W), dtype=torch.float32, device=dev))
    return np.empty((C, H, W, 3), np.float32), np.empty((C, H, W), np.float32)


def _store(rgb_out, alpha_out, index, rgb, alpha) -> None:
    """Put rendered tensors at ``index`` (an int or a slice of views) of the outputs."""
    if isinstance(rgb_out, np.ndarray):
        rgb, alpha = rgb.cpu().numpy(), alpha.cpu().numpy()
    rgb_out[index], alpha_out[index] = rgb, alpha


# ----------------------------------------------------------------------------- own renderer


def _render_tiles(g: Gaussians, cameras: Cameras, progress) -> tuple[np.ndarray, np.ndarray]:
    """Kiln's renderer on the host: numpy projection, compiled tiles (``splat_tiles``), a view
    at a time. Returns numpy (rgb [C, H, W, 3], alpha [C, H, W]) float32, straight colour."""
    from pipeline.views.gaussian_math import covariance_3d

    covars = covariance_3d(g.quats, g.scales)
    C, H, W = len(cameras), cameras.height, cameras.width
    rgb_out, alpha_out = _view_buffers(C, H, W, None, False)
    for i in range(C):
        premult, alpha = render_view_tiles(g, covars, cameras.viewmats[i], cameras.Ks[i], W, H)
        a = alpha[..., None]
        rgb_out[i] = np.clip(np.divide(premult, a, out=np.zeros_like(premult), where=a > 0), 0.0, 1.0)
        alpha_out[i] = alpha
        _report(progress, i + 1, C)
    return rgb_out, alpha_out


def render_view_tiles(g: Gaussians, covars: np.ndarray, viewmat: np.ndarray, K: np.ndarray,
                      width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """One view with the compiled tile renderer: covars (N, 3, 3) float32 from
    ``covariance_3d``. Returns (premultiplied rgb (H, W, 3) float32, alpha (H, W) float32)."""
    from pipeline.views.gaussian_math import project_gaussians
    from pipeline.views.splat_tiles import render_tiles

    proj = project_gaussians(g.means, covars, g.opacities, viewmat, K, width, height)
    return render_tiles(proj.means2d, proj.conics, proj.radii, proj.draw_order(), g.opacities,
                        g.colors, width, height)


def _render_cpu(g: Gaussians, cameras: Cameras, dev, progress,
                fragment_budget: int = DEFAULT_FRAGMENT_BUDGET, as_tensors: bool = False):
    """Kiln's torch renderer on ``dev`` (a CUDA device without gsplat; on the host, tests
    check it against the tiles), a view at a time; its fragment chunks bound the memory.
    Returns (rgb [C, H, W, 3], alpha [C, H, W]) float32: numpy, or tensors on ``dev``."""
    import torch

    from pipeline.views.gaussian_math import covariance_3d

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)

    with torch.no_grad():
        covars = covariance_3d(g.quats, g.scales)
        opacities = t(g.opacities)
        colors = t(g.colors)
        C, H, W = len(cameras), cameras.height, cameras.width
        rgb_out, alpha_out = _view_buffers(C, H, W, dev, as_tensors)
        for i in range(C):
            premult, alpha = render_view(g, covars, opacities, colors, cameras.viewmats[i],
                                         cameras.Ks[i], W, H, fragment_budget=fragment_budget)
            rgb = _to_straight(premult, alpha)
            _store(rgb_out, alpha_out, i, rgb, alpha)
            _report(progress, i + 1, C)
    return rgb_out, alpha_out


@dataclass
class _OnDevice:
    """A ``Projected`` moved to a torch device for the fragment renderer."""

    means2d: Any
    depths: Any
    conics: Any
    radii: Any


def render_view(g: Gaussians, covars: np.ndarray, opacities, colors, viewmat: np.ndarray,
                K: np.ndarray, width: int, height: int, fragment_budget: int = DEFAULT_FRAGMENT_BUDGET):
    """One view with the torch fragment renderer (gsplat's math, see the module docstring).

    g: the Gaussians (numpy); covars (N, 3, 3) float32 numpy from ``covariance_3d``;
    opacities (N,), colors (N, 3): float32 torch tensors on the render device; viewmat
    (4, 4), K (3, 3): numpy. The projection is computed on the host and moved there.
    fragment_budget: most (pixel, Gaussian) fragments generated at once (memory bound).
    returns (premultiplied rgb (H, W, 3) float32, alpha (H, W) float32) tensors on the device
    """
    import torch

    from pipeline.views.gaussian_math import project_gaussians

    dev = opacities.device
    n_pix = width * height
    premult = torch.zeros(n_pix, 3, dtype=torch.float32, device=dev)
    log_t = torch.zeros(n_pix, dtype=torch.float64, device=dev)   # log transmittance so far
    done = torch.zeros(n_pix, dtype=torch.bool, device=dev)       # compositing stopped here

    host = project_gaussians(g.means, covars, g.opacities, viewmat, K, width, height)
    proj = _OnDevice(*(torch.from_numpy(np.ascontiguousarray(a)).to(dev)
                       for a in (host.means2d, host.depths, host.conics, host.radii)))
    vis = torch.from_numpy(host.draw_order()).to(dev)
    # Spans are made for a run of Gaussians at a time (about SPAN_BUDGET rows) so
    # memory stays bounded for many or large Gaussians; compositing carries over.
    my = proj.means2d[vis, 1]
    ry = proj.radii[vis, 1].float()
    nrows = (torch.ceil(my + ry).clamp(0, height) - torch.floor(my - ry).clamp(0, height)).clamp(min=0)
    ends = torch.searchsorted(torch.cumsum(nrows.double(), 0),
                              torch.arange(1, int(nrows.sum()) // SPAN_BUDGET + 1, device=dev,
                                           dtype=torch.float64) * SPAN_BUDGET, right=True)
    bounds = [0] + sorted(set(int(e) for e in ends.tolist()) - {0, vis.numel()}) + [vis.numel()]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        spans = _row_spans(proj, opacities, colors, vis[lo:hi], width, height)
        if spans is not None:
            _composite(spans, premult, log_t, done, width, height, fragment_budget)
    alpha = (1.0 - torch.exp(log_t)).float().clamp_(0.0, 1.0)
    return premult.reshape(height, width, 3), alpha.reshape(height, width)


def _row_spans(proj, opacities, colors, vis, width: int, height: int):
    """Cut the depth-sorted Gaussians ``vis`` (G,) into row spans, front to back.

    A span is one pixel row of one Gaussian's footprint, cut to the pixels whose
    centres lie where the row crosses the ellipse alpha >= ALPHA_MIN (plus
    SPAN_SLACK px; the exact per-fragment test decides). Returns None when empty,
    else a dict of (S,) tensors: ``base`` (int64 flat index of the span's first
    pixel), ``width`` (int64, pixels in the span), ``quad`` (S, 3) float32
    (q2, q1, q0) with alpha = min(ALPHA_MAX, exp(-(q2 k^2 + q1 k + q0))) for the
    pixel k to the right of the first, and ``color`` (S, 3) float32.
    """
    import torch

    from pipeline.views.gaussian_math import ALPHA_MIN

    if vis.numel() == 0:
        return None
    dev = vis.device
    f64 = torch.float64
    mx, my = proj.means2d.index_select(0, vis).to(f64).unbind(-1)
    ca, cb, cc = proj.conics.index_select(0, vis).to(f64).unbind(-1)
    op = opacities.index_select(0, vis).to(f64)
    rx, ry = proj.radii.index_select(0, vis).to(f64).unbind(-1)
    level = 2.0 * torch.log(op / ALPHA_MIN)              # alpha >= ALPHA_MIN <=> d^T conic d <= level
    det = ca * cc - cb * cb

    y0 = torch.floor(my - ry).clamp(0, height).long()
    y1 = torch.ceil(my + ry).clamp(0, height).long()
    nrows = (y1 - y0).clamp(min=0)
    sg = torch.repeat_interleave(torch.arange(vis.numel(), device=dev), nrows)
    if sg.numel() == 0:
        return None
    first = torch.cumsum(nrows, 0) - nrows
    row = (torch.arange(sg.numel(), device=dev) - first.index_select(0, sg)) + y0.index_select(0, sg)

    per_g = torch.stack([mx, my, ca, cb, cc, level, det, mx - rx, mx + rx, torch.log(op)], 1)
    smx, smy, sa, sb, sc, slevel, sdet, sbx0, sbx1, slog_op = per_g.index_select(0, sg).unbind(1)
    dy = smy - (row.to(f64) + 0.5)
    # Along the row, d^T conic d = a u^2 + 2 b dy u + c dy^2 with u = mx - px; its
    # roots in u bound the pixels that can reach ALPHA_MIN.
    disc = sa * slevel - dy * dy * sdet
    half = torch.sqrt(disc.clamp(min=0)) / sa
    centre = smx + sb * dy / sa                           # px where this row's sigma is smallest
    lo = torch.maximum(centre - half, sbx0) - SPAN_SLACK
    hi = torch.minimum(centre + half, sbx1) + SPAN_SLACK
    x0 = torch.ceil(lo - 0.5).clamp(0, width)             # first pixel whose centre x0+0.5 >= lo
    x1 = (torch.floor(hi - 0.5) + 1).clamp(0, width)      # one past the last centre <= hi
    keep = ((disc >= 0) & (x1 > x0)).nonzero().squeeze(1)
    if keep.numel() == 0:
        return None
    sa, sb, sc, dy, slog_op, smx, x0, x1, row = (
        t.index_select(0, keep) for t in (sa, sb, sc, dy, slog_op, smx, x0, x1, row))
    # sigma(k) at pixel x0 + k: u = u0 - k with u0 = mx - (x0 + 0.5); opacity folded
    # in as -log(op) so one exp gives alpha.
    u0 = smx - (x0 + 0.5)
    q2 = 0.5 * sa
    q1 = -(sa * u0 + sb * dy)
    q0 = 0.5 * sa * u0 * u0 + sb * dy * u0 + 0.5 * sc * dy * dy - slog_op
    gid = vis.index_select(0, sg.index_select(0, keep))
    return {
        "base": row * width + x0.long(),
        "width": (x1 - x0).long(),
        "quad": torch.stack([q2, q1, q0], 1).float(),
        "color": colors.index_select(0, gid),
    }


def _composite(spans: dict, premult, log_t, done, width: int, height: int, fragment_budget: int) -> None:
    """Composite row spans (front to back) into ``premult`` (P, 3), ``log_t`` (P,) float64
    and ``done`` (P,) bool, in place; P = width * height."""
    import torch

    from pipeline.views.gaussian_math import ALPHA_MAX, ALPHA_MIN, T_MIN

    dev = premult.device
    log_tmin = math.log(T_MIN)
    neg_log_amin = -math.log(ALPHA_MIN)
    base, span_w, quad, color = spans["base"], spans["width"], spans["quad"], spans["color"]
    # flat index into a (H, W+1) table of per-row prefix sums: row * (W+1) + column
    row = torch.div(base, width, rounding_mode="floor")
    pref0 = base + row
    n_spans = base.numel()
    pos = 0
    while pos < n_spans:
        # Drop spans whose pixels are all finished (prefix sums of `done` per row),
        # then take as many of the rest as fit in the budget.
        done_rows = torch.zeros(height, width + 1, dtype=torch.int32, device=dev)
        done_rows[:, 1:] = torch.cumsum(done.view(height, width), 1, dtype=torch.int32)
        done_rows = done_rows.view(-1)
        r0, rw = pref0[pos:], span_w[pos:]
        n_done = done_rows.index_select(0, r0 + rw) - done_rows.index_select(0, r0)
        live_w = rw * (n_done < rw)
        cum = torch.cumsum(live_w, 0)
        take = max(1, int(torch.searchsorted(cum, fragment_budget, right=True)))
        idx = pos + (live_w[:take] > 0).nonzero().squeeze(1)
        pos += take
        if idx.numel() == 0:
            continue

        # Fragments of the chosen spans, still in depth order.
        w = span_w.index_select(0, idx)
        n_frag = int(cum[take - 1])
        fspan = torch.repeat_interleave(idx, w, output_size=n_frag)   # span of each fragment
        start = torch.cumsum(w, 0) - w
        k = torch.arange(n_frag, device=dev) - torch.repeat_interleave(start, w, output_size=n_frag)
        q = quad.index_select(0, fspan)
        kf = k.float()
        e = (q[:, 0] * kf + q[:, 1]) * kf + q[:, 2]          # sigma - log(opacity)
        pix = base.index_select(0, fspan) + k
        ok = ((e <= neg_log_amin) & ~done.index_select(0, pix)).nonzero().squeeze(1)
        del q, kf, k, start
        if ok.numel() == 0:
            continue
        alpha = torch.exp(-e.index_select(0, ok)).clamp_(max=ALPHA_MAX)
        pix = pix.index_select(0, ok).to(torch.int32)
        fspan = fspan.index_select(0, ok)
        del e, ok

        # Stable sort by pixel keeps front-to-back order within each pixel.
        pix, perm = torch.sort(pix, stable=True)
        pix = pix.long()
        alpha = alpha.index_select(0, perm).double()
        fspan = fspan.index_select(0, perm)
        la = torch.log1p(-alpha)
        incl = torch.cumsum(la, 0)
        _, counts = torch.unique_consecutive(pix, return_counts=True)
        seg_end = torch.cumsum(counts, 0) - 1
        before = torch.cat([incl.new_zeros(1), incl.index_select(0, seg_end[:-1])])
        # log T after each fragment, continuing from the pixel's earlier chunks
        s = log_t.index_select(0, pix) + incl - torch.repeat_interleave(before, counts, output_size=pix.numel())
        # log(1-alpha) <= 0 makes s non-increasing within a pixel, so the composited
        # fragments are exactly a prefix: gsplat's "stop before next_T <= T_MIN".
        inc = s > log_tmin
        weight = (alpha * torch.exp(s - la)).float() * inc
        premult.index_add_(0, pix, color.index_select(0, fspan) * weight[:, None])
        log_t.index_add_(0, pix, la * inc)
        done.index_fill_(0, pix.masked_select(~inc), True)
