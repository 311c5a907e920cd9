"""Per-Gaussian math shared by the renderers: rotations, 3D covariances and the
EWA projection to the image plane, written to match gsplat 1.5.3's CUDA kernels
(``projection_ewa_3dgs_fused_fwd_kernel`` and ``persp_proj``) in its default
mode (pinhole, ``rasterize_mode="classic"``, ``radius_clip=0``).

On the host, without torch: rotations and covariances in numpy float32 as gsplat computes
them, the projection a compiled loop (``projection_kernels``); the torch renderer for a GPU
without gsplat takes the projection to its device (a few arrays of N, cheap next to its
fragments).
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
    """EWA-project 3D Gaussians into one pinhole camera, as gsplat does: a compiled loop over
    the Gaussians (``projection_kernels``), in float64, results in float32.

    means:     (N, 3) float32, world space
    covars:    (N, 3, 3) float32, world-space covariances (see ``covariance_3d``)
    opacities: (N,) float32 in [0, 1]
    viewmat:   (4, 4) float32, world -> camera (OpenCV axes)
    K:         (3, 3) float32, intrinsics; only fx, fy, cx, cy are used (gsplat ignores skew)

    The Jacobian is evaluated at the centre clamped to 1.3x the field of view (for Gaussians
    far outside the image the linearisation would explode); ``eps2d`` is added to the 2D
    covariance's diagonal; the radius box holds every pixel whose alpha can reach ALPHA_MIN
    (along each axis the ellipse {d: d^T conic d <= e^2} extends e * sqrt(cov_axis)); a
    Gaussian behind the near plane, degenerate, too faint or off the image gets radii 0.
    """
    from pipeline.views.projection_kernels import project

    n = len(means)
    out = Projected(means2d=np.empty((n, 2), np.float32), depths=np.empty(n, np.float32),
                    conics=np.empty((n, 3), np.float32), radii=np.empty((n, 2), np.int32))
    project(np.ascontiguousarray(means, np.float64), np.ascontiguousarray(covars, np.float64),
            np.ascontiguousarray(opacities, np.float64), np.asarray(viewmat, np.float64),
            np.asarray(K, np.float64), float(width), float(height), float(eps2d), float(near_plane),
            float(far_plane), float(ALPHA_MIN), float(RADIUS_EXTEND), out.means2d, out.depths, out.conics,
            out.radii)
    return out
