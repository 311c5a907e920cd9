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
        background_reach: a background click's region reaches at most this share of the
            image's longest side from the click.
        loose: ``near_colour``'s range, in ``tolerance``s (or the click's range when wider): colours this close may be more of
            the same thing (its shaded side), farther ones are some other thing until
            GrabCut's colour model says otherwise.
    """

    tolerance: float = 9.0
    noise_factor: float = 2.5
    max_tolerance: float = 24.0
    blur: float = 1.0
    max_object_share: float = 0.25
    loose: float = 2.0
    background_reach: float = 0.06

    def lab(self, rgb: np.ndarray) -> np.ndarray:
        """(h, w, 3) uint8 RGB -> smoothed (h, w, 3) uint8 Lab, what the regions are grown on."""
        import cv2

        smooth = cv2.GaussianBlur(rgb, (0, 0), self.blur) if self.blur > 0 else rgb
        return cv2.cvtColor(np.ascontiguousarray(smooth), cv2.COLOR_RGB2LAB)

    def seed(self, lab: np.ndarray, x: int, y: int) -> tuple[np.ndarray, float]:
        """(the clicked colour (3,) float32, its range) at (x, y) of ``lab``.

        The colour is the median of the most even of the four 4x4 patches that have the
        click at a corner and about its colour, and the noise that patch's largest channel
        spread: a click beside an edge takes its own side's colour, not the mixture of both
        nor the other side's.
        """
        h, w = lab.shape[:2]
        own = lab[y, x].astype(np.float32)
        best = None
        for dx, dy in ((-3, -3), (0, -3), (-3, 0), (0, 0)):
            patch = lab[max(0, y + dy):max(0, y + dy + 4), max(0, x + dx):max(0, x + dx + 4)]
            patch = patch.reshape(-1, 3).astype(np.float32)
            if len(patch) < 4:
                continue
            colour, spread = np.median(patch, axis=0), float(patch.std(axis=0).max())
            # only a patch of the clicked pixel's own colour: on an edge, the side clicked
            if float(np.abs(colour - own).max()) > self.tolerance:
                continue
            if best is None or spread < best[1]:
                best = (colour, spread)
        colour, noise = best if best is not None else (own, 0.0)
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
            # within ``background_reach`` of the click: the whole backdrop as certain
            # background teaches GrabCut that its colour is never the object's, and the
            # dark stripes of a toy on a dark backdrop would go with it
            yy, xx = np.ogrid[:h, :w]
            reach = self.background_reach * max(h, w)
            backgrounds.append(r & ((xx - x) ** 2 + (yy - y) ** 2 <= reach * reach))
        return objects, backgrounds


@dataclass(frozen=True)
class Spread:
    """When a selection made by clicks has most likely taken in other things than the clicked
    one (issue 38: one click on a sofa took the side table, the lamp and the door along):
    opened with a disk of ``neck`` of the image, on a copy of at most ``side`` pixels, it
    falls into several pieces of at least ``piece`` of it each, separate things joined by
    thin parts (a sofa and the rug its feet stand on; a table's thin top leading on to a
    lamp and a door).

    Colour alone does not tell: a part of the selection of other colours than the clicked
    ones, beside the clicks, is as often the same thing (a toy's head above its striped
    body, a sofa's shaded back above the clicked seat) as another one, so it is not warned
    about (measured on tests/composites.py's objects and tests/clutter.py's rooms).

    Args:
        side: working size (pixels, longest side).
        neck: radius of the opening, as a share of the longest side.
        piece: share of the selection a piece must have to count as a thing.
    """

    side: int = 320
    neck: float = 0.02
    piece: float = 0.1

    def check(self, mask: np.ndarray, clicks: Sequence[Click]) -> str:
        """A warning (lower case, no final stop) about (H, W) bool ``mask`` selected by
        ``clicks``, or "" when it looks like one thing."""
        import cv2

        if not any(c[2] == 1 for c in clicks) or not mask.any():
            return ""
        h, w = mask.shape
        s = min(1.0, self.side / max(h, w))
        size = (max(8, round(w * s)), max(8, round(h * s)))
        m = cv2.resize(mask.astype(np.uint8), size, interpolation=cv2.INTER_NEAREST) if s < 1 else mask.astype(np.uint8)
        total = int(m.sum())
        if not total:
            return ""
        r = max(2, int(round(self.neck * max(size))))
        opened = cv2.morphologyEx(m, cv2.MORPH_OPEN, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * r + 1,) * 2))
        _, _, stats, _ = cv2.connectedComponentsWithStats(opened, connectivity=8)
        pieces = int((stats[1:, cv2.CC_STAT_AREA] >= self.piece * total).sum())
        if pieces >= 2:
            return (f"the selection looks like {pieces} things joined by thin parts: if only one is "
                    "wanted, add a background click on each of the others, or drag a box around it")
        return ""


@dataclass(frozen=True)
class ColourSpread:
    """When a selection made by clicks reaches far beyond the clicked colours (issue 38: one
    click on a sofa took the rug under it and the plant beside it, joined broadly, so that
    ``Spread``'s thin parts do not show them).

    The selection is cut into flat patches (pixels whose Lab neighbourhood varies by less
    than ``edge``; the edges between colours belong to none), and the patches into colour
    groups: patches within ``chain`` of one another, transitively, wherever they lie (a
    thing's shades, a gradient's bands). The clicked group is the one the object clicks land
    on. A many-coloured thing has its other colours between its clicked-colour patches
    (stripes, a checker): inside the clicked group's convex hull, or its clicked colour is a
    small part of it (a gradient checker, where no group is large). Another thing lies beside
    the clicked one: a group of at least ``piece`` of the selection, at least half of it
    outside that hull. Warned when such groups hold more than ``beyond`` of the selection
    outside the hull (grown by ``margin`` of the longest side), and the clicked group at
    least ``own`` of it.

    Measured on tests/clutter.py's rooms (sofa alone 0 %, sofa + rug + plant 29-30 % of the
    selection beyond) and tests/composites.py's many-coloured objects (0 %); see
    docs/benchmarks.md. Not told apart: one thing of two colours side by side (a person's
    shirt and trousers, clicked on the shirt) reads as two things.

    Args:
        side: working size (pixels, longest side).
        edge: largest Lab step (OpenCV's 8-bit scale) across a 3x3 neighbourhood inside a patch.
        patch: smallest patch, as a share of the selection.
        chain: largest Lab difference (any channel) between the median colours of two
            patches that chain: more than a thing's lit and shaded sides (a sofa's seat and
            back differ by about 20 in L), less than a light stripe and a dark one.
        margin: growth of the clicked group's hull, as a share of the longest side.
        own: the clicked group's smallest share of the selection for colour to say anything.
        piece: a group's smallest share of the selection to count as another thing.
        beyond: share of the selection outside the hull, in other things, that is warned about.
    """

    side: int = 200
    edge: float = 10.0
    patch: float = 0.003
    chain: float = 24.0
    margin: float = 0.02
    own: float = 0.2
    piece: float = 0.05
    beyond: float = 0.2

    def outside(self, rgb: np.ndarray, mask: np.ndarray, clicks: Sequence[Click]) -> float:
        """The share of (H, W) bool ``mask`` outside the grown hull of its clicked colours,
        on (H, W, 3) uint8 ``rgb``; 0 without object clicks."""
        import cv2

        if not any(c[2] == 1 for c in clicks) or not mask.any():
            return 0.0
        h, w = mask.shape
        s = min(1.0, self.side / max(h, w))
        size = (max(8, round(w * s)), max(8, round(h * s)))
        m = cv2.resize(mask.astype(np.uint8), size, interpolation=cv2.INTER_NEAREST) > 0
        if not m.any():
            return 0.0
        small = cv2.resize(rgb, size, interpolation=cv2.INTER_AREA) if s < 1 else rgb
        regions = ClickRegions()
        lab = regions.lab(small)
        k3 = np.ones((3, 3), np.uint8)
        step = (cv2.dilate(lab, k3).astype(np.int16) - cv2.erode(lab, k3)).max(axis=2)
        flat = m & (step <= self.edge)
        n, labels, stats, _ = cv2.connectedComponentsWithStats(flat.astype(np.uint8), connectivity=4)
        big = [i for i in range(1, n) if stats[i, cv2.CC_STAT_AREA] >= max(4, self.patch * m.sum())]
        if not big:
            return 0.0
        labf = lab.astype(np.float32)
        colours = np.array([np.median(labf[labels == i], axis=0) for i in big])
        # colour groups: patches chained by colour, transitively (a thing's shades, the bands
        # of a gradient), wherever they lie
        similar = np.abs(colours[:, None] - colours[None, :]).max(axis=2) <= self.chain
        group = np.arange(len(big))
        while True:
            merged = np.where(similar, group[None, :], len(big)).min(axis=1)
            if (merged == group).all():
                break
            group = merged
        area = stats[big, cv2.CC_STAT_AREA].astype(np.float64)
        total = float(m.sum())
        index = {b: i for i, b in enumerate(big)}
        clicked: set[int] = set()
        for x, y, label in clicks:
            if label != 1:
                continue
            cx, cy = min(max(int(round(x * s)), 0), size[0] - 1), min(max(int(round(y * s)), 0), size[1] - 1)
            # the patch the click lands on, else those of about its colour (a click on an
            # edge, or on a patch too small to count, still names its colour)
            if int(labels[cy, cx]) in index:
                clicked.add(int(group[index[int(labels[cy, cx])]]))
            else:
                near = np.abs(colours - regions.seed(lab, cx, cy)[0]).max(axis=1) <= self.chain
                clicked |= set(group[near].tolist())
        own = np.isin(group, sorted(clicked))
        if area[own].sum() < self.own * total:
            return 0.0   # the clicked colours are a small part: a many-coloured thing
        drawn = np.zeros(m.shape, np.uint8)
        cv2.fillConvexPoly(drawn, cv2.convexHull(cv2.findNonZero(np.isin(labels, np.array(big)[own]).astype(np.uint8))), 1)
        r = max(1, int(round(self.margin * max(size))))
        hull = cv2.dilate(drawn, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * r + 1,) * 2)) > 0
        out = 0.0
        for g in set(group[~own].tolist()):
            pix = np.isin(labels, np.array(big)[group == g])
            if pix.sum() >= self.piece * total and (pix & ~hull).sum() >= 0.5 * pix.sum():
                out += float((pix & ~hull).sum()) / total   # another thing beside the clicked one
        return out

    def check(self, rgb: np.ndarray, mask: np.ndarray, clicks: Sequence[Click]) -> str:
        """A warning (lower case, no final stop) about ``mask`` selected by ``clicks`` on
        ``rgb``, or "" when it keeps to the clicked colours."""
        share = self.outside(rgb, mask, clicks)
        if share <= self.beyond:
            return ""
        return (f"{round(100 * share)} % of the selection lies beyond the clicked colours: if that is "
                "other things, add a background click on each, or drag a box around the object")
