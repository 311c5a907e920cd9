"""Per-Gaussian math shared by the renderers: rotations, 3D covariances and the
EWA projection to the image plane, written to match gsplat 1.5.3's CUDA kernels
(``projection_ewa_3dgs_fused_fwd_kernel`` and ``persp_proj``) in its default
mode (pinhole, ``rasterize_mode="classic"``, ``radius_clip=0``).

All functions take and return float32 torch tensors on any device. torch is
imported inside them, so the constants (``SH_C0`` for the PLY export and SAM 3D's
colours) cost nothing to import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

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


def quat_to_rotmat(quats: torch.Tensor) -> torch.Tensor:
    """Rotation matrices from quaternions.

    quats: (N, 4) float, (w, x, y, z), any non-zero length (normalised here, as gsplat does)
    returns (N, 3, 3) float, R such that a local vector v maps to R @ v
    """
    import torch

    q = quats / torch.linalg.norm(quats, dim=-1, keepdim=True)
    w, x, y, z = q.unbind(-1)
    r = torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ], dim=-1)
    return r.reshape(quats.shape[:-1] + (3, 3))


def covariance_3d(quats: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """World-space covariances R S S^T R^T.

    quats:  (N, 4) float, (w, x, y, z)
    scales: (N, 3) float, standard deviations along the local axes (not log)
    returns (N, 3, 3) float, symmetric positive semi-definite
    """
    m = quat_to_rotmat(quats) * scales[..., None, :]  # R @ diag(s)
    return m @ m.transpose(-1, -2)


@dataclass
class Projected:
    """Gaussians projected into one camera (gsplat's ``packed=False`` layout).

    means2d: (N, 2) float32, pixel coordinates of the centres (top-left pixel centre = (0.5, 0.5))
    depths:  (N,)   float32, camera-space z
    conics:  (N, 3) float32, (a, b, c) of the inverse blurred 2D covariance [[a, b], [b, c]]
    radii:   (N, 2) int32, half-extent of the footprint's bounding box in pixels along x and y;
             (0, 0) for Gaussians that are culled (behind the near plane, outside the
             image, degenerate, or too transparent to ever reach ALPHA_MIN)
    """

    means2d: torch.Tensor
    depths: torch.Tensor
    conics: torch.Tensor
    radii: torch.Tensor

    @property
    def visible(self) -> torch.Tensor:
        """(N,) bool: Gaussians that reach the image."""
        return (self.radii > 0).all(dim=-1)


def project_gaussians(means: torch.Tensor, covars: torch.Tensor, opacities: torch.Tensor,
                      viewmat: torch.Tensor, K: torch.Tensor, width: int, height: int,
                      eps2d: float = EPS2D, near_plane: float = NEAR_PLANE,
                      far_plane: float = FAR_PLANE) -> Projected:
    """EWA-project 3D Gaussians into one pinhole camera, as gsplat does.

    means:     (N, 3) float32, world space
    covars:    (N, 3, 3) float32, world-space covariances (see ``covariance_3d``)
    opacities: (N,) float32 in [0, 1]
    viewmat:   (4, 4) float32, world -> camera (OpenCV axes)
    K:         (3, 3) float32, intrinsics; only fx, fy, cx, cy are used (gsplat ignores skew)
    """
    import torch

    R = viewmat[:3, :3]
    t = viewmat[:3, 3]
    mean_c = means @ R.T + t
    cov_c = R @ covars @ R.T
    x, y, z = mean_c.unbind(-1)
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]

    # The Jacobian is evaluated at the centre clamped to 1.3x the field of view:
    # for Gaussians far outside the image the linearisation would explode.
    tan_fovx = 0.5 * width / fx
    tan_fovy = 0.5 * height / fy
    lim_x_pos = (width - cx) / fx + 0.3 * tan_fovx
    lim_x_neg = cx / fx + 0.3 * tan_fovx
    lim_y_pos = (height - cy) / fy + 0.3 * tan_fovy
    lim_y_neg = cy / fy + 0.3 * tan_fovy
    safe_z = torch.where(z.abs() < 1e-12, torch.full_like(z, 1e-12), z)  # culled below anyway
    rz = 1.0 / safe_z
    tx = z * torch.minimum(lim_x_pos, torch.maximum(-lim_x_neg, x * rz))
    ty = z * torch.minimum(lim_y_pos, torch.maximum(-lim_y_neg, y * rz))
    zero = torch.zeros_like(z)
    J = torch.stack([fx * rz, zero, -fx * tx * rz * rz,
                     zero, fy * rz, -fy * ty * rz * rz], dim=-1).reshape(-1, 2, 3)
    cov2d = J @ cov_c @ J.transpose(-1, -2)
    means2d = torch.stack([fx * x * rz + cx, fy * y * rz + cy], dim=-1)

    a = cov2d[:, 0, 0] + eps2d
    b = 0.5 * (cov2d[:, 0, 1] + cov2d[:, 1, 0])
    c = cov2d[:, 1, 1] + eps2d
    det = a * c - b * b
    ok_det = det > 0
    inv_det = 1.0 / torch.where(ok_det, det, torch.ones_like(det))
    conics = torch.stack([c * inv_det, -b * inv_det, a * inv_det], dim=-1)

    # The box holds every pixel whose alpha can reach ALPHA_MIN: along each axis the
    # ellipse {d: d^T conic d <= e^2} extends e * sqrt(cov_axis) from the centre.
    ok_op = opacities >= ALPHA_MIN
    extend = torch.sqrt(2.0 * torch.log(torch.where(ok_op, opacities, torch.ones_like(opacities))
                                        / ALPHA_MIN)).clamp(max=RADIUS_EXTEND)
    rx = torch.ceil(extend * torch.sqrt(a.clamp(min=0)))
    ry = torch.ceil(extend * torch.sqrt(c.clamp(min=0)))
    mx, my = means2d.unbind(-1)
    valid = ((z >= near_plane) & (z <= far_plane) & ok_det & ok_op
             & ~((rx <= 0) & (ry <= 0))
             & (mx + rx > 0) & (mx - rx < width) & (my + ry > 0) & (my - ry < height))
    radii = torch.stack([rx, ry], dim=-1).to(torch.int32) * valid[:, None].to(torch.int32)
    return Projected(means2d=means2d, depths=z, conics=conics, radii=radii)
