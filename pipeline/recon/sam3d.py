"""SAM 3D Objects (facebookresearch/sam-3d-objects) as a reconstruction backend.

Loading mirrors the public ``notebook/inference.py`` ``Inference`` class without
importing it: that file overwrites ``CUDA_HOME`` with ``$CONDA_PREFIX`` at import
(exactly the toolkit mix-up the worker's environment set-up prevents) and pulls
in gradio, seaborn and kaolin. So, like it, we load ``pipeline.yaml`` with
OmegaConf, set ``rendering_engine="pytorch3d"``, ``compile_model=False`` and
``workspace_dir`` (the yaml's folder), refuse any ``_target_`` outside
sam3d_objects/torch/torchvision/moge, ``hydra.utils.instantiate`` it (an
``InferencePipelinePointMap``) and call

    pipeline.run(rgba, None, seed, stage1_only=False, with_mesh_postprocess=False,
                 with_texture_baking=False, with_layout_postprocess=False,
                 use_vertex_color=True, stage1_inference_steps=None, pointmap=None)

with SAM 3D's own mesh post-processing and texture baking off: Kiln simplifies,
unwraps and bakes itself. From the returned dict we use

* ``"gs"`` (or ``"gaussian"[0]``): a TRELLIS-style ``Gaussian``; we read its
  activated getters, so the biases and activations stay SAM 3D's business:
  ``get_xyz`` (N, 3), ``get_scaling`` (N, 3) linear std devs (exp + min kernel),
  ``get_rotation`` (N, 4) normalised (w, x, y, z), ``get_opacity`` (N, 1) sigmoid,
  ``get_features`` (N, 1, 3) SH degree-0 coefficients -> colour 0.5 + C0 * dc;
* ``"mesh"[0]``: a ``MeshExtractResult`` with ``vertices`` (V, 3), ``faces``
  (F, 3) and ``vertex_attrs`` (V, >=3) whose first three channels are colours
  in [0, 1]; when absent, ``"glb"`` (a trimesh already turned y-up by SAM 3D's
  ``to_glb``);
* ``"rotation"`` (1, 4) wxyz, ``"translation"`` (1, 3), ``"scale"`` (1, 3): the
  object's pose, local -> camera, and ``"pointmap"`` (h, w, 3): the scene's
  points in the same camera frame.

Frames. The decoders' local frame is TRELLIS's, z up. Camera space is
PyTorch3D's (x left, y up, z forward into the scene: SAM 3D turns MoGe's
OpenCV points (x right, y down) into it by negating x and y). The pose is
applied as PyTorch3D's ``Transform3d`` does, on row vectors, which in column
form is ``p_cam = s * R(q)^T p + t``; the notebook's ``make_scene`` agrees (it
rotates Gaussians by ``q^-1``). Kiln's frame (``pipeline/recon/reconstruct.py``) has
the photo's camera looking along -z, image column -> +x, image row -> -y, so

    p_kiln = diag(-1, 1, -1) @ p_cam     (a half turn about y)

and then everything is centred on the mesh's bounding box and scaled so its
longest side is 1. When the result has no pose, the object stays in SAM 3D's
canonical frame turned y-up the way its ``to_glb`` does: (x, y, z) -> (x, z, -y).
When a pointmap comes back, the pose convention is checked against it (the
masked scene points must lie on the posed object); if the transposed rotation
fits far better it is used instead and ``meta["pose_convention"]`` says so.

Source camera (the photo's camera in Kiln's normalised world). SAM 3D does not
return intrinsics (``run`` keeps MoGe's and drops them), but the pointmap holds,
for every pixel of the image it was given, the camera-space point seen there.
With ``u = -x/z``, ``v = -y/z`` (PyTorch3D -> OpenCV axes), a pinhole camera has
``col = fx u + cx`` and ``row = fy v + cy``; fx, cx and fy, cy are fitted by
least squares over all finite pointmap pixels (pixel centres in the image's
pixels; SAM 3D shrinks the pointmap by 1/2, 1/4 or 1/8 for large images, which
is undone), with a second pass that drops outliers (mixed depths at edges). The
extrinsics compose what ``convert_outputs`` did to the object: with s the
(uniform) pose scale, t its translation, C = diag(-1, 1, -1), D = diag(-1, -1, 1)
(PyTorch3D -> OpenCV) and the normalisation p_norm = (p_kiln - center) * k,

    p_cv = D p_cam = (s / k) * (D C p_norm + k D C center + (k / s) D t)

and a uniform factor does not change a perspective projection, so the viewmat
is [D C | k D C center + (k / s) D t], rigid and in normalised units. No pose
or no pointmap: no source camera (``meta["source_camera"]`` says why).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from pipeline.views.gaussian_math import SH_C0
from pipeline.geometry import signed_volume
from pipeline.camera.rotations import matrix_to_quat, quat_mul, quat_to_matrix
from pipeline.types import Gaussians, ImageInput, Mesh, Reconstruction, SourceCamera
from pipeline.validate import StageInputError

ProgressFn = Callable[[float, str], None]

MIN_OPACITY = 1.0 / 255.0       # gsplat skips fragments below this, so such Gaussians never show
MIN_GPU_MEMORY_GIB = 32.0       # SAM 3D Objects' doc/setup.md: "a NVIDIA GPU with at least 32 Gb of VRAM"
ALLOWED_TARGET_ROOTS = ("sam3d_objects", "torch", "torchvision", "moge")
RUN_FLAGS = dict(stage1_only=False, with_mesh_postprocess=False, with_texture_baking=False,
                 with_layout_postprocess=False, use_vertex_color=True, stage1_inference_steps=None,
                 pointmap=None)

# column-vector rotations (p' = M @ p)
CAM_TO_KILN = np.diag([-1.0, 1.0, -1.0])
P3D_TO_OPENCV = np.diag([-1.0, -1.0, 1.0])   # PyTorch3D camera (x left, y up) -> OpenCV (x right, y down)
POINTMAP_SHRINK = (1.0, 0.5, 0.25, 0.125)    # InferencePipelinePointMap._down_sample_img's factors
MIN_FIT_PIXELS = 64                           # fewer valid pointmap pixels cannot pin down 4 intrinsics
ZUP_TO_YUP = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])  # (x, y, z) -> (x, z, -y)

_PIPELINE_CACHE: dict[tuple, Any] = {}


class Sam3dError(StageInputError):
    """SAM 3D Objects could not be loaded, or returned something unusable.

    A StageInputError: the job fails with this message and retrying the same
    settings and image cannot help (the worker classifies it as 'input')."""


def min_gpu_memory_gib() -> float:
    """Free GPU memory the probe asks for; KILN_SAM3D_MIN_GPU_GIB overrides the 32 GiB
    from SAM 3D's setup notes (e.g. for a trimmed pipeline.yaml)."""
    try:
        return float(os.environ.get("KILN_SAM3D_MIN_GPU_GIB", MIN_GPU_MEMORY_GIB))
    except ValueError:
        return MIN_GPU_MEMORY_GIB


