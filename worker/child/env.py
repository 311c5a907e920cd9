"""Process environment for CUDA work, decided without importing torch.

The old tool's segfaults began with nvdiffrast being JIT-compiled by the first
``nvcc`` on PATH (CUDA 9.1) for a torch built against CUDA 11.8. So a worker,
before it imports torch, points ``CUDA_HOME``/``PATH`` at a toolkit whose version
matches ``torch.version.cuda`` (read from torch's ``version.py`` as text) and turns
on faulthandler.

JIT builds (gsplat, nvdiffrast) take minutes each, and torch keys its build cache by
folder and compiler flags: every Kiln process (job workers, selftest children, doctor's
probes, tests) must share one ``TORCH_EXTENSIONS_DIR`` and one ``TORCH_CUDA_ARCH_LIST``
or each compiles the same extension again. ``extension_env`` decides both once
(the user's values win); ``share_extension_env`` puts them into an environment that
processes are spawned from.

GPU discovery for the supervisor lives here too: it must not initialise CUDA in
the app process, so it asks ``nvidia-smi -L`` or ``/proc/driver/nvidia/gpus``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, MutableMapping, Optional


_RELEASE_RE = re.compile(r"release (\d+)\.(\d+)")


def torch_cuda_version() -> Optional[str]:
    """``torch.version.cuda`` (e.g. '12.1') without importing torch; None for CPU builds
    or when torch is not installed."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        vfile = Path(loc) / "version.py"
        if vfile.is_file():
            m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([\d.]+)['\"]", vfile.read_text(), re.M)
            return m.group(1) if m else None
    return None


def toolkit_version(home: Path) -> Optional[str]:
    """'major.minor' of the CUDA toolkit at ``home``, or None when it has no nvcc."""
    home = Path(home)
    nvcc = home / "bin" / "nvcc"
    if not nvcc.is_file():
        return None
    vjson = home / "version.json"
    if vjson.is_file():
        try:
            ver = json.loads(vjson.read_text())["cuda"]["version"]
            return ".".join(ver.split(".")[:2])
        except (ValueError, KeyError, TypeError):
            pass
    vtxt = home / "version.txt"
    if vtxt.is_file():
        m = re.search(r"(\d+)\.(\d+)", vtxt.read_text())
        if m:
            return f"{m.group(1)}.{m.group(2)}"
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = _RELEASE_RE.search(out)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def toolkit_candidates(env: Mapping[str, str]) -> list[Path]:
    """Where CUDA toolkits usually live, most specific first."""
    out: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            out.append(Path(env[var]))
    if env.get("CONDA_PREFIX"):
        out.append(Path(env["CONDA_PREFIX"]))
    for base in ("/usr/local", "/opt"):
        p = Path(base)
        if p.is_dir():
            out.extend(sorted(p.glob("cuda-*"), reverse=True))
            out.append(p / "cuda")
    for d in env.get("PATH", "").split(os.pathsep):
        if d and (Path(d) / "nvcc").is_file():
            out.append(Path(d).resolve().parent)
    seen, uniq = set(), []
    for p in out:
        key = str(p)
        if key not in seen:
            seen.add(key)
            uniq.append(p)
    return uniq


def find_toolkit(want: str, candidates: Iterable[Path]) -> tuple[Optional[Path], list[str]]:
    """First toolkit whose major.minor equals ``want``; also the versions seen elsewhere."""
    want = ".".join(want.split(".")[:2])
    seen: list[str] = []
    for home in candidates:
        ver = toolkit_version(home)
        if ver is None:
            continue
        if ver == want:
            return home, seen
        seen.append(f"{ver} at {home}")
    return None, seen


# Kiln's own extension cache when the user names none: one folder for every process.
PROJECT_EXTENSIONS_DIR = Path(__file__).resolve().parents[2] / "var" / "torch_extensions"


def compute_capabilities(env: Optional[Mapping[str, str]] = None) -> list[str]:
    """Compute capabilities ('9.0', ...) of the GPUs ``nvidia-smi`` lists, in order, without
    touching CUDA; [] without a driver. Honours CUDA_VISIBLE_DEVICES given as indices."""
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=15,
                             env=None if env is None else dict(env))
    except (OSError, subprocess.SubprocessError):
        return []
    if res.returncode != 0:
        return []
    caps = [line.strip() for line in res.stdout.splitlines() if re.fullmatch(r"\d+\.\d+", line.strip())]
    visible = (env if env is not None else os.environ).get("CUDA_VISIBLE_DEVICES")
    if visible is not None and all(v.strip().isdigit() for v in visible.split(",") if v.strip()):
        picked = [int(v) for v in visible.split(",") if v.strip()]
        caps = [caps[i] for i in picked if i < len(caps)]
    return caps


@lru_cache(maxsize=8)
def _derived_arch_list(path: str, visible: Optional[str]) -> Optional[str]:
    env = dict(os.environ, PATH=path)
    if visible is None:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        env["CUDA_VISIBLE_DEVICES"] = visible
    caps = sorted(set(compute_capabilities(env)), key=lambda c: tuple(int(x) for x in c.split(".")))
    return ";".join(caps) or None


