"""``kiln doctor``: what this machine can run, what is broken, and the command that fixes it.

The old tool's crashes came from the environment, not the code: an ``nvcc`` 9.1
first on PATH JIT-compiling nvdiffrast for a CUDA 11.8 torch, stale extension
build locks, tiny ``/dev/shm`` in containers. The doctor checks those and tries
each render backend on one triangle.

It never initialises CUDA in its own process (it may be run next to a server):
GPUs come from ``nvidia-smi``, and what touches CUDA or GL is the worker's own
start-up probes (``worker.probe``: CUDA, moderngl, gsplat, nvdiffrast), run by
``worker.proberun`` in a child under the interpreter workers use, in the
environment a worker would get (``worker.env.prepare``: matching CUDA_HOME/PATH,
project-local TORCH_EXTENSIONS_DIR), each with a time limit, so a crash or a hang
there is reported, not suffered.

Exit code: 0 when everything the configured pipeline needs works (warnings
allowed), 1 when something it needs is broken, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from kiln import settings as settings_mod
from kiln.checkpoints import DEFAULT_FOLDER, find_checkpoints, resolve_checkpoint

from .proberun import ProbeOutcome, run_probes

GIB = 1024 ** 3
SHM_MIN_BYTES = 1 * GIB
STALE_LOCK_S = 15 * 60          # a JIT build holds its lock for minutes at most
SAM2_URL = "https://dl.fbaipublicfiles.com/segment_anything_2/092824/sam2.1_hiera_tiny.pt"
STATUSES = ("ok", "info", "warn", "fail")


@dataclass
class Check:
    """One line of the report. status: ok | info | warn | fail (fail = the
    configured pipeline cannot run). fix: shell commands or settings that fix it."""

    name: str
    status: str
    detail: str
    fix: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- helpers

def _run(cmd: list[str], timeout: float = 15.0, env: Optional[Mapping] = None) -> Optional[str]:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env=dict(env) if env is not None else None)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def _tail(err: str, n: int = 300) -> str:
    err = (err or "").strip()
    if not err:
        return ""
    last = err.splitlines()[-1]
    return ": " + (last if len(last) <= n else last[:n] + "...")


def _major_minor(v: Optional[str]) -> Optional[str]:
    if not v:
        return None
    m = re.match(r"(\d+)\.(\d+)", v)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def _export_line(home: str) -> str:
    return f"export CUDA_HOME={home} PATH={home}/bin:$PATH"


# --------------------------------------------------------------------------- checks

def check_python() -> Check:
    return Check("python", "ok", f"{platform.python_version()} ({sys.executable})",
                 data={"version": platform.python_version(), "executable": sys.executable})


def check_torch(import_torch: bool) -> Check:
    """torch version and the CUDA it was built for. Importing torch does not initialise CUDA."""
    if import_torch:
        try:
            import torch
        except Exception as e:  # noqa: BLE001 - a broken install raises all sorts
            return Check("torch", "fail", f"cannot import torch: {type(e).__name__}: {e}",
                         fix=[f"{sys.executable} -m pip install torch==2.14.1 torchvision==0.29.1"])
        version, cuda = torch.__version__, torch.version.cuda
    else:
        from importlib import metadata

        from worker.env import torch_cuda_version

        try:
            version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            return Check("torch", "fail", "torch is not installed",
                         fix=[f"{sys.executable} -m pip install torch==2.14.1 torchvision==0.29.1"])
        cuda = torch_cuda_version()
    detail = f"{version}, " + (f"built for CUDA {cuda}" if cuda else "CPU-only build")
    return Check("torch", "ok", detail, data={"version": version, "cuda": cuda})


def list_gpus(env: Mapping) -> tuple[list[dict], str]:
    """GPUs from nvidia-smi (name, memory in MiB, driver), without touching CUDA."""
    out = _run(["nvidia-smi", "--query-gpu=index,name,memory.total,memory.free,driver_version",
                "--format=csv,noheader,nounits"], env=env)
    if out is None:
        if shutil.which("nvidia-smi", path=env.get("PATH")) is None:
            return [], "nvidia-smi not found"
        return [], "nvidia-smi failed (driver not loaded?)"
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5:
            try:
                gpus.append({"index": int(parts[0]), "name": parts[1], "memory_total_mib": float(parts[2]),
                             "memory_free_mib": float(parts[3]), "driver": parts[4]})
            except ValueError:
                continue
    return gpus, "nvidia-smi"


def check_gpus(env: Mapping) -> Check:
    gpus, source = list_gpus(env)
    if not gpus:
        return Check("gpus", "info", f"none ({source})", data={"gpus": []})
    desc = "; ".join(f"{g['index']}: {g['name']}, {g['memory_free_mib'] / 1024:.0f}/"
                     f"{g['memory_total_mib'] / 1024:.0f} GiB free, driver {g['driver']}" for g in gpus)
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        desc += f" (CUDA_VISIBLE_DEVICES={vis!r})"
    return Check("gpus", "ok", desc, data={"gpus": gpus})


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


def check_nvcc(torch_cuda: Optional[str], env: Mapping, needed: bool = False) -> Check:
    """The nvcc first on PATH against torch.version.cuda.

    A mismatch is what made the old tool segfault: JIT builds (gsplat, nvdiffrast)
    use the first nvcc on PATH / CUDA_HOME. Kiln's workers pick a matching
    toolkit themselves when one is installed; shells and other tools do not.
    """
    from worker.env import find_toolkit, toolkit_candidates, toolkit_version

    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    want = _major_minor(torch_cuda)
    have = toolkit_version(Path(nvcc).resolve().parent.parent) if nvcc else None
    if have is None and nvcc:
        out = _run([nvcc, "--version"], env=env) or ""
        m = re.search(r"release (\d+)\.(\d+)", out)
        have = f"{m.group(1)}.{m.group(2)}" if m else None
    data = {"nvcc": nvcc, "nvcc_version": have, "torch_cuda": want}
    if want is None:
        detail = f"{nvcc} (CUDA {have})" if nvcc else "not found"
        return Check("nvcc", "info", detail + "; torch is a CPU build, nothing is JIT-compiled for CUDA",
                     data=data)
    match, others = find_toolkit(want, toolkit_candidates(dict(env)))
    data["matching_toolkit"] = str(match) if match else None
    home = str(match) if match else f"/usr/local/cuda-{want}"
    fix = [_export_line(home)]
    if match is None:
        fix.insert(0, f"install the CUDA {want} toolkit (e.g. apt-get install cuda-toolkit-"
                      f"{want.replace('.', '-')}) so that {home}/bin/nvcc exists")
    status_bad = "fail" if needed else "warn"
    if nvcc is None:
        detail = "no nvcc on PATH"
        if match:
            return Check("nvcc", "info", f"{detail}; workers will use CUDA {want} at {match}", data=data)
        return Check("nvcc", status_bad, f"{detail} and no CUDA {want} toolkit found; gsplat/nvdiffrast "
                     "cannot be JIT-compiled", fix=fix, data=data)
    if have != want:
        worker = (f"Kiln's workers switch to CUDA {want} at {match}, but this shell and other tools "
                  "would build with the wrong one" if match else
                  f"no CUDA {want} toolkit is installed, so JIT builds will fail or crash")
        return Check("nvcc", status_bad if match is None else "warn",
                     f"{nvcc} is CUDA {have} but torch is built for CUDA {want}: mismatch; {worker}",
                     fix=fix, data=data)
    return Check("nvcc", "ok", f"{nvcc} is CUDA {have}, matching torch", data=data)


def check_cuda_home(torch_cuda: Optional[str], env: Mapping) -> Check:
    from worker.env import toolkit_version

    home = env.get("CUDA_HOME")
    want = _major_minor(torch_cuda)
    if not home:
        return Check("CUDA_HOME", "info", "not set" + ("; workers set it to a matching toolkit" if want else ""))
    ver = toolkit_version(Path(home))
    if ver is None:
        return Check("CUDA_HOME", "warn", f"{home} has no bin/nvcc", fix=["unset CUDA_HOME"],
                     data={"path": home})
    if want and ver != want:
        return Check("CUDA_HOME", "warn", f"{home} is CUDA {ver} but torch is built for CUDA {want}",
                     fix=[_export_line(f"/usr/local/cuda-{want}")], data={"path": home, "version": ver})
    return Check("CUDA_HOME", "ok", f"{home} (CUDA {ver})", data={"path": home, "version": ver})


def worker_extensions_dir(settings, cwd: Path) -> Path:
    """Where Kiln's workers build extensions: <parent of app.jobs_dir>/torch_extensions
    (var/torch_extensions by default), unless TORCH_EXTENSIONS_DIR is set."""
    return (cwd / settings.app.jobs_dir).parent / "torch_extensions"


def extension_dirs(env: Mapping, cwd: Path, extra: Optional[Path] = None) -> list[Path]:
    """torch's JIT build caches: $TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions, and
    the project-local var/torch_extensions that Kiln's workers use."""
    dirs = []
    if env.get("TORCH_EXTENSIONS_DIR"):
        dirs.append(Path(env["TORCH_EXTENSIONS_DIR"]))
    else:
        xdg = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", str(Path.home()))) / ".cache")
        dirs.append(Path(xdg) / "torch_extensions")
    if extra is not None:
        dirs.append(extra)
    dirs.append(cwd / "var" / "torch_extensions")
    dirs.append(settings_mod.REPO_ROOT / "var" / "torch_extensions")
    out, seen = [], set()
    for d in dirs:
        key = str(d.resolve()) if d.exists() else str(d)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def find_locks(root: Path, max_depth: int = 4) -> list[Path]:
    out = []
    if not root.is_dir():
        return out
    base = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root):
        if len(Path(dirpath).parts) - base >= max_depth:
            dirnames[:] = []
        if "lock" in filenames:
            out.append(Path(dirpath) / "lock")
    return sorted(out)


