"""``kiln doctor``'s checks of what a worker runs: the answers of the worker's own start-up
probes (torch.cuda, moderngl/EGL, gsplat, nvdiffrast; run by ``worker.checks.proberun``, handed in
here), ``worker.device``, the models (SAM2 checkpoints, SAM 3D) and the interpreter workers
run under (``worker.python``). Each problem comes with the command or setting that fixes it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Optional
from pathlib import Path

from kiln.checkpoints import find_checkpoints, resolve_checkpoint

from worker.checks.doctorcheck import Check
from worker.checks.proberun import ProbeOutcome



# --------------------------------------------------------------------------- helpers

def _tail(err: str, n: int = 300) -> str:
    err = (err or "").strip()
    if not err:
        return ""
    last = err.splitlines()[-1]
    return ": " + (last if len(last) <= n else last[:n] + "...")


# --------------------------------------------------------------------------- checks

def check_torch_cuda(probe: ProbeOutcome) -> Check:
    """What the worker's CUDA probe found: devices, and one kernel's result."""
    devices = probe.info.get("devices", [])
    if probe.ok:
        names = ", ".join(f"{d['name']} (sm {d['capability']})" for d in devices)
        return Check("torch.cuda", "ok", f"{len(devices)} device(s): {names}",
                     data={"cuda": True, "devices": devices})
    if probe.broke:
        return Check("torch.cuda", "warn", f"CUDA check in a subprocess failed: {probe.reason}",
                     data={"cuda": False})
    if devices:   # visible, yet the kernel's answer was wrong
        return Check("torch.cuda", "fail", probe.reason, data={"cuda": False, "devices": devices})
    return Check("torch.cuda", "info", f"not available ({probe.reason})", data={"cuda": False})


def check_moderngl(quick: bool, needed: bool, probe: Optional[ProbeOutcome] = None) -> Check:
    """moderngl on EGL; beyond --quick, the worker's probe rasterizes two triangles with it."""
    import ctypes.util
    import importlib.util

    bad = "fail" if needed else "warn"
    if importlib.util.find_spec("moderngl") is None:
        return Check("moderngl/EGL", bad, "moderngl is not installed",
                     fix=[f"{sys.executable} -m pip install moderngl"])
    debs = "sudo apt-get install -y libegl1 libgl1-mesa-dri libegl-mesa0"
    if quick or probe is None:
        if ctypes.util.find_library("EGL") is None:
            return Check("moderngl/EGL", bad, "libEGL not found", fix=[debs])
        return Check("moderngl/EGL", "ok", "moderngl and libEGL present (not rendered: --quick)")
    if probe.ok:
        gl = probe.info
        on = f"{gl['renderer']} (GL {gl.get('version')})" if gl.get("renderer") else "EGL"
        return Check("moderngl/EGL", "ok", f"the worker's rasterizer drew its test triangles on {on}",
                     data=gl)
    if probe.broke:
        return Check("moderngl/EGL", bad, f"EGL context / test rasterization failed: {probe.reason}",
                     fix=[debs])
    return Check("moderngl/EGL", bad, f"the test rasterization came out wrong: {probe.reason}", fix=[debs])


def check_cuda_backend(name: str, package: str, install: str, fallback: str, quick: bool,
                       cuda_ok: bool, needed: bool, probe: Optional[ProbeOutcome]) -> Check:
    """gsplat / nvdiffrast: the worker's probe imported, JIT-built and ran it on CUDA."""
    import importlib.util

    bad = "fail" if needed else "warn"
    if importlib.util.find_spec(package) is None:
        st = bad if needed else "info"
        return Check(name, st, f"not installed; {fallback} is used instead", fix=[install] if needed else [])
    if not cuda_ok:
        return Check(name, bad if needed else "info", "not available: no CUDA",
                     fix=[f"use {fallback}"] if needed else [])
    if quick or probe is None:
        return Check(name, "info", "installed; not built or rendered (--quick)")
    if probe.broke:
        extra = (" (a first JIT build can take minutes: rerun with --timeout 900)"
                 if "timed out" in probe.reason else "")
        return Check(name, bad, f"build / one-primitive render failed: {probe.reason}{extra}",
                     fix=["fix the nvcc / CUDA_HOME items above, then rerun kiln doctor", f"or use {fallback}"])
    if not probe.info.get("installed", True):   # worker.python: another env than this one
        return Check(name, bad if needed else "info", f"not installed in the worker's interpreter: "
                     f"{probe.reason}; {fallback} is used instead", fix=[install] if needed else [])
    if not probe.ok:
        return Check(name, bad, f"rendered one primitive wrongly: {probe.reason}", fix=[f"use {fallback}"])
    return Check(name, "ok", "built and rendered one primitive on CUDA", data=probe.info)