# --------------------------------------------------------------------------- config

def config_problem(config_path: str) -> tuple[Optional[Path], str]:
    """(resolved path, "") when ``reconstruct.sam3d_config`` names a usable pipeline.yaml,
    else (None, reason). Reads only the YAML; imports nothing heavy."""
    import yaml

    if not config_path:
        return None, ("reconstruct.sam3d_config is empty; set it to SAM 3D Objects' "
                      "checkpoints/<tag>/pipeline.yaml (e.g. --set reconstruct.sam3d_config="
                      "/path/to/sam-3d-objects/checkpoints/hf/pipeline.yaml)")
    path = Path(config_path).expanduser()
    if path.is_dir():
        path = path / "pipeline.yaml"
    if not path.is_file():
        return None, (f"SAM 3D Objects config {path} does not exist; download the checkpoints "
                      "(see docs/models.md) and point reconstruct.sam3d_config at their pipeline.yaml")
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        return None, f"SAM 3D Objects config {path} cannot be read as YAML: {e}"
    if not isinstance(data, dict) or "_target_" not in data:
        return None, f"SAM 3D Objects config {path} has no top-level _target_; is it pipeline.yaml?"
    bad = [t for t in _targets(data) if t.split(".", 1)[0] not in ALLOWED_TARGET_ROOTS]
    if bad:
        return None, (f"SAM 3D Objects config {path} instantiates {bad[0]!r}, outside "
                      + "/".join(ALLOWED_TARGET_ROOTS) + "; refusing to run it")
    return path, ""


