"""Each object of a scene placed under the photo's one camera, in that camera's frame.

An object keeps its pose where it already fits the camera: its silhouette from the camera lies
inside its own mask by at least ``bake.photo_min_inside`` (the test a single bake gates a given
camera by) and its IoU with the mask is at least ``bake.fit_min_iou`` (the test a fitted camera
passes; the share inside alone would keep a pose that draws the object too small). Otherwise its pose is fitted under the camera with the intrinsics held
(``pipeline.camera.fit_under_camera``), keeping the depth its file gives it. Then everything
is moved into the camera's own frame (OpenGL axes, as glTF and SAM 3D have them: the camera at
the origin looking down -z, y up), so the scene's GLB opens as the photo saw it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from pipeline.types import Gaussians, Mesh, SourceCamera

if TYPE_CHECKING:
    from pipeline.camera.camera_fit import CameraFit
    from pipeline.raster.rasterize import RasterContext

# world -> camera of a camera at the origin looking down -z with y up (OpenCV's axes turned)
GL_CAMERA = np.diag([1.0, -1.0, -1.0, 1.0])


@dataclass(frozen=True)
class Placement:
    """How one object was placed.

    how:       "kept" (its pose fits the camera) | "fitted" (fitted under it) | "camera fitted"
               (the camera itself was fitted to this object: no camera was given)
    transform: (4, 4) float64, the object's file frame -> the photo camera's frame (a similarity)
    scale:     the transform's uniform scale (1 for a kept object)
    before:    its silhouette figures under the camera as the file placed it ({"inside",
               "coverage", "iou"}), None when the camera was fitted to it
    fit:       the fit's figures when fitted (``CameraFit``, with the photo's camera)
    """

    how: str
    transform: np.ndarray
    scale: float
    before: Optional[dict[str, float]]
    fit: Optional["CameraFit"] = None

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"how": self.how, "scale": round(self.scale, 5)}
        if self.before is not None:
            out["before"] = self.before
        if self.fit is not None:
            out["fit"] = {k: v for k, v in self.fit.report().items() if k != "source_camera"}
        return out


def in_camera_frame(camera: SourceCamera) -> tuple[SourceCamera, np.ndarray]:
    """(the camera as seen from its own frame, the (4, 4) world -> that frame)."""
    to_frame = GL_CAMERA @ camera.viewmat.astype(np.float64)
    return SourceCamera(viewmat=GL_CAMERA.astype(np.float32), K=camera.K, width=camera.width,
                        height=camera.height, projection=camera.projection).validate("scene camera"), to_frame


def place(ctx: "RasterContext", mesh: Mesh, mask: np.ndarray, camera: SourceCamera, min_inside: float,
          min_iou: float, fitted_to_it: Optional["CameraFit"] = None) -> Placement:
    """Place ``mesh`` (its file's frame) under ``camera`` (in that frame's world): kept when its
    silhouette lies inside ``mask`` by ``min_inside`` and its IoU with it is ``min_iou``, else
    fitted with the intrinsics held.
    ``fitted_to_it``: the camera was fitted to this very object (kept as fitted)."""
    from pipeline.camera.fit_under_camera import fit_under_camera
    from pipeline.texture.model_bake import silhouette_fit

    _, to_frame = in_camera_frame(camera)
    if fitted_to_it is not None:
        return Placement(how="camera fitted", transform=to_frame, scale=1.0, before=None, fit=fitted_to_it)
    sil = silhouette_fit(ctx, mesh, camera, mask)
    before = {"inside": round(sil.inside, 4), "coverage": round(sil.coverage, 4), "iou": round(sil.iou, 4)}
    if sil.inside >= min_inside and sil.iou >= min_iou:
        return Placement(how="kept", transform=to_frame, scale=1.0, before=before)
    got = fit_under_camera(ctx, mesh, mask, camera)
    return Placement(how="fitted", transform=to_frame @ got.transform, scale=got.scale, before=before, fit=got.fit)


def moved_mesh(mesh: Mesh, transform: np.ndarray) -> Mesh:
    from pipeline.camera.fit_under_camera import moved

    return moved(mesh, transform)


def moved_splat(g: Gaussians, transform: np.ndarray, scale: float) -> Gaussians:
    """The splat moved with its mesh: centres by the similarity, orientations by its rotation,
    sizes by its scale."""
    from pipeline.io.frames import transform_gaussians

    turned = transform_gaussians(g, transform[:3, :3] / scale)
    means = (g.means.astype(np.float64) @ transform[:3, :3].T + transform[:3, 3]).astype(np.float32)
    return Gaussians(means=means, scales=(g.scales * np.float32(scale)).astype(np.float32), quats=turned.quats,
                     opacities=g.opacities, colors=g.colors)
