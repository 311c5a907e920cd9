"""Keep the parts of a mask that are narrower than the reconstruction grid's cells.

The built-in surface lives on a grid whose cells span ``longest side / reconstruct.resolution``
pixels (about 2.4 px for a 380 px object at the default 160). It reads the mask as an
area-averaged coverage at each cell centre and puts the edge where that crosses 0.5, so a
stem, an antenna or a sprout one or two cells wide averages to less than 0.5 everywhere,
or breaks into pieces that are then dropped as strays: it is lost between the mask and the
grid, whatever the mesh cleanup settings. Raising the resolution keeps it, at four times the
cells and faces for twice the resolution.

Instead, the pixels of such parts (what a morphological opening the size of about two cells
takes away, in pieces big enough to be a part and not the staircase of a rim) mark the cells
they fall in as object cells, and each such cell's edge distances (the Shortley-Weller arms of
``builtin._poisson_height``) are measured from those pixels' extent inside the cell, not
interpolated from coverage. The surface there is a narrow ribbon whose outline, seen from
the photo's camera, is the part's own outline, widened at most to the cell it crosses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Arms are fractions of a cell: shorter than ARM_MIN makes the stencil stiff for nothing (a
# sliver no pixel sees), and 1 would put the edge on the neighbouring cell's centre.
ARM_MIN, ARM_MAX = 0.05, 0.95
# Below this many pixels per cell side the grid already holds anything a pixel wide
# (an opening of 2 cells would be under 3 px).
MIN_CELL_PX = 1.25

# The order of the four arms in ``ThinParts.arms``: (axis, step) as ``_poisson_height``
# walks them, step +1 being the neighbour at index + 1 (down for rows, right for columns).
ARM_ORDER = ((0, 1), (0, -1), (1, 1), (1, -1))


@dataclass(frozen=True)
class ThinParts:
    """Cells added to the silhouette grid for parts thinner than it.

    cells: (ny, nx) bool, the added cells (none on the grid's border).
    region: (ny, nx) bool, every cell a thin part's pixels fall in, added or not.
    arms:  (4, ny, nx) float64, for added cells the distance in cells from the cell centre
           to the part's edge in each ``ARM_ORDER`` direction, in [ARM_MIN, ARM_MAX];
           0 elsewhere (the coverage rule applies there).
    """
    cells: np.ndarray
    arms: np.ndarray
    region: np.ndarray


def find_thin_parts(mask_crop: np.ndarray, origin: tuple[int, int], x0: float, y0: float,
                    cell: float, inside: np.ndarray) -> ThinParts:
    """The cells a grid of ``cell`` pixels misses on the thin parts of a mask.

    mask_crop: (H, W) bool, the mask around the object; origin: (xa, ya), the crop's top-left
    pixel in the image. The grid: cell (i, j) is centred on image point (x0 + j * cell,
    y0 + i * cell) in continuous coordinates (pixel centres at +0.5). inside: (ny, nx) bool,
    the cells the coverage rule keeps, a False border all round.
    """
    none = ThinParts(np.zeros(inside.shape, bool), np.zeros((4,) + inside.shape), np.zeros(inside.shape, bool))
    if cell < MIN_CELL_PX:
        return none
    ys, xs = _thin_pixels(mask_crop, cell)
    if len(xs) == 0:
        return none
    px = xs + float(origin[0])          # pixel column c spans [c, c + 1) in image coordinates
    py = ys + float(origin[1])
    ny, nx = inside.shape
    j = np.clip(np.floor((px + 0.5 - x0) / cell + 0.5).astype(np.int64), 1, nx - 2)
    i = np.clip(np.floor((py + 0.5 - y0) / cell + 0.5).astype(np.int64), 1, ny - 2)
    flat = i * nx + j
    count = np.bincount(flat, minlength=ny * nx).reshape(ny, nx)
    added = (count > 0) & ~inside

    arms = np.zeros((4, ny * nx))
    cx = x0 + j * cell
    cy = y0 + i * cell
    reach = {(0, 1): (py + 1.0 - cy), (0, -1): (cy - py), (1, 1): (px + 1.0 - cx), (1, -1): (cx - px)}
    for k, key in enumerate(ARM_ORDER):
        np.maximum.at(arms[k], flat, reach[key] / cell)
    arms = np.clip(arms.reshape(4, ny, nx), ARM_MIN, ARM_MAX)

    added = _bridge_diagonals(inside, added, count)
    region = added | (count > 0)
    arms = np.where(region[None], arms, 0.0)
    return ThinParts(added, arms, region)


def height_floor(parts: ThinParts, thickness: float) -> np.ndarray:
    """(ny, nx) float64: the least height field value of each thin-part cell, 0 elsewhere.

    The height field of a strip one cell wide is tiny (about arm^2 / 2), so marching cubes,
    sampling depth a whole cell apart, made it a flat ribbon; quadric simplification then
    folds a ribbon's width away almost for free and the part vanished from the model. Raised
    to this floor the strip becomes as deep as the body's own rule makes a part that wide
    (depth = thickness * width): between the sample at z = 0 (value h) and the one a cell
    away (h - 1 / (4 thickness^2)), the surface crosses at z = 4 thickness^2 h, which is
    thickness * a for h = a / (4 thickness), a being the strip's half width. Where it meets
    the edge across the strip is set by the arms alone, so the outline does not move.
    """
    half_width = np.minimum(parts.arms[0] + parts.arms[1], parts.arms[2] + parts.arms[3]) / 2.0
    return np.where(parts.region, half_width / (4.0 * thickness), 0.0)


def _thin_pixels(mask_crop: np.ndarray, cell: float) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of the crop's pixels in parts narrower than about two cells."""
    ys, xs = np.nonzero(narrow_parts(mask_crop, 2.0 * cell))
    return ys.astype(np.int64), xs.astype(np.int64)


def narrow_parts(mask: np.ndarray, width: float) -> np.ndarray:
    """(H, W) bool: the pixels of ``mask`` in parts narrower than ``width`` pixels.

    An opening with a disc ``width`` across removes exactly the parts such a disc cannot
    pass through; of what it removes, pieces smaller than half that disc's square are the
    pixel staircase of a smooth rim, not a part. Also the mesh stage's rule for what its
    simplification must not fold away (``pipeline.meshing.thin_faces``).
    """
    import cv2

    d = int(math.ceil(width)) | 1
    m = np.asarray(mask, bool).astype(np.uint8)
    opened = cv2.morphologyEx(m, cv2.MORPH_OPEN, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (d, d)))
    residual = (m > 0) & (opened == 0)
    if not residual.any():
        return residual
    n, labels, stats, _ = cv2.connectedComponentsWithStats(residual.astype(np.uint8), connectivity=8)
    big = np.flatnonzero(stats[1:, cv2.CC_STAT_AREA] >= max(2 * d, d * d / 2.0)) + 1
    return np.isin(labels, big) if len(big) else np.zeros_like(residual)


