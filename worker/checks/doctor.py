"""``kiln doctor``: what this machine can run, what is broken, and the command that fixes it.

The old tool's crashes came from the environment, not the code: an ``nvcc`` 9.1
first on PATH JIT-compiling nvdiffrast for a CUDA 11.8 torch, stale extension
build locks, tiny ``/dev/shm`` in containers. The doctor checks those and tries
each render backend on one triangle.

It never initialises CUDA in its own process (it may be run next to a server):
GPUs come from ``nvidia-smi``, and what touches CUDA or GL is the worker's own
start-up probes (``worker.child.probe``: CUDA, moderngl, gsplat, nvdiffrast), run by
``worker.checks.proberun`` in a child under the interpreter workers use, in the
environment a worker would get (``worker.child.env.prepare``: matching CUDA_HOME/PATH,
project-local TORCH_EXTENSIONS_DIR), each with a time limit, so a crash or a hang
there is reported, not suffered.

The checks live in two modules: ``worker.checks.hostchecks`` (this machine and its toolchain:
Python, torch, GPUs, nvcc, CUDA_HOME, extension caches, /dev/shm) and
``worker.checks.backendchecks`` (what a worker runs: the probes' answers, worker.device, SAM2,
SAM 3D, worker.python); each returns a ``Check`` (``worker.checks.doctorcheck``). This module
runs them in the report's order and prints the report, the summary line or JSON.

Exit code: 0 when everything the configured pipeline needs works (warnings
allowed), 1 when something it needs is broken, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Mapping, Optional

from kiln import settings as settings_mod
from kiln.checkpoints import DEFAULT_FOLDER, MODELS_DIR_ENV, models_dir

from worker.checks.backendchecks import (check_cuda_backend, check_device, check_moderngl, check_rembg, check_sam2, check_sam3d,
                            check_torch_cuda, check_worker_python)
from worker.checks.doctorcheck import Check
from worker.child.env import extension_env
from worker.checks.hostchecks import (check_cuda_home, check_extension_cache, check_gpus, check_nvcc, check_python,
                         check_shm, check_torch)
from worker.checks.proberun import run_probes


# --------------------------------------------------------------------------- driver

# the worker probes whose answers the report shows (the CPU renderer and SAM 3D's model load
# are left to the worker's own start-up)
DOCTOR_PROBES = ("cuda", "moderngl", "gsplat", "nvdiffrast")


def worker_interpreter(settings) -> str:
    """The interpreter a worker runs under: ``worker.python``, or this one (also when
    ``worker.python`` is unusable: its own check says why)."""
    from worker.child.interpreter import InterpreterError, resolve

    try:
        return resolve(settings.worker.python) or sys.executable
    except InterpreterError:
        return sys.executable


def needs(settings) -> dict:
    """What the configured pipeline cannot run without, whatever this machine has: what the
    settings name, and the CPU twin ``auto`` falls back to (``pipeline.backends``'s rule)."""
    from pipeline.backends import needed_capabilities

    need = needed_capabilities(settings)
    return {cap: cap in need for cap in ("cuda", "gsplat", "nvdiffrast", "moderngl")}


def run_checks(settings, quick: bool = False, timeout: float = 180.0,
               checkpoints: Optional[str] = None, env: Optional[Mapping] = None,
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
        from worker.child.env import prepare

        prepare(probe_env, None, settings.worker.device)
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
                                        extra=Path(extension_env(env)["TORCH_EXTENSIONS_DIR"])))
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
    checks.append(check_sam2(settings, str(checkpoints or models_dir())))
    checks.append(check_rembg(settings, str(checkpoints or models_dir())))
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
    p.add_argument("--checkpoints", default=None,
                   help=f"folder searched for SAM2 checkpoints (default: ${MODELS_DIR_ENV}, else {DEFAULT_FOLDER}/)")
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
