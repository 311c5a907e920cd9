"""The compiled steps of ``pipeline.texture.opt.host`` (see there for the fit they make).

Imports numba at the top: ``host`` imports this module only when it runs. Every loop is
parallel over what it writes (pixels, texels or texture entries), never scattering into a
shared array, so no two threads add to one value. ``cache=True``: compiled once into
``__pycache__`` (``pipeline/kernels.py``).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, parallel=True)
def residual_signs(idx, w, tex, target, sign, want_l1):
    """sign (M, 3) int8 = the sign of the texture's bilinear lookups (taps idx (M, 4), weights
    w (M, 4)) minus target (M, 3): all the L1 gradient needs, a quarter of the residuals'
    bytes for the transpose to gather. Returns the residuals' mean |r| when ``want_l1``."""
    m = idx.shape[0]
    total = 0.0
    for i in numba.prange(m):
        row = 0.0
        for c in range(3):
            v = (w[i, 0] * tex[idx[i, 0], c] + w[i, 1] * tex[idx[i, 1], c]
                 + w[i, 2] * tex[idx[i, 2], c] + w[i, 3] * tex[idx[i, 3], c]) - target[i, c]
            sign[i, c] = np.int8((v > 0) - (v < 0))
            row += abs(v)
        if want_l1:
            total += row
    return total / max(3 * m, 1) if want_l1 else 0.0


@numba.njit(cache=True, nogil=True, parallel=True)
def residual(idx, w, tex, target, out):
    """out (M, 3) = the texture's bilinear lookups minus target (for the fit's first PSNR)."""
    for i in numba.prange(idx.shape[0]):
        for c in range(3):
            out[i, c] = (w[i, 0] * tex[idx[i, 0], c] + w[i, 1] * tex[idx[i, 1], c]
                         + w[i, 2] * tex[idx[i, 2], c] + w[i, 3] * tex[idx[i, 3], c]) - target[i, c]


@numba.njit(cache=True, nogil=True, parallel=True)
def sign_gradient(trow, rows, vals, sign, grad):
    """grad (T, 3) = the lookups' transpose applied to the residuals' signs: per texel t, the
    sum over the lookups that read it (CSR: ``trow`` (T + 1,), ``rows``/``vals`` their pixel
    and weight)."""
    for t in numba.prange(grad.shape[0]):
        g0 = np.float32(0.0)
        g1 = np.float32(0.0)
        g2 = np.float32(0.0)
        for e in range(trow[t], trow[t + 1]):
            r = rows[e]
            v = vals[e]
            g0 += v * sign[r, 0]
            g1 += v * sign[r, 1]
            g2 += v * sign[r, 2]
        grad[t, 0] = g0
        grad[t, 1] = g1
        grad[t, 2] = g2


@numba.njit(cache=True, nogil=True, parallel=True)
def add_tv(flat, gflat, shift_x, w_x, shift_y, w_y):
    """Anisotropic L1 TV's gradient for the pairs (i, i + shift_x) and (i, i + shift_y) of the
    flat texture, weighted by w_x (len - shift_x,) and w_y (len - shift_y,), added to gflat:
    entry j gains each pair it ends and loses each it starts (x pairs first, then y)."""
    n = flat.shape[0]
    for j in numba.prange(n):
        g = gflat[j]
        f = flat[j]
        if j >= shift_x:
            g += np.sign(f - flat[j - shift_x]) * w_x[j - shift_x]
        if j < n - shift_x:
            g -= np.sign(flat[j + shift_x] - f) * w_x[j]
        if j >= shift_y:
            g += np.sign(f - flat[j - shift_y]) * w_y[j - shift_y]
        if j < n - shift_y:
            g -= np.sign(flat[j + shift_y] - f) * w_y[j]
        gflat[j] = g


@numba.njit(cache=True, nogil=True, parallel=True)
def adam_step(param, grad, m, v, lr, beta1, beta2, eps, t, lo, hi):
    """One Adam step (Kingma & Ba) on the flat ``param`` in place, then clamped to [lo, hi];
    in float32, as the torch loop computes it."""
    b1 = np.float32(beta1)
    b2 = np.float32(beta2)
    one_b1 = np.float32(1.0 - beta1)
    one_b2 = np.float32(1.0 - beta2)
    inv_bias2 = np.float32(1.0 / (1.0 - beta2 ** t))
    step = np.float32(lr / (1.0 - beta1 ** t))
    e = np.float32(eps)
    flo = np.float32(lo)
    fhi = np.float32(hi)
    for i in numba.prange(param.shape[0]):
        g = grad[i]
        mi = m[i] * b1 + one_b1 * g
        vi = v[i] * b2 + one_b2 * g * g
        m[i] = mi
        v[i] = vi
        p = param[i] - step * mi / (np.sqrt(vi * inv_bias2) + e)
        param[i] = min(max(p, flo), fhi)


@numba.njit(cache=True, nogil=True, parallel=True)
def signs_scattered(idx, w, tex, target, buffers, want_l1):
    """The sign gradient in one pass over the pixels, for atlases small enough to keep one
    gradient per thread: block b of the pixels adds w * sign(residual) into ``buffers[b]``
    (B, T, 3), which ``sum_buffers`` then adds up. Returns the residuals' mean |r| when
    ``want_l1``. Cheaper than the transpose's gather when the texels are few and the pixels
    many (opt's coarse correction: 64k texels, 544k pixels on the toy)."""
    m = idx.shape[0]
    n_blocks = buffers.shape[0]
    per = (m + n_blocks - 1) // n_blocks
    totals = np.zeros(n_blocks)
    for b in numba.prange(n_blocks):
        buf = buffers[b]
        buf[:] = 0.0
        total = 0.0
        for i in range(b * per, min(m, (b + 1) * per)):
            t0, t1, t2, t3 = idx[i, 0], idx[i, 1], idx[i, 2], idx[i, 3]
            w0, w1, w2, w3 = w[i, 0], w[i, 1], w[i, 2], w[i, 3]
            v0 = (w0 * tex[t0, 0] + w1 * tex[t1, 0] + w2 * tex[t2, 0] + w3 * tex[t3, 0]) - target[i, 0]
            v1 = (w0 * tex[t0, 1] + w1 * tex[t1, 1] + w2 * tex[t2, 1] + w3 * tex[t3, 1]) - target[i, 1]
            v2 = (w0 * tex[t0, 2] + w1 * tex[t1, 2] + w2 * tex[t2, 2] + w3 * tex[t3, 2]) - target[i, 2]
            if want_l1:
                total += abs(v0) + abs(v1) + abs(v2)
            s0 = np.float32((v0 > 0) - (v0 < 0))
            s1 = np.float32((v1 > 0) - (v1 < 0))
            s2 = np.float32((v2 > 0) - (v2 < 0))
            for t, wk in ((t0, w0), (t1, w1), (t2, w2), (t3, w3)):
                buf[t, 0] += wk * s0
                buf[t, 1] += wk * s1
                buf[t, 2] += wk * s2
        totals[b] = total
    return totals.sum() / max(3 * m, 1) if want_l1 else 0.0


@numba.njit(cache=True, nogil=True, parallel=True)
def sum_buffers(buffers, grad):
    """grad (T, 3) = the sum of buffers (B, T, 3) over B, in block order."""
    for t in numba.prange(grad.shape[0]):
        for c in range(3):
            g = np.float32(0.0)
            for b in range(buffers.shape[0]):
                g += buffers[b, t, c]
            grad[t, c] = g