def check_device(settings, cuda_ok: bool, gpus: list) -> Check:
    dev = settings.worker.device
    if dev == "cuda" and not cuda_ok:
        why = "no GPU found" if not gpus else "torch cannot use the GPU"
        return Check("worker.device", "fail", f"worker.device is 'cuda' but {why}",
                     fix=["--set worker.device=auto  (or worker.device: auto in your settings YAML)"])
    if dev == "cpu":
        return Check("worker.device", "ok", "cpu (GPU backends off)")
    return Check("worker.device", "ok", f"{dev}: jobs run on " + ("CUDA" if cuda_ok else "the CPU"))


def check_sam2(settings, folder: str) -> Check:
    import importlib.util

    found = find_checkpoints(folder)
    chosen = resolve_checkpoint(settings.app, folder=folder)
    data = {"found": [c.to_dict() for c in found], "chosen": chosen.to_dict() if chosen else None}
    listed = ", ".join(c.path.name + ("" if c.config else " (unknown model)") for c in found) or "none"
    if importlib.util.find_spec("sam2") is None:
        return Check("sam2", "warn", f"the sam2 package is not installed; segmentation uses GrabCut "
                     f"(checkpoints in {folder}/: {listed})",
                     fix=[f"SAM2_BUILD_CUDA=0 {sys.executable} -m pip install --no-build-isolation sam2==1.1.0"],
                     data=data)
    if chosen is None:
        return Check("sam2", "info", f"no checkpoint in {folder}/ and app.sam2_checkpoint unset; "
                     "segmentation uses GrabCut",
                     fix=[f"kiln models fetch tiny --dest {folder}   (its size and sha256 checked; docs/models.md)"],
                     data=data)
    if not chosen.exists:
        return Check("sam2", "warn", f"app.sam2_checkpoint {chosen.path} does not exist; segmentation "
                     "falls back to GrabCut", fix=["fix app.sam2_checkpoint, or empty it to use "
                                                   f"checkpoints found in {folder}/"], data=data)
    if not chosen.config:
        return Check("sam2", "warn", f"{chosen.path.name}: cannot tell the model from the name",
                     fix=["set app.sam2_config, e.g. configs/sam2.1/sam2.1_hiera_t.yaml"], data=data)
    return Check("sam2", "ok", f"using {chosen.label} with {chosen.config} ({chosen.source}); "
                 f"found: {listed} (loaded on first use; not loaded here)", data=data)


def check_rembg(settings, folder: str) -> Check:
    """--mask auto's optional rembg method: its model file in the models folder, and rembg
    with onnxruntime to run it (``app.segment.rembg_auto``; nothing is loaded here)."""
    import importlib.util

    from kiln.models import rembg_model_path

    path = rembg_model_path(Path(folder))
    forced = settings.app.auto_mask == "rembg"
    missing = [m for m in ("rembg", "onnxruntime") if importlib.util.find_spec(m) is None]
    data = {"model": str(path), "present": path.is_file(), "missing_packages": missing}
    if not path.is_file():
        return Check("rembg", "warn" if forced else "info",
                     f"no rembg model at {path}; --mask auto uses " + ("nothing (app.auto_mask is rembg)" if forced
                                                                       else "SAM 2 or the border model"),
                     fix=[f"kiln models fetch rembg --dest {folder}   (optional; and {INSTALL_REMBG})"], data=data)
    if missing:
        return Check("rembg", "warn", f"{path.name} is there but {' and '.join(missing)} "
                     f"{'is' if len(missing) == 1 else 'are'} not installed; --mask auto goes without rembg",
                     fix=[INSTALL_REMBG], data=data)
    return Check("rembg", "ok", f"{path.name} with rembg on onnxruntime's CPU provider for --mask auto "
                 "(loaded on first use; not loaded here)", data=data)


INSTALL_REMBG = f"{sys.executable} -m pip install 'kiln3d[rembg]'"


# import name -> pip requirement, for what a worker imports (Kiln's dependencies minus the UI)
WORKER_PACKAGES = {
    "numpy": "numpy>=1.26", "scipy": "scipy>=1.11", "PIL": "pillow>=10", "yaml": "pyyaml>=6",
    "trimesh": "trimesh>=4.4", "pyfqmr": "pyfqmr>=0.2", "xatlas": "xatlas>=0.0.9",
    "moderngl": "moderngl>=5.10", "cv2": "opencv-python-headless>=4.8", "skimage": "scikit-image>=0.22",
    "embreex": "embreex>=2.17", "plyfile": "plyfile>=1.0", "psutil": "psutil>=5.9",
    "networkx": "networkx>=3", "rtree": "rtree>=1.0", "torch": "torch>=2.4",
}
WORKER_PYTHON_SNIPPET = r"""
import json, sys, importlib.util
names = json.loads(sys.argv[1])
out = {"version": "%d.%d.%d" % sys.version_info[:3], "prefix": sys.prefix,
       "missing": [n for n in names if importlib.util.find_spec(n) is None]}
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = bool(torch.cuda.is_available())
    out["devices"] = torch.cuda.device_count() if out["cuda_available"] else 0
except Exception as e:
    out["torch_error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
"""