def _targets(node: Any) -> list[str]:
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, dict):
            if isinstance(n.get("_target_"), str):
                out.append(n["_target_"])
            stack.extend(n.values())
        elif isinstance(n, (list, tuple)):
            stack.extend(n)
    return out


# --------------------------------------------------------------------------- probe

def probe_sam3d(settings) -> tuple[bool, str]:
    """Can this (worker) process run SAM 3D Objects? -> (ok, reason).

    ``settings`` is a ``kiln.settings.Settings``. Checks, cheapest first: the
    config file, the ``sam3d_objects`` package, a CUDA GPU, its free memory,
    and finally that the pipeline class named in the yaml imports (catching
    missing dependencies such as pytorch3d before a job starts). Initialises
    CUDA, so call it only in the worker process.
    """
    import importlib
    import importlib.util

    path, problem = config_problem(settings.reconstruct.sam3d_config)
    if path is None:
        return False, problem
    if importlib.util.find_spec("sam3d_objects") is None:
        return False, ("the sam3d_objects package is not installed in this environment; install "
                       "facebookresearch/sam-3d-objects as its doc/setup.md says (pip install -e .[inference])")
    import torch

    if not torch.cuda.is_available():
        return False, ("no CUDA GPU is visible to the worker; SAM 3D Objects needs one with at least "
                       f"{min_gpu_memory_gib():g} GiB (worker.device must not be cpu)")
    free, total = torch.cuda.mem_get_info()
    gib = 1024.0 ** 3
    name = torch.cuda.get_device_name()
    if free / gib < min_gpu_memory_gib():
        return False, (f"not enough GPU memory for SAM 3D Objects: {free / gib:.1f} GiB free of "
                       f"{total / gib:.1f} GiB on {name}, needs {min_gpu_memory_gib():g} GiB")
    import yaml

    target = yaml.safe_load(path.read_text())["_target_"]
    module = target.rsplit(".", 1)[0]
    os.environ.setdefault("LIDRA_SKIP_INIT", "true")  # as SAM 3D's notebook does
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure makes the backend unusable
        return False, f"SAM 3D Objects cannot be imported ({module}): {type(e).__name__}: {e}"
    return True, f"SAM 3D Objects ready ({path}; {name}, {free / gib:.0f} GiB free)"


# --------------------------------------------------------------------------- loading

def load_pipeline(config_path: str | Path):
    """Instantiate SAM 3D's inference pipeline from pipeline.yaml, once per process."""
    path, problem = config_problem(str(config_path))
    if path is None:
        raise Sam3dError(problem)
    key = (str(path.resolve()), path.stat().st_mtime_ns)
    if key in _PIPELINE_CACHE:
        return _PIPELINE_CACHE[key]
    os.environ.setdefault("LIDRA_SKIP_INIT", "true")
    try:
        import sam3d_objects  # noqa: F401  (the notebook insists on importing it first)
        from hydra.utils import instantiate
        from omegaconf import OmegaConf
    except ImportError as e:
        raise Sam3dError(f"SAM 3D Objects is not installed ({e}); install facebookresearch/"
                         "sam-3d-objects or use reconstruct.backend builtin") from None
    config = OmegaConf.load(path)
    config.rendering_engine = "pytorch3d"   # the notebook's choice: keeps nvdiffrast out of SAM 3D
    config.compile_model = False
    config.workspace_dir = str(path.parent)
    try:
        pipe = instantiate(config)
    except Exception as e:  # noqa: BLE001
        cause = e.__cause__ or e    # hydra wraps what the constructor raised
        if _is_oom(cause):
            raise cause from None   # the worker retries / reports OOM by its type
        raise Sam3dError(f"loading SAM 3D Objects from {path} failed: "
                         f"{type(cause).__name__}: {cause}") from e
    _PIPELINE_CACHE.clear()   # one pipeline per worker: they are tens of GiB
    _PIPELINE_CACHE[key] = pipe
    return pipe


