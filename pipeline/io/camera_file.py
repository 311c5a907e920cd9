"""The photo's camera for a model made elsewhere: a JSON file in the form ``kiln run
--report`` writes (``source_camera``: K in pixels of the photo, an OpenCV world-to-camera
matrix in the model's frame, width, height), or a focal length for a mesh already placed
in the camera's frame (OpenGL convention as SAM 3D writes, or OpenCV)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np

from pipeline.types import SourceCamera
from pipeline.validate import StageInputError
from pipeline.io.frames import CAMERA_FRAMES


def read_camera(path) -> SourceCamera:
    """A camera JSON: the ``source_camera`` object itself, or a ``kiln run --report`` that
    holds one (at the top or under ``stats``)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise StageInputError(f"camera file {path.name} cannot be read as JSON: {e}") from None
    except RecursionError:
        raise StageInputError(f"camera file {path.name} is nested too deeply to be a camera") from None
    if isinstance(data, dict) and "source_camera" not in data and isinstance(data.get("stats"), dict):
        data = data["stats"]
    if isinstance(data, dict) and isinstance(data.get("source_camera"), dict):
        data = data["source_camera"]
    if not isinstance(data, dict) or not {"K", "viewmat", "width", "height"} <= set(data):
        raise StageInputError(f"camera file {path.name} needs K, viewmat, width and height (the "
                              "source_camera that `kiln run --report` writes)")
    try:
        cam = SourceCamera.from_dict(data)
    except (TypeError, ValueError, OverflowError) as e:   # OverflowError: 1e999 as a size, 10**400 in K
        raise StageInputError(f"camera file {path.name}: K and viewmat must be matrices of numbers, "
                              f"width and height whole numbers of pixels ({e})") from None
    if not (np.isfinite(cam.K).all() and np.isfinite(cam.viewmat).all()):
        raise StageInputError(f"camera file {path.name} holds non-finite numbers")
    return cam.validate(f"camera {path.name}")


def camera_from_focal(focal: float, width: int, height: int, principal: Optional[tuple[float, float]] = None,
                      frame: str = "opengl") -> SourceCamera:
    """A pinhole camera at the origin of a mesh placed in its frame: ``focal`` in pixels,
    ``principal`` (cx, cy) in pixels (default: the image centre), ``frame`` "opengl" (looking
    down -z, y up: SAM 3D) or "opencv" (looking down +z, y down)."""
    if frame not in CAMERA_FRAMES:
        raise StageInputError(f"unknown camera frame {frame!r}; choose one of {', '.join(CAMERA_FRAMES)}")
    if not (np.isfinite(focal) and focal > 0):
        raise StageInputError(f"focal length must be a positive number of pixels, got {focal!r}")
    cx, cy = principal if principal is not None else (width / 2.0, height / 2.0)
    if not (np.isfinite(cx) and np.isfinite(cy)):
        raise StageInputError(f"principal point must be two numbers, got {principal!r}")
    K = np.array([[focal, 0.0, cx], [0.0, focal, cy], [0.0, 0.0, 1.0]], np.float32)
    return SourceCamera(viewmat=CAMERA_FRAMES[frame].astype(np.float32), K=K, width=int(width),
                        height=int(height)).validate("camera")


def at_photo_size(camera: SourceCamera, width: int, height: int) -> SourceCamera:
    """``camera`` for a photo of ``width`` x ``height``: its intrinsics scaled when the photo
    is the same picture at another size; StageInputError when the shapes differ."""
    if (camera.width, camera.height) == (width, height):
        return camera
    sx, sy = width / camera.width, height / camera.height
    if abs(sx - sy) > 0.01 * max(sx, sy):
        raise StageInputError(f"the camera is for a {camera.width}x{camera.height} photo, but the photo is "
                              f"{width}x{height} (another shape): give the photo the camera was made for")
    S = np.diag([sx, sy, 1.0]).astype(np.float32)
    return SourceCamera(viewmat=camera.viewmat, K=(S @ camera.K).astype(np.float32), width=width,
                        height=height, projection=camera.projection).validate("camera")
