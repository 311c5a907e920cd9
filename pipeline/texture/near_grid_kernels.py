"""The compiled kernels of ``pipeline.texture.near_grid`` (see there for what they compute).

This module imports numba at the top: import it only when a grid is built or queried.
``cache=True`` keeps the machine code in ``__pycache__``, so only the first run after an
install compiles.
"""

from __future__ import annotations

import math

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def cell_of(x, origin, cell):
    return int(math.floor((x - origin) / cell))


@numba.njit(cache=True, nogil=True)
def build(points, origin, cell, dims):
    """Counting sort of the points by cell: (start (cells + 1,) int64, order (M,) int64), the
    points of cell c being order[start[c]:start[c + 1]], in their own order."""
    nx, ny, nz = dims[0], dims[1], dims[2]
    m = points.shape[0]
    key = np.empty(m, np.int64)
    counts = np.zeros(nx * ny * nz + 1, np.int64)
    for i in range(m):
        cx = min(max(cell_of(points[i, 0], origin[0], cell), 0), nx - 1)
        cy = min(max(cell_of(points[i, 1], origin[1], cell), 0), ny - 1)
        cz = min(max(cell_of(points[i, 2], origin[2], cell), 0), nz - 1)
        key[i] = (cx * ny + cy) * nz + cz
        counts[key[i] + 1] += 1
    start = np.cumsum(counts)
    fill = start[:-1].copy()
    order = np.empty(m, np.int64)
    for i in range(m):
        order[fill[key[i]]] = i
        fill[key[i]] += 1
    return start, order


@numba.njit(cache=True, nogil=True)
def _gap(x, lo, hi):
    # distance from x to the interval [lo, hi] (0 inside)
    if x < lo:
        return lo - x
    if x > hi:
        return x - hi
    return 0.0


@numba.njit(cache=True, nogil=True)
def _lo(origin, cell, i):
    # a cell's lower edge; the outer cells reach to infinity, as the points clamped into them do
    return origin + i * cell if i > 0 else -np.inf


@numba.njit(cache=True, nogil=True)
def _hi(origin, cell, i, n):
    return origin + (i + 1) * cell if i < n - 1 else np.inf


@numba.njit(cache=True, nogil=True)
def _scan(ordered, start, order, c, x, y, z, best, found):
    # the points of cell c (stored one after another in ``ordered``) against the best so far;
    # a tie keeps the lower index
    m = ordered.shape[0]
    for k in range(start[c], start[c + 1]):
        dx = x - ordered[k, 0]
        dy = y - ordered[k, 1]
        dz = z - ordered[k, 2]
        d = dx * dx + dy * dy + dz * dz
        if d <= best:
            p = order[k]
            if d < best or p < found < m:
                best = d
                found = p
    return best, found


@numba.njit(cache=True, nogil=True)
def nearest_one(ordered, start, order, origin, cell, dims, x, y, z, r2):
    """(squared distance, index) of the nearest point to (x, y, z) closer than sqrt(r2), or
    (r2, len(points)). The query's own cell first: what it finds prunes the other 26."""
    nx, ny, nz = dims[0], dims[1], dims[2]
    m = ordered.shape[0]
    cx, cy, cz = cell_of(x, origin[0], cell), cell_of(y, origin[1], cell), cell_of(z, origin[2], cell)
    best = r2
    found = m
    own = 0 <= cx < nx and 0 <= cy < ny and 0 <= cz < nz
    if own:
        best, found = _scan(ordered, start, order, (cx * ny + cy) * nz + cz, x, y, z, best, found)
    for ix in range(max(cx - 1, 0), min(cx + 2, nx)):
        gx = _gap(x, _lo(origin[0], cell, ix), _hi(origin[0], cell, ix, nx))
        for iy in range(max(cy - 1, 0), min(cy + 2, ny)):
            gy = _gap(y, _lo(origin[1], cell, iy), _hi(origin[1], cell, iy, ny))
            for iz in range(max(cz - 1, 0), min(cz + 2, nz)):
                if own and ix == cx and iy == cy and iz == cz:
                    continue
                gz = _gap(z, _lo(origin[2], cell, iz), _hi(origin[2], cell, iz, nz))
                if gx * gx + gy * gy + gz * gz > best:
                    continue
                best, found = _scan(ordered, start, order, (ix * ny + iy) * nz + iz, x, y, z, best, found)
    return best, found


@numba.njit(cache=True, nogil=True)
def query(ordered, start, order, origin, cell, dims, queries, radius, dist, idx):
    """Per query, the nearest point closer than ``radius`` (strictly, as cKDTree's
    ``distance_upper_bound``): its distance into ``dist`` and index into ``idx``, else inf and
    len(points). ``cell`` >= ``radius``, so the 3 x 3 x 3 cells around a query's own hold every
    candidate. One thread: the symmetry search's queries are small and many, and on 2 busy
    cores numba's threads made them slower, not faster."""
    for q in range(queries.shape[0]):
        _answer(ordered, start, order, origin, cell, dims, queries, radius, dist, idx, q)


@numba.njit(cache=True, nogil=True)
def _answer(ordered, start, order, origin, cell, dims, queries, radius, dist, idx, q):
    best, found = nearest_one(ordered, start, order, origin, cell, dims, queries[q, 0], queries[q, 1],
                              queries[q, 2], radius * radius)
    if found < ordered.shape[0]:
        dist[q] = math.sqrt(best)
        idx[q] = found
    else:
        dist[q] = np.inf
        idx[q] = ordered.shape[0]
