"""Quality of a UV layout: texel coverage, overlaps and distortion.

Used by the unwrap itself (to find charts that fold over themselves), by the tests
and by bench/uv.py, so both unwrappers are judged with the same ruler.

Coverage is counted the way the baker sees the atlas: a texel belongs to a
triangle when the texel's centre lies inside it (texel (row, col) has its centre at
uv = ((col + .5) / S, 1 - (row + .5) / S)). Triangles are shrunk by ``INSET``
(barycentric) so neighbours sharing an edge never both claim a centre on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INSET = 1e-3


@dataclass
class Coverage:
    """count: (S, S) int32 triangles covering each texel (row 0 = top of the texture);
    hit_face, hit_texel: (K,) int64, one row per (triangle, covered texel centre)."""

    count: np.ndarray
    hit_face: np.ndarray
    hit_texel: np.ndarray

    @property
    def utilisation(self) -> float:
        """Fraction of the texture's texels covered by some triangle."""
        return float((self.count > 0).mean())

    def overlapping_faces(self) -> np.ndarray:
        """(M,) ids of faces that share a texel centre with another face."""
        multi = self.count.ravel()[self.hit_texel] > 1
        return np.unique(self.hit_face[multi])


def coverage(uvs: np.ndarray, faces: np.ndarray, size: int) -> Coverage:
    """Rasterize the UV triangles at texel centres, counting how many cover each
    (a compiled loop over each triangle's box: ``coverage_kernels``)."""
    from pipeline.unwrap.coverage_kernels import rasterize_centres

    p = np.empty((len(uvs), 2))
    p[:, 0] = uvs[:, 0].astype(np.float64) * size
    p[:, 1] = (1.0 - uvs[:, 1].astype(np.float64)) * size
    count, hit_face, hit_texel = rasterize_centres(p, np.ascontiguousarray(faces, np.int64), int(size),
                                                   INSET)
    return Coverage(count=count.reshape(size, size).astype(np.int32), hit_face=hit_face,
                    hit_texel=hit_texel)


def distortion(vertices: np.ndarray, faces: np.ndarray, uvs: np.ndarray) -> dict:
    """Area and angle distortion of the map surface -> UV, weighted by surface area.

    area:  mean of max(r, 1/r), r = a face's share of the UV area / its share of the
           surface area (1 = every face gets the texel density of the whole atlas)
    angle: mean of sigma1 / sigma2, the singular values of the face's map (1 = conformal)
    degenerate: faces left out (no surface area, or no UV area)
    """
    v = vertices.astype(np.float64)[faces]
    q = uvs.astype(np.float64)[faces]
    e1, e2 = v[:, 1] - v[:, 0], v[:, 2] - v[:, 0]
    x1 = np.linalg.norm(e1, axis=1)
    x1s = np.maximum(x1, 1e-30)
    x2 = np.einsum("ij,ij->i", e2, e1) / x1s
    y2 = np.linalg.norm(np.cross(e1, e2), axis=1) / x1s
    area = 0.5 * x1 * y2
    d1, d2 = q[:, 1] - q[:, 0], q[:, 2] - q[:, 0]
    uv_signed = 0.5 * (d1[:, 0] * d2[:, 1] - d1[:, 1] * d2[:, 0])
    ok = (area > 1e-14 * max(area.sum(), 1e-300)) & (np.abs(uv_signed) > 0)
    # Jacobian J = [d1 d2] @ inv([[x1, x2], [0, y2]])
    inv11, inv12, inv22 = 1 / np.where(ok, x1s, 1), -x2 / np.where(ok, x1s * y2, 1), 1 / np.where(ok, y2, 1)
    j11 = d1[:, 0] * inv11
    j21 = d1[:, 1] * inv11
    j12 = d1[:, 0] * inv12 + d2[:, 0] * inv22
    j22 = d1[:, 1] * inv12 + d2[:, 1] * inv22
    # singular values of a 2x2 matrix in closed form
    s_sum = np.hypot(j11 + j22, j21 - j12)
    s_diff = np.hypot(j11 - j22, j21 + j12)
    s1, s2 = 0.5 * (s_sum + s_diff), 0.5 * np.abs(s_sum - s_diff)
    w = area[ok] / area[ok].sum()
    r = (np.abs(uv_signed[ok]) / np.abs(uv_signed[ok]).sum()) / w
    angle = s1[ok] / np.maximum(s2[ok], 1e-300)
    angle = np.minimum(angle, 1e6)
    return {"area": float((w * np.maximum(r, 1 / r)).sum()),
            "angle": float((w * angle).sum()),
            "degenerate": int((~ok).sum())}
