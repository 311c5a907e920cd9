"""The opt bake's texture fit on the host, without torch.

The same fit as the loop on a device (``pipeline.texture.bake._optimise``): the texture's
bilinear lookups at the target pixels' UVs against the pixels' colours, L1, plus an
anisotropic L1 total variation between neighbouring chart texels, minimised by Adam with the
cosine learning rate and the stall stop of ``schedule``, the texture clamped to ``bounds``
after each step. Each step is a few compiled passes (``host_kernels``): the lookups and their
residuals per pixel, the sign gradient gathered per texel through the lookups' transpose, the
TV pairs and Adam per entry; every pass parallel over what it writes.

The bilinear taps (``bilinear_taps``) are computed here for both loops: the device loop
moves them to its device.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from kiln.settings import BakeSettings

from pipeline.texture.opt.schedule import StallSchedule

ProgressFn = Callable[[float, str], None]

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
# per-thread gradients (4 bytes x 3 channels a texel each) are kept within this many bytes;
# beyond, the gradient is gathered through the lookups' transpose instead
SCATTER_BYTES = 64 << 20


def bilinear_taps(uv: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The 4 texels and weights a bilinear lookup at ``uv`` reads.

    uv: (N, 2) float32. Returns idx (N, 4) int64 flat texel indices (row * size + col)
    and w (N, 4) float32, rows summing to 1. The continuous texel coordinate is clamped to
    the outer texel centres, so indices never repeat within a row and border texels extend
    outwards.
    """
    if size < 2:
        raise ValueError("bilinear sampling needs a texture of at least 2x2")
    uv = np.asarray(uv, np.float32)
    x = np.clip(uv[:, 0] * np.float32(size) - np.float32(0.5), 0.0, size - 1.0).astype(np.float32)
    y = np.clip((np.float32(1.0) - uv[:, 1]) * np.float32(size) - np.float32(0.5), 0.0, size - 1.0).astype(np.float32)
    x0 = np.minimum(np.floor(x), size - 2)
    y0 = np.minimum(np.floor(y), size - 2)
    fx = (x - x0)[:, None]
    fy = (y - y0)[:, None]
    base = (y0.astype(np.int64) * size + x0.astype(np.int64))[:, None]
    idx = base + np.array([0, 1, size, size + 1], np.int64)
    w = np.concatenate([(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy], 1)
    return idx, w.astype(np.float32)


def tv_pair_weights(chart: np.ndarray, tv_weight: float) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Per-entry weights of TV's neighbour pairs on the flat (S*S*3) texture, or (None, None).

    Entry i of tv_x weights the pair (i, i + 3) (right neighbour, same channel), entry i of
    tv_y the pair (i, i + 3 S) (lower neighbour); both lengths are trimmed to match the
    shifted slices. Only pairs with both texels inside a chart count: gutter texels must not
    pull chart edges towards other charts.
    """
    if tv_weight <= 0:
        return None, None
    size = chart.shape[0]
    both_x = np.zeros((size, size), bool)
    both_x[:, :-1] = chart[:, 1:] & chart[:, :-1]
    both_y = np.zeros((size, size), bool)
    both_y[:-1] = chart[1:] & chart[:-1]
    scale = tv_weight / (max(int(both_x.sum() + both_y.sum()), 1) * 3.0)   # mean over pairs and channels
    weights = []
    for both, shift in ((both_x, 3), (both_y, 3 * size)):
        w = np.repeat(both.reshape(-1), 3).astype(np.float32) * np.float32(scale)
        weights.append(np.ascontiguousarray(w[:-shift]))
    return weights[0], weights[1]


def transpose_taps(idx: np.ndarray, w: np.ndarray, n_texels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lookups' transpose in CSR form: per texel, the (pixel, weight) pairs that read it,
    in pixel order. Returns (trow (T + 1,) int64, rows (4M,) int64, vals (4M,) float32)."""
    cols = idx.reshape(-1)
    order = np.argsort(cols, kind="stable")
    trow = np.zeros(n_texels + 1, np.int64)
    trow[1:] = np.cumsum(np.bincount(cols, minlength=n_texels))
    rows = np.repeat(np.arange(len(idx), dtype=np.int64), 4)[order]
    return trow, rows, np.ascontiguousarray(w.reshape(-1)[order])


def optimise(init: np.ndarray, chart: np.ndarray, pixel_uv: np.ndarray, target: np.ndarray,
             settings: BakeSettings, progress: ProgressFn, bounds: tuple = (0.0, 1.0)
             ) -> tuple[np.ndarray, np.ndarray, float, int]:
    """Adam on the texture against the compact list of target pixels, on the host.

    init (S, S, 3) float32, chart (S, S) bool, pixel_uv (M, 2), target (M, 3) numpy.
    Returns (texture (S, S, 3) float32, touched (S, S) bool: texels some pixel samples,
    PSNR of ``init`` on the targets, the steps taken: ``settings.steps``, or fewer when L1
    stalled (``schedule.StallSchedule``)).
    """
    from pipeline.texture.opt import host_kernels as k

    size = init.shape[0]
    n_texels = size * size
    idx, w = bilinear_taps(pixel_uv, size)
    # neighbouring pixels then read neighbouring texels: the passes stay cache friendly
    order = np.argsort(idx[:, 0], kind="stable")
    idx, w = np.ascontiguousarray(idx[order]), np.ascontiguousarray(w[order])
    tgt = np.ascontiguousarray(np.asarray(target, np.float32)[order])
    m = len(idx)
    blocks = _scatter_blocks(n_texels)
    if blocks:
        buffers = np.empty((blocks, n_texels, 3), np.float32)
    else:
        trow, rows, vals = transpose_taps(idx, w, n_texels)

    tex = np.ascontiguousarray(init, np.float32).reshape(n_texels, 3).copy()
    resid = np.empty_like(tgt)
    k.residual(idx, w, tex, tgt, resid)
    fast_psnr = -10.0 * math.log10(max(float(np.mean(resid.astype(np.float64) ** 2)), 1e-10))
    del resid
    sign = np.empty(tgt.shape if not blocks else (0, 3), np.int8)

    # Adam is invariant to the loss scale, so drop the 1/(3M) of the mean: per-pixel
    # gradients of ~1 keep Adam's second moments far from float32 denormals
    tv_x, tv_y = tv_pair_weights(chart, float(settings.tv_weight) * 3.0 * m)
    grad = np.empty_like(tex)
    m1 = np.zeros(n_texels * 3, np.float32)
    m2 = np.zeros(n_texels * 3, np.float32)
    flat, gflat = tex.reshape(-1), grad.reshape(-1)
    lo, hi = float(bounds[0]), float(bounds[1])
    schedule = StallSchedule.for_settings(int(settings.steps), settings.stop_when_stalled)
    step = 0
    while step < schedule.end:
        lr, check_now, report_now = schedule.plan(step, settings.lr)
        want_l1 = report_now or check_now
        if blocks:
            l1 = k.signs_scattered(idx, w, tex, tgt, buffers, want_l1)        # of rendered - target
            k.sum_buffers(buffers, grad)
        else:
            l1 = k.residual_signs(idx, w, tex, tgt, sign, want_l1)
            k.sign_gradient(trow, rows, vals, sign, grad)
        if check_now:
            schedule.observe(step, l1)
        if tv_x is not None and tv_y is not None:
            k.add_tv(flat, gflat, 3, tv_x, 3 * size, tv_y)
        k.adam_step(flat, gflat, m1, m2, lr, ADAM_BETAS[0], ADAM_BETAS[1], ADAM_EPS, step + 1, lo, hi)
        step += 1
        if report_now:
            progress(step / schedule.end, schedule.message(step, l1))

    touched = np.zeros(n_texels, bool)
    touched[idx.reshape(-1)[w.reshape(-1) > 0]] = True
    return tex.reshape(size, size, 3), touched.reshape(size, size), fast_psnr, step


def _scatter_blocks(n_texels: int) -> int:
    """How many pixel blocks scatter their sign gradients into gradients of their own (one a
    thread, as many as fit in SCATTER_BYTES), or 0: gather through the transpose instead."""
    import numba

    blocks = min(numba.get_num_threads(), SCATTER_BYTES // (n_texels * 12))
    return blocks if blocks >= 2 else 0
