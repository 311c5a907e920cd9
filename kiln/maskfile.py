"""How a mask file is read: which channel marks the object, and where the line is drawn.

The rule (README "Masks", docs/ui.md), for the CLI's ``--mask``/``--mask-dir`` and the page:

1. A file whose alpha channel is not constant is read by its alpha; its colour channels
   are ignored. (SAM 3D Objects ships masks like that: the alpha marks the object while
   the colour channels hold other data.)
2. Otherwise it is read by its grey level (luma of the colour channels), white = object.
3. A channel with two levels: the higher one is the object (0/255, but also 0/1 masks
   saved straight from numpy). More than two levels (soft edges, JPEG noise): the channel
   is thresholded halfway between its lowest and highest value, and the reading says so.

An image's own transparency (no mask file) is read by rules 1 and 3.

Pure numpy: the app process uses this and must stay light.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class MaskReading:
    """A mask as read from a file (or an image's alpha), and how it was read.

    mask:        (H, W) bool, True on the object
    channel:     "alpha" or "grey"
    levels:      distinct values in that channel (1..256)
    threshold:   a pixel is the object when its channel value is >= threshold
    thresholded: the channel had more than two levels, so ``threshold`` was decided here
    own_alpha:   the image's own transparency, not a mask file (its colour is the photo)
    """

    mask: np.ndarray
    channel: str
    levels: int
    threshold: int
    thresholded: bool
    own_alpha: bool = False

    @property
    def coverage(self) -> float:
        """Fraction of the image that is the object, 0..1."""
        return float(self.mask.mean()) if self.mask.size else 0.0

    def describe(self, name: str) -> str:
        """One line for a person: which channel, any thresholding, and the coverage."""
        if self.own_alpha:
            how = "its alpha (opaque = object)"
        elif self.channel == "alpha":
            how = "its alpha channel (colour channels ignored)"
        else:
            how = "its grey level (white = object)"
        text = f"{name}: read by {how}"
        if self.thresholded:
            text += (f"; it has {self.levels} levels, so it was thresholded at {self.threshold} "
                     f"(>= {self.threshold} is the object)")
        return text + f"; the object covers {100 * self.coverage:.1f} % of the image"


def grey_level(rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 -> (H, W) uint8 luma, ITU-R 601 weights (as PIL's "L" conversion)."""
    r, g, b = (rgb[..., i].astype(np.uint32) for i in range(3))
    return ((299 * r + 587 * g + 114 * b + 500) // 1000).astype(np.uint8)


def _read_channel(values: np.ndarray, channel: str, own_alpha: bool = False) -> MaskReading:
    counts = np.bincount(values.ravel(), minlength=256)
    present = np.flatnonzero(counts)
    lo, hi = int(present[0]), int(present[-1])
    if len(present) == 1:
        # constant: all object or all background; >= 128 reads white (or opaque) as object
        threshold, thresholded = 128, False
    elif len(present) == 2:
        threshold, thresholded = hi, False
    else:
        threshold, thresholded = (lo + hi + 1) // 2, True
    return MaskReading(mask=np.ascontiguousarray(values >= threshold), channel=channel,
                       levels=int(len(present)), threshold=threshold, thresholded=thresholded,
                       own_alpha=own_alpha)


def read_mask_channels(rgb: np.ndarray, alpha: np.ndarray | None) -> MaskReading:
    """Apply the rule to a decoded mask file: (H, W, 3) uint8 colour, (H, W) uint8 alpha or None."""
    if alpha is not None and alpha.min() != alpha.max():
        return _read_channel(alpha, "alpha")
    return _read_channel(grey_level(rgb), "grey")


def read_alpha(alpha: np.ndarray) -> MaskReading:
    """An image's own transparency as its mask (rules 1 and 3)."""
    return _read_channel(alpha, "alpha", own_alpha=True)


def load_mask(source: str | Path | bytes, max_pixels: int,
              max_bytes: int | None = None) -> MaskReading:
    """Load a mask file (path or encoded bytes) and read it by the rule.

    Raises ``kiln.imageio.ImageError`` for a file that is not a usable image.
    """
    from kiln.imageio import load_image

    rgb, alpha = load_image(source, max_pixels=max_pixels, max_bytes=max_bytes)
    return read_mask_channels(rgb, alpha)
