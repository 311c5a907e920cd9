"""The picture to judge a scene's placement by: every object's silhouette from the photo's
camera over the photo, each in its own colour, with its mask's outline in the same colour.

Inside an object's silhouette the photo is tinted with its colour; the silhouette's outline is
drawn solid, the mask's thin. A well placed object shows its outline on its mask's wherever
nothing stands in front of it (``pipeline.camera.fit_overlay`` draws one object the same way).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from pipeline.types import Cameras, Mesh, SourceCamera

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext

PICTURE_SIDE = 1024     # the picture's longest side at most
# one colour an object, in the objects' order (then round again)
COLOURS = ((60, 120, 255), (255, 140, 0), (40, 200, 80), (230, 60, 200), (0, 210, 220), (240, 220, 40))


def scene_picture(ctx: "RasterContext", meshes: Sequence[Mesh], masks: Sequence[np.ndarray], photo: np.ndarray,
                  camera: SourceCamera, side: int = PICTURE_SIDE) -> np.ndarray:
    """(h, w, 3) uint8: ``photo`` (H, W, 3) at most ``side`` long with each mesh's silhouette
    from ``camera`` and each mask's outline over it, object i in ``COLOURS[i]``."""
    import cv2

    from pipeline.raster.rasterize import rasterize_silhouettes

    H, W = photo.shape[:2]
    if (camera.width, camera.height) != (W, H) or any(m.shape != (H, W) for m in masks):
        raise ValueError(f"the photo {W}x{H}, its masks and the camera {camera.width}x{camera.height} "
                         "must have one size")
    s = min(1.0, side / max(H, W))
    w, h = max(1, round(W * s)), max(1, round(H * s))
    K = (np.diag([w / W, h / H, 1.0]) @ camera.K)[None].astype(np.float32)
    cams = Cameras(camera.viewmat[None].astype(np.float32), K, w, h)
    out = cv2.resize(np.ascontiguousarray(photo[..., :3]), (w, h), interpolation=cv2.INTER_AREA).astype(np.float32)
    sils = [rasterize_silhouettes(ctx, m, cams)[0] for m in meshes]
    for i, sil in enumerate(sils):
        out[sil] = 0.6 * out[sil] + 0.4 * np.array(COLOURS[i % len(COLOURS)], np.float32)
    out = np.ascontiguousarray(np.clip(out, 0, 255).astype(np.uint8))
    thick = max(1, round(max(w, h) / 400))
    for i, (sil, mask) in enumerate(zip(sils, masks)):
        colour = COLOURS[i % len(COLOURS)]
        small = cv2.resize(mask.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST)
        for binary, width in ((small, max(1, thick // 2)), (sil.astype(np.uint8), thick)):
            contours, _ = cv2.findContours(binary, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
            cv2.drawContours(out, contours, -1, colour, width, lineType=cv2.LINE_AA)
    return out
