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
Barycentrics and depth are compared, by a high percentile, wherever both sides see the
same triangle: both compute them from the unsnapped vertices, so snapping does not
touch them, even beside an edge.

A wrong convention fails: a y-flip puts other triangles on most interior pixels; a
half-pixel shift keeps the triangles (they are wider than a pixel) but moves every
barycentric by half a pixel over the triangle's size, far above float round-off.
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
# 99th percentile of |barycentric difference| where both see one triangle. Both compute them
# in float32 from the unsnapped vertices (nvdiffrast in its shader pass, GL as
# interpolated varyings): ~1e-5 apart; a half-pixel shift moves them by 0.5 / (triangle
# size in pixels), 0.02-0.2 on Kiln's meshes.
BARY_P99_TOL = 2e-3
# 99th percentile of |depth difference| / depth where both see one triangle (float32 depth on both
# sides; GL's depth is rebuilt from a float z/w): ~1e-6 apart.
DEPTH_REL_P99_TOL = 1e-4


@dataclass(frozen=True)
class RasterAgreement:
    """A candidate raster against its reference (``compare``).

    interior:          pixels whose 3x3 neighbourhood in the reference is one triangle
    interior_mismatch: fraction of them where the candidate has another triangle or none
    covered_mismatch:  fraction of pixels either side covers where the triangles differ
    same:              pixels where both sides see the same triangle
    bary_p99:          99th percentile of the largest barycentric difference over ``same``
    depth_rel_p99:     99th percentile of |depth difference| / depth over ``same``
                       (None when depth is not compared, as for UV rasters)
    """

    interior: int
    interior_mismatch: float
    covered_mismatch: float
    same: int
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
        if self.bary_p99 > BARY_P99_TOL:
            out.append(f"barycentrics differ by {self.bary_p99:.2e} at the 99th percentile (> {BARY_P99_TOL:g})")
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
                f"of one triangle: bary p99 {self.bary_p99:.1e} (<= {BARY_P99_TOL:g}), depth p99 {depth} "
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
    if both.any():
        bary = np.abs(candidate.bary[both].astype(np.float64) - reference.bary[both]).max(axis=1)
        bary_p99 = float(np.percentile(bary, 99))
    else:
        bary_p99 = 0.0
    depth_p99 = None
    if depth:
        depth_p99 = 0.0
        if both.any():
            ref_z = reference.depth[both].astype(np.float64)
            rel = np.abs(candidate.depth[both] - ref_z) / np.maximum(np.abs(ref_z), 1e-12)
            depth_p99 = float(np.percentile(rel, 99))
    return RasterAgreement(n, interior_mismatch, covered_mismatch, int(both.sum()), bary_p99, depth_p99)
