"""Flatten charts with least-squares conformal maps (LSCM, Lévy et al. 2002).

All charts are solved in one sparse least-squares system: the system is block
diagonal (one block per chart), so one factorisation costs what the separate
ones would, without a Python loop over charts. Each chart pins two vertices (the
extremes of its projection onto its mean plane) to their projected positions,
which fixes the rotation, scale and translation LSCM leaves free and keeps the
map orientation-preserving: a triangle whose UV area comes out <= 0 has folded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Flattened:
    """Charts laid out in the plane, one UV per (chart, vertex) pair.

    corner:    (F, 3) int64, per face corner the index of its chart-vertex
    cv_vertex: (N,) int64, the mesh vertex of each chart-vertex
    cv_chart:  (N,) int64, its chart
    uv:        (N, 2) float64, UVs in world units (a chart's UV area equals its surface
               area), each chart translated so its bounding box starts at 0
    """

    corner: np.ndarray
    cv_vertex: np.ndarray
    cv_chart: np.ndarray
    uv: np.ndarray


def chart_vertices(faces: np.ndarray, charts: np.ndarray, num_vertices: int):
    """Split vertices along chart borders: (corner (F, 3), cv_vertex (N,), cv_chart (N,))."""
    key = charts[:, None] * (num_vertices + 1) + faces
    uniq, inv = np.unique(key.ravel(), return_inverse=True)
    return (inv.reshape(faces.shape).astype(np.int64), (uniq % (num_vertices + 1)).astype(np.int64),
            (uniq // (num_vertices + 1)).astype(np.int64))


def _frames(normals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two unit tangents per normal, (t1, t2, n) right-handed."""
    helper = np.where(np.abs(normals[:, :1]) < 0.9, [[1.0, 0, 0]], [[0, 1.0, 0]])
    t1 = np.cross(normals, helper)
    ln = np.linalg.norm(t1, axis=1, keepdims=True)
    t1 = np.where(ln > 1e-12, t1 / np.maximum(ln, 1e-300), [[1.0, 0, 0]])
    t2 = np.cross(normals, t1)
    # a zero normal (chart whose normals cancel) still gets an orthonormal frame
    t2 = np.where(np.linalg.norm(t2, axis=1, keepdims=True) > 1e-12, t2, [[0, 1.0, 0]])
    return t1, t2


