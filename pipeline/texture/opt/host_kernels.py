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
