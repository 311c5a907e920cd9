"""Quaternions and rotation matrices, (w, x, y, z) order, for numpy arrays: the one home of
this maths for the stages (conversions through scipy's ``Rotation``; the Hamilton product
written out because it must keep lengths: Gaussians' quaternions arrive unnormalised).
``pipeline.views.gaussian_math.quat_to_rotmat`` is its float32 twin in gsplat's formula."""

from __future__ import annotations

import numpy as np


def quat_to_matrix(q: np.ndarray) -> np.ndarray:
    """(..., 4) (w, x, y, z), any non-zero length -> (..., 3, 3) float64 rotation matrices
    acting on column vectors."""
    from scipy.spatial.transform import Rotation

    q = np.asarray(q, np.float64)
    return Rotation.from_quat(q.reshape(-1, 4), scalar_first=True).as_matrix().reshape(q.shape[:-1] + (3, 3))


def matrix_to_quat(m: np.ndarray) -> np.ndarray:
    """(..., 3, 3) proper rotations -> (..., 4) unit (w, x, y, z) float64 with w >= 0."""
    from scipy.spatial.transform import Rotation

    m = np.asarray(m, np.float64)
    q = Rotation.from_matrix(m.reshape(-1, 3, 3)).as_quat(canonical=True, scalar_first=True)
    return q.reshape(m.shape[:-2] + (4,))


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product a * b of (..., 4) (w, x, y, z) quaternions (lengths multiply)."""
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw], axis=-1)
