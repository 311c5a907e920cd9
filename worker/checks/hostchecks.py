"""``kiln doctor``'s checks of this machine and its toolchain: Python, torch and the CUDA it
was built for, GPUs (from ``nvidia-smi``, never CUDA in this process), the ``nvcc`` first on
PATH and ``CUDA_HOME`` against torch's CUDA, stale JIT build locks in the torch extension
caches, and the size of ``/dev/shm``.

These are what made the old tool crash: an ``nvcc`` 9.1 first on PATH JIT-compiling
nvdiffrast for a CUDA 11.8 torch, stale extension build locks, tiny ``/dev/shm`` in
containers. Each problem comes with the command that fixes it.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Optional

from kiln import settings as settings_mod

from worker.checks.doctorcheck import Check

GIB = 1024 ** 3
SHM_MIN_BYTES = 1 * GIB
STALE_LOCK_S = 15 * 60          # a JIT build holds its lock for minutes at most


# --------------------------------------------------------------------------- helpers

def _run(cmd: list[str], timeout: float = 15.0, env: Optional[Mapping] = None) -> Optional[str]:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env=dict(env) if env is not None else None)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


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
        version, cuda = str(torch.__version__), torch.version.cuda
    else:
        from importlib import metadata

        from worker.child.env import torch_cuda_version

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


def check_nvcc(torch_cuda: Optional[str], env: Mapping, needed: bool = False) -> Check:
    """The nvcc first on PATH against torch.version.cuda.

    A mismatch is what made the old tool segfault: JIT builds (gsplat, nvdiffrast)
    use the first nvcc on PATH / CUDA_HOME. Kiln's workers pick a matching
    toolkit themselves when one is installed; shells and other tools do not.
    """
    from worker.child.env import find_toolkit, toolkit_candidates, toolkit_version

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
    from worker.child.env import toolkit_version

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


def extension_dirs(env: Mapping, cwd: Path, extra: Optional[Path] = None) -> list[Path]:
    """torch's JIT build caches: $TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions, and
    the one Kiln's processes share (``worker.child.env.extension_env``), and older project-local ones."""
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
    out: list[Path] = []
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
    stale: list[tuple[Path, float]] = []
    fresh: list[tuple[Path, float]] = []
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
