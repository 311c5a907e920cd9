"""Which pixels of the photo each object of a scene may take its colours from.

One photo projected onto several objects needs a depth test across all of them: a texel of one
object that another object hides from the camera is hidden, and takes none of that object's
colours. Each object's own bake already finds its own nearest surface at every pixel, so the
test across objects comes down to one thing per pixel: whether this object's nearest surface
is the nearest of all. Its photo mask loses the pixels where another object lies nearer, and
a band of ``EDGE_PX`` round them and round the pixels only another object's mask holds: there
the photo's pixels mix both objects' colours (and the masks' and meshes' edges do not meet
exactly). Where two masks overlap (a mask of a whole object, behind what hides it), the depth
test alone decides.
The texels that lose their pixels are filled like any the camera does not see, each from its
own object (``pipeline.texture.unseen``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from pipeline.types import Mesh, SourceCamera
from pipeline.validate import StageInputError

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext

EDGE_PX = 3               # pixels of the photo round another object that no object takes colour from
DEPTH_SLACK = 1e-4        # relative depth difference below which two surfaces touch (neither hides)


@dataclass(frozen=True)
class Visibility:
    """masks: (N, H, W) bool, each object's photo mask less what others hide or touch;
    hidden_px: per object, the pixels of its own mask another object lies in front of;
    edge_px: per object, the pixels of its own mask dropped as an edge band."""

    masks: np.ndarray
    hidden_px: tuple[int, ...]
    edge_px: tuple[int, ...]


def depth_maps(ctx: "RasterContext", meshes: Sequence[Mesh], camera: SourceCamera) -> np.ndarray:
    """(N, H, W) float32: each mesh's nearest camera depth at every pixel, +inf where it is not."""
    from pipeline.raster.rasterize import rasterize_views

    out = np.empty((len(meshes), camera.height, camera.width), np.float32)
    for i, mesh in enumerate(meshes):
        r = rasterize_views(ctx, mesh, camera.as_cameras())
        out[i] = np.where(r.tri_id[0] >= 0, r.depth[0], np.inf)
    return out


def visible_masks(depths: np.ndarray, masks: Sequence[np.ndarray], edge_px: int = EDGE_PX) -> Visibility:
    """Each object's mask (``masks``, (H, W) bool each) kept where its surface is the nearest
    of all (``depths`` from ``depth_maps``) and away from the others' pixels."""
    import cv2

    n = len(masks)
    if depths.shape[0] != n or any(m.shape != depths.shape[1:] for m in masks):
        raise StageInputError(f"{n} masks of sizes {sorted({m.shape for m in masks})} for "
                              f"{depths.shape[0]} depth maps of {depths.shape[1:]}")
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * edge_px + 1, 2 * edge_px + 1))
    out, hidden, edge = [], [], []
    for i in range(n):
        others = np.delete(depths, i, axis=0)
        nearest_other = others.min(0) if len(others) else np.full(depths.shape[1:], np.inf, np.float32)
        mine = depths[i]
        in_front = np.isfinite(nearest_other) & (nearest_other < mine * (1.0 - DEPTH_SLACK))
        own = masks[i].astype(bool)
        # the pixels the photo gives only to others (their masks reach where their meshes do
        # not); where two masks overlap (a mask of the whole object, behind what hides it)
        # the depth test alone decides
        theirs = np.zeros(mine.shape, bool)
        for j in range(n):
            if j != i:
                theirs |= masks[j] & ~own
        band = cv2.dilate((in_front | theirs).astype(np.uint8), kernel) > 0 if edge_px > 0 else in_front | theirs
        keep = own & ~band
        out.append(keep)
        hidden.append(int((own & in_front).sum()))
        edge.append(int((own & band & ~in_front).sum()))
    return Visibility(masks=np.stack(out), hidden_px=tuple(hidden), edge_px=tuple(edge))
