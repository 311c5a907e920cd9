"""Selecting an object in a line drawing by the outlines around it, without a model.

GrabCut tells object from background by colour; in a line drawing (dark strokes on
paper) the inside of an object is the same paper as the outside, so a box around a
sofa gives nothing or a few strokes. What marks the object is geometry: its outline
closes around it. Here the strokes are found against the paper's colour, small gaps
in them are closed, and every region the outside cannot reach without crossing a
stroke is the object, together with the strokes that bound it.

Works on the segmenter's working copy (clicks and box in its pixels) and returns a
mask of that size, or None when the region is not a line drawing: the caller then
falls back on GrabCut.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from app.segment.prompts import Box, Click, box_mask

# a line drawing is mostly paper: at least this share of the region is within the paper's
# noise of its colour (anti-aliased stroke edges are neither paper nor ink)
MIN_PAPER_SHARE = 0.6
# ... and has strokes: between these shares of the region differ clearly from the paper
MIN_INK_SHARE, MAX_INK_SHARE = 0.002, 0.3
# strokes are thin: at most this share of the ink survives a 9x9 erosion, which takes
# strokes up to about 8 px (anti-aliasing included) of the working copy; a filled shape,
# such as a product photographed on white, mostly survives it and is left to GrabCut
MAX_THICK_INK = 0.3
# a closed shape belongs to the box's object when at least this share of it lies inside the box
MIN_INSIDE_BOX = 0.7
# pieces under this share of the box (letters, hatching specks) are dropped, and without object
# clicks those under this share of the largest (a cup beside the sofa the box was drawn around)
MIN_PIECE_OF_BOX, MIN_PIECE_OF_LARGEST = 0.005, 0.2
# a clicked shape over this share of the image is the picture's frame, not an object
MAX_CLICKED_SHARE = 0.5


def paper_ink(rgb: np.ndarray) -> tuple[np.ndarray, float]:
    """(ink mask, paper share) of an (h, w, 3) uint8 region.

    The paper is the region's median colour (a drawing is mostly paper); a pixel is
    ink when one channel differs from it by well over the paper's own noise. The
    largest channel difference rather than brightness, so coloured pens and tinted
    paper count too.
    """
    import cv2

    # medians of every other pixel: as good an estimate at a quarter of the cost
    paper = np.median(rgb[::2, ::2].reshape(-1, 3), axis=0).astype(np.uint8)
    diff = cv2.absdiff(rgb, np.ascontiguousarray(np.broadcast_to(paper, rgb.shape)))
    # channel by channel: numpy's max(axis=2) is twenty times slower on an (h, w, 3) array
    dist = np.maximum(np.maximum(diff[..., 0], diff[..., 1]), diff[..., 2])
    noise = float(np.median(dist[::2, ::2]))
    paper_share = float((dist <= max(12.0, 2.5 * noise)).mean())
    return dist > max(28.0, 5.0 * noise), paper_share


def is_line_art(ink: np.ndarray, paper_share: float) -> bool:
    """True for mostly-paper regions whose ink is thin strokes."""
    import cv2

    share = float(ink.mean())
    if paper_share < MIN_PAPER_SHARE or not MIN_INK_SHARE <= share <= MAX_INK_SHARE:
        return False
    u8 = ink.astype(np.uint8)
    thick = cv2.erode(u8, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (9, 9)))
    return int(thick.sum()) <= MAX_THICK_INK * int(u8.sum())


def stroke_radius(ink: np.ndarray) -> int:
    """How far (pixels) an enclosed region must grow to cover the strokes around it.

    A stroke of width w and length L has area w*L and about 2L edge pixels, so
    w ~ 2 * area / edge pixels; half of it plus one reaches across, and two
    neighbouring regions grown so meet over the stroke between them.
    """
    import cv2

    inner = cv2.erode(ink.astype(np.uint8), np.ones((3, 3), np.uint8)) > 0
    edge = int((ink & ~inner).sum())
    width = 2.0 * int(ink.sum()) / max(1, edge)
    return int(np.clip(np.ceil(width / 2) + 1, 2, 8))


def reachable(free: np.ndarray, seeds: Sequence[tuple[int, int]]) -> np.ndarray:
    """Free pixels reachable from the region's border or from the (x, y) seeds.

    4-connected: a thin diagonal stroke is only 8-connected, and an 8-connected
    flood would leak through it.
    """
    import cv2

    n, labels = cv2.connectedComponents(free.astype(np.uint8), connectivity=4)
    outside = set(np.unique(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]])).tolist())
    for x, y in seeds:
        outside.add(int(labels[y, x]))
    outside.discard(0)   # label 0 is the ink itself
    return np.isin(labels, sorted(outside)) & free


def fill_holes(mask: np.ndarray, keep_open: Sequence[tuple[int, int]] = ()) -> np.ndarray:
    """``mask`` with every region it encloses added (pieces drawn inside an object),
    except those a (x, y) in ``keep_open`` lands in (a background click there)."""
    return ~reachable(~mask, [(x, y) for x, y in keep_open if not mask[y, x]])


def closed_shapes(ink: np.ndarray, background: Sequence[tuple[int, int]]) -> np.ndarray:
    """The regions enclosed by strokes, with their strokes; (h, w) bool.

    Small gaps in the strokes are closed first (a drawing downscaled from many
    megapixels keeps faint lines with holes in them). Background seeds open the
    regions they land in to the outside, as a background click should.
    """
    import cv2

    ink = cv2.morphologyEx(ink.astype(np.uint8), cv2.MORPH_CLOSE,
                           cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3))) > 0
    free = ~ink
    enclosed = free & ~reachable(free, [(x, y) for x, y in background if free[y, x]])
    if not enclosed.any():
        return enclosed
    r = stroke_radius(ink)
    grown = cv2.dilate(enclosed.astype(np.uint8), cv2.getStructuringElement(
        cv2.MORPH_ELLIPSE, (2 * r + 1, 2 * r + 1))) > 0
    return fill_holes(enclosed | (ink & grown), background)


def _pieces(mask: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    import cv2

    n, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    return n, labels, stats[:, cv2.CC_STAT_AREA]


def pieces_for_box(shapes: np.ndarray, inside: np.ndarray, by_size: bool = True) -> np.ndarray:
    """The closed shapes that belong to the box: mostly inside it, and not specks.

    A shape straddling the box's edge is a neighbour the box cuts through; one
    the box only clips a little is the object under a tight box. A box is drawn
    around one object, so with ``by_size`` a separate shape much smaller than the
    largest is something beside it; without (object clicks choose the pieces), it stays.
    """
    n, labels, area = _pieces(shapes)
    if n <= 1:
        return np.zeros(shapes.shape, bool)
    within = np.bincount(labels[inside], minlength=n)
    ok = within >= MIN_INSIDE_BOX * area
    ok[0] = False
    if not ok.any():
        return np.zeros(shapes.shape, bool)
    biggest = int(within[ok].max())
    ok &= within >= MIN_PIECE_OF_BOX * int(inside.sum())
    if by_size:
        ok &= within >= MIN_PIECE_OF_LARGEST * biggest
    return ok[labels] & inside


def pieces_clicked(shapes: np.ndarray, objects: Sequence[tuple[int, int]]) -> Optional[np.ndarray]:
    """The closed shapes the object clicks land in; None when a click misses them all
    or a clicked shape is most of the image (a frame around the whole picture)."""
    n, labels, area = _pieces(shapes)
    hit = {int(labels[y, x]) for x, y in objects} - {0}
    if not hit or any(area[i] > MAX_CLICKED_SHARE * shapes.size for i in hit):
        return None
    return np.isin(labels, sorted(hit))


def _grown_box(box: Box, shape: tuple[int, int]) -> tuple[int, int, int, int]:
    """Integer (x0, y0, x1, y1), end exclusive, of ``box`` grown by a tenth of its size
    (at least 4 px): an object a tight box clips still closes inside the crop."""
    h, w = shape
    mx = max(4.0, 0.1 * (box[2] - box[0]))
    my = max(4.0, 0.1 * (box[3] - box[1]))
    return (max(0, int(box[0] - mx)), max(0, int(box[1] - my)),
            min(w, int(np.ceil(box[2] + mx)) + 1), min(h, int(np.ceil(box[3] + my)) + 1))


def select_outlined(rgb: np.ndarray, clicks: Sequence[Click], box: Optional[Box]) -> Optional[np.ndarray]:
    """(h, w) bool: the closed outlines the prompt points at, when ``rgb`` is a line drawing.

    With a box: the closed shapes inside it (found in the box grown a little, so a
    tight box still works), then those the object clicks land in; an empty mask
    when nothing in the box is closed (GrabCut would only find strokes there).
    Without a box: the shapes the object clicks land in. None when the region is
    not line art, or when object clicks land on nothing closed, so that the caller
    tries GrabCut, which grows a selection from the clicks themselves.
    """
    h, w = rgb.shape[:2]
    x0, y0, x1, y1 = _grown_box(box, (h, w)) if box is not None else (0, 0, w, h)
    if x1 - x0 < 8 or y1 - y0 < 8:
        return None
    ink, paper_share = paper_ink(rgb[y0:y1, x0:x1])
    if not is_line_art(ink, paper_share):
        return None

    def local(label: int) -> list[tuple[int, int]]:
        return [(min(max(int(round(x)) - x0, 0), x1 - x0 - 1), min(max(int(round(y)) - y0, 0), y1 - y0 - 1))
                for x, y, lab in clicks if lab == label
                and x0 <= round(x) < x1 and y0 <= round(y) < y1]

    shapes = closed_shapes(ink, local(0))
    objects = local(1)
    if box is None:
        picked = pieces_clicked(shapes, objects)
        if picked is None:
            return None   # the clicks are on something open: GrabCut grows from them
        shapes = picked
    else:
        inside = box_mask((h, w), box)[y0:y1, x0:x1]
        picked = pieces_clicked(pieces_for_box(shapes, inside, by_size=False), objects) if objects else None
        # clicks that miss every shape in the box see what the box found, as in
        # keep_clicked_components, unless it found nothing: then GrabCut grows from them
        shapes = picked if picked is not None else pieces_for_box(shapes, inside)
        if objects and not shapes.any():
            return None
    out = np.zeros((h, w), bool)
    out[y0:y1, x0:x1] = shapes
    return out
