"""What a click says beyond its pixel, for the weight-free segmenter (issue 38 item 1).

A person clicks on a thing, not on a pixel: the thing's near part is the connected region of
about the clicked colour around the click. An object click's region is certainly object, a
background click's region certainly background: given to GrabCut as hard seeds, a background
click removes what it lands on and cuts whatever joined the object through it, and the
object is then what stays connected to the object clicks (``keep_clicked_components``).

Leaf module: numpy and OpenCV only, on the segmenter's small copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from app.segment.prompts import Click


@dataclass(frozen=True)
class ClickRegions:
    """How far a click's region reaches.

    Args:
        tolerance: a pixel joins the region when each of its Lab channels (OpenCV's 8-bit
            scale, L 0..255) is within this of the clicked colour; about what tells a
            cushion from the wall behind it in a flat illustration.
        noise_factor: ... or within this many times the click's local noise (a grainy photo
            needs a wider range than a drawing; the noise is the channels' spread in a
            7x7 patch around the click).
        max_tolerance: the range never grows past this, however noisy the patch.
        blur: sigma (small copy's pixels) of the smoothing before the flood, so that the
            clicked pixel stands for its neighbourhood and grain does not stop the flood.
        max_object_share: an object click's region larger than this share of the image is
            the background around an object of the same colour: only the click's disk is
            then certain.
        loose: ``near_colour``'s range, in ``tolerance``s (or the click's range when wider): colours this close may be more of
            the same thing (its shaded side), farther ones are some other thing until
            GrabCut's colour model says otherwise.
    """

    tolerance: float = 9.0
    noise_factor: float = 2.5
    max_tolerance: float = 24.0
    blur: float = 1.0
    max_object_share: float = 0.25
    loose: float = 3.0

    def lab(self, rgb: np.ndarray) -> np.ndarray:
        """(h, w, 3) uint8 RGB -> smoothed (h, w, 3) uint8 Lab, what the regions are grown on."""
        import cv2

        smooth = cv2.GaussianBlur(rgb, (0, 0), self.blur) if self.blur > 0 else rgb
        return cv2.cvtColor(np.ascontiguousarray(smooth), cv2.COLOR_RGB2LAB)

    def seed(self, lab: np.ndarray, x: int, y: int) -> tuple[np.ndarray, float]:
        """(the clicked colour (3,) float32, its range) at (x, y) of ``lab``.

        The colour is the median of the most even of the four 4x4 patches that have the
        click at a corner, and the noise that patch's largest channel spread: a click on an
        edge still takes one side's colour, not the mixture of both.
        """
        h, w = lab.shape[:2]
        best = None
        for dx, dy in ((-3, -3), (0, -3), (-3, 0), (0, 0)):
            patch = lab[max(0, y + dy):max(0, y + dy + 4), max(0, x + dx):max(0, x + dx + 4)]
            patch = patch.reshape(-1, 3).astype(np.float32)
            if len(patch) < 4:
                continue
            spread = float(patch.std(axis=0).max())
            if best is None or spread < best[1]:
                best = (np.median(patch, axis=0), spread)
        colour, noise = best if best is not None else (lab[y, x].astype(np.float32), 0.0)
        return colour, min(self.max_tolerance, max(self.tolerance, self.noise_factor * noise))

    def region(self, lab: np.ndarray, x: int, y: int, scale: float = 1.0) -> np.ndarray:
        """(h, w) bool: the 4-connected region around (x, y) within ``scale`` times the
        click's range of the clicked colour (``seed``); at least the clicked pixel."""
        import cv2

        colour, tol = self.seed(lab, x, y)
        near = (np.abs(lab.astype(np.float32) - colour) <= scale * tol).all(axis=2)
        near[y, x] = True
        _, labels = cv2.connectedComponents(near.astype(np.uint8), connectivity=4)
        return labels == labels[y, x]

    def near_colour(self, lab: np.ndarray, x: int, y: int) -> np.ndarray:
        """(h, w) bool: every pixel within ``loose`` times the click's range of its colour,
        connected to it or not: where the rest of a clicked thing may be."""
        colour, tol = self.seed(lab, x, y)
        # the base tolerance scaled, not the click's own range: a click on a thin part sees
        # the edges around it as noise, and three times that takes in everything
        return (np.abs(lab.astype(np.float32) - colour) <= max(tol, self.loose * self.tolerance)).all(axis=2)

    def regions(self, lab: np.ndarray, clicks: Sequence[Click]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(object regions, background regions), one (h, w) bool each per click on (h, w, 3)
        ``lab`` (``self.lab`` of the picture), in click order.

        A background click's region never holds an object click: when it would (the object
        and the background there are one colour), its range is halved until it does not,
        and in the end only the click's pixel is kept. An object click's region over
        ``max_object_share`` of the image becomes the click's pixel alone.
        """
        h, w = lab.shape[:2]
        pts = [(min(max(int(round(x)), 0), w - 1), min(max(int(round(y)), 0), h - 1), int(lab_))
               for x, y, lab_ in clicks]
        obj_pts = [(x, y) for x, y, lab_ in pts if lab_ == 1]
        objects, backgrounds = [], []
        for x, y, label in pts:
            if label == 1:
                r = self.region(lab, x, y)
                if r.mean() > self.max_object_share:
                    r = np.zeros((h, w), bool)
                    r[y, x] = True
                objects.append(r)
                continue
            for scale in (1.0, 0.5, 0.25):
                r = self.region(lab, x, y, scale)
                if not any(r[oy, ox] for ox, oy in obj_pts):
                    break
            else:
                r = np.zeros((h, w), bool)
                r[y, x] = True
            backgrounds.append(r)
        return objects, backgrounds
