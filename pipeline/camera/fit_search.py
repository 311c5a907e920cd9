"""Where the camera fit starts: a global search for a canonical mesh (no pose), or the
camera at the origin for a mesh already in the camera's frame.

The search renders the silhouette over a grid of yaw (10 degree steps) and pitch (20 degree
steps) at one field of view, each pose moved and scaled so its bounding box lands on the
mask's, all from a mesh decimated to a few thousand faces at a low resolution: the grid only
has to land each candidate in the basin of the smooth refinement (``fit_contour``), which
finds the rest. Its best poses are kept from distinct basins (a turn of at least
``DISTINCT_DEG`` apart), so that a near-symmetric object's twin views both go on to the
refinement and the tie-break.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from pipeline.camera.fit_pose import FitView, Pose, mask_box, pose_from
from pipeline.types import Mesh

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext

FOVS_DEG = (30.0, 55.0)   # the starts of a posed mesh
GRID_FOV_DEG = 40.0       # the grid's: at a box-fitted low resolution the field of view changes
#                           the outline less than a grid step of turn, and the refinement fits it
YAW_STEP, PITCHES = 10.0, (-60.0, -40.0, -20.0, 0.0, 20.0, 40.0, 60.0)
DISTINCT_DEG = 30.0
# OpenGL camera axes (x right, y up, looking along -z) -> OpenCV's (x right, y down, along +z)
GL_TO_CV = np.diag([1.0, -1.0, -1.0])


def start_depth(view: FitView, radius: float, fov_deg: float) -> float:
    """The depth at which a sphere of ``radius`` spans the mask's size."""
    mx0, my0, mx1, my1 = mask_box(view.mask)
    share = max((mx1 - mx0) / view.w, (my1 - my0) / view.h, 1e-3)
    return radius / math.tan(math.radians(fov_deg) / 2.0) / share


def grid_poses(view: FitView, points: np.ndarray, radius: float) -> list[Pose]:
    """Every pose of the grid, box-fitted to the mask. The camera looks at the mesh's front
    (+z, y up) turned by yaw about y, then pitched."""
    from scipy.spatial.transform import Rotation

    depth = start_depth(view, radius, GRID_FOV_DEG)
    poses = []
    for pitch in PITCHES:
        for yaw in np.arange(0.0, 360.0, YAW_STEP):
            turn = Rotation.from_euler("xy", [pitch, yaw], degrees=True).as_matrix()
            poses.append(pose_from(GL_TO_CV @ turn.T, GRID_FOV_DEG, 0.5, 0.5, depth))
    return view.box_fitted(points, poses)


def distinct_best(poses: list[Pose], scores: np.ndarray, keep: int,
                  apart_deg: float = DISTINCT_DEG) -> list[tuple[Pose, float]]:
    """The ``keep`` best poses, each at least ``apart_deg`` of turn from every better one."""
    out: list[tuple[Pose, float]] = []
    cos_min = math.cos(math.radians(apart_deg))
    for i in np.argsort(-scores):
        R = poses[i].R
        # the angle between two rotations from the trace of their difference
        if all((np.trace(R.T @ p.R) - 1.0) / 2.0 < cos_min for p, _ in out):
            out.append((poses[i], float(scores[i])))
            if len(out) == keep:
                break
    return out


def global_search(ctx: "RasterContext", mesh: Mesh, view: FitView, radius: float,
                  keep: int) -> list[tuple[Pose, float]]:
    """The best poses of the grid, from distinct basins, with their scores."""
    poses = grid_poses(view, hull_points(mesh), radius)
    return distinct_best(poses, view.score(ctx, mesh, poses), keep)


def hull_points(mesh: Mesh) -> np.ndarray:
    """The corners of the mesh's convex hull (float64): a projection's bounding box is theirs."""
    from scipy.spatial import ConvexHull, QhullError

    v = mesh.vertices.astype(np.float64)
    try:
        return v[ConvexHull(v).vertices]
    except (QhullError, ValueError):   # flat or degenerate: all of them
        return v


def posed_starts(view: FitView, points: np.ndarray, depth: float) -> list[Pose]:
    """A mesh in the camera's frame (OpenGL axes): the camera at the origin, a few fields of
    view, each box-fitted to the mask."""
    mx0, my0, mx1, my1 = mask_box(view.mask)
    u, v = (mx0 + mx1) / 2.0 / view.w, (my0 + my1) / 2.0 / view.h
    return view.box_fitted(points, [pose_from(GL_TO_CV, fov, u, v, depth) for fov in FOVS_DEG])