def check_worker_python(settings, quick: bool = False, timeout: float = 120.0) -> Check:
    """``worker.python``: the interpreter workers run under (the app stays in this one).
    Runs it once: Python version, torch and its CUDA, the packages a worker imports."""
    python = settings.worker.python
    if not python:
        return Check("worker.python", "info", f"not set: workers run under {sys.executable}")
    from worker.child.interpreter import MIN_VERSION, InterpreterError, resolve

    try:
        exe = resolve(python)
    except InterpreterError as e:
        return Check("worker.python", "fail", str(e), fix=["kiln doctor --set worker.python=/path/to/env/bin/python"])
    assert exe is not None   # resolve answers None only for an empty setting
    need = dict(WORKER_PACKAGES)
    if settings.bake.enabled and settings.views.backend in ("gsplat", "auto"):
        need["gsplat"] = "gsplat==1.5.3"
    if settings.reconstruct.backend == "sam3d":
        need.update({"sam3d_objects": "sam3d_objects (facebookresearch/sam-3d-objects: pip install -e .[inference])",
                     "hydra": "hydra-core", "omegaconf": "omegaconf"})
    err = ""
    try:
        res = subprocess.run([exe, "-c", WORKER_PYTHON_SNIPPET, json.dumps(sorted(need))],
                             capture_output=True, text=True, timeout=timeout, cwd="/")
        err = res.stderr
        info = json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("{")][-1])
    except subprocess.TimeoutExpired:
        return Check("worker.python", "fail", f"{exe} did not answer within {timeout:g} s")
    except (OSError, ValueError, IndexError) as e:
        return Check("worker.python", "fail", f"{exe} could not be run ({type(e).__name__})" + _tail(err))
    data = {"python": exe, **info}
    problems, fix = [], []
    if tuple(int(x) for x in info["version"].split(".")[:2]) < MIN_VERSION:
        problems.append(f"Python {info['version']} is older than {'.'.join(map(str, MIN_VERSION))}")
    missing = [m for m in info["missing"] if m != "sam3d_objects"]
    if missing:
        problems.append("missing " + ", ".join(missing))
        fix.append(f"{exe} -m pip install " + " ".join(f"'{need[m]}'" for m in missing))
    if "sam3d_objects" in info["missing"]:
        problems.append("sam3d_objects is not installed")
        fix.append("install facebookresearch/sam-3d-objects into that env as its doc/setup.md says "
                   "(see docs/models.md)")
    if settings.worker.device == "cuda" and not info.get("cuda_available"):
        problems.append("worker.device is cuda but torch there sees no CUDA device")
    torch_s = (f"torch {info['torch']} (CUDA {info.get('torch_cuda') or 'none'}, "
               f"{info.get('devices', 0)} device(s) visible)") if "torch" in info else \
        f"torch: {info.get('torch_error', 'not importable')}"
    detail = f"{exe}: Python {info['version']}, {torch_s}"
    if problems:
        return Check("worker.python", "fail", detail + "; " + "; ".join(problems), fix=fix, data=data)
    return Check("worker.python", "ok", detail + f"; all {len(need)} packages a worker imports are installed",
                 data=data)


def check_sam3d(settings, gpus: list) -> Check:
    import importlib.util

    needed = settings.reconstruct.backend == "sam3d"
    cfg = settings.reconstruct.sam3d_config
    if not needed and not cfg:
        return Check("sam3d", "info", "not configured (reconstruct.backend builtin)")
    bad = "fail" if needed else "warn"
    from pipeline.recon.sam3d import config_problem, min_gpu_memory_gib

    path, problem = config_problem(cfg)
    if path is None:
        return Check("sam3d", bad, problem, fix=["see docs/models.md, or --set reconstruct.backend=builtin"])
    if importlib.util.find_spec("sam3d_objects") is None:
        return Check("sam3d", bad, f"{path} found but the sam3d_objects package is not installed",
                     fix=["install facebookresearch/sam-3d-objects per its doc/setup.md "
                          "(pip install -e '.[inference]')", "or --set reconstruct.backend=builtin"])
    best = max((g["memory_free_mib"] / 1024 for g in gpus), default=0.0)
    if best < min_gpu_memory_gib():
        what = f"the best GPU has {best:.0f} GiB free" if gpus else "no GPU found"
        return Check("sam3d", bad, f"needs a GPU with {min_gpu_memory_gib():g} GiB free; {what}",
                     fix=["--set reconstruct.backend=builtin"])
    return Check("sam3d", "ok", f"{path}; package installed; {best:.0f} GiB GPU memory free "
                 "(model not loaded here: the worker probes it at start-up)")
