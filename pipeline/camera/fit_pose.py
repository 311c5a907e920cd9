"""The camera fit's unknowns and the mask they are scored against.

A pose is 7 numbers around a rotation: the rotation (world -> OpenCV camera, turned about the
mesh's centre), the focal length, where the mesh's centre lands in the image and how large
the mesh appears there. Size in the image, not depth, is the unknown: a silhouette pins down
its own size well but the field of view only through perspective, so with depth as the
unknown every change of focal length also changed the size, and a search had to move two
numbers together along a narrow valley; here it moves one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.types import Cameras, Mesh, SourceCamera

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext

# a silhouette pixel outside the mask counts this much against the fit (see camera_fit)
OUTSIDE_WEIGHT = 0.3
# the diagonal field of view stays inside these bounds (degrees)
FOV_RANGE = (6.0, 110.0)


def focal_share(fov_deg: float) -> float:
    """log(focal length / image diagonal) for a diagonal field of view."""
    return math.log(0.5 / math.tan(math.radians(fov_deg) / 2.0))


_LF_RANGE = (focal_share(FOV_RANGE[1]), focal_share(FOV_RANGE[0]))


@dataclass(frozen=True)
class Pose:
    """R: (3, 3) world -> camera rotation; lf: log(focal / image diagonal); (u, v): the mesh
    centre's image position as shares of width and height; ls: log(image size of one world
    unit at the centre's depth / image diagonal), so depth = exp(lf - ls)."""

    R: np.ndarray
    lf: float
    u: float
    v: float
    ls: float

    def moved(self, delta) -> "Pose":
        """Turned by delta[:3] (a rotation vector about the camera's axes through the mesh
        centre) and shifted by delta[3:] in (lf, u, v, ls); the focal length kept in bounds."""
        from scipy.spatial.transform import Rotation

        d = np.asarray(delta, np.float64)
        R = Rotation.from_rotvec(d[:3]).as_matrix() @ self.R if d[:3].any() else self.R
        lf = min(max(self.lf + d[3], _LF_RANGE[0]), _LF_RANGE[1])
        return Pose(R, lf, self.u + d[4], self.v + d[5], self.ls + d[6])

    @property
    def fov_deg(self) -> float:
        return math.degrees(2.0 * math.atan(0.5 / math.exp(self.lf)))

    def matrices(self, centre: np.ndarray, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
        """(4, 4) viewmat and (3, 3) K for an image of w x h pixels."""
        diag = math.hypot(w, h)
        f = math.exp(self.lf) * diag
        d = math.exp(self.lf - self.ls)
        at = np.array([(self.u - 0.5) * w * d / f, (self.v - 0.5) * h * d / f, d])
        vm = np.eye(4)
        vm[:3, :3], vm[:3, 3] = self.R, at - self.R @ centre
        return vm, np.array([[f, 0.0, w / 2.0], [0.0, f, h / 2.0], [0.0, 0.0, 1.0]])

    def project(self, points: np.ndarray, centre: np.ndarray, w: int, h: int) -> np.ndarray:
        """(N, 3) world points -> (N, 2) pixel positions in a w x h image."""
        vm, K = self.matrices(centre, w, h)
        p = points @ vm[:3, :3].T + vm[:3, 3]
        z = np.maximum(p[:, 2], 1e-9)
        return np.stack([p[:, 0] / z * K[0, 0] + K[0, 2], p[:, 1] / z * K[1, 1] + K[1, 2]], axis=1)


    def project_jacobian(self, points: np.ndarray, centre: np.ndarray, w: int,
                         h: int) -> tuple[np.ndarray, np.ndarray]:
        """(N, 2) pixel positions and (N, 2, 7) their derivatives by the 7 numbers ``moved``
        takes (worked out by hand: the camera-space point is R (X - c) + d (a_x, a_y, 1), with
        a_x = (u - 1/2) w / f, d = exp(lf - ls), f = exp(lf) * diagonal)."""
        vm, K = self.matrices(centre, w, h)
        f = K[0, 0]
        y = (points - centre) @ self.R.T
        at = vm[:3, 3] + self.R @ centre
        pc = y + at
        z = np.maximum(pc[:, 2], 1e-9)
        px = np.stack([pc[:, 0] / z * f + K[0, 2], pc[:, 1] / z * f + K[1, 2]], axis=1)
        dpc = np.zeros((len(points), 3, 7))
        # a turn by a small rotation vector e about the centre: d(pc) = e x y
        dpc[:, 0, 1], dpc[:, 0, 2] = y[:, 2], -y[:, 1]
        dpc[:, 1, 0], dpc[:, 1, 2] = -y[:, 2], y[:, 0]
        dpc[:, 2, 0], dpc[:, 2, 1] = y[:, 1], -y[:, 0]
        d = at[2]
        dpc[:, 2, 3] = d                     # lf: the depth grows with f, the shift (d/f) stays
        dpc[:, 0, 4] = w * d / f             # u
        dpc[:, 1, 5] = h * d / f             # v
        dpc[:, :, 6] = -at                   # ls: depth and shift both shrink
        jac = f * (dpc[:, :2, :] * z[:, None, None] - pc[:, :2, None] * dpc[:, 2:3, :]) / (z * z)[:, None, None]
        jac[:, :, 3] += (px - K[:2, 2])      # ... and f itself grows
        return px, jac


def pose_from(R: np.ndarray, fov_deg: float, u: float, v: float, depth: float) -> Pose:
    lf = focal_share(fov_deg)
    return Pose(np.asarray(R, np.float64), lf, u, v, lf - math.log(depth))


def downscale_mask(mask: np.ndarray, side: int) -> np.ndarray:
    """The mask with its longest side at most ``side`` (area-averaged, then thresholded)."""
    import cv2

    h, w = mask.shape
    s = min(1.0, side / max(h, w))
    if s == 1.0:
        return mask.copy()
    size = (max(1, round(w * s)), max(1, round(h * s)))
    return cv2.resize(mask.astype(np.float32), size, interpolation=cv2.INTER_AREA) >= 0.5


def mask_box(mask: np.ndarray) -> tuple[float, float, float, float]:
    ys, xs = np.nonzero(mask)
    return xs.min(), ys.min(), xs.max() + 1.0, ys.max() + 1.0


class FitView:
    """The mask at one resolution, and poses scored against it by their silhouettes."""

    def __init__(self, mask: np.ndarray, side: int, centre: np.ndarray):
        self.full = mask.shape
        self.mask = downscale_mask(mask, side)
        self.h, self.w = self.mask.shape
        self.mask_px = float(self.mask.sum())
        self.centre = centre

    def cameras(self, poses: list[Pose]) -> Cameras:
        mats = [p.matrices(self.centre, self.w, self.h) for p in poses]
        return Cameras(viewmats=np.asarray([m[0] for m in mats], np.float32),
                       Ks=np.asarray([m[1] for m in mats], np.float32), width=self.w, height=self.h)

    def silhouettes(self, ctx: "RasterContext", mesh: Mesh, poses: list[Pose]) -> np.ndarray:
        from pipeline.raster.rasterize import rasterize_silhouettes

        return rasterize_silhouettes(ctx, mesh, self.cameras(poses))

    def score(self, ctx: "RasterContext", mesh: Mesh, poses: list[Pose], batch: int = 256) -> np.ndarray:
        """The fit's objective for each pose: |S & M| / (|M| + OUTSIDE_WEIGHT |S - M|)."""
        out = []
        for i in range(0, len(poses), batch):
            sil = self.silhouettes(ctx, mesh, poses[i:i + batch])
            both = (sil & self.mask).sum((1, 2))
            outside = sil.sum((1, 2)) - both
            out.append(both / (self.mask_px + OUTSIDE_WEIGHT * outside))
        return np.concatenate(out) if out else np.zeros(0)

    def camera(self, pose: Pose) -> SourceCamera:
        """The pose as the photo's camera (at the photo's full size)."""
        h, w = self.full
        vm, K = pose.matrices(self.centre, w, h)
        return SourceCamera(viewmat=vm.astype(np.float32), K=K.astype(np.float32), width=w,
                            height=h).validate("fitted camera")

    def box_fitted(self, points: np.ndarray, poses: list[Pose]) -> list[Pose]:
        """Each pose shifted and scaled so the bounding box of ``points`` (N, 3) projected lands
        on the mask's (no render needed)."""
        mx0, my0, mx1, my1 = mask_box(self.mask)
        out = []
        for p in poses:
            vm, _ = p.matrices(self.centre, self.w, self.h)
            if not ((points @ vm[2, :3] + vm[2, 3]) > 1e-6).all():
                out.append(p)
                continue
            px = p.project(points, self.centre, self.w, self.h)
            (x0, y0), (x1, y1) = px.min(0), px.max(0)
            scale = math.sqrt(((mx1 - mx0) * (my1 - my0)) / max((x1 - x0) * (y1 - y0), 1e-6))
            # the centre's image position and the image scale at fixed depth are what (u, v)
            # and ls mean; scaling about the centre moves the box's middle too
            bx, by = (x0 + x1) / 2.0, (y0 + y1) / 2.0
            u = ((mx0 + mx1) / 2.0 - scale * (bx - p.u * self.w)) / self.w
            v = ((my0 + my1) / 2.0 - scale * (by - p.v * self.h)) / self.h
            moved = p.moved([0, 0, 0, 0, u - p.u, v - p.v, math.log(max(scale, 1e-6))])
            out.append(moved)
        return out
