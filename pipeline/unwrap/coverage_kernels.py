"""The compiled loop of ``pipeline.unwrap.uv_metrics.coverage`` (see there for the rule).

Imports numba at the top: ``uv_metrics`` imports this module only when it counts. Each
triangle visits the texel centres of its bounding box once; the numpy version it replaced
built every (triangle, candidate texel) pair as arrays (0.08 s a call on a 6k-face atlas at
1024², a quarter of the UV stage). ``cache=True``: compiled once into ``__pycache__``.
"""

from __future__ import annotations

import math

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _covered(p, faces, f, col, row, inset):
    """Whether texel centre (col, row) lies inside face f, shrunk by ``inset``; -1 for a
    degenerate face. The barycentric formulae and their order are those of the numpy
    version, so the decision on a centre is the same to the bit."""
    ax, ay = p[faces[f, 0], 0], p[faces[f, 0], 1]
    bx, by = p[faces[f, 1], 0], p[faces[f, 1], 1]
    cx, cy = p[faces[f, 2], 0], p[faces[f, 2], 1]
    d = (bx - ax) * (cy - ay) - (cx - ax) * (by - ay)
    px, py = col + 0.5, row + 0.5
    w1 = ((px - ax) * (cy - ay) - (cx - ax) * (py - ay)) / d
    w2 = ((bx - ax) * (py - ay) - (px - ax) * (by - ay)) / d
    return w1 > inset and w2 > inset and 1.0 - w1 - w2 > inset


@numba.njit(cache=True, nogil=True)
def _box(p, faces, f, size):
    """(col0, col1, row0, row1) inclusive texel range of face f's box, or an empty range for
    a degenerate face."""
    ax, ay = p[faces[f, 0], 0], p[faces[f, 0], 1]
    bx, by = p[faces[f, 1], 0], p[faces[f, 1], 1]
    cx, cy = p[faces[f, 2], 0], p[faces[f, 2], 1]
    d = (bx - ax) * (cy - ay) - (cx - ax) * (by - ay)
    if abs(d) < 1e-12:
        return 0, -1, 0, -1
    c0 = min(max(math.ceil(min(ax, bx, cx) - 0.5), 0), size - 1)
    c1 = min(max(math.floor(max(ax, bx, cx) - 0.5), 0), size - 1)
    r0 = min(max(math.ceil(min(ay, by, cy) - 0.5), 0), size - 1)
    r1 = min(max(math.floor(max(ay, by, cy) - 0.5), 0), size - 1)
    return int(c0), int(c1), int(r0), int(r1)


@numba.njit(cache=True, nogil=True)
def _hits(p, faces, size, inset, count, hit_face, hit_texel, write):
    """Visit every (face, covered texel centre) in face order: count them or, with ``write``,
    record each. Returns how many there are."""
    k = 0
    for f in range(faces.shape[0]):
        c0, c1, r0, r1 = _box(p, faces, f, size)
        for row in range(r0, r1 + 1):
            for col in range(c0, c1 + 1):
                if _covered(p, faces, f, col, row, inset):
                    if write:
                        t = row * size + col
                        count[t] += 1
                        hit_face[k] = f
                        hit_texel[k] = t
                    k += 1
    return k


@numba.njit(cache=True, nogil=True)
def rasterize_centres(p, faces, size, inset):
    """p (V, 2) float64 texel coordinates (x right, y down), faces (F, 3) int64.
    Returns (count (S*S,) int64, hit_face (K,) int64, hit_texel (K,) int64) in face order:
    one pass sizes the lists, the next fills them."""
    count = np.zeros(size * size, np.int64)
    none = np.zeros(0, np.int64)
    n_hits = _hits(p, faces, size, inset, count, none, none, False)
    hit_face = np.empty(n_hits, np.int64)
    hit_texel = np.empty(n_hits, np.int64)
    _hits(p, faces, size, inset, count, hit_face, hit_texel, True)
    return count, hit_face, hit_texel