def check_extension_cache(env: Mapping, cwd: Path, needed: bool = False,
                          stale_after_s: float = STALE_LOCK_S, extra: Optional[Path] = None) -> Check:
    """Lock files left by interrupted JIT builds make every later build wait forever."""
    dirs = extension_dirs(env, cwd, extra)
    now = time.time()
    stale, fresh = [], []
    for d in dirs:
        for lock in find_locks(d):
            age = now - lock.stat().st_mtime
            (stale if age > stale_after_s else fresh).append((lock, age))
    listed = ", ".join(f"{d}{'' if d.is_dir() else ' (absent)'}" for d in dirs)
    data = {"dirs": [str(d) for d in dirs], "stale_locks": [str(p) for p, _ in stale],
            "recent_locks": [str(p) for p, _ in fresh]}
    if stale:
        what = "; ".join(f"{p} ({age / 60:.0f} min old)" for p, age in stale)
        return Check("extension cache", "fail" if needed else "warn",
                     f"stale build lock(s): {what}; the next JIT build would wait on them forever",
                     fix=[f"rm -f {p}" for p, _ in stale], data=data)
    if fresh:
        what = ", ".join(str(p) for p, _ in fresh)
        return Check("extension cache", "info", f"{listed}; build lock(s) younger than "
                     f"{stale_after_s / 60:.0f} min (a build may be running): {what}", data=data)
    return Check("extension cache", "ok", f"{listed}; no build locks", data=data)


