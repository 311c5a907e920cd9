import numpy as np
import pytest

from pipeline.camera import cameras as C


def test_look_at_puts_target_on_the_optical_axis():
    for eye in ([0, 0, 3], [2, 1, -1], [0, 3, 0.0], [0, -2, 0]):
        vm = C.look_at(eye)
        K = C.intrinsics(40, 100, 80)
        uv, z = C.project(np.zeros((1, 3), np.float32), vm, K)
        assert np.allclose(uv[0], [50, 40], atol=1e-4)
        assert np.isclose(z[0], np.linalg.norm(eye), atol=1e-5)
        R = vm[:3, :3]
        assert np.allclose(R @ R.T, np.eye(3), atol=1e-6) and np.isclose(np.linalg.det(R), 1, atol=1e-6)


def test_image_axes_follow_opencv():
    # camera on +z looking at the origin: world +x is image right, world +y (up) is image up (smaller row)
    vm = C.look_at([0, 0, 3])
    K = C.intrinsics(40, 100, 100)
    uv, _ = C.project(np.array([[0.2, 0, 0], [0, 0.2, 0]], np.float32), vm, K)
    assert uv[0, 0] > 50 and np.isclose(uv[0, 1], 50)
    assert uv[1, 1] < 50 and np.isclose(uv[1, 0], 50)


def test_intrinsics_fov():
    K = C.intrinsics(90, 200, 100)
    assert np.isclose(K[1, 1], 50) and K[0, 2] == 100 and K[1, 2] == 50
    with pytest.raises(ValueError):
        C.intrinsics(0, 10, 10)


def test_hammersley_directions_are_unit_and_spread():
    d = C.hammersley_directions(64)
    assert np.allclose(np.linalg.norm(d, axis=1), 1)
    assert abs(d.mean(axis=0)).max() < 0.1           # balanced over the sphere
    dots = d @ d.T - 2 * np.eye(64)
    assert dots.max() < 0.97                          # no two views nearly the same


def test_sphere_cameras_centres_and_front_view():
    cams = C.sphere_cameras(8, 2.5, 40, 64).validate()
    centres = C.camera_centers(cams)
    assert np.allclose(np.linalg.norm(centres, axis=1), 2.5, atol=1e-5)
    assert np.allclose(centres[0], [0, 0, 2.5], atol=1e-5)
    assert cams.viewmats.dtype == np.float32 and cams.Ks.shape == (8, 3, 3)
