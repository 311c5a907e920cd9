"""How far a rasterizer's output agrees with its twin's, judged where agreement is owed.

Two correct rasterizers do not give the same triangle on every pixel. nvdiffrast decides
coverage on vertex positions snapped to 1/16 pixel, OpenGL (llvmpipe, or NVIDIA's
hardware GL on a GPU machine) on 1/256: on silhouette slivers and along shared edges,
0.5-1.5 % of covered pixels land on another triangle (simulated on the selftest's own
scene: camera views 1.4 %, UV space 0.56 %). A comparison over every covered pixel with a
tighter bound reports a correct rasterizer as wrong.

So the triangle test is made on *interior* pixels: pixels whose 3x3 neighbourhood in the
reference is one triangle. The reference's pixel centres around such a pixel all lie in
that triangle, so the pixel's own centre lies about a pixel inside its visible part, far
more than any snapping moves an edge: a correct candidate gives the same triangle there.
(Meshes of pixel-sized triangles have few such pixels; the summary says how many.)
Barycentrics and depth are compared wherever both sides see the same triangle, but not
as raw numbers: a GPU's fixed-point triangle setup (NVIDIA's hardware GL snaps vertices to
1/256 px) moves a barycentric by that snap over the triangle's size in pixels, so raw
differences grow as triangles shrink (measured on an H200 against nvdiffrast: p99 2.2e-3
on the selftest's scene, 3.8e-3 on a 5120-face sphere at 96 px) while a half-pixel shift
moves them by 0.5 over the same size. Dividing by the barycentrics' screen gradient (read
off the reference's neighbouring pixels of the same triangle) turns the difference into
the offset in pixels that would explain it: ~1/256 px for snapping, whatever the triangle
size; 0.5 px for a half-pixel shift.

A wrong convention fails: a y-flip puts other triangles on most interior pixels; a
half-pixel shift keeps the triangles (they are wider than a pixel) but places them half a
pixel off.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.types import Raster

# Interior pixels on another triangle. ~0 is owed (see above); the slack covers depth
# ties, where two surfaces lie within float round-off of each other.
INTERIOR_MISMATCH_TOL = 0.001
# Covered pixels (either side) on another triangle, silhouettes included: coverage
# snapping alone moves 0.5-1.5 % (measured above); a flip moves most of them.
COVERED_MISMATCH_TOL = 0.05
# 99th percentile of the offset, in pixels, that explains the barycentric difference where both
# see one triangle. Snapping: nvdiffrast computes barycentrics from unsnapped vertices, GL on
# NVIDIA hardware from vertices snapped to 1/256 px (<= 0.004 px; llvmpipe ~1e-5 px);
# a half-pixel shift: 0.5 px. 0.05 px sits an order of magnitude from both.
OFFSET_P99_TOL_PX = 0.05
# 99th percentile of |depth difference| / depth, beyond what an offset of OFFSET_P99_TOL_PX
# explains along the depth's own screen gradient, where both see one triangle: float32 depth on
# both sides (GL's is rebuilt from a float z/w) leaves ~1e-6.
DEPTH_REL_P99_TOL = 1e-4


@dataclass(frozen=True)
class RasterAgreement:
    """A candidate raster against its reference (``compare``).

    interior:          pixels whose 3x3 neighbourhood in the reference is one triangle
    interior_mismatch: fraction of them where the candidate has another triangle or none
    covered_mismatch:  fraction of pixels either side covers where the triangles differ
    same:              pixels where both sides see the same triangle
    offset_p99_px:     99th percentile over ``same`` of the screen offset (pixels) that explains
                       the barycentric difference (pixels whose gradient the reference shows)
    bary_p99:          99th percentile of the largest raw barycentric difference over ``same``
                       (reported, not judged: it scales with 1 / triangle size)
    depth_rel_p99:     99th percentile over ``same`` of |depth difference| / depth beyond what an
                       offset of OFFSET_P99_TOL_PX explains (None for UV rasters)
    """

    interior: int
    interior_mismatch: float
    covered_mismatch: float
    same: int
    offset_p99_px: float
    bary_p99: float
    depth_rel_p99: float | None

    def failures(self) -> list[str]:
        """What is out of tolerance, in words; [] when the candidate agrees."""
        out = []
        if self.same == 0:
            out.append("the two rasters share no covered pixel")
        if self.interior_mismatch > INTERIOR_MISMATCH_TOL:
            out.append(f"another triangle on {100 * self.interior_mismatch:.2f} % of interior pixels "
                       f"(> {100 * INTERIOR_MISMATCH_TOL:g} %)")
        if self.covered_mismatch > COVERED_MISMATCH_TOL:
            out.append(f"another triangle on {100 * self.covered_mismatch:.2f} % of covered pixels "
                       f"(> {100 * COVERED_MISMATCH_TOL:g} %)")
        if self.offset_p99_px > OFFSET_P99_TOL_PX:
            out.append(f"barycentrics place the triangles {self.offset_p99_px:.3f} px off at the 99th "
                       f"percentile (> {OFFSET_P99_TOL_PX:g} px; raw difference p99 {self.bary_p99:.1e})")
        if self.depth_rel_p99 is not None and self.depth_rel_p99 > DEPTH_REL_P99_TOL:
            out.append(f"depth differs by {self.depth_rel_p99:.2e} of itself at the 99th percentile "
                       f"(> {DEPTH_REL_P99_TOL:g})")
        return out

    @property
    def ok(self) -> bool:
        return not self.failures()

    def summary(self) -> str:
        depth = "-" if self.depth_rel_p99 is None else f"{self.depth_rel_p99:.1e}"
        return (f"other triangle on {100 * self.interior_mismatch:.3f} % of {self.interior} interior px "
                f"(<= {100 * INTERIOR_MISMATCH_TOL:g} %) and {100 * self.covered_mismatch:.2f} % of all "
                f"covered px (<= {100 * COVERED_MISMATCH_TOL:g} %: silhouette slivers); on {self.same} px "
                f"of one triangle: barycentrics {self.offset_p99_px:.4f} px off at p99 (<= {OFFSET_P99_TOL_PX:g}; "
                f"raw p99 {self.bary_p99:.1e}), depth p99 {depth} "
                f"(<= {DEPTH_REL_P99_TOL:g} of itself)")


def interior_pixels(tri_id: np.ndarray) -> np.ndarray:
    """(C, H, W) bool: covered pixels whose 3x3 neighbourhood (inside the image) holds one
    triangle id. tri_id: (C, H, W) int32, -1 where nothing is covered."""
    c, h, w = tri_id.shape
    pad = np.pad(tri_id, ((0, 0), (1, 1), (1, 1)), constant_values=-1)
    same = tri_id >= 0
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            same &= pad[:, dy:dy + h, dx:dx + w] == tri_id
    return same


def compare(candidate: Raster, reference: Raster, depth: bool = True) -> RasterAgreement:
    """Judge ``candidate`` (e.g. nvdiffrast) against ``reference`` (its GL twin); both
    Rasters of the same (C, H, W). ``depth=False`` for UV rasters, whose depth is unused."""
    if candidate.tri_id.shape != reference.tri_id.shape:
        raise ValueError(f"rasters differ in shape: {candidate.tri_id.shape} vs {reference.tri_id.shape}")
    inner = interior_pixels(reference.tri_id)
    n = int(inner.sum())
    same_tri = candidate.tri_id == reference.tri_id
    interior_mismatch = float((inner & ~same_tri).sum() / max(n, 1))
    either = (candidate.tri_id >= 0) | (reference.tri_id >= 0)
    covered_mismatch = float((either & ~same_tri).sum() / max(int(either.sum()), 1))
    both = same_tri & (reference.tri_id >= 0)
    bary_p99 = offset_p99 = 0.0
    if both.any():
        d_bary = candidate.bary[both].astype(np.float64) - reference.bary[both]
        bary_p99 = float(np.percentile(np.abs(d_bary).max(axis=1), 99))
        offsets = _explaining_offsets(d_bary, *_screen_gradients(reference.bary, reference.tri_id, both))
        offset_p99 = float(np.percentile(offsets, 99)) if offsets.size else 0.0
    depth_p99 = None
    if depth:
        depth_p99 = 0.0
        if both.any():
            ref_z = reference.depth[both].astype(np.float64)
            gx, gy = _screen_gradients(reference.depth[..., None], reference.tri_id, both)
            slope = np.nan_to_num(np.abs(gx[:, 0]) + np.abs(gy[:, 0]))   # no neighbour: no allowance
            excess = np.maximum(np.abs(candidate.depth[both] - ref_z) - OFFSET_P99_TOL_PX * slope, 0.0)
            depth_p99 = float(np.percentile(excess / np.maximum(np.abs(ref_z), 1e-12), 99))
    return RasterAgreement(n, interior_mismatch, covered_mismatch, int(both.sum()), offset_p99, bary_p99,
                           depth_p99)


def _screen_gradients(field: np.ndarray, tri_id: np.ndarray, where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-pixel change of ``field`` (C, H, W, K) per pixel step in x and in y, read off the
    neighbouring pixel (the next one, else the previous one) that shows the same triangle;
    NaN where neither does. Returns two (N, K) float64 arrays for the N pixels in ``where``."""
    f = field.astype(np.float64)
    grads = []
    for axis in (2, 1):
        g = np.full(f.shape, np.nan)
        n = f.shape[axis]
        lo = tuple(slice(0, n - 1) if a == axis else slice(None) for a in range(3))
        hi = tuple(slice(1, n) if a == axis else slice(None) for a in range(3))
        step = (tri_id[hi] == tri_id[lo]) & (tri_id[lo] >= 0)
        diff = f[hi] - f[lo]
        g[lo][step] = diff[step]                       # forward difference
        back = g[hi]
        fill = step & np.isnan(back[..., 0])
        back[fill] = diff[fill]                        # backward, where no forward one exists
        grads.append(g[where])
    return grads[0], grads[1]


