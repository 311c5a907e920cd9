"""The compiled kernels of ``pipeline.views.splat_tiles`` (see there for the math).

This module imports numba at the top: import it only when a view is rendered on the CPU.
``cache=True`` keeps the machine code in ``__pycache__`` so that only the first run after an
install compiles (a few seconds).
"""

from __future__ import annotations

import math

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def tile_range(m, r, tile, n_tiles):
    # gsplat's isect_tiles: tiles [floor((m - r) / tile), ceil((m + r) / tile)), clamped
    lo = min(max(0, int(math.floor((m - r) / tile))), n_tiles)
    hi = min(max(0, int(math.ceil((m + r) / tile))), n_tiles)
    return lo, hi


@numba.njit(cache=True, nogil=True)
def _pairs(means2d, radii, order, tile, ntx, nty, counts, fill, ids, write):
    """Visit every (tile, Gaussian) pair in draw order: count them per tile (into counts[t + 1])
    or, with ``write``, put each Gaussian at its tile's next free place in ``ids``."""
    for k in range(order.shape[0]):
        g = order[k]
        x0, x1 = tile_range(means2d[g, 0], radii[g, 0], tile, ntx)
        y0, y1 = tile_range(means2d[g, 1], radii[g, 1], tile, nty)
        for ty in range(y0, y1):
            for tx in range(x0, x1):
                t = ty * ntx + tx
                if write:
                    ids[fill[t]] = g
                    fill[t] += 1
                else:
                    counts[t + 1] += 1


@numba.njit(cache=True, nogil=True)
def bin_tiles(means2d, radii, order, width, height, tile):
    """Per tile, the Gaussians touching it in draw order: (start (T + 1,), ids). One pass
    sizes the lists, the next fills them."""
    ntx = (width + tile - 1) // tile
    nty = (height + tile - 1) // tile
    counts = np.zeros(ntx * nty + 1, np.int64)
    none = np.zeros(0, np.int64)
    _pairs(means2d, radii, order, tile, ntx, nty, counts, none, none, False)
    start = np.cumsum(counts)
    fill = start[:-1].copy()
    ids = np.empty(start[-1], np.int64)
    _pairs(means2d, radii, order, tile, ntx, nty, counts, fill, ids, True)
    return start, ids


@numba.njit(cache=True, nogil=True, parallel=True)
def composite(means2d, conics, radii, opacities, colors, start, ids, width, height, tile,
              premult, alpha):
    ntx = (width + tile - 1) // tile
    nty = (height + tile - 1) // tile
    alpha_min = 1.0 / 255.0
    for t in numba.prange(ntx * nty):
        tx0 = (t % ntx) * tile
        ty0 = (t // ntx) * tile
        tx1 = min(tx0 + tile, width)
        ty1 = min(ty0 + tile, height)
        tw = tx1 - tx0
        n_pix = tw * (ty1 - ty0)
        trans = np.ones(n_pix, np.float64)
        acc = np.zeros((n_pix, 3), np.float64)
        done = np.zeros(n_pix, np.bool_)
        n_done = 0
        for k in range(start[t], start[t + 1]):
            if n_done == n_pix:
                break
            g = ids[k]
            mx = np.float64(means2d[g, 0])
            my = np.float64(means2d[g, 1])
            rx = np.float64(radii[g, 0])
            ry = np.float64(radii[g, 1])
            ca = np.float64(conics[g, 0])
            cb = np.float64(conics[g, 1])
            cc = np.float64(conics[g, 2])
            op = np.float64(opacities[g])
            # alpha < 1/255 exactly where sigma > log(255 op): most of a footprint's box,
            # skipped before the exp (the exact test below still decides at the border)
            sigma_max = math.log(op / alpha_min) + 1e-9
            # pixel centres inside the footprint box, within this tile
            x0 = max(tx0, int(math.ceil(mx - rx - 0.5)))
            x1 = min(tx1, int(math.floor(mx + rx - 0.5)) + 1)
            y0 = max(ty0, int(math.ceil(my - ry - 0.5)))
            y1 = min(ty1, int(math.floor(my + ry - 0.5)) + 1)
            det = ca * cc - cb * cb
            for py in range(y0, y1):
                dy = my - (py + 0.5)
                # this row's pixels with sigma <= sigma_max: the roots in dx of
                # 0.5 ca dx^2 + cb dy dx + 0.5 cc dy^2 = sigma_max (one pixel of slack)
                disc = 2.0 * ca * sigma_max - dy * dy * det
                if disc < 0.0 or ca <= 0.0:
                    continue
                half = math.sqrt(disc) / ca
                centre = mx + cb * dy / ca - 0.5          # px where this row's sigma is least
                rx0 = max(x0, int(math.floor(centre - half)))
                rx1 = min(x1, int(math.ceil(centre + half)) + 1)
                row = (py - ty0) * tw - tx0
                for px in range(rx0, rx1):
                    i = row + px
                    if done[i]:
                        continue
                    dx = mx - (px + 0.5)
                    sigma = 0.5 * (ca * dx * dx + cc * dy * dy) + cb * dx * dy
                    if sigma < 0.0 or sigma > sigma_max:
                        continue
                    a = min(0.999, op * math.exp(-sigma))
                    if a < alpha_min:
                        continue
                    next_t = trans[i] * (1.0 - a)
                    if next_t <= 1e-4:
                        done[i] = True
                        n_done += 1
                        continue
                    w = a * trans[i]
                    acc[i, 0] += colors[g, 0] * w
                    acc[i, 1] += colors[g, 1] * w
                    acc[i, 2] += colors[g, 2] * w
                    trans[i] = next_t
        for py in range(ty0, ty1):
            for px in range(tx0, tx1):
                i = (py - ty0) * tw + px - tx0
                premult[py, px, 0] = acc[i, 0]
                premult[py, px, 1] = acc[i, 1]
                premult[py, px, 2] = acc[i, 2]
                alpha[py, px] = 1.0 - trans[i]

