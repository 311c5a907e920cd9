"""pipeline.camera.rotations: the stages' quaternion maths, checked against the renderer's float32
twin (gaussian_math.quat_to_rotmat, gsplat's formula) and the algebra it must keep."""

from __future__ import annotations

import numpy as np

from pipeline.camera import rotations as R
from pipeline.views.gaussian_math import quat_to_rotmat


def test_the_stages_and_the_renderers_twins_agree_on_unnormalised_batches():
    q = np.random.default_rng(0).normal(size=(5, 7, 4)) * 3.0
    ours = R.quat_to_matrix(q)
    twin = quat_to_rotmat(q)
    assert ours.shape == twin.shape == (5, 7, 3, 3)
    np.testing.assert_allclose(ours, twin, atol=2e-6)   # the renderer's is float32
    np.testing.assert_allclose(ours @ np.swapaxes(ours, -1, -2), np.broadcast_to(np.eye(3), ours.shape), atol=1e-12)


def test_matrix_to_quat_round_trips_with_w_non_negative():
    q = np.random.default_rng(1).normal(size=(50, 4))
    back = R.matrix_to_quat(R.quat_to_matrix(q))
    unit = q / np.linalg.norm(q, axis=1, keepdims=True)
    np.testing.assert_allclose(back, unit * np.sign(unit[:, :1]), atol=1e-9)
    assert (back[:, 0] >= 0).all()
    np.testing.assert_allclose(R.matrix_to_quat(np.diag([-1.0, 1.0, -1.0])), [0, 0, 1, 0], atol=1e-12)


def test_hamilton_product_composes_rotations_and_keeps_lengths():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(20, 4)), rng.normal(size=(20, 4)) * 2.5
    ab = R.quat_mul(a, b)
    np.testing.assert_allclose(np.linalg.norm(ab, axis=1),
                               np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), rtol=1e-12)
    np.testing.assert_allclose(R.quat_to_matrix(ab), R.quat_to_matrix(a) @ R.quat_to_matrix(b), atol=1e-9)