def _explaining_offsets(d_bary: np.ndarray, gx: np.ndarray, gy: np.ndarray) -> np.ndarray:
    """|offset| in pixels (M,) whose first-order effect ``gx * dx + gy * dy`` best matches the
    barycentric differences ``d_bary`` (N, 3), for the M pixels with both gradients known and
    well conditioned (a least-squares fit over the three barycentrics)."""
    known = np.isfinite(gx).all(axis=1) & np.isfinite(gy).all(axis=1)
    g = np.stack([gx[known], gy[known]], axis=-1)                  # (M, 3, 2)
    gtg = np.einsum("nki,nkj->nij", g, g)
    det = gtg[:, 0, 0] * gtg[:, 1, 1] - gtg[:, 0, 1] ** 2
    trace = gtg[:, 0, 0] + gtg[:, 1, 1]
    ok = det > 1e-6 * trace ** 2                                   # not a sliver seen edge-on
    gtg, det = gtg[ok], det[ok]
    rhs = np.einsum("nki,nk->ni", g[ok], d_bary[known][ok])
    dx = (gtg[:, 1, 1] * rhs[:, 0] - gtg[:, 0, 1] * rhs[:, 1]) / det
    dy = (gtg[:, 0, 0] * rhs[:, 1] - gtg[:, 0, 1] * rhs[:, 0]) / det
    return np.hypot(dx, dy)
