"""Per-Gaussian math shared by the renderers: rotations, 3D covariances and the
EWA projection to the image plane, written to match gsplat 1.5.3's CUDA kernels
(``projection_ewa_3dgs_fused_fwd_kernel`` and ``persp_proj``) in its default
mode (pinhole, ``rasterize_mode="classic"``, ``radius_clip=0``).

numpy in float32, as gsplat's kernels compute: the CPU renderer runs without torch, and
the torch renderer for a GPU without gsplat takes the projection to its device (a few
arrays of N, cheap next to its fragments).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# degree-0 spherical harmonic (3DGS / gsplat): colour = 0.5 + SH_C0 * f_dc
SH_C0 = 0.28209479177387814
# gsplat's defaults; the CPU renderer and the gsplat call both use these so the
# two backends compute the same image.
EPS2D = 0.3            # added to the 2D covariance's diagonal (low-pass filter, >= ~1 px footprint)
NEAR_PLANE = 0.01      # Gaussians with camera z below this are culled
FAR_PLANE = 1e10
ALPHA_MIN = 1.0 / 255.0  # fragments with a smaller alpha are skipped
ALPHA_MAX = 0.999      # alpha clamp, so one Gaussian never makes a pixel fully opaque
T_MIN = 1e-4           # compositing stops before transmittance would drop to this
RADIUS_EXTEND = 3.33   # gsplat's cap on the footprint radius in standard deviations


def quat_to_rotmat(quats: np.ndarray) -> np.ndarray:
    """Rotation matrices from quaternions, in float32 as gsplat computes them.

    quats: (N, 4) float, (w, x, y, z), any non-zero length (normalised here, as gsplat does)
    returns (N, 3, 3) float32, R such that a local vector v maps to R @ v
    (``pipeline.camera.rotations.quat_to_matrix`` is the stages' float64 version)
    """
    q = np.asarray(quats, np.float32)
    q = q / np.linalg.norm(q, axis=-1, keepdims=True)
    w, x, y, z = np.moveaxis(q, -1, 0)
    r = np.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ], axis=-1)
    return r.reshape(q.shape[:-1] + (3, 3))


def covariance_3d(quats: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """World-space covariances R S S^T R^T.

    quats:  (N, 4) float, (w, x, y, z)
    scales: (N, 3) float, standard deviations along the local axes (not log)
    returns (N, 3, 3) float32, symmetric positive semi-definite
    """
    m = quat_to_rotmat(quats) * np.asarray(scales, np.float32)[..., None, :]  # R @ diag(s)
    return m @ np.swapaxes(m, -1, -2)


@dataclass
class Projected:
    """Gaussians projected into one camera (gsplat's ``packed=False`` layout), numpy.

    means2d: (N, 2) float32, pixel coordinates of the centres (top-left pixel centre = (0.5, 0.5))
    depths:  (N,)   float32, camera-space z
    conics:  (N, 3) float32, (a, b, c) of the inverse blurred 2D covariance [[a, b], [b, c]]
    radii:   (N, 2) int32, half-extent of the footprint's bounding box in pixels along x and y;
             (0, 0) for Gaussians that are culled (behind the near plane, outside the
             image, degenerate, or too transparent to ever reach ALPHA_MIN)
    """

    means2d: np.ndarray
    depths: np.ndarray
    conics: np.ndarray
    radii: np.ndarray

    @property
    def visible(self) -> np.ndarray:
        """(N,) bool: Gaussians that reach the image."""
        return np.asarray((self.radii > 0).all(axis=-1))

    def draw_order(self) -> np.ndarray:
        """(M,) int64: the visible Gaussians front to back. gsplat's radix sort on depth keys
        is stable over Gaussian index, so ties keep input order."""
        vis = np.flatnonzero(self.visible)
        return vis[np.argsort(self.depths[vis], kind="stable")]


def project_gaussians(means: np.ndarray, covars: np.ndarray, opacities: np.ndarray,
                      viewmat: np.ndarray, K: np.ndarray, width: int, height: int,
                      eps2d: float = EPS2D, near_plane: float = NEAR_PLANE,
                      far_plane: float = FAR_PLANE) -> Projected:
    """EWA-project 3D Gaussians into one pinhole camera, as gsplat does (float32).

    means:     (N, 3) float32, world space
    covars:    (N, 3, 3) float32, world-space covariances (see ``covariance_3d``)
    opacities: (N,) float32 in [0, 1]
    viewmat:   (4, 4) float32, world -> camera (OpenCV axes)
    K:         (3, 3) float32, intrinsics; only fx, fy, cx, cy are used (gsplat ignores skew)
    """
    f32 = np.float32
    viewmat = np.asarray(viewmat, f32)
    K = np.asarray(K, f32)
    R = viewmat[:3, :3]
    t = viewmat[:3, 3]
    mean_c = np.asarray(means, f32) @ R.T + t
    cov_c = R @ np.asarray(covars, f32) @ R.T
    x, y, z = mean_c[:, 0], mean_c[:, 1], mean_c[:, 2]
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]

    # The Jacobian is evaluated at the centre clamped to 1.3x the field of view:
    # for Gaussians far outside the image the linearisation would explode.
    tan_fovx = f32(0.5) * f32(width) / fx
    tan_fovy = f32(0.5) * f32(height) / fy
    lim_x_pos = (f32(width) - cx) / fx + f32(0.3) * tan_fovx
    lim_x_neg = cx / fx + f32(0.3) * tan_fovx
    lim_y_pos = (f32(height) - cy) / fy + f32(0.3) * tan_fovy
    lim_y_neg = cy / fy + f32(0.3) * tan_fovy
    safe_z = np.where(np.abs(z) < 1e-12, f32(1e-12), z)  # culled below anyway
    rz = f32(1.0) / safe_z
    tx = z * np.minimum(lim_x_pos, np.maximum(-lim_x_neg, x * rz))
    ty = z * np.minimum(lim_y_pos, np.maximum(-lim_y_neg, y * rz))
    zero = np.zeros_like(z)
    J = np.stack([fx * rz, zero, -fx * tx * rz * rz,
                  zero, fy * rz, -fy * ty * rz * rz], axis=-1).reshape(-1, 2, 3)
    cov2d = J @ cov_c @ np.swapaxes(J, -1, -2)
    means2d = np.stack([fx * x * rz + cx, fy * y * rz + cy], axis=-1)

    a = cov2d[:, 0, 0] + f32(eps2d)
    b = f32(0.5) * (cov2d[:, 0, 1] + cov2d[:, 1, 0])
    c = cov2d[:, 1, 1] + f32(eps2d)
    det = a * c - b * b
    ok_det = det > 0
    inv_det = f32(1.0) / np.where(ok_det, det, f32(1.0))
    conics = np.stack([c * inv_det, -b * inv_det, a * inv_det], axis=-1)

    # The box holds every pixel whose alpha can reach ALPHA_MIN: along each axis the
    # ellipse {d: d^T conic d <= e^2} extends e * sqrt(cov_axis) from the centre.
    opacities = np.asarray(opacities, f32)
    ok_op = opacities >= ALPHA_MIN
    extend = np.minimum(np.sqrt(f32(2.0) * np.log(np.where(ok_op, opacities, f32(1.0)) / f32(ALPHA_MIN))),
                        f32(RADIUS_EXTEND))
    rx = np.ceil(extend * np.sqrt(np.maximum(a, 0)))
    ry = np.ceil(extend * np.sqrt(np.maximum(c, 0)))
    mx, my = means2d[:, 0], means2d[:, 1]
    valid = ((z >= near_plane) & (z <= far_plane) & ok_det & ok_op
             & ~((rx <= 0) & (ry <= 0))
             & (mx + rx > 0) & (mx - rx < width) & (my + ry > 0) & (my - ry < height))
    radii = np.stack([rx, ry], axis=-1).astype(np.int32) * valid[:, None].astype(np.int32)
    return Projected(means2d=means2d.astype(f32), depths=z.astype(f32), conics=conics.astype(f32),
                     radii=radii)