def check_shm(path: str = "/dev/shm", min_bytes: int = SHM_MIN_BYTES) -> Check:
    try:
        st = os.statvfs(path)
    except OSError as e:
        return Check("/dev/shm", "warn", f"cannot stat {path}: {e.strerror}",
                     fix=["docker run --shm-size=8g ... (or mount a tmpfs on /dev/shm)"])
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    detail = f"{size / GIB:.1f} GiB ({free / GIB:.1f} GiB free)"
    data = {"bytes": size, "free_bytes": free}
    if size < min_bytes:
        return Check("/dev/shm", "warn", f"only {detail}: worker processes and torch share memory "
                     f"there; under {min_bytes / GIB:.0f} GiB they fail with bus errors",
                     fix=["docker run --shm-size=8g ...  (or: sudo mount -o remount,size=8G /dev/shm)"],
                     data=data)
    return Check("/dev/shm", "ok", detail, data=data)


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
                     fix=[f"mkdir -p {folder} && curl -L -o {folder}/sam2.1_hiera_tiny.pt {SAM2_URL}"],
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
    from worker.interpreter import MIN_VERSION, InterpreterError, resolve

    try:
        exe = resolve(python)
    except InterpreterError as e:
        return Check("worker.python", "fail", str(e), fix=["kiln doctor --set worker.python=/path/to/env/bin/python"])
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
    from pipeline.sam3d import config_problem, min_gpu_memory_gib

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