def run_kwargs(run: Callable) -> dict:
    """RUN_FLAGS that ``run`` accepts: the base ``InferencePipeline.run`` has no
    ``with_layout_postprocess`` / ``pointmap`` (only the PointMap pipeline does)."""
    import inspect

    try:
        params = inspect.signature(run).parameters
    except (TypeError, ValueError):
        return dict(RUN_FLAGS)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(RUN_FLAGS)
    return {k: v for k, v in RUN_FLAGS.items() if k in params}


def _is_oom(e: BaseException) -> bool:
    return type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower()


# --------------------------------------------------------------------------- stage

def reconstruct_sam3d(image: ImageInput, settings, seed: int,
                      progress: Optional[ProgressFn] = None) -> Reconstruction:
    """Run SAM 3D Objects on the masked photo and convert its output to Kiln's frame.

    image.rgb (H, W, 3) uint8, image.mask (H, W) bool; ``settings`` is a
    ``ReconstructSettings`` whose ``sam3d_config`` points at pipeline.yaml.
    Errors while loading raise ``Sam3dError``; CUDA errors from the model
    itself propagate unchanged so the worker can classify them (OOM, sticky).
    """
    from pipeline.recon.reconstruct import prepare_image

    report = progress or (lambda f, m: None)
    image, _ = prepare_image(image, settings.max_image_side)
    report(0.0, "loading SAM 3D Objects")
    pipe = load_pipeline(settings.sam3d_config)
    rgba = np.concatenate([image.rgb, image.mask.astype(np.uint8)[..., None] * 255], axis=-1)
    report(0.1, "running SAM 3D Objects")
    outputs = pipe.run(rgba, None, int(seed), **run_kwargs(pipe.run))
    report(0.9, "converting SAM 3D output")
    recon = convert_outputs(outputs, mask=image.mask)
    recon.meta["sam3d_config"] = str(settings.sam3d_config)
    report(1.0, f"{recon.mesh.num_faces} faces, {len(recon.gaussians)} Gaussians")
    return recon


# --------------------------------------------------------------------------- conversion

def _np(x: Any) -> np.ndarray:
    """float64 numpy copy of a tensor / array (any device)."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _raw_gaussians(gs: Any) -> dict:
    """Activated Gaussian parameters in SAM 3D's local frame (float64 numpy)."""
    try:
        means = _np(gs.get_xyz)
        scales = _np(gs.get_scaling)
        quats = _np(gs.get_rotation)
        opac = _np(gs.get_opacity).reshape(-1)
        # the DC band alone: TRELLIS concatenates higher bands after it along dim 2, which
        # reshape(n, -1, 3) would mix into the colour; Kiln's Gaussians are view-independent
        dc_raw = getattr(gs, "_features_dc", None)
        feats = _np(dc_raw if dc_raw is not None else gs.get_features)
    except AttributeError as e:
        raise Sam3dError(f"SAM 3D output 'gs' is not a Gaussian model ({e})") from None
    n = means.shape[0]
    dc = feats.reshape(n, -1)[:, :3] if feats.ndim >= 2 and feats.size >= 3 * n else feats
    if means.shape != (n, 3) or scales.shape != (n, 3) or quats.shape != (n, 4) or opac.shape != (n,):
        raise Sam3dError(f"SAM 3D Gaussians have inconsistent shapes: xyz {means.shape}, scaling "
                         f"{scales.shape}, rotation {quats.shape}, opacity {opac.shape}")
    return {"means": means, "scales": scales, "quats": quats, "opacities": opac,
            "colors": np.clip(0.5 + SH_C0 * dc, 0.0, 1.0),
            "sh_degree": int(getattr(gs, "sh_degree", 0) or 0)}


