"""Pack flattened charts into one square texture: rotate, then skyline-pack bounding boxes.

Each chart is turned to the angle that gives it the smallest bounding box (and lying
flat, wider than tall), then the boxes, padded for the gutter, are placed tallest
first on a skyline (each box goes where the skyline under it is lowest). The texel
density is the largest one at which everything fits, found by bisection; a packing
attempt costs O(charts * texture_size), independent of the face count.

Gutter: boxes are padded so that two charts' texel-centre footprints are at least
``2 * gutter + 1`` texels apart, and every chart is ``gutter + 0.5`` texels from the
atlas border, so each chart can be dilated by ``gutter`` texels for bilinear
sampling without reaching another one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ANGLES = 24                 # rotations tried per chart, over 90 degrees
BISECTION_STEPS = 10
MIN_FILL = 1e-4


class PackError(Exception):
    """The charts cannot fit one texture with this gutter."""


@dataclass
class Placement:
    """texels: (N, 2) float64 positions in texels, x right, y up (v = y / size)."""

    texels: np.ndarray
    texels_per_unit: float
    fixed_offset: np.ndarray | None = None    # (2,) whole texels: where the fixed block went


def _group_starts(sorted_ids: np.ndarray) -> np.ndarray:
    return np.r_[0, np.flatnonzero(np.diff(sorted_ids)) + 1]


def orient(uv: np.ndarray, chart: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rotate every chart to its smallest bounding box, wider than tall.

    uv: (N, 2) chart-vertex positions; chart: (N,) chart ids, sorted ascending.
    Returns (rotated uv with every chart's box starting at 0, (C, 2) box sizes).
    """
    starts = _group_starts(chart)
    best_area = np.full(starts.size, np.inf)
    best_angle = np.zeros(starts.size)
    for a in np.linspace(0.0, np.pi / 2, ANGLES, endpoint=False):
        ca, sa = np.cos(a), np.sin(a)
        x = uv[:, 0] * ca - uv[:, 1] * sa
        y = uv[:, 0] * sa + uv[:, 1] * ca
        w = np.maximum.reduceat(x, starts) - np.minimum.reduceat(x, starts)
        h = np.maximum.reduceat(y, starts) - np.minimum.reduceat(y, starts)
        area = w * h + 1e-12 * (w + h)      # thin charts: still prefer the narrower box
        better = area < best_area
        best_area[better] = area[better]
        best_angle[better] = a
    counts = np.diff(np.r_[starts, uv.shape[0]])
    ang = np.repeat(best_angle, counts)
    ca, sa = np.cos(ang), np.sin(ang)
    out = np.stack([uv[:, 0] * ca - uv[:, 1] * sa, uv[:, 0] * sa + uv[:, 1] * ca], 1)
    size = _boxes(out, starts)
    tall = np.repeat(size[:, 1] > size[:, 0], counts)
    out[tall] = np.stack([-out[tall, 1], out[tall, 0]], 1)     # a quarter turn keeps orientation
    size = _boxes(out, starts)
    lo = np.stack([np.minimum.reduceat(out[:, 0], starts), np.minimum.reduceat(out[:, 1], starts)], 1)
    return out - np.repeat(lo, counts, axis=0), size


def _boxes(uv: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.stack([np.maximum.reduceat(uv[:, k], starts) - np.minimum.reduceat(uv[:, k], starts)
                     for k in range(2)], 1)


def skyline(widths: np.ndarray, heights: np.ndarray, size: int) -> np.ndarray | None:
    """Place integer boxes in a size x size square; (C, 2) lower-left corners or None."""
    from scipy.ndimage import maximum_filter1d

    if widths.max() > size or heights.max() > size:
        return None
    sky = np.zeros(size, np.int64)
    pos = np.zeros((widths.size, 2), np.int64)
    for i in np.lexsort((-widths, -heights)):
        w, h = int(widths[i]), int(heights[i])
        # maximum over sky[x : x + w] for every x: a centred filter shifted by origin
        top = maximum_filter1d(sky, w, mode="constant", cval=size + 1,
                               origin=-(w // 2))[: size - w + 1]
        x = int(np.argmin(top))
        y = int(top[x])
        if y + h > size:
            return None
        sky[x:x + w] = y + h
        pos[i] = x, y
    return pos


def pack(uv: np.ndarray, chart: np.ndarray, areas: np.ndarray, size: int, gutter: int,
         fixed: tuple[int, int] | None = None) -> Placement:
    """Scale, rotate and place all charts. uv (N, 2) in world units, chart (N,) sorted ids
    0..C-1, areas (C,) surface area per chart. Raises PackError when nothing fits.

    fixed: (width, height) in whole texels of one more block that is neither scaled nor
    rotated (the photo chart, ``pipeline.unwrap.photo_chart``); it is placed with ``gutter + 1``
    empty texels on every side at a whole-texel offset, returned as ``fixed_offset``:
    block coordinate (x, y) goes to texel coordinate (x, y) + fixed_offset."""
    pad = 2 * gutter + 1
    total = float(areas.sum())
    if chart.size == 0:
        if fixed is None:
            raise PackError("nothing to pack")
        pos = skyline(np.array([fixed[0] + pad + 1]), np.array([fixed[1] + pad + 1]), size)
        if pos is None:
            raise PackError(f"a {fixed[0]}x{fixed[1]} block does not fit a {size}x{size} texture")
        return Placement(texels=np.zeros((0, 2)), texels_per_unit=0.0,
                         fixed_offset=pos[0].astype(np.float64) + gutter + 1)
    rot, box = orient(uv, chart)
    if not total > 0:
        raise PackError("the mesh has no surface area")
    extra_w = np.array([] if fixed is None else [fixed[0] + pad + 1], np.int64)
    extra_h = np.array([] if fixed is None else [fixed[1] + pad + 1], np.int64)

    def attempt(s: float):
        w = np.ceil(box[:, 0] * s).astype(np.int64) + pad
        h = np.ceil(box[:, 1] * s).astype(np.int64) + pad
        return skyline(np.r_[w, extra_w], np.r_[h, extra_h], size)

    hi = size / np.sqrt(total)                  # every texel covered: an upper bound
    s, pos = hi, None
    while pos is None:
        s *= 0.8
        if s * s * total < MIN_FILL * size * size:
            raise PackError(f"{chart.max() + 1} charts do not fit one {size}x{size} texture with a "
                            f"{gutter}-texel gutter")
        pos = attempt(s)
    lo, hi = s, s / 0.8
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        p = attempt(mid)
        if p is None:
            hi = mid
        else:
            lo, pos = mid, p
    offset = pos.astype(np.float64) + gutter + 0.5
    n = box.shape[0]
    return Placement(texels=rot * lo + offset[:n][chart], texels_per_unit=float(lo),
                     fixed_offset=None if fixed is None else pos[n].astype(np.float64) + gutter + 1)