# --------------------------------------------------------------------------- driver

# the worker probes whose answers the report shows (the CPU renderer and SAM 3D's model load
# are left to the worker's own start-up)
DOCTOR_PROBES = ("cuda", "moderngl", "gsplat", "nvdiffrast")


def worker_interpreter(settings) -> str:
    """The interpreter a worker runs under: ``worker.python``, or this one (also when
    ``worker.python`` is unusable: its own check says why)."""
    from .interpreter import InterpreterError, resolve

    try:
        return resolve(settings.worker.python) or sys.executable
    except InterpreterError:
        return sys.executable


def needs(settings) -> dict:
    """What the configured pipeline cannot run without."""
    bake = settings.bake.enabled
    return {
        "cuda": settings.worker.device == "cuda",
        "gsplat": bake and settings.views.backend == "gsplat",
        "nvdiffrast": bake and settings.rasterize.backend == "nvdiffrast",
        "moderngl": bake and settings.rasterize.backend in ("moderngl", "auto"),
    }


def run_checks(settings, quick: bool = False, timeout: float = 180.0,
               checkpoints: str = DEFAULT_FOLDER, env: Optional[Mapping] = None,
               cwd: Optional[Path] = None) -> list[Check]:
    env = dict(os.environ if env is None else env)
    cwd = Path(cwd or os.getcwd())
    need = needs(settings)
    checks = [check_python()]
    torch_check = check_torch(import_torch=not quick)
    checks.append(torch_check)
    torch_cuda = torch_check.data.get("cuda")
    gpu_check = check_gpus(env)
    checks.append(gpu_check)
    gpus = gpu_check.data.get("gpus", [])

    # the environment a worker would get: the probes below build and render in it
    probe_env = dict(env)
    try:
        from worker.env import prepare

        prepare(probe_env, worker_extensions_dir(settings, cwd), None, settings.worker.device)
    except Exception:  # noqa: BLE001 - the probes still run, in the plain environment
        probe_env = dict(env)

    # the worker's own probes, all in one child (a crash or hang is that probe's result)
    probes = {} if quick else run_probes(
        list(DOCTOR_PROBES), {"cuda": min(timeout, 120.0), "moderngl": min(timeout, 60.0),
                              "gsplat": timeout, "nvdiffrast": timeout},
        worker_interpreter(settings), probe_env, settings.worker.device,
        json.dumps(settings.to_dict(), default=str))

    if quick or torch_check.status == "fail":
        cuda_ok = bool(gpus) and bool(torch_cuda) and settings.worker.device != "cpu"
        if gpus and torch_cuda:
            checks.append(Check("torch.cuda", "info", "not checked (--quick); assuming a driver GPU works"))
    else:
        tc = check_torch_cuda(probes["cuda"])
        checks.append(tc)
        cuda_ok = bool(tc.data.get("cuda")) and settings.worker.device != "cpu"
    if settings.worker.device == "cpu":
        cuda_ok = False

    jit_needed = cuda_ok and (need["gsplat"] or need["nvdiffrast"])
    checks.append(check_nvcc(torch_cuda, env, needed=jit_needed))
    checks.append(check_cuda_home(torch_cuda, env))
    checks.append(check_extension_cache(env, cwd, needed=jit_needed,
                                        extra=worker_extensions_dir(settings, cwd)))
    checks.append(check_shm())
    checks.append(check_device(settings, cuda_ok, gpus))
    nvd = check_cuda_backend("nvdiffrast", "nvdiffrast",
                             f"{sys.executable} -m pip install diffrp-nvdiffrast==0.3.3.1",
                             "rasterize.backend moderngl", quick, cuda_ok, need["nvdiffrast"],
                             probes.get("nvdiffrast"))
    # with 'auto', moderngl is only the fallback when nvdiffrast works on this GPU
    moderngl_needed = need["moderngl"] and not (settings.rasterize.backend == "auto" and nvd.status == "ok")
    checks.append(check_moderngl(quick, moderngl_needed, probes.get("moderngl")))
    checks.append(check_cuda_backend("gsplat", "gsplat", f"{sys.executable} -m pip install gsplat==1.5.3",
                                     "views.backend cpu", quick, cuda_ok, need["gsplat"], probes.get("gsplat")))
    checks.append(nvd)
    checks.append(check_sam2(settings, checkpoints))
    checks.append(check_sam3d(settings, gpus))
    checks.append(check_worker_python(settings, quick, min(timeout, 120.0)))
    return checks


