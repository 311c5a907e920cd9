"""Small mesh-geometry helpers shared by several stages (numpy only)."""

from __future__ import annotations

import numpy as np


def face_normals(vertices: np.ndarray, faces: np.ndarray, unit: bool = True) -> np.ndarray:
    """(F, 3) float64 normals following the faces' counter-clockwise winding.

    vertices (V, 3) float, faces (F, 3) int. ``unit``: length 1 (0 for degenerate
    faces); otherwise the raw cross product, whose length is twice the face's area.
    """
    v = np.asarray(vertices, np.float64)
    n = np.cross(v[faces[:, 1]] - v[faces[:, 0]], v[faces[:, 2]] - v[faces[:, 0]])
    if not unit:
        return n
    length = np.linalg.norm(n, axis=1, keepdims=True)
    return np.where(length > 1e-20, n / np.maximum(length, 1e-20), 0.0)


def vertex_normals(vertices: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """(V, 3) float64 unit area-weighted vertex normals of a CCW mesh; 0 where none.

    Vertices at the same position share one normal: UV unwrapping splits vertices
    along seams, and a normal that jumped there would show the seam in shading and
    in the bake's view weighting.
    """
    v = np.asarray(vertices, np.float64)
    _, weld = np.unique(v, axis=0, return_inverse=True)
    weld = weld.reshape(-1)
    fn = face_normals(v, faces, unit=False)
    corners = weld[faces]
    acc = np.stack([sum(np.bincount(corners[:, j], weights=fn[:, k], minlength=int(weld.max()) + 1)
                        for j in range(3)) for k in range(3)], axis=1)
    out = acc[weld]
    length = np.linalg.norm(out, axis=1, keepdims=True)
    return np.where(length > 1e-20, out / np.maximum(length, 1e-20), 0.0)


def signed_volume(vertices: np.ndarray, faces: np.ndarray) -> float:
    """Volume enclosed by a closed mesh; negative when its faces are wound inward."""
    v = np.asarray(vertices, np.float64)
    a, b, c = v[faces[:, 0]], v[faces[:, 1]], v[faces[:, 2]]
    return float(np.einsum("ij,ij->i", a, np.cross(b, c)).sum() / 6.0)
