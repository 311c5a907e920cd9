"""Shape helpers for the automatic masks (``app.segment.border_model``, ``app.segment.sam2_auto``):
pieces of a mask and their weight, holes, contact with the image border, scaling.

Masks are (h, w) bool numpy arrays; cv2 is imported inside the functions that use it.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


def work_copy(rgb: np.ndarray, side: int) -> np.ndarray:
    """``rgb`` downscaled (area average) so its longest side is at most ``side``."""
    import cv2

    h, w = rgb.shape[:2]
    s = side / max(h, w)
    if s >= 1:
        return np.ascontiguousarray(rgb)
    return cv2.resize(rgb, (max(16, round(w * s)), max(16, round(h * s))), interpolation=cv2.INTER_AREA)


def components(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(labels (h, w) int32, stats (n, 5): cv2's x, y, w, h, area; row 0 the rest)."""
    import cv2

    _, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    return labels, stats


def piece_weights(labels: np.ndarray, stats: np.ndarray) -> np.ndarray:
    """(n - 1,) each piece's area times its centrality: 1 with its centroid at the image's
    centre, 0.7 at the middle of a side, 0.4 at a corner. Size wins; the middle breaks ties."""
    h, w = labels.shape
    n = len(stats)
    ys, xs = np.nonzero(labels)
    lab = labels[ys, xs]
    count = np.maximum(np.bincount(lab, minlength=n), 1).astype(np.float64)
    cx = np.bincount(lab, xs, minlength=n) / count
    cy = np.bincount(lab, ys, minlength=n) / count
    r2 = ((cx - w / 2) / (w / 2)) ** 2 + ((cy - h / 2) / (h / 2)) ** 2
    return (stats[:, 4] * (1.0 - 0.3 * np.minimum(r2, 2.0)))[1:]


def disk(radius: float) -> np.ndarray:
    """An elliptic structuring element of ``radius`` (>= 1) pixels."""
    import cv2

    r = max(1, int(round(radius)))
    return cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * r + 1, 2 * r + 1))


def dilate(mask: np.ndarray, radius: float) -> np.ndarray:
    import cv2

    return cv2.dilate(mask.astype(np.uint8), disk(radius)) > 0


def erode(mask: np.ndarray, radius: float) -> np.ndarray:
    import cv2

    return cv2.erode(mask.astype(np.uint8), disk(radius)) > 0


def open_specks(mask: np.ndarray) -> np.ndarray:
    """``mask`` without one-pixel specks and whiskers (a 3x3 opening)."""
    import cv2

    return cv2.morphologyEx(mask.astype(np.uint8), cv2.MORPH_OPEN, disk(1)) > 0


def fill_holes(obj: np.ndarray, stands_out: np.ndarray, small_share: float = 0.002) -> np.ndarray:
    """``obj`` with its holes filled, except those that are not tiny (``small_share`` of
    the object) and do not stand out (``stands_out`` false on most of them): the space
    inside a handle or between legs shows the background."""
    labels, stats = components(~obj)
    h, w = obj.shape
    small = max(4, int(small_share * obj.sum()))
    out = obj.copy()
    for i in range(1, len(stats)):
        x, y, bw, bh, area = stats[i]
        if x == 0 or y == 0 or x + bw == w or y + bh == h:
            continue   # open to the border: outside, not a hole
        hole = labels == i
        if area <= small or stands_out[hole].mean() > 0.5:
            out |= hole
    return out


def frame_contact(mask: np.ndarray) -> float:
    """The share of the image's outermost pixel ring that ``mask`` covers."""
    ring = np.concatenate([mask[0], mask[-1], mask[1:-1, 0], mask[1:-1, -1]])
    return float(ring.mean())


def spans(mask: np.ndarray) -> Optional[str]:
    """"left to right" or "top to bottom" when ``mask`` touches two opposite sides (more
    than 1 % of each), else None. An object cut by one side, or by two at a corner, is
    still a photo of an object; a region from side to side splits the background in two,
    as a table edge, a floor or a horizon does."""
    def touches(edge: np.ndarray) -> bool:
        return int(edge.sum()) > max(2, 0.01 * edge.size)

    if touches(mask[:, 0]) and touches(mask[:, -1]):
        return "left to right"
    if touches(mask[0]) and touches(mask[-1]):
        return "top to bottom"
    return None


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two bool masks (0 when both are empty)."""
    return float((a & b).sum() / max(1, (a | b).sum()))


def to_size(mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(h, w) bool -> (H, W) bool with interpolated (not blocky) edges."""
    import cv2

    H, W = shape
    if mask.shape == (H, W):
        return mask
    soft = cv2.GaussianBlur(mask.astype(np.float32), (3, 3), 0)
    return cv2.resize(soft, (W, H), interpolation=cv2.INTER_LINEAR) >= 0.5