def _raw_mesh(outputs: dict) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """(vertices (V, 3), faces (F, 3), colours (V, 3) or None) in SAM 3D's local frame."""
    mesh = outputs.get("mesh")
    if isinstance(mesh, (list, tuple)) and mesh:
        m = mesh[0]
        verts = _np(m.vertices)
        faces = _np(m.faces).astype(np.int64)
        attrs = getattr(m, "vertex_attrs", None)
        colors = _np(attrs)[:, :3] if attrs is not None else None
        return verts, faces, colors
    glb = outputs.get("glb")
    if glb is not None and hasattr(glb, "vertices"):
        # to_glb already turned it y-up; undo that so both inputs share one path
        verts = np.asarray(glb.vertices, np.float64) @ ZUP_TO_YUP   # row-vector form of ZUP_TO_YUP^T
        faces = np.asarray(glb.faces, np.int64)
        vc = getattr(getattr(glb, "visual", None), "vertex_colors", None)
        colors = None
        if vc is not None and len(vc) == len(verts):
            colors = np.asarray(vc, np.float64)[:, :3] / 255.0
        return verts, faces, colors
    raise Sam3dError("SAM 3D output has neither 'mesh' nor 'glb'; pipeline.yaml must decode "
                     "the mesh format (decode_formats: [gaussian, mesh])")


