"""Camera math: Hammersley view sets, look-at extrinsics, pinhole intrinsics.

One convention for all of Kiln (also gsplat's): OpenCV camera axes (x right,
y down, looking along +z), ``viewmat`` maps world to camera, intrinsics ``K``
in pixels with the top-left pixel's centre at (0.5, 0.5). World is y-up.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from pipeline.types import Cameras, SourceCamera

WORLD_UP = np.array([0.0, 1.0, 0.0])


def intrinsics(fov_y_deg: float, width: int, height: int) -> np.ndarray:
    """(3, 3) float32 pinhole K for a vertical field of view, square pixels, centred."""
    if not (0.0 < fov_y_deg < 180.0):
        raise ValueError(f"field of view must be in (0, 180) degrees, got {fov_y_deg}")
    f = 0.5 * height / math.tan(math.radians(fov_y_deg) / 2.0)
    return np.array([[f, 0.0, width / 2.0], [0.0, f, height / 2.0], [0.0, 0.0, 1.0]], np.float32)


def look_at(eye, target=(0.0, 0.0, 0.0), up=WORLD_UP) -> np.ndarray:
    """(4, 4) float32 world->camera matrix for a camera at ``eye`` looking at ``target``.

    Camera +z points at the target, +x to the right in the image, +y down.
    When ``up`` is parallel to the view direction another up vector is used.
    """
    eye = np.asarray(eye, np.float64)
    forward = np.asarray(target, np.float64) - eye
    n = np.linalg.norm(forward)
    if n < 1e-12:
        raise ValueError("camera eye and target coincide")
    forward /= n
    up = np.asarray(up, np.float64)
    if abs(np.dot(forward, up / np.linalg.norm(up))) > 0.999:
        up = np.array([0.0, 0.0, 1.0]) if abs(forward[2]) < 0.9 else np.array([1.0, 0.0, 0.0])
    right = np.cross(forward, up)
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    R = np.stack([right, down, forward])  # rows: camera axes in world coordinates
    m = np.eye(4)
    m[:3, :3] = R
    m[:3, 3] = -R @ eye
    return m.astype(np.float32)


def hammersley_directions(n: int) -> np.ndarray:
    """(n, 3) float64 unit vectors spread evenly over the sphere (Hammersley set).

    Heights step evenly from just below the top (+y) to just above the bottom;
    azimuths follow the base-2 radical inverse, so consecutive heights face far
    apart and no band of the sphere is left out.
    """
    if n < 1:
        raise ValueError("need at least one view")
    i = np.arange(n)
    # radical inverse base 2 (van der Corput) of i
    bits = np.zeros(n)
    k = i.copy()
    f = 0.5
    while k.any():
        bits += f * (k & 1)
        k >>= 1
        f *= 0.5
    u = (i + 0.5) / n          # uniform in height
    v = bits                    # uniform in azimuth
    y = 1.0 - 2.0 * u           # y-up world: height along y
    r = np.sqrt(np.clip(1.0 - y * y, 0.0, 1.0))
    phi = 2.0 * math.pi * v
    return np.stack([r * np.sin(phi), y, r * np.cos(phi)], axis=1)


def sphere_cameras(count: int, radius: float, fov_deg: float, resolution: int,
                   include_front: bool = True) -> Cameras:
    """``count`` cameras on a sphere of ``radius`` looking at the origin.

    With ``include_front`` the first camera looks straight at the object's front
    (from +z), which is the view the input photo shows.
    """
    dirs = hammersley_directions(count)
    if include_front:
        dirs = np.concatenate([[[0.0, 0.0, 1.0]], dirs[:-1]]) if count > 1 else np.array([[0.0, 0.0, 1.0]])
    K = intrinsics(fov_deg, resolution, resolution)
    viewmats = np.stack([look_at(d * radius) for d in dirs])
    return Cameras(viewmats=viewmats.astype(np.float32), Ks=np.repeat(K[None], count, 0),
                   width=resolution, height=resolution)


# the photo's camera stands in for the first bake view when their viewing directions are
# this close: the first view then sees nothing the photo does not show, at the photo's own
# resolution (the bake takes the photo's pixels there: pipeline.texture.photo_projection)
FRONT_MATCH_DEG = 5.0


def photo_shows_front(source: SourceCamera, cameras: Cameras) -> bool:
    """Whether the photo's camera ``source`` looks at the object along the first of
    ``cameras`` (``sphere_cameras``' front view), within FRONT_MATCH_DEG."""
    photo_forward = np.asarray(source.viewmat, np.float64)[2, :3]   # camera +z in world, rows are axes
    front_forward = np.asarray(cameras.viewmats[0], np.float64)[2, :3]
    cos = float(photo_forward @ front_forward) / max(float(np.linalg.norm(photo_forward) * np.linalg.norm(front_forward)), 1e-12)
    return cos >= math.cos(math.radians(FRONT_MATCH_DEG))


def project(points: np.ndarray, viewmat: np.ndarray, K: np.ndarray):
    """Project (N, 3) world points. Returns ((N, 2) pixel coords, (N,) camera z)."""
    p = points @ viewmat[:3, :3].T + viewmat[:3, 3]
    z = p[:, 2]
    uv = (p[:, :2] / np.where(np.abs(z) < 1e-12, 1e-12, z)[:, None]) @ K[:2, :2].T + K[:2, 2]
    return uv, z


def camera_centers(cameras: Cameras) -> np.ndarray:
    """(C, 3) float32 camera positions in world space."""
    R = cameras.viewmats[:, :3, :3]
    t = cameras.viewmats[:, :3, 3]
    return (-np.einsum("cji,cj->ci", R, t)).astype(np.float32)


def framed_cameras(points: np.ndarray, count: int, fov_deg: float, resolution: int,
                   front: Optional[np.ndarray] = None, margin: float = 1.1) -> Cameras:
    """``count`` cameras around the bounding sphere of ``points`` (N, 3), each far enough for
    the whole sphere to fit its field of view (times ``margin``), looking at its centre.
    ``front``: a direction (3,) from the centre; the first camera looks from there (the
    photo's side), the rest spread evenly (Hammersley)."""
    pts = np.asarray(points, np.float64)
    lo, hi = pts.min(0), pts.max(0)
    centre = (lo + hi) / 2.0
    radius = max(float(np.linalg.norm(pts - centre, axis=1).max()), 1e-9)
    dist = margin * radius / math.sin(math.radians(fov_deg) / 2.0)
    dirs = hammersley_directions(count)
    if front is not None and count >= 1:
        f = np.asarray(front, np.float64)
        f = f / max(float(np.linalg.norm(f)), 1e-12)
        dirs = np.concatenate([f[None], dirs[:-1]]) if count > 1 else f[None]
    K = intrinsics(fov_deg, resolution, resolution)
    viewmats = np.stack([look_at(centre + d * dist, target=centre) for d in dirs])
    return Cameras(viewmats=viewmats.astype(np.float32), Ks=np.repeat(K[None], count, 0),
                   width=resolution, height=resolution)
