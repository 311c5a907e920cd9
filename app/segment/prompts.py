"""What a person points at an object with: clicks (object or background) and a box, in image
pixels. A leaf that the segmenters (``app.segment.segment``, ``app.segment.outline``) and
the page share."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

Click = tuple[float, float, int]   # (x, y, label); label 1 = object, 0 = background
Box = tuple[float, float, float, float]   # (x0, y0, x1, y1), x0 < x1, y0 < y1, image pixels


def box_mask(shape: tuple[int, int], box: Box) -> np.ndarray:
    """(H, W) bool, True inside ``box`` (edges included)."""
    h, w = shape[:2]
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    out = np.zeros((h, w), bool)
    out[max(y0, 0):max(min(y1, h - 1), -1) + 1, max(x0, 0):max(min(x1, w - 1), -1) + 1] = True
    return out


def has_prompt(clicks: Sequence[Click], box: Optional[Box]) -> bool:
    """An object click or a box: enough to ask a segmenter for a mask."""
    return box is not None or any(c[2] == 1 for c in clicks)


def scale_prompt(clicks: Sequence[Click], box: Optional[Box], sx: float,
                 sy: float) -> tuple[list[Click], Optional[Box]]:
    """Clicks and box in the pixels of a copy scaled by (sx, sy)."""
    scaled = [(x * sx, y * sy, int(lab)) for x, y, lab in clicks]
    return scaled, None if box is None else (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
