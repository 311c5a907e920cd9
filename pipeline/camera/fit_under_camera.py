"""Place a model under a camera that is already known: its pose fitted to its mask with the
camera's intrinsics held.

The objects of a scene share one photo and so one camera. A tool like SAM 3D Objects poses
each object in the frame of a camera of its own whose intrinsics it does not save; read under
the shared camera such an object lands in the wrong place and at the wrong size (the real
bench under the person's focal length: IoU 0.27). ``camera_fit`` would fit it a camera of its
own, field of view and all, which cannot be the photo's. Here only the rotation, the image
position and the image size move (``refine_outline`` with the focal length held). The pose is
then turned into a motion of the model into the shared camera's world: a similarity, since
a silhouette fixes an object's size in the image, not its distance. Scaled about the camera
centre, the model keeps its silhouette exactly; the scale is chosen so the model keeps the
depth its own file gives it (the layout of the tool that made it), or its own size when the
file places it behind the camera.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.camera.camera_fit import COARSE_SIDE, FINE_SIDE, POLISH_SIDE, CameraFit, _Fit, _measure
from pipeline.camera.fit_pose import Pose, mask_box
from pipeline.types import Mesh, SourceCamera
from pipeline.validate import StageInputError

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext

FOCAL = 3                 # the focal length's place among the 7 pose numbers (``Pose.moved``)
SQUARE_PIXELS = 0.01      # fx and fy may differ by this share (a pose fit has one focal length)


@dataclass(frozen=True)
class PlacedByFit:
    """A model's pose fitted under a known camera.

    transform: (4, 4) float64, the model's frame -> the camera's world (rotation, uniform
               scale, shift); the model moved by it shows its fitted silhouette
    scale:     the uniform scale in ``transform`` (1: the model kept its own size)
    depth_kept: the scale keeps the depth of the model's centre as its file gave it
    fit:       the figures of the fit (IoU, coverage, inside share, seconds) with the shared
               camera as its camera (the model once moved is seen by it)
    """

    transform: np.ndarray
    scale: float
    depth_kept: bool
    fit: CameraFit


def fit_under_camera(ctx: "RasterContext", mesh: Mesh, mask: np.ndarray, camera: SourceCamera) -> PlacedByFit:
    """Fit ``mesh`` (posed in some camera's frame, OpenGL axes, as SAM 3D writes it) to ``mask``
    (H, W) bool as seen by ``camera``, whose intrinsics stay as they are."""
    t0 = time.perf_counter()
    if camera.projection != "perspective":
        raise StageInputError("a pose can be fitted under a perspective camera only")
    if mask.shape != (camera.height, camera.width):
        raise StageInputError(f"the mask is {mask.shape[1]}x{mask.shape[0]} but the camera is for "
                              f"{camera.width}x{camera.height}")
    if not mask.any():
        raise StageInputError("the mask to fit the pose to is empty")
    K = camera.K.astype(np.float64)
    f = float(K[0, 0])
    if abs(float(K[1, 1]) - f) > SQUARE_PIXELS * f:
        raise StageInputError(f"the camera's pixels are not square (fx {f:.1f}, fy {K[1, 1]:.1f}): "
                              "a pose cannot be fitted under it")
    mesh.validate("mesh to place")
    h, w = mask.shape
    fit = _Fit(ctx, mesh, mask.astype(bool, copy=False), held=(FOCAL,))
    view = fit.views[COARSE_SIDE]
    V = camera.viewmat.astype(np.float64)
    # start as the file places the model under this camera: its rotation, moved and sized
    # so its box lands on the mask's
    own_depth = float(V[2, :3] @ fit.centre + V[2, 3])
    lf = math.log(f / math.hypot(w, h))
    x0, y0, x1, y1 = mask_box(view.mask)
    start = Pose(V[:3, :3].copy(), lf, (x0 + x1) / 2.0 / view.w, (y0 + y1) / 2.0 / view.h,
                 lf - math.log(max(own_depth, 1e-3 * fit.radius, 1e-6)))
    points = fit.small.vertices.astype(np.float64)
    best = fit.refine(view.box_fitted(points, [start])[0])
    # straight outlines leave shallow pits a few degrees off: try small turns too
    tried = [best] + [fit.refine(p, sides=(FINE_SIDE,), rounds=3) for p in fit.nudged(best)]
    best = max(fit.scored(tried, FINE_SIDE), key=lambda t: t[1])[0]
    best = fit.refine(best, sides=(POLISH_SIDE,))
    measured = _measure(fit, best, "under the photo's camera", None, t0)
    vb = measured.camera.viewmat.astype(np.float64)
    depth = float(vb[2, :3] @ fit.centre + vb[2, 3])
    # the fit drew with the principal point at the image centre; the camera's own may lie
    # elsewhere: shift so the centre lands where it did (exact at the centre's depth)
    vb[0, 3] += (w / 2.0 - K[0, 2]) * depth / f
    vb[1, 3] += (h / 2.0 - K[1, 2]) * depth / f
    depth_kept = own_depth > 1e-3 * fit.radius
    scale = own_depth / depth if depth_kept else 1.0
    transform = np.linalg.inv(V) @ np.diag([scale, scale, scale, 1.0]) @ vb
    return PlacedByFit(transform=transform, scale=scale, depth_kept=depth_kept,
                       fit=CameraFit(camera=camera, iou=measured.iou, coverage=measured.coverage,
                                     inside=measured.inside, objective=measured.objective,
                                     seconds=time.perf_counter() - t0, case=measured.case))


def moved(mesh: Mesh, transform: np.ndarray) -> Mesh:
    """``mesh`` with its vertices moved by ``transform`` (4, 4): a similarity keeps the faces'
    winding and the UVs and colours mean the same."""
    v = mesh.vertices.astype(np.float64) @ transform[:3, :3].T + transform[:3, 3]
    return Mesh(vertices=v.astype(np.float32), faces=mesh.faces, vertex_colors=mesh.vertex_colors, uvs=mesh.uvs)