def flatten(vertices: np.ndarray, faces: np.ndarray, charts: np.ndarray,
            face_normals: np.ndarray, face_areas: np.ndarray) -> Flattened:
    """LSCM-flatten every chart. ``faces``/``charts``/normals/areas may be a subset of
    the mesh's faces; charts ids need not be compact."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    v = vertices.astype(np.float64)
    corner, cv_vertex, cv_chart = chart_vertices(faces, charts, len(v))
    n = cv_vertex.size
    ids, cidx = np.unique(cv_chart, return_inverse=True)
    nc = ids.size

    # projection of every chart onto its mean plane: the pins' targets
    face_c = np.searchsorted(ids, charts)
    mean_n = np.zeros((nc, 3))
    np.add.at(mean_n, face_c, face_normals * face_areas[:, None])
    ln = np.linalg.norm(mean_n, axis=1, keepdims=True)
    mean_n = np.divide(mean_n, ln, out=np.zeros_like(mean_n), where=ln > 0)
    t1, t2 = _frames(mean_n)
    p = v[cv_vertex]
    proj = np.stack([np.einsum("ij,ij->i", p, t1[cidx]), np.einsum("ij,ij->i", p, t2[cidx])], 1)

    # two pins per chart: the extremes along t1 (or t2 for a chart thin along t1)
    order = np.lexsort((proj[:, 0], cidx))
    first = np.r_[0, np.flatnonzero(np.diff(cidx[order])) + 1]
    last = np.r_[first[1:] - 1, n - 1]
    pin_a, pin_b = order[first], order[last]
    span0 = proj[pin_b, 0] - proj[pin_a, 0]
    order1 = np.lexsort((proj[:, 1], cidx))
    alt_a, alt_b = order1[first], order1[last]
    span1 = proj[alt_b, 1] - proj[alt_a, 1]
    use_alt = span1 > span0
    pin_a = np.where(use_alt, alt_a, pin_a)
    pin_b = np.where(use_alt, alt_b, pin_b)
    pins = np.unique(np.concatenate([pin_a, pin_b]))

    # per-triangle local 2D coordinates: w0 = 0, w1 = (x1, 0), w2 = (x2, y2), y2 > 0
    a, b, c = v[faces[:, 0]], v[faces[:, 1]], v[faces[:, 2]]
    e1, e2 = b - a, c - a
    x1 = np.linalg.norm(e1, axis=1)
    x1s = np.maximum(x1, 1e-30)
    x2 = np.einsum("ij,ij->i", e2, e1) / x1s
    y2 = np.linalg.norm(np.cross(e1, e2), axis=1) / x1s
    twice_area = np.maximum(x1 * y2, 1e-20 * max(float(np.median(x1 * y2)), 1e-30))
    s = 1.0 / np.sqrt(twice_area)
    # complex coefficients W_j = w_{j+2} - w_{j+1}: sum_j W_j u_j = 0 for any similarity
    wr = np.stack([x2 - x1, 0.0 - x2, x1 - 0.0], 1) * s[:, None]
    wi = np.stack([y2 - 0.0, 0.0 - y2, np.zeros_like(y2)], 1) * s[:, None]

    t = len(faces)
    rows_re = np.repeat(np.arange(t) * 2, 3)
    rows_im = rows_re + 1
    cu = corner.ravel()
    cv = cu + n
    rows = np.concatenate([rows_re, rows_re, rows_im, rows_im])
    cols = np.concatenate([cu, cv, cu, cv])
    vals = np.concatenate([wr.ravel(), -wi.ravel(), wi.ravel(), wr.ravel()])
    A = sp.csc_matrix((vals, (rows, cols)), shape=(2 * t, 2 * n))

    pinned = np.zeros(2 * n, bool)
    pinned[pins] = True
    pinned[pins + n] = True
    xp = np.concatenate([proj[pins, 0], proj[pins, 1]])
    free = np.flatnonzero(~pinned)
    Af = A[:, free]
    Ap = A[:, np.concatenate([pins, pins + n])]
    rhs = -(Af.T @ (Ap @ xp))
    M = (Af.T @ Af).tocsc()
    # A whisper of a pull towards the projection keeps M positive definite even for a
    # vertex that only fully degenerate triangles (all corners coincide) constrain.
    xproj = np.concatenate([proj[:, 0], proj[:, 1]])[free]
    eps = 1e-9 * float(M.diagonal().mean()) if free.size else 0.0
    M = (M + sp.identity(free.size, format="csc") * eps).tocsc()
    rhs = rhs + eps * xproj
    x = np.zeros(2 * n)
    x[np.concatenate([pins, pins + n])] = xp
    if free.size:
        # M is symmetric positive definite: a symmetric ordering without pivoting keeps
        # the fill-in of these mesh-like blocks small (SuperLU's default partial
        # pivoting destroys the ordering and makes large charts take minutes).
        lu = splu(M, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                  options={"SymmetricMode": True})
        x[free] = lu.solve(rhs)
    uv = np.stack([x[:n], x[n:]], 1)
    uv = _normalise(uv, corner, cidx, face_c, face_areas, nc)
    return Flattened(corner=corner, cv_vertex=cv_vertex, cv_chart=cv_chart, uv=uv)


def uv_signed_areas(uv: np.ndarray, corner: np.ndarray) -> np.ndarray:
    """(F,) signed UV area per face (positive = same winding as in 3D)."""
    q = uv[corner]
    d1, d2 = q[:, 1] - q[:, 0], q[:, 2] - q[:, 0]
    return 0.5 * (d1[:, 0] * d2[:, 1] - d1[:, 1] * d2[:, 0])


def _normalise(uv, corner, cidx, face_c, face_areas, nc):
    """Scale each chart so its UV area equals its surface area; move its bbox to 0."""
    uv_area = np.bincount(face_c, np.abs(uv_signed_areas(uv, corner)), minlength=nc)
    area = np.bincount(face_c, face_areas, minlength=nc)
    scale = np.where(uv_area > 0, np.sqrt(area / np.maximum(uv_area, 1e-300)), 1.0)
    uv = uv * scale[cidx, None]
    lo = np.full((nc, 2), np.inf)
    np.minimum.at(lo, cidx, uv)
    return uv - lo[cidx]


def triangle_local(vertices: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """(F, 3, 2) each triangle laid flat on its own (never folds): the last resort."""
    v = vertices.astype(np.float64)
    a, b, c = v[faces[:, 0]], v[faces[:, 1]], v[faces[:, 2]]
    e1, e2 = b - a, c - a
    x1 = np.linalg.norm(e1, axis=1)
    x1s = np.maximum(x1, 1e-30)
    x2 = np.einsum("ij,ij->i", e2, e1) / x1s
    y2 = np.linalg.norm(np.cross(e1, e2), axis=1) / x1s
    out = np.zeros((len(faces), 3, 2))
    out[:, 1, 0] = x1
    out[:, 2, 0] = x2
    out[:, 2, 1] = y2
    return out
