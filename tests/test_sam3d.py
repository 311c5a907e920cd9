"""SAM 3D Objects backend against SAM 3D's real output classes.

``tests/fake_sam3d/sam3d_objects`` stands in for the model only: it has the real
import path, constructor and ``run`` signature and output keys, and returns a known
object with a known pose and a pinhole-consistent pointmap, built with SAM 3D's real
``Gaussian`` and ``MeshExtractResult`` classes, loaded from the ``sam3d`` PyPI package's
vendored copy of upstream (the ``test`` extra; see the fake's ``representations``). So
the conversion to Kiln's frame and the derived source camera can be checked exactly.
The real pipeline and weights are never run here (see docs/models.md).
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")

from kiln.settings import ReconstructSettings, Settings  # noqa: E402
from pipeline.recon import sam3d
from pipeline.types import ImageInput  # noqa: E402

FAKE = Path(__file__).parent / "fake_sam3d"
TARGET = "sam3d_objects.pipeline.inference_pipeline_pointmap.InferencePipelinePointMap"
HAVE_SAM3D_PYPI = importlib.util.find_spec("sam3d") is not None
needs_real_classes = pytest.mark.skipif(
    not HAVE_SAM3D_PYPI, reason="the sam3d PyPI package (test extra) that vendors SAM 3D's "
    "Gaussian / MeshExtractResult is not installed: pip install -e .[test]")


@pytest.fixture
def fake_pkg(monkeypatch):
    """Put the stand-in ``sam3d_objects`` on sys.path for one test."""
    if not HAVE_SAM3D_PYPI:
        pytest.skip("the sam3d PyPI package (test extra) is not installed: pip install -e .[test]")
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


def _image(height=96, width=128, **pose) -> ImageInput:
    """A photo whose mask is the posed box's silhouette under the fake's camera
    (needs the fake package on sys.path); without pose keys, a rectangle."""
    rgb = np.full((height, width, 3), 30, np.uint8)
    if pose:
        from sam3d_objects.pipeline.inference_pipeline_pointmap import silhouette

        mask = silhouette(height, width, **pose)
    else:
        mask = np.zeros((height, width), bool)
        mask[height // 5:height * 5 // 6, width // 3:width * 2 // 3] = True
    rgb[mask] = (200, 120, 60)
    return ImageInput(rgb=rgb, mask=mask)


def _settings(path: Path, **kw) -> ReconstructSettings:
    return ReconstructSettings(backend="sam3d", sam3d_config=str(path), **kw)


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


def _silhouette_from(mesh, cam) -> np.ndarray:
    """(H, W) bool: pixels of ``cam`` (a SourceCamera) whose centre ray hits ``mesh``,
    by ray casting (not Kiln's rasterizers, not the fake's caster)."""
    import trimesh

    tm = trimesh.Trimesh(mesh.vertices.astype(np.float64), mesh.faces, process=False)
    R, t = cam.viewmat[:3, :3].astype(np.float64), cam.viewmat[:3, 3].astype(np.float64)
    cc, rr = np.meshgrid(np.arange(cam.width) + 0.5, np.arange(cam.height) + 0.5)
    pix = np.stack([cc, rr, np.ones_like(cc)], axis=-1).reshape(-1, 3)
    d_cam = pix @ np.linalg.inv(cam.K.astype(np.float64)).T
    d_world = d_cam @ R                       # R^T d for row vectors
    origin = -R.T @ t
    hit = np.zeros(len(pix), bool)
    _, idx, _ = tm.ray.intersects_location(np.broadcast_to(origin, d_world.shape), d_world,
                                           multiple_hits=False)
    hit[idx] = True
    return hit.reshape(cam.height, cam.width)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max(1, (a | b).sum()))


# --------------------------------------------------------------------------- conversion

@pytest.mark.parametrize("convention", ["pytorch3d-row", "column"])
def test_reconstruct_converts_to_kiln_frame(fake_pkg, tmp_path, convention):
    pose = dict(pose_wxyz=list(POSE), translation=[0.1, -0.2, 2.5], scale=0.7,
                pose_convention=convention)
    cfg = write_config(tmp_path / "ckpt", **pose)
    progress = []
    image = _image(**pose)
    recon = sam3d.reconstruct_sam3d(image, _settings(cfg), seed=3,
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

    # the photo's camera sits on the +z side, facing the object, and sees it where the mask is
    cam = recon.source_camera
    assert cam is not None and recon.meta["source_camera"]["derived"]
    centre = -cam.viewmat[:3, :3].T @ cam.viewmat[:3, 3]
    assert centre[2] > 1.0 and np.hypot(centre[0], centre[1]) < 0.5 * centre[2]
    assert (cam.width, cam.height) == (128, 96)
    assert _iou(_silhouette_from(mesh, cam), image.mask) > 0.95

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
    from pipeline.recon.reconstruct import RECONSTRUCTORS, reconstruct

    cfg = write_config(tmp_path / "a", pose_wxyz=list(POSE))
    via_dispatch = reconstruct(_image(pose_wxyz=list(POSE)), _settings(cfg), seed=0)
    assert RECONSTRUCTORS["sam3d"] is sam3d.reconstruct_sam3d
    assert via_dispatch.meta["backend"] == "sam3d"

    # an output with only the y-up 'glb' trimesh gives the same mesh as the raw 'mesh'
    cfg_b = write_config(tmp_path / "b", pose_wxyz=list(POSE), drop_mesh_key=True)
    from_glb = sam3d.reconstruct_sam3d(_image(pose_wxyz=list(POSE)), _settings(cfg_b), seed=0)
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
    # without a pointmap there are no intrinsics, so no source camera, and meta says why
    assert recon.source_camera is None and "no pointmap" in recon.meta["source_camera"]["why"]
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
    assert recon.source_camera is None and "no object pose" in recon.meta["source_camera"]["why"]
    # the box is 0.9 tall along local z (up): that becomes Kiln's y and the longest side
    assert np.isclose(np.ptp(recon.mesh.vertices[:, 1]), 1.0, atol=1e-4)


# --------------------------------------------------------------------------- source camera

@pytest.mark.parametrize("shrink", [1.0, 0.5])
def test_source_camera_from_pose_and_pointmap_lands_on_mask(fake_pkg, tmp_path, shrink):
    """Through ``reconstruct`` with a photo larger than max_image_side: the camera comes
    back in the original photo's pixels, its intrinsics equal the fake's camera, and the
    final mesh projected with it covers the photo's mask."""
    from pipeline.recon.reconstruct import reconstruct
    from sam3d_objects.pipeline.inference_pipeline_pointmap import pixel_K

    pose = dict(pose_wxyz=[0.9, -0.1, 0.4, 0.1], translation=[-0.15, 0.1, 2.2], scale=0.9,
                camera_K=[0.95, 0.97, 0.55, 0.45])
    cfg = write_config(tmp_path / "cam", pointmap_shrink=shrink, **pose)
    photo = _image(240, 320, **pose)           # original photo, downscaled to 160 x 120 to reconstruct
    recon = reconstruct(photo, _settings(cfg, max_image_side=160), seed=0)
    cam = recon.source_camera
    assert cam is not None, recon.meta["source_camera"]
    assert (cam.width, cam.height, cam.projection) == (320, 240, "perspective")
    np.testing.assert_allclose(cam.K, pixel_K(pose["camera_K"], 320, 240), rtol=2e-3, atol=0.3)
    fit = recon.meta["source_camera"]["intrinsics_fit"]
    assert fit["rms_px"] < 0.05 and fit["pixels"] >= 0.9 * (160 * shrink) * (120 * shrink)
    # rigid, in normalised units: the whole object in front of the camera
    R = cam.viewmat[:3, :3].astype(np.float64)
    np.testing.assert_allclose(R @ R.T, np.eye(3), atol=1e-6)
    _, z = cam.project(recon.mesh.vertices)
    assert z.min() > 0
    sil = _silhouette_from(recon.mesh, cam)
    assert _iou(sil, photo.mask) > 0.95, _iou(sil, photo.mask)
    # and the Gaussians project inside the (slightly grown) mask
    import cv2

    uv, _ = cam.project(recon.gaussians.means)
    grown = cv2.dilate(photo.mask.astype(np.uint8), np.ones((5, 5), np.uint8)) > 0
    c = np.clip(uv[:, 0].astype(int), 0, 319)
    r = np.clip(uv[:, 1].astype(int), 0, 239)
    assert grown[r, c].mean() > 0.99


