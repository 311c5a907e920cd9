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
def residual(idx, w, tex, target, out, want_l1):
    """out (M, 3) = the texture's bilinear lookups (taps idx (M, 4), weights w (M, 4)) minus
    target (M, 3); returns mean |out| when ``want_l1``, else 0."""
    m = idx.shape[0]
    total = 0.0
    for i in numba.prange(m):
        row = 0.0
        for c in range(3):
            v = (w[i, 0] * tex[idx[i, 0], c] + w[i, 1] * tex[idx[i, 1], c]
                 + w[i, 2] * tex[idx[i, 2], c] + w[i, 3] * tex[idx[i, 3], c]) - target[i, c]
            out[i, c] = v
            row += abs(v)
        if want_l1:
            total += row
    return total / max(3 * m, 1) if want_l1 else 0.0


@numba.njit(cache=True, nogil=True, parallel=True)
def sign_gradient(trow, rows, vals, resid, grad):
    """grad (T, 3) = the lookups' transpose applied to sign(resid): per texel t, the sum over
    the lookups that read it (CSR: ``trow`` (T + 1,), ``rows``/``vals`` their pixel and weight)."""
    for t in numba.prange(grad.shape[0]):
        g0 = 0.0
        g1 = 0.0
        g2 = 0.0
        for e in range(trow[t], trow[t + 1]):
            r = rows[e]
            v = vals[e]
            g0 += v * np.sign(resid[r, 0])
            g1 += v * np.sign(resid[r, 1])
            g2 += v * np.sign(resid[r, 2])
        grad[t, 0] = g0
        grad[t, 1] = g1
        grad[t, 2] = g2


@numba.njit(cache=True, nogil=True, parallel=True)
def add_tv(flat, gflat, shift, pair_w):
    """Anisotropic L1 TV's gradient for the pairs (i, i + shift) of the flat texture, weighted
    by pair_w (len(flat) - shift,), added to gflat: entry j gains the pair it ends and loses
    the one it starts."""
    n = flat.shape[0]
    for j in numba.prange(n):
        g = gflat[j]
        if j >= shift:
            i = j - shift
            g += np.sign(flat[j] - flat[i]) * pair_w[i]
        if j < n - shift:
            g -= np.sign(flat[j + shift] - flat[j]) * pair_w[j]
        gflat[j] = g


@numba.njit(cache=True, nogil=True, parallel=True)
def adam_step(param, grad, m, v, lr, beta1, beta2, eps, t, lo, hi):
    """One Adam step (Kingma & Ba) on the flat ``param`` in place, then clamped to [lo, hi]."""
    bias1 = 1.0 - beta1 ** t
    bias2 = 1.0 - beta2 ** t
    step = lr / bias1
    for i in numba.prange(param.shape[0]):
        g = grad[i]
        mi = m[i] * beta1 + (1.0 - beta1) * g
        vi = v[i] * beta2 + (1.0 - beta2) * g * g
        m[i] = mi
        v[i] = vi
        p = param[i] - step * mi / (np.sqrt(vi / bias2) + eps)
        param[i] = min(max(p, lo), hi)