def _bridge_diagonals(inside: np.ndarray, added: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``added`` plus one cell at each diagonal-only step that involves an added cell.

    The height field couples edge neighbours only, so two cells that touch at a corner are
    two parts, and the smaller is dropped as a stray; a thin diagonal part is such a chain.
    Of the two cells that would join them, the one more of the part's pixels fall in is added.
    """
    cells = inside | added
    for _ in range(2):         # a bridge can only complete a chain, not open a new corner
        # the four cells of every 2x2 block: top-left, top-right, bottom-left, bottom-right
        tl, tr, bl, br = cells[:-1, :-1], cells[:-1, 1:], cells[1:, :-1], cells[1:, 1:]
        new = np.zeros_like(cells)
        # tl-br touching at a corner only: join through tr or bl
        falling = tl & br & ~tr & ~bl & (added[:-1, :-1] | added[1:, 1:])
        via_tr = count[:-1, 1:] >= count[1:, :-1]
        new[:-1, 1:] |= falling & via_tr
        new[1:, :-1] |= falling & ~via_tr
        # tr-bl touching at a corner only: join through tl or br
        rising = tr & bl & ~tl & ~br & (added[:-1, 1:] | added[1:, :-1])
        via_tl = count[:-1, :-1] >= count[1:, 1:]
        new[:-1, :-1] |= rising & via_tl
        new[1:, 1:] |= rising & ~via_tl
        new &= ~cells
        if not new.any():
            break
        added = added | new
        cells = cells | new
    return added
