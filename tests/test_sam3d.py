"""SAM 3D Objects backend against a stand-in package with the real API.

``tests/fake_sam3d/sam3d_objects`` has the real import path, constructor and
``run`` signature and output keys, and returns a known object with a known
pose, so the conversion to Kiln's frame can be checked exactly. The real
package and weights are never run here (see docs/models.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")

from kiln.settings import ReconstructSettings, Settings  # noqa: E402
from pipeline import sam3d  # noqa: E402
from pipeline.types import ImageInput  # noqa: E402

FAKE = Path(__file__).parent / "fake_sam3d"
TARGET = "sam3d_objects.pipeline.inference_pipeline_pointmap.InferencePipelinePointMap"


@pytest.fixture
def fake_pkg(monkeypatch):
    """Put the stand-in ``sam3d_objects`` on sys.path for one test."""
    monkeypatch.syspath_prepend(str(FAKE))
    sam3d._PIPELINE_CACHE.clear()
    yield sys
    for name in [m for m in sys.modules if m == "sam3d_objects" or m.startswith("sam3d_objects.")]:
        del sys.modules[name]
    sam3d._PIPELINE_CACHE.clear()


def _calls():
    from sam3d_objects.pipeline.inference_pipeline_pointmap import CALLS

    return CALLS


def write_config(folder: Path, **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"_target_": TARGET, "ss_generator_config_path": "ss_generator.yaml",
           "ss_generator_ckpt_path": "ss_generator.ckpt", "rendering_engine": "nvdiffrast",
           "compile_model": True, **extra}
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _image() -> ImageInput:
    rgb = np.full((96, 128, 3), 30, np.uint8)
    mask = np.zeros((96, 128), bool)
    mask[20:80, 40:90] = True
    rgb[mask] = (200, 120, 60)
    return ImageInput(rgb=rgb, mask=mask)


def _settings(path: Path) -> ReconstructSettings:
    return ReconstructSettings(backend="sam3d", sam3d_config=str(path))


def _normalise(p: np.ndarray) -> np.ndarray:
    lo, hi = p.min(axis=0), p.max(axis=0)
    return (p - (lo + hi) / 2) / (hi - lo).max()


def _rotmat(q_wxyz) -> np.ndarray:
    from scipy.spatial.transform import Rotation

    w, x, y, z = q_wxyz
    return Rotation.from_quat([x, y, z, w]).as_matrix()


POSE = (0.8, 0.2, -0.5, 0.26)   # some rotation, not symmetric for the box


def _expected_kiln(points_local: np.ndarray, q, convention: str) -> np.ndarray:
    """Independent route: pose the local points the way PyTorch3D does (row vectors,
    p @ R) or the other way, then camera (x left, y up, z forward) -> Kiln
    (x right, y up, camera on +z), then the unit-cube normalisation."""
    r = _rotmat(np.asarray(q) / np.linalg.norm(q))
    cam = points_local @ (r if convention == "pytorch3d-row" else r.T)
    return cam * np.array([-1.0, 1.0, -1.0])


# --------------------------------------------------------------------------- conversion

@pytest.mark.parametrize("convention", ["pytorch3d-row", "column"])
def test_reconstruct_converts_to_kiln_frame(fake_pkg, tmp_path, convention):
    cfg = write_config(tmp_path / "ckpt", pose_wxyz=list(POSE), translation=[0.1, -0.2, 2.5],
                       scale=0.7, pose_convention=convention)
    progress = []
    recon = sam3d.reconstruct_sam3d(_image(), _settings(cfg), seed=3,
                                    progress=lambda f, m="": progress.append(f))
    init, run = _calls()[0][1], _calls()[1][1]
    # loaded the way SAM 3D's notebook Inference does
    assert init["rendering_engine"] == "pytorch3d" and init["compile_model"] is False
    assert init["workspace_dir"] == str(cfg.parent)
    # SAM 3D's own mesh post-processing and baking are off; Kiln does those
    assert run["with_mesh_postprocess"] is False and run["with_texture_baking"] is False
    assert run["stage1_only"] is False and run["use_vertex_color"] is True
    assert run["seed"] == 3 and run["image_shape"] == (96, 128, 4) and run["mask"] is None
    assert progress[0] == 0.0 and progress[-1] == 1.0 and progress == sorted(progress)

    from sam3d_objects.pipeline.inference_pipeline_pointmap import box_mesh

    verts_local, faces_local = box_mesh()
    mesh, g = recon.mesh, recon.gaussians
    assert mesh.vertices.dtype == np.float32 and mesh.faces.dtype == np.int32
    assert np.abs(mesh.vertices).max() <= 0.5
    assert np.isclose(np.ptp(mesh.vertices, axis=0).max(), 1.0, atol=1e-4)
    expected = _expected_kiln(verts_local, POSE, convention)
    lo, hi = expected.min(axis=0), expected.max(axis=0)
    center, k = (lo + hi) / 2, 1.0 / (hi - lo).max()
    np.testing.assert_allclose(mesh.vertices, (expected - center) * k, atol=2e-4)
    assert recon.meta["pose_convention"] == convention
    assert recon.meta["orientation"] == "photo camera"

    # meta records how to get back to the photo's camera: it sits on the +z side, facing the object
    meta = recon.meta
    t, s_pose = np.array(meta["pose"]["translation"]), np.mean(meta["pose"]["scale"])
    norm = meta["normalisation"]
    cam = (np.diag([-1.0, 1.0, -1.0]) @ -t / s_pose - norm["center"]) * norm["scale"]
    assert cam[2] > 1.0 and np.hypot(cam[0], cam[1]) < 0.5 * cam[2]

    # outward winding: positive signed volume
    v = mesh.vertices[mesh.faces].astype(np.float64)
    assert np.einsum("ij,ij->i", v[:, 0], np.cross(v[:, 1], v[:, 2])).sum() > 0
    np.testing.assert_allclose(mesh.vertex_colors, np.clip(verts_local + 0.5, 0, 1), atol=1e-5)

    # Gaussians: same transform as the mesh; invisible ones dropped
    fake = sam3d._PIPELINE_CACHE[next(iter(sam3d._PIPELINE_CACHE))]
    truth = fake.truth
    keep = truth["opacities"] >= 1 / 255
    assert len(g) == keep.sum() == len(truth["means"]) - 10
    means_exp = (_expected_kiln(truth["means"], POSE, convention) - center) * k
    np.testing.assert_allclose(g.means, means_exp[keep], atol=2e-4)
    np.testing.assert_allclose(g.opacities, truth["opacities"][keep], rtol=1e-4)
    np.testing.assert_allclose(g.colors, truth["colors"][keep], atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(g.quats, axis=1), 1.0, atol=1e-5)
    # covariances rotate with the frame: Sigma' = k^2 M Sigma M^T with M the local->Kiln rotation
    r = _rotmat(np.asarray(POSE) / np.linalg.norm(POSE))
    m = np.diag([-1.0, 1.0, -1.0]) @ (r.T if convention == "pytorch3d-row" else r)
    for i in range(5):
        j = np.flatnonzero(keep)[i]
        rl = _rotmat(truth["quats"][j])
        sig = rl @ np.diag(truth["scales"][j] ** 2) @ rl.T
        rk = _rotmat(g.quats[i].astype(np.float64))
        sig_k = rk @ np.diag(g.scales[i].astype(np.float64) ** 2) @ rk.T
        np.testing.assert_allclose(sig_k, k * k * m @ sig @ m.T, atol=1e-9, rtol=1e-4)


def test_dispatch_through_reconstruct_and_glb_fallback(fake_pkg, tmp_path):
    from pipeline.reconstruct import RECONSTRUCTORS, reconstruct

    cfg = write_config(tmp_path / "a", pose_wxyz=list(POSE))
    via_dispatch = reconstruct(_image(), _settings(cfg), seed=0)
    assert RECONSTRUCTORS["sam3d"] is sam3d.reconstruct_sam3d
    assert via_dispatch.meta["backend"] == "sam3d"

    # an output with only the y-up 'glb' trimesh gives the same mesh as the raw 'mesh'
    cfg_b = write_config(tmp_path / "b", pose_wxyz=list(POSE), drop_mesh_key=True)
    from_glb = sam3d.reconstruct_sam3d(_image(), _settings(cfg_b), seed=0)
    np.testing.assert_allclose(from_glb.mesh.vertices, via_dispatch.mesh.vertices, atol=1e-5)
    np.testing.assert_allclose(from_glb.mesh.vertex_colors, via_dispatch.mesh.vertex_colors, atol=3e-3)


def test_base_pipeline_gets_only_arguments_it_accepts(fake_pkg, tmp_path):
    """pipeline.yaml may name the base InferencePipeline, whose run() has no
    with_layout_postprocess / pointmap; without a pointmap the pose is applied as
    PyTorch3D does, unchecked."""
    cfg = write_config(tmp_path / "base", _target_="sam3d_objects.pipeline.inference_pipeline.InferencePipeline",
                       pose_wxyz=list(POSE))
    recon = sam3d.reconstruct_sam3d(_image(), _settings(cfg), seed=1)
    run = _calls()[-1][1]
    assert run["base_pipeline"] and run["with_mesh_postprocess"] is False and run["with_texture_baking"] is False
    assert recon.meta["pose_convention"] == "pytorch3d-row" and "pose_fit_median" not in recon.meta
    from sam3d_objects.pipeline.inference_pipeline_pointmap import box_mesh

    expected = _expected_kiln(box_mesh()[0], POSE, "pytorch3d-row")
    np.testing.assert_allclose(recon.mesh.vertices, _normalise(expected), atol=2e-4)


def test_without_pose_keeps_sam3d_canonical_frame(fake_pkg, tmp_path):
    from sam3d_objects.pipeline.inference_pipeline_pointmap import box_mesh

    cfg = write_config(tmp_path / "c", return_pose=False)
    recon = sam3d.reconstruct_sam3d(_image(), _settings(cfg), seed=0)
    verts_local, _ = box_mesh()
    yup = verts_local @ np.array([[1, 0, 0], [0, 0, -1], [0, 1, 0]])  # SAM 3D's to_glb rotation
    np.testing.assert_allclose(recon.mesh.vertices, _normalise(yup), atol=2e-4)
    assert recon.meta["orientation"].startswith("sam3d canonical")
    # the box is 0.9 tall along local z (up): that becomes Kiln's y and the longest side
    assert np.isclose(np.ptp(recon.mesh.vertices[:, 1]), 1.0, atol=1e-4)


# --------------------------------------------------------------------------- errors

def test_loading_and_output_errors(fake_pkg, tmp_path):
    cfg = write_config(tmp_path / "d", fail_on_load="ss_generator.ckpt: No such file")
    with pytest.raises(sam3d.Sam3dError, match="loading SAM 3D Objects .* failed.*No such file"):
        sam3d.reconstruct_sam3d(_image(), _settings(cfg), seed=0)
    cfg = write_config(tmp_path / "e", empty_mesh=True)
    with pytest.raises(sam3d.Sam3dError, match="empty mesh"):
        sam3d.reconstruct_sam3d(_image(), _settings(cfg), seed=0)
    with pytest.raises(sam3d.Sam3dError, match="does not exist"):
        sam3d.reconstruct_sam3d(_image(), _settings(tmp_path / "nowhere" / "pipeline.yaml"), seed=0)
    with pytest.raises(sam3d.Sam3dError, match="no Gaussians"):
        sam3d.convert_outputs({"mesh": []})


def test_unsafe_config_is_refused(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"_target_": TARGET, "depth_model": {"_target_": "os.system",
                                                                        "command": "true"}}))
    got, reason = sam3d.config_problem(str(path))
    assert got is None and "os.system" in reason
    ok, reason = sam3d.probe_sam3d(Settings().override({"reconstruct.sam3d_config": str(path)}))
    assert not ok and "refusing" in reason


def test_probe_reports_each_missing_piece(tmp_path, monkeypatch):
    settings = Settings()
    ok, reason = sam3d.probe_sam3d(settings)
    assert not ok and "reconstruct.sam3d_config is empty" in reason

    missing = settings.override({"reconstruct.sam3d_config": str(tmp_path / "none" / "pipeline.yaml")})
    ok, reason = sam3d.probe_sam3d(missing)
    assert not ok and "does not exist" in reason

    cfg = write_config(tmp_path / "ckpt")
    with_cfg = settings.override({"reconstruct.sam3d_config": str(cfg)})
    assert "sam3d_objects" not in sys.modules
    ok, reason = sam3d.probe_sam3d(with_cfg)   # the real package is not installed here
    assert not ok and "sam3d_objects package is not installed" in reason


def test_probe_gpu_checks(fake_pkg, tmp_path, monkeypatch):
    cfg = write_config(tmp_path / "ckpt")
    settings = Settings().override({"reconstruct.sam3d_config": str(cfg.parent)})  # a folder works too
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok, reason = sam3d.probe_sam3d(settings)
    assert not ok and "no CUDA GPU" in reason

    gib = 1024 ** 3
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (10 * gib, 80 * gib))
    ok, reason = sam3d.probe_sam3d(settings)
    assert not ok and "not enough GPU memory" in reason and "10.0 GiB free" in reason

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (60 * gib, 80 * gib))
    ok, reason = sam3d.probe_sam3d(settings)
    assert ok and "ready" in reason, reason

    broken = write_config(tmp_path / "broken", _target_="sam3d_objects.pipeline.broken_pipeline.X")
    ok, reason = sam3d.probe_sam3d(Settings().override({"reconstruct.sam3d_config": str(broken)}))
    assert not ok and "pytorch3d" in reason


def test_quaternion_helpers_agree_with_scipy():
    rng = np.random.default_rng(0)
    for _ in range(20):
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        m = sam3d.quat_to_matrix(q)
        np.testing.assert_allclose(m, _rotmat(q), atol=1e-12)
        back = sam3d.matrix_to_quat(m)
        np.testing.assert_allclose(back, q if q[0] >= 0 else -q, atol=1e-9)
        q2 = rng.normal(size=4)
        np.testing.assert_allclose(sam3d.quat_to_matrix(sam3d.quat_mul(q, q2)),
                                   _rotmat(q) @ sam3d.quat_to_matrix(q2), atol=1e-9)
    np.testing.assert_allclose(sam3d.matrix_to_quat(np.diag([-1.0, 1.0, -1.0])), [0, 0, 1, 0], atol=1e-12)