def test_source_camera_is_none_for_unusable_pointmaps(fake_pkg, tmp_path):
    cfg = write_config(tmp_path / "bad", pose_wxyz=list(POSE))
    pipe_out = sam3d.load_pipeline(cfg).run(np.zeros((48, 64, 4), np.uint8), None, 0)
    image_mask = np.ones((48, 64), bool)
    pipe_out["pointmap"] = torch.full((24, 32, 3), float("nan"))
    cam, why = sam3d.source_camera_from_outputs(pipe_out, image_mask, np.zeros(3), 1.0)
    assert cam is None and "could not be fitted" in why["why"]
    pipe_out["pointmap"] = torch.zeros((24, 32))
    cam, why = sam3d.source_camera_from_outputs(pipe_out, image_mask, np.zeros(3), 1.0)
    assert cam is None and "shape" in why["why"]


def test_fit_intrinsics_recovers_a_pinhole_despite_outliers():
    rng = np.random.default_rng(4)
    H, W = 90, 120
    K = np.array([[150.0, 0, 61.0], [0, 140.0, 44.0], [0, 0, 1]])
    cc, rr = np.meshgrid(np.arange(W) + 0.5, np.arange(H) + 0.5)
    depth = rng.uniform(1.0, 4.0, (H, W))
    x_cv = (cc - K[0, 2]) / K[0, 0] * depth
    y_cv = (rr - K[1, 2]) / K[1, 1] * depth
    pm = np.stack([-x_cv, -y_cv, depth], axis=-1)     # PyTorch3D axes
    pm[:5] = np.nan                                     # clipped far points
    pm[40, :30] *= np.array([1.3, 0.7, 1.0])           # mixed points at a depth edge
    got, fit = sam3d.fit_intrinsics(pm, (H, W))
    np.testing.assert_allclose(got, K, atol=1e-6)
    assert fit["outliers"] >= 25
    # a half-size pointmap of the same image: cell centres map back through the factor
    half = pm[::2, ::2].copy()
    cc2, rr2 = np.meshgrid((np.arange(W // 2) + 0.5) * 2, (np.arange(H // 2) + 0.5) * 2)
    half[..., 0] = -(cc2 - K[0, 2]) / K[0, 0] * half[..., 2]
    half[..., 1] = -(rr2 - K[1, 2]) / K[1, 1] * half[..., 2]
    np.testing.assert_allclose(sam3d.fit_intrinsics(half, (H, W))[0], K, atol=1e-6)
    with pytest.raises(ValueError, match="finite"):
        sam3d.fit_intrinsics(np.full((8, 8, 3), np.nan), (8, 8))


# --------------------------------------------------------------------------- real upstream classes

def _git_blob_sha(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@needs_real_classes
def test_vendored_classes_are_upstreams(fake_pkg):
    """The sam3d PyPI package's copies of the files that define Gaussian and
    MeshExtractResult are byte-identical to facebookresearch/sam-3d-objects."""
    import inspect

    from sam3d_objects.model.backbone.tdfy_dit import representations as rep

    root = rep.vendored_root()
    for rel, blob in rep.UPSTREAM_BLOBS.items():
        assert _git_blob_sha(root / rel) == blob, f"{rel} differs from upstream {rep.UPSTREAM_COMMIT}"
    assert Path(inspect.getsourcefile(rep.Gaussian)).resolve() == \
        (root / rep._TDFY / "representations/gaussian/gaussian_model.py").resolve()
    assert Path(inspect.getsourcefile(rep.MeshExtractResult)).resolve() == \
        (root / rep._TDFY / "representations/mesh/cube2mesh.py").resolve()


@needs_real_classes
@pytest.mark.parametrize("activation", ["exp", "softplus"])
def test_activations_of_the_real_gaussian(fake_pkg, activation):
    """convert_outputs reads SAM 3D's activated values: biased exp/softplus scales with the
    3D filter kernel, sigmoid opacity with its bias, normalised rotations (w first), xyz
    through the aabb, colour = 0.5 + C0 * DC; higher SH bands are dropped, not mixed in."""
    from sam3d_objects.model.backbone.tdfy_dit.representations import Gaussian, cpu_tensors

    n = 200
    rng = np.random.default_rng(2)
    with cpu_tensors():
        gs = Gaussian(aabb=[-0.5, -0.5, -0.5, 1.0, 1.0, 1.0], sh_degree=1, mininum_kernel_size=0.002,
                      scaling_bias=0.004, opacity_bias=0.1, scaling_activation=activation, device="cpu")
    f32 = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    # raw parameters as the decoder writes them
    gs._xyz = f32(rng.uniform(0, 1, (n, 3)))
    gs._scaling = f32(rng.normal(0, 1, (n, 3)))
    gs._rotation = f32(rng.normal(0, 0.3, (n, 4)))
    gs._opacity = f32(rng.normal(0, 2, (n, 1)))
    gs._features_dc = f32(rng.normal(0, 0.5, (n, 1, 3)))
    gs._features_rest = f32(rng.normal(0, 5, (n, 1, 9)))
    raw = sam3d._raw_gaussians(gs)

    act = np.exp if activation == "exp" else (lambda x: np.log1p(np.exp(x)))
    bias = np.log(0.004) if activation == "exp" else np.log(np.expm1(0.004))
    scales = np.sqrt(act(gs._scaling.double().numpy() + bias) ** 2 + 0.002 ** 2)
    np.testing.assert_allclose(raw["scales"], scales, rtol=1e-4)
    op = 1 / (1 + np.exp(-(gs._opacity.double().numpy()[:, 0] + np.log(0.1 / 0.9))))
    np.testing.assert_allclose(raw["opacities"], op, rtol=1e-4)
    q = gs._rotation.double().numpy() + np.array([1.0, 0, 0, 0])
    np.testing.assert_allclose(raw["quats"], q / np.linalg.norm(q, axis=1, keepdims=True), atol=1e-6)
    np.testing.assert_allclose(raw["means"], gs._xyz.double().numpy() - 0.5, atol=1e-6)
    dc = gs._features_dc.double().numpy()[:, 0]
    np.testing.assert_allclose(raw["colors"], np.clip(0.5 + sam3d.SH_C0 * dc, 0, 1), atol=1e-6)
    assert raw["sh_degree"] == 1 and gs.get_features.shape == (n, 1, 12)


@needs_real_classes
def test_higher_sh_bands_are_dropped_in_conversion(fake_pkg, tmp_path):
    pose = dict(pose_wxyz=list(POSE))
    cfg = write_config(tmp_path / "sh", sh_degree=2, **pose)
    recon = sam3d.reconstruct_sam3d(_image(**pose), _settings(cfg), seed=0)
    truth = sam3d._PIPELINE_CACHE[next(iter(sam3d._PIPELINE_CACHE))].truth
    keep = truth["opacities"] >= 1 / 255
    np.testing.assert_allclose(recon.gaussians.colors, truth["colors"][keep], atol=1e-5)
    assert recon.meta["sh_bands_dropped"] == 2


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