def summary_line(checks: list[Check], settings) -> str:
    by = {c.name: c for c in checks}
    fails = [c for c in checks if c.status == "fail"]
    warns = [c for c in checks if c.status == "warn"]
    head = "ok" if not fails else f"{len(fails)} problem(s): " + ", ".join(c.name for c in fails)
    if warns:
        head += f"; {len(warns)} warning(s): " + ", ".join(c.name for c in warns)
    torch_c = by.get("torch")
    tv = torch_c.data.get("version", "?") if torch_c else "?"
    tcuda = torch_c.data.get("cuda") if torch_c else None
    gpus = by["gpus"].data.get("gpus", []) if "gpus" in by else []
    gpu = ", ".join(g["name"] for g in gpus) or "none"

    def state(name):
        c = by.get(name)
        if c is None:
            return "?"
        return {"ok": "ok", "fail": "BROKEN", "warn": "warn"}.get(c.status, "n/a")

    sam2 = by.get("sam2")
    chosen = sam2.data.get("chosen") if sam2 else None
    sam2_s = Path(chosen["path"]).name if chosen and chosen.get("exists") else "grabcut"
    return (f"kiln doctor: {head} | torch {tv} (CUDA {tcuda or 'none'}) | gpu {gpu} | "
            f"device {settings.worker.device} | moderngl {state('moderngl/EGL')} | gsplat {state('gsplat')} | "
            f"nvdiffrast {state('nvdiffrast')} | sam2 {sam2_s} | reconstruct {settings.reconstruct.backend}")


def format_report(checks: list[Check], summary: str) -> str:
    lines = ["Kiln doctor"]
    width = max(len(c.name) for c in checks)
    for c in checks:
        tag = {"ok": " ok ", "info": "info", "warn": "WARN", "fail": "FAIL"}[c.status]
        lines.append(f"  [{tag}] {c.name:<{width}}  {c.detail}")
        for f in c.fix:
            lines.append(f"  {'':6} {'':<{width}}  fix: {f}")
    lines.append("")
    lines.append(summary)
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kiln doctor",
        description="Check Python, torch/CUDA, nvcc, caches, render backends and checkpoints. "
                    "Every problem comes with the command that fixes it. Exit code 1 when something "
                    "the configured pipeline needs is broken.")
    p.add_argument("--config", help="settings YAML (default: configs/default.yaml)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a setting, e.g. --set worker.device=cuda")
    p.add_argument("--quick", action="store_true", help="skip the subprocess render/build probes")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--summary", action="store_true",
                   help="print one summary line (implies --quick unless --full); for run.sh")
    p.add_argument("--full", action="store_true", help="with --summary: run the render probes too")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per build/render probe (default 180)")
    p.add_argument("--checkpoints", default=DEFAULT_FOLDER, help="folder searched for SAM2 checkpoints")
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:   # `kiln doctor -- --json`: the CLI may pass the separator along
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    try:
        settings = settings_mod.load(args.config, settings_mod.parse_set(args.set))
    except settings_mod.SettingsError as e:
        print(f"kiln doctor: {e}", file=sys.stderr)
        return 2
    quick = args.quick or (args.summary and not args.full)
    checks = run_checks(settings, quick=quick, timeout=args.timeout, checkpoints=args.checkpoints)
    summary = summary_line(checks, settings)
    code = 1 if any(c.status == "fail" for c in checks) else 0
    if args.json:
        print(json.dumps({"ok": code == 0, "exit_code": code, "quick": quick, "summary": summary,
                          "checks": [asdict(c) for c in checks]}, indent=2, default=str))
    elif args.summary:
        print(summary)
    else:
        print(format_report(checks, summary))
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