def extension_env(env: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The ``TORCH_EXTENSIONS_DIR`` and ``TORCH_CUDA_ARCH_LIST`` every Kiln process uses:
    the user's when set, else the project's folder and the compute capabilities of this
    machine's GPUs (asked of ``nvidia-smi`` once per process; no arch list without a GPU,
    which leaves torch its own default)."""
    if env is None:
        env = os.environ
    out = {"TORCH_EXTENSIONS_DIR": env.get("TORCH_EXTENSIONS_DIR") or str(PROJECT_EXTENSIONS_DIR)}
    arch = env.get("TORCH_CUDA_ARCH_LIST") or _derived_arch_list(env.get("PATH", ""),
                                                                 env.get("CUDA_VISIBLE_DEVICES"))
    if arch:
        out["TORCH_CUDA_ARCH_LIST"] = arch
    return out


def share_extension_env(env: Optional[MutableMapping[str, str]] = None) -> dict[str, str]:
    """Write ``extension_env`` into ``env`` (``os.environ`` by default) so that every process
    started from it builds into, and loads from, the same cache. Returns what it wrote."""
    if env is None:
        env = os.environ
    shared = extension_env(env)
    env.update(shared)
    return shared


# --------------------------------------------------------------------------- OpenMP threads
# torch's CPU build runs its parallel ops on GNU OpenMP (libgomp), whose idle threads spin
# for a while at the end of every parallel region before they sleep. The CPU stages run
# thousands of short ops (the splat renderer alone ~15k a job), so on a machine whose cores
# are busy with other work a spinning thread takes the time slice its partner needs to
# finish, and every op waits a scheduler quantum. Measured on the 2-core machine at load
# average 9-11 (docs/benchmarks.md, "Issue 36 item 1"): the 16 bake views took 150-163 s
# wall and 47-54 s CPU with libgomp's default, 16-22 s and 6.5-6.7 s with
# OMP_WAIT_POLICY=PASSIVE (GOMP_SPINCOUNT=10000: 37 s, 9.5 s). libgomp reads the variable
# once, when torch loads it, so it has to be in the environment before the first import.

# the variables through which a person may already have chosen how OpenMP threads wait
# (libgomp's two, and Intel's OpenMP's): any of them set, Kiln leaves the choice alone
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def passive_openmp(env: MutableMapping[str, str]) -> bool:
    """Put ``OMP_WAIT_POLICY=PASSIVE`` into ``env`` (normally ``os.environ``) unless one of
    ``WAIT_VARS`` is set. Returns whether it was put there."""
    if any(env.get(name) for name in WAIT_VARS):
        return False
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


def prepare(env: MutableMapping[str, str], gpu: Optional[str], device: str) -> dict[str, Any]:
    """Adjust ``env`` (normally ``os.environ``) in place for a worker about to import torch.

    gpu: the CUDA_VISIBLE_DEVICES entry this worker owns, or None to leave it alone.
    Returns notes for the capability report: 'torch_cuda', 'cuda_home', 'toolkit',
    'torch_extensions_dir', 'torch_cuda_arch_list', 'omp_wait_policy'.
    """
    notes: dict[str, Any] = {}
    # before pinning CUDA_VISIBLE_DEVICES: the arch list covers the machine's GPUs, so a
    # worker pinned to any of them shares the one cache
    shared = share_extension_env(env)
    notes["torch_extensions_dir"] = shared["TORCH_EXTENSIONS_DIR"]
    notes["torch_cuda_arch_list"] = shared.get("TORCH_CUDA_ARCH_LIST")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU worker must not even see a GPU
    elif gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    env["PYTHONFAULTHANDLER"] = "1"
    # before torch loads libgomp: idle threads sleep instead of spinning (passive_openmp)
    notes["omp_wait_policy"] = "passive" if passive_openmp(env) else "as set"
    want = torch_cuda_version()
    notes["torch_cuda"] = want
    if want is None or device == "cpu":
        notes["toolkit"] = "not needed" if device == "cpu" else "torch is a CPU build"
        return notes
    home, others = find_toolkit(want, toolkit_candidates(env))
    if home is not None:
        env["CUDA_HOME"] = str(home)
        env["PATH"] = str(home / "bin") + os.pathsep + env.get("PATH", "")
        notes["cuda_home"] = str(home)
        notes["toolkit"] = f"CUDA {want} at {home}"
    else:
        # Leave PATH alone: JIT builds then fail with torch's own version-mismatch
        # message, which beats silently building with the wrong compiler.
        notes["toolkit"] = (f"no CUDA {want} toolkit found (torch needs it for JIT builds)"
                            + (f"; found {', '.join(others)}" if others else ""))
    return notes


def detect_gpus(env: Optional[Mapping[str, str]] = None) -> list[str]:
    """CUDA_VISIBLE_DEVICES entries, one per GPU a worker may be pinned to.

    Honors an existing CUDA_VISIBLE_DEVICES; otherwise counts GPUs with
    ``nvidia-smi -L`` or ``/proc/driver/nvidia/gpus``. Never touches CUDA itself.
    """
    if env is None:
        env = os.environ
    if "CUDA_VISIBLE_DEVICES" in env:
        out = []
        for item in env["CUDA_VISIBLE_DEVICES"].split(","):
            item = item.strip()
            if not item or item.startswith("-"):
                break  # CUDA stops at the first invalid entry
            out.append(item)
        return out
    try:
        res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=15)
        if res.returncode == 0:
            n = sum(1 for line in res.stdout.splitlines() if line.startswith("GPU "))
            return [str(i) for i in range(n)]
    except (OSError, subprocess.SubprocessError):
        pass
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir():
        return [str(i) for i in range(len(list(gpus.iterdir())))]
    return []
