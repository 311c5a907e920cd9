"""What a person looks at to judge a fitted camera: the model's silhouette from that camera
drawn over the photo, with the mask's outline beside it.

Inside the silhouette the photo is tinted blue; the silhouette's outline is orange, the
mask's green. A good fit shows the orange outline on the green one wherever nothing stands
in front of the object (in front of an occluder the model reaches past the mask: that is
expected, and the fit forgives it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pipeline.types import Cameras, Mesh, SourceCamera

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext

OVERLAY_SIDE = 1024       # the picture's longest side at most
_TINT = np.array([60, 120, 255], np.float32)
_SILHOUETTE_LINE = (255, 140, 0)
_MASK_LINE = (40, 220, 60)


def fit_overlay(ctx: "RasterContext", mesh: Mesh, photo: np.ndarray, mask: np.ndarray,
                camera: SourceCamera, side: int = OVERLAY_SIDE) -> np.ndarray:
    """(h, w, 3) uint8: ``photo`` (H, W, 3) uint8 at most ``side`` pixels long, the silhouette
    of ``mesh`` from ``camera`` (at the photo's size) over it, and ``mask`` (H, W)'s outline."""
    import cv2

    from pipeline.raster.rasterize import rasterize_silhouettes

    H, W = mask.shape
    if photo.shape[:2] != (H, W) or (camera.width, camera.height) != (W, H):
        raise ValueError(f"the photo {photo.shape[1]}x{photo.shape[0]}, mask {W}x{H} and camera "
                         f"{camera.width}x{camera.height} must have one size")
    s = min(1.0, side / max(H, W))
    w, h = max(1, round(W * s)), max(1, round(H * s))
    K = (np.diag([w / W, h / H, 1.0]) @ camera.K)[None].astype(np.float32)
    sil = rasterize_silhouettes(ctx, mesh, Cameras(camera.viewmat[None].astype(np.float32), K, w, h))[0]
    small_mask = cv2.resize(mask.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST)
    out = cv2.resize(np.ascontiguousarray(photo[..., :3]), (w, h), interpolation=cv2.INTER_AREA).astype(np.float32)
    out[sil] = 0.6 * out[sil] + 0.4 * _TINT
    out = np.ascontiguousarray(np.clip(out, 0, 255).astype(np.uint8))
    thick = max(1, round(max(w, h) / 400))
    # the mask's holes are drawn, the model's are not: its gaps (between a bench's slats) would
    # hide the photo under lines, and the fit matches outer outlines only
    for binary, colour, which in ((small_mask, _MASK_LINE, cv2.RETR_LIST),
                                  (sil.astype(np.uint8), _SILHOUETTE_LINE, cv2.RETR_EXTERNAL)):
        contours, _ = cv2.findContours(binary, which, cv2.CHAIN_APPROX_SIMPLE)
        cv2.drawContours(out, contours, -1, colour, thick, lineType=cv2.LINE_AA)
    return out
