"""The mirror side: texels no photo sees take the colour of their mirror image, where a photo
sees that.

Works on what the photos saw, per texel: a colour and a confidence in [0, 1] (one photo's
``PhotoProjection.colors``/``weight``, or the best of several), so it does not care how many
photos there were. Three gates, each with its negative control in ``tests/test_mirror_fill.py``:

1. the shape: the mesh's plane of mirror symmetry (``pipeline.texture.symmetry``) scores at
   least ``min_score`` (a lopsided object gets none);
2. the picture: a symmetric shape may carry other pictures on its two sides (a card, a book, a
   labelled can). Where a photo sees both a texel and its mirror image, far enough apart not to
   be the same patch near the plane, their colours must agree: at least ``min_agreement`` of
   at least ``min_pairs`` such pairs. No such pairs, no mirror: a card seen from the front
   shows nothing of its back, so nothing confirms mirroring text onto it;
3. the spot: a texel's mirror image must land on a seen texel (within ``landing`` of the
   object's size, normals agreeing), and takes that texel's confidence, feathered by how
   close it landed, so the mirror's edges ramp as the photo's own do.

The colour is read from the photos themselves at the mirror image (``Resample``), where the
bake gives the means: the nearest seen texel's colour is the photo already resampled once onto
the texel grid, and copying it to the nearest texel on the other side resamples it again with
a nearest-neighbour step (a jagged, half-texel-shifted edge on every stroke: the far side was
7.4 dB below the near side on the symmetric duck, 2.6 dB with the photo read directly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from pipeline.texture.symmetry import MirrorPlane

# the photos' colours at M surface points: (texels (M,) int: the seen texel each point lies
# next to, points (M, 3) float32, normals (M, 3) float32) -> (colours (M, 3) float32 in
# [0, 1], (M,) bool: a photo gave that point a colour)
Resample = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class MirrorRules:
    """min_score:     the plane's symmetry score needed (``MirrorPlane.score``)
    seen_weight:   a texel counts as seen by a photo, for the colour check, above this confidence
    separation:    pairs closer than this share of the object's size (straddling the plane)
                   do not count as evidence: they are one patch seen twice
    colour_tolerance: a pair agrees when its colours differ by less than this (mean over
                   channels, colours in [0, 1]: about 25 of 255, room for shading)
    min_pairs:     at least this many pairs seen on both sides are needed ...
    min_agreement: ... and at least this share of them must agree
    landing:       a texel's mirror image must lie within this share of the object's size of
                   a seen texel (else it has no mirror colour)
    normal_cos:    ... whose normal agrees with the mirrored one at least this well
    """

    min_score: float = 0.9
    seen_weight: float = 0.5
    separation: float = 0.05
    colour_tolerance: float = 0.1
    min_pairs: int = 100
    min_agreement: float = 0.75
    landing: float = 0.02
    normal_cos: float = 0.5


@dataclass(frozen=True)
class MirrorFill:
    """The mirror's contribution to N texels.

    colors (N, 3) float32 and weight (N,) float32 in [0, 1] (0: no mirror colour); used:
    whether the mirror gave any; why: a sentence when it did not; plane: the plane tried (or
    None); pairs, agreement: the colour check's evidence (texel pairs a photo sees on both
    sides, and the share of them whose colours agree); texels_fraction: share of the N texels
    the mirror coloured (weight over half) where the photos gave them less than half."""

    colors: np.ndarray
    weight: np.ndarray
    used: bool
    why: str = ""
    plane: Optional[MirrorPlane] = None
    pairs: int = 0
    agreement: float = 0.0
    texels_fraction: float = 0.0

    def report(self) -> dict:
        out: dict = {"used": self.used, "pairs_seen_both_sides": self.pairs,
                     "agreement": round(self.agreement, 4), "texels_fraction": round(self.texels_fraction, 4)}
        if self.plane is not None:
            out["plane"] = self.plane.report()
        if self.why:
            out["why_not"] = self.why
        return out


def mirror_fill(positions: np.ndarray, normals: np.ndarray, colors: np.ndarray, confidence: np.ndarray,
                plane: Optional[MirrorPlane], rules: MirrorRules = MirrorRules(),
                resample: Optional[Resample] = None) -> MirrorFill:
    """The mirror colours of N texels.

    positions, normals: (N, 3) float32 surface points and unit normals of the texels
    colors:     (N, 3) float32 in [0, 1], what the photos saw at each texel
    confidence: (N,) float32 in [0, 1], how much to trust that (0: no photo saw the texel)
    plane:      the mesh's mirror plane (``SymmetrySearch.find``), or None
    resample:   reads the photos at the mirror images (put on the landing texel's tangent
                plane); None: each takes its landing texel's colour
    """
    from scipy.spatial import cKDTree

    n = len(positions)
    none_c, none_w = np.zeros((n, 3), np.float32), np.zeros(n, np.float32)

    def refuse(why: str, pairs: int = 0, agreement: float = 0.0) -> MirrorFill:
        return MirrorFill(none_c, none_w, used=False, why=why, plane=plane, pairs=pairs, agreement=agreement)

    if plane is None:
        return refuse("the mesh has no plane of symmetry")
    if plane.score < rules.min_score:
        return refuse(f"the shape is not mirror-symmetric enough: its best plane scores "
                      f"{plane.score:.2f} (at least {rules.min_score:.2f} is needed)")
    seen = confidence > 0
    if not seen.any():
        return refuse("no photo sees the surface")
    size = float(np.ptp(positions, axis=0).max()) or 1.0
    landing = rules.landing * size
    mirrored = plane.reflect_points(positions)
    mirrored_n = plane.reflect_vectors(normals)
    src = np.flatnonzero(seen)
    tree = cKDTree(positions[src].astype(np.float64))
    dist = np.full(n, np.inf)
    j = np.zeros(n, np.int64)

    def land(which: np.ndarray) -> None:
        # the seen texel each of ``which`` mirrors onto (j, at dist), if any
        if not which.any():
            return
        d, k = tree.query(mirrored[which], distance_upper_bound=landing, workers=-1)
        dist[which] = d
        j[which] = np.where(np.isfinite(d), src[np.minimum(k, len(src) - 1)], 0)

    # the picture's check: pairs a photo sees on both sides, apart across the plane. Only
    # these texels can make a pair, so they are landed first: the check often refuses (one
    # photo sees one side), and then the other texels need no landing at all
    apart = 2.0 * np.abs(plane.signed_distance(positions)) > rules.separation * size
    may_pair = apart & (confidence > rules.seen_weight)
    land(may_pair)
    lands = np.isfinite(dist)
    lands &= (mirrored_n * normals[j]).sum(axis=1) >= rules.normal_cos
    both = lands & may_pair & (confidence[j] > rules.seen_weight)
    pairs = int(both.sum())
    if pairs < rules.min_pairs:
        return refuse(f"no photo sees both sides of the plane: {pairs} texel pairs seen on both sides "
                      f"(at least {rules.min_pairs} are needed to confirm the picture is symmetric too)",
                      pairs)
    diff = np.abs(colors[both] - colors[j[both]]).mean(axis=1)
    agreement = float((diff < rules.colour_tolerance).mean())
    if agreement < rules.min_agreement:
        return refuse(f"the two sides' pictures differ: {100 * agreement:.0f} % of the {pairs} texel pairs "
                      f"seen on both sides agree in colour (at least {100 * rules.min_agreement:.0f} % "
                      "is needed)", pairs, agreement)
    rest = ~may_pair
    land(rest)
    lands[rest] = np.isfinite(dist[rest]) & ((mirrored_n[rest] * normals[j[rest]]).sum(axis=1) >= rules.normal_cos)
    # feathered by how close the image landed, so a mirror colour fades out where the
    # mirrored surface leaves the seen one, rather than stopping at a line; full weight over
    # the first half of ``landing`` (a texel or two away is landing on the surface: a ramp
    # from 0 would mix a few % of the fill into every mirrored texel, measured 0.7 dB)
    closeness = np.where(lands, 1.0 - _smoothstep(2.0 * np.minimum(dist, landing) / landing - 1.0), 0.0)
    weight = (closeness * confidence[j]).astype(np.float32)
    out_c = np.where((weight > 0)[:, None], colors[j], 0.0).astype(np.float32)
    some = np.flatnonzero(weight > 0)
    if resample is not None and len(some):
        # the mirror image, moved onto its landing texel's tangent plane: on the surface to
        # within that texel's flatness, so the photo's depth test sees it as the texel itself
        js = j[some]
        off = ((mirrored[some] - positions[js]) * normals[js]).sum(axis=1, keepdims=True)
        points = (mirrored[some] - off * normals[js]).astype(np.float32)
        got, ok = resample(js, points, normals[js].astype(np.float32))
        out_c[some[ok]] = got[ok]
    filled = (weight > 0.5) & (confidence <= 0.5)
    return MirrorFill(out_c, weight, used=True, plane=plane, pairs=pairs, agreement=agreement,
                      texels_fraction=float(filled.mean()) if n else 0.0)


def _smoothstep(x: np.ndarray) -> np.ndarray:
    s = np.clip(x, 0.0, 1.0)
    return s * s * (3.0 - 2.0 * s)
