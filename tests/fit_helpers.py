"""A small model and its photo from a known camera, as files, for the fit step's tests (the
worker's fit job, the page's "Fit the camera to the photo", ``/fit_camera``): an asymmetric
coloured mesh (no two sides alike), the photo its colours make from the camera, and the
object's mask in it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class FitScene:
    mesh: Path
    photo: Path
    mask: Path
    camera: "object"        # pipeline.types.SourceCamera: the truth


def _mesh():
    import trimesh

    from pipeline.types import Mesh

    parts = [trimesh.creation.box(extents=(1.0, 0.3, 0.3)), trimesh.creation.box(extents=(0.3, 0.8, 0.3)),
             trimesh.creation.icosphere(subdivisions=2, radius=0.22)]
    parts[1].apply_translation((-0.35, 0.4, 0))
    parts[2].apply_translation((0.4, 0.1, 0.25))
    tm = trimesh.util.concatenate(parts)
    v = tm.vertices
    col = np.clip(np.stack([0.5 + 0.8 * v[:, 0], 0.5 + 0.5 * v[:, 1], 0.5 + 0.8 * v[:, 2]], 1), 0, 1)
    return tm, Mesh(v.astype(np.float32), tm.faces.astype(np.int32), vertex_colors=col.astype(np.float32))


def fit_scene(folder: Path, yaw: float = 35.0, pitch: float = 15.0, fov: float = 40.0) -> FitScene:
    """Write ``model.ply`` (vertex colours), ``photo.png`` (320x240) and ``mask.png`` into
    ``folder``; the photo is the model's colours seen from a camera ``yaw``/``pitch`` degrees
    round it with a ``fov`` degree field of view, on grey."""
    from PIL import Image

    from pipeline.camera.cameras import intrinsics, look_at
    from pipeline.raster.rasterize import interpolate, rasterize_views
    from pipeline.types import SourceCamera
    from raster_helpers import gl_context

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tm, mesh = _mesh()
    y, p = math.radians(yaw), math.radians(pitch)
    eye = 3.0 * np.array([math.cos(p) * math.sin(y), math.sin(p), math.cos(p) * math.cos(y)])
    cam = SourceCamera(look_at(eye), intrinsics(fov, 320, 240), 320, 240)
    raster = rasterize_views(gl_context(), mesh, cam.as_cameras())
    mask = np.asarray(raster.tri_id[0]) >= 0
    colours = np.asarray(interpolate(raster, mesh, mesh.vertex_colors)[0])
    photo = np.where(mask[..., None], colours, 0.55)
    tm.visual.vertex_colors = np.hstack([(mesh.vertex_colors * 255).astype(np.uint8),
                                         np.full((len(tm.vertices), 1), 255, np.uint8)])
    tm.export(folder / "model.ply")
    Image.fromarray((np.clip(photo, 0, 1) * 255).round().astype(np.uint8)).save(folder / "photo.png")
    Image.fromarray(mask.astype(np.uint8) * 255).save(folder / "mask.png")
    return FitScene(folder / "model.ply", folder / "photo.png", folder / "mask.png", cam)


def rotation_error_deg(a: np.ndarray, b: np.ndarray) -> float:
    """The angle between two world -> camera rotations (4x4 or 3x3), in degrees."""
    from scipy.spatial.transform import Rotation

    a, b = np.asarray(a, float)[:3, :3], np.asarray(b, float)[:3, :3]
    return float(np.degrees(Rotation.from_matrix(a.T @ b).magnitude()))