def _pose(outputs: dict) -> Optional[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(quat (4,), translation (3,), scale (3,)) of the object in camera space, or None."""
    if not all(k in outputs and outputs[k] is not None for k in ("rotation", "translation", "scale")):
        return None
    q = _np(outputs["rotation"]).reshape(-1)[:4]
    t = _np(outputs["translation"]).reshape(-1)[:3]
    s = _np(outputs["scale"]).reshape(-1)
    s = np.broadcast_to(s if s.size in (1, 3) else s[:3], (3,)).astype(np.float64)
    if q.size != 4 or not np.isfinite(q).all() or np.linalg.norm(q) == 0 or not np.isfinite(t).all() \
            or not np.isfinite(s).all():
        return None
    return q / np.linalg.norm(q), t, s


def _scene_points(outputs: dict, mask: Optional[np.ndarray], limit: int = 20000) -> Optional[np.ndarray]:
    """Camera-space points of the object from the returned pointmap, (P, 3), or None."""
    pm = outputs.get("pointmap")
    if pm is None or mask is None:
        return None
    pm = _np(pm)
    if pm.ndim != 3 or pm.shape[-1] != 3:
        return None
    h, w = pm.shape[:2]
    rows = (np.arange(h) + 0.5) * mask.shape[0] / h
    cols = (np.arange(w) + 0.5) * mask.shape[1] / w
    small = mask[rows.astype(int).clip(0, mask.shape[0] - 1)][:, cols.astype(int).clip(0, mask.shape[1] - 1)]
    pts = pm[small]
    pts = pts[np.isfinite(pts).all(axis=1)]
    if len(pts) < 16:
        return None
    if len(pts) > limit:
        pts = pts[np.random.default_rng(0).choice(len(pts), limit, replace=False)]
    return pts


def _choose_rotation(q: np.ndarray, t: np.ndarray, s: np.ndarray, local_pts: np.ndarray,
                     scene: Optional[np.ndarray]) -> tuple[np.ndarray, str, dict]:
    """Column-form local -> camera rotation for the pose, and which convention was used.

    Default: PyTorch3D's row-vector ``Transform3d`` (R(q)^T in column form). With
    scene points, the transposed reading replaces it only when it fits at least
    twice as well (median distance from scene points to the posed object)."""
    r_row = quat_to_matrix(q).T
    if scene is None:
        return r_row, "pytorch3d-row", {}
    from scipy.spatial import cKDTree

    sample = local_pts
    if len(sample) > 20000:
        sample = sample[np.random.default_rng(1).choice(len(sample), 20000, replace=False)]
    fits = {}
    for name, r in (("pytorch3d-row", r_row), ("column", r_row.T)):
        posed = (sample * s) @ r.T + t
        fits[name] = float(np.median(cKDTree(posed).query(scene)[0]))
    if fits["column"] * 2.0 < fits["pytorch3d-row"]:
        return r_row.T, "column", fits
    return r_row, "pytorch3d-row", fits


def _frame_rotation(outputs: dict, local_means: np.ndarray, mask: Optional[np.ndarray],
                    meta: dict) -> tuple[np.ndarray, np.ndarray]:
    """(3, 3) rotation from SAM 3D's local frame to Kiln's, and the (3,) pose scale
    kept (uniform; ones without a pose). Records the orientation and pose convention
    used in ``meta``."""
    pose = _pose(outputs)
    if pose is None:
        meta["orientation"] = "sam3d canonical (no pose returned)"
        return ZUP_TO_YUP, np.ones(3)
    q, t, s = pose
    scene = _scene_points(outputs, mask)
    r_pose, convention, fits = _choose_rotation(q, t, s, local_means, scene)
    meta.update(orientation="photo camera", pose_convention=convention,
                pose={"rotation_wxyz": q.tolist(), "translation": t.tolist(), "scale": s.tolist()})
    if fits:
        meta["pose_fit_median"] = fits
    if not np.allclose(s, s.mean(), rtol=1e-3):
        # an anisotropic scale would shear the Gaussians; its mean keeps proportions close
        meta["pose_scale_made_uniform"] = True
    return CAM_TO_KILN @ r_pose, np.full(3, s.mean())


def convert_outputs(outputs: dict, mask: Optional[np.ndarray] = None) -> Reconstruction:
    """SAM 3D's ``run`` output dict -> Kiln ``Reconstruction`` (frame: module docstring).

    mask: (H, W) bool, the object mask given to SAM 3D; used to check the pose
    convention against the returned pointmap and to state the source camera in
    that image's pixels (``source_camera_from_outputs``; None without pose or pointmap).
    Mesh: float32 vertices in [-0.5, 0.5]^3 (longest side 1), int32 faces wound
    counter-clockwise from outside (by signed volume), float32 vertex colours.
    Gaussians: same transform; scales multiplied by the same factor, rotations
    composed with the frame rotation, nearly invisible ones (opacity < 1/255) dropped.
    """
    if not isinstance(outputs, dict):
        raise Sam3dError(f"SAM 3D returned {type(outputs).__name__}, expected a dict")
    gs = outputs.get("gs")
    if gs is None:
        g_list = outputs.get("gaussian")
        gs = g_list[0] if isinstance(g_list, (list, tuple)) and g_list else None
    if gs is None:
        raise Sam3dError("SAM 3D output has no Gaussians ('gs' / 'gaussian'); pipeline.yaml must "
                         "decode the gaussian format (decode_formats: [gaussian, mesh])")
    g = _raw_gaussians(gs)
    verts, faces, vcolors = _raw_mesh(outputs)
    if len(verts) == 0 or len(faces) == 0:
        raise Sam3dError("SAM 3D produced an empty mesh (nothing was reconstructed); try a tighter mask")
    if faces.min() < 0 or faces.max() >= len(verts):
        raise Sam3dError("SAM 3D mesh faces index vertices that do not exist")
    for name, arr in (("mesh vertices", verts), ("Gaussian means", g["means"]),
                      ("Gaussian scales", g["scales"]), ("Gaussian rotations", g["quats"])):
        if not np.isfinite(arr).all():
            raise Sam3dError(f"SAM 3D output has non-finite {name}")

    meta: dict = {"backend": "sam3d", "gaussians_from_model": int(len(g["means"]))}
    rot, scale_vec = _frame_rotation(outputs, g["means"], mask, meta)
    # uniform part of the pose scale cancels in the normalisation below
    verts_k = verts @ rot.T
    means_k = g["means"] @ rot.T
    lo, hi = verts_k.min(axis=0), verts_k.max(axis=0)
    center = (lo + hi) / 2.0
    extent = float((hi - lo).max())
    if not extent > 0:
        raise Sam3dError("SAM 3D mesh has zero size")
    k = (1.0 - 1e-5) / extent     # strictly inside the unit cube despite float32 rounding
    verts_k = (verts_k - center) * k
    means_k = (means_k - center) * k
    scales_k = g["scales"] * k
    q_rot = matrix_to_quat(rot)
    quats_k = quat_mul(np.broadcast_to(q_rot, g["quats"].shape), g["quats"])
    quats_k /= np.linalg.norm(quats_k, axis=1, keepdims=True)
    meta["normalisation"] = {"center": center.tolist(), "scale": k,
                             "pose_scale": scale_vec.tolist()}
    if g["sh_degree"] > 0:
        meta["sh_bands_dropped"] = g["sh_degree"]   # view-dependent colour is not kept
    source, why = source_camera_from_outputs(outputs, mask, center, k)
    meta["source_camera"] = why

    faces = faces.astype(np.int32)
    if signed_volume(verts_k, faces) < 0:
        faces = faces[:, [0, 2, 1]]
        meta["faces_flipped"] = True
    if vcolors is None or vcolors.shape != verts.shape:
        vcolors = _colours_from_gaussians(verts_k, means_k, g["colors"])
        meta["vertex_colours"] = "from nearest Gaussians"
    keep = g["opacities"] >= MIN_OPACITY
    if not keep.any():
        raise Sam3dError("all SAM 3D Gaussians are transparent (opacity < 1/255)")
    meta["gaussians_dropped_transparent"] = int((~keep).sum())

    mesh = Mesh(vertices=verts_k.astype(np.float32), faces=np.ascontiguousarray(faces),
                vertex_colors=np.clip(vcolors, 0.0, 1.0).astype(np.float32))
    gaussians = Gaussians(
        means=means_k[keep].astype(np.float32),
        scales=np.maximum(scales_k[keep], 1e-8).astype(np.float32),
        quats=quats_k[keep].astype(np.float32),
        opacities=np.clip(g["opacities"][keep], MIN_OPACITY, 1.0).astype(np.float32),
        colors=g["colors"][keep].astype(np.float32),
    )
    try:
        mesh.validate("sam3d mesh")
        gaussians.validate("sam3d gaussians")
    except StageInputError as e:
        raise Sam3dError(f"SAM 3D output could not be converted: {e}") from None
    return Reconstruction(mesh=mesh, gaussians=gaussians, meta=meta, source_camera=source)


# --------------------------------------------------------------------------- source camera

def _pointmap_pixel_centres(pm_shape: tuple, image_shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Column and row (image pixels) of each pointmap cell's centre: (w,), (h,).

    SAM 3D shrinks the pointmap with ``interpolate(scale_factor=f)``, whose output
    cell i samples input coordinate (i + 0.5) / f; when the sizes match one of its
    factors that is used, else each axis's own ratio."""
    (h, w), (H, W) = pm_shape, image_shape
    fy, fx = h / H, w / W
    for f in POINTMAP_SHRINK:
        if int(np.floor(H * f)) == h and int(np.floor(W * f)) == w:
            fy = fx = f
            break
    return (np.arange(w) + 0.5) / fx, (np.arange(h) + 0.5) / fy


def fit_intrinsics(pointmap: np.ndarray, image_shape: tuple) -> tuple[np.ndarray, dict]:
    """Pinhole K (3, 3) in pixels of the image SAM 3D saw, fitted to its pointmap.

    pointmap: (h, w, 3) camera-space points in PyTorch3D axes; image_shape: (H, W).
    Least squares col = fx * (-x/z) + cx and row = fy * (-y/z) + cy over every finite
    point in front of the camera, refitted once without points off by more than
    max(1 px, 4 x the median residual). Raises ValueError when the fit is not possible."""
    pm = np.asarray(pointmap, np.float64)
    cols, rows = _pointmap_pixel_centres(pm.shape[:2], image_shape)
    cc, rr = np.meshgrid(cols, rows)
    z = pm[..., 2]
    ok = np.isfinite(pm).all(axis=-1) & (z > 1e-9)
    if ok.sum() < MIN_FIT_PIXELS:
        raise ValueError(f"only {int(ok.sum())} pointmap pixels are finite and in front of the camera")
    u, v = -pm[..., 0][ok] / z[ok], -pm[..., 1][ok] / z[ok]
    col, row = cc[ok], rr[ok]
    keep = np.ones(len(u), bool)
    for _ in range(2):
        a_x = np.stack([u[keep], np.ones(keep.sum())], axis=1)
        a_y = np.stack([v[keep], np.ones(keep.sum())], axis=1)
        (fx, cx), *_ = np.linalg.lstsq(a_x, col[keep], rcond=None)
        (fy, cy), *_ = np.linalg.lstsq(a_y, row[keep], rcond=None)
        res = np.hypot(fx * u + cx - col, fy * v + cy - row)
        keep = res <= max(1.0, 4.0 * float(np.median(res)))
        if keep.sum() < MIN_FIT_PIXELS:
            raise ValueError("the pointmap is not consistent with a pinhole camera")
    if not (fx > 0 and fy > 0 and np.isfinite([fx, fy, cx, cy]).all()):
        raise ValueError(f"fitted focal lengths are not positive ({fx:.4g}, {fy:.4g})")
    K = np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])
    return K, {"fx": float(fx), "fy": float(fy), "cx": float(cx), "cy": float(cy),
               "rms_px": float(np.sqrt(np.mean(res[keep] ** 2))), "pixels": int(keep.sum()),
               "outliers": int((~keep).sum())}


def source_camera_from_outputs(outputs: dict, mask: Optional[np.ndarray], center: np.ndarray,
                               k: float) -> tuple[Optional[SourceCamera], dict]:
    """The photo's camera in Kiln's normalised frame (module docstring), stated in
    pixels of the image SAM 3D saw (``mask``'s shape), and a dict saying how it was
    derived or why there is none. center, k: ``convert_outputs``' normalisation."""
    pose = _pose(outputs)
    if pose is None:
        return None, {"derived": False, "why": "SAM 3D returned no object pose"}
    if mask is None or outputs.get("pointmap") is None:
        return None, {"derived": False, "why": "SAM 3D returned no pointmap, so no intrinsics"}
    pm = _np(outputs["pointmap"])
    if pm.ndim != 3 or pm.shape[-1] != 3:
        return None, {"derived": False, "why": f"pointmap has shape {pm.shape}, not (h, w, 3)"}
    try:
        K, fit = fit_intrinsics(pm, mask.shape)
    except ValueError as e:
        return None, {"derived": False, "why": f"intrinsics could not be fitted: {e}"}
    _, t, s = pose
    s_mean = float(np.mean(s))
    if not s_mean > 0:
        return None, {"derived": False, "why": f"pose scale {s_mean:.4g} is not positive"}
    dc = P3D_TO_OPENCV @ CAM_TO_KILN
    viewmat = np.eye(4)
    viewmat[:3, :3] = dc
    viewmat[:3, 3] = k * dc @ center + (k / s_mean) * (P3D_TO_OPENCV @ t)
    h, w = mask.shape
    cam = SourceCamera(viewmat=viewmat.astype(np.float32), K=K.astype(np.float32),
                       width=int(w), height=int(h), projection="perspective")
    depth = viewmat[2, 3]     # camera z of the normalised object's centre
    if not depth > 0.5:
        return None, {"derived": False, "why": f"the posed object is not in front of the camera "
                      f"(centre depth {depth:.3g} normalised units)", "intrinsics_fit": fit}
    return cam, {"derived": True, "intrinsics": "least squares on the pointmap",
                 "extrinsics": "object pose + Kiln's frame change and normalisation",
                 "intrinsics_fit": fit}


def _colours_from_gaussians(verts: np.ndarray, means: np.ndarray, colors: np.ndarray) -> np.ndarray:
    from scipy.spatial import cKDTree

    _, idx = cKDTree(means).query(verts)
    return colors[idx]


def register() -> None:
    """Make ``reconstruct.backend: sam3d`` dispatch here (pipeline/recon/reconstruct.py
    imports this module on first use of the backend, as it does ``pipeline/recon/builtin.py``)."""
    from pipeline.recon.reconstruct import register_backend

    register_backend("sam3d", reconstruct_sam3d)


register()
