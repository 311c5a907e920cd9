"""Start-up probes: which backends really work in this worker process.

Each probe runs a tiny job through the same pipeline function a real job uses
(one Gaussian rendered, two triangles rasterized) on the worker's main thread,
because that is where the real job's CUDA and GL contexts will live. A probe
that raises or returns nonsense marks its backend unusable with the reason; one
that hangs is cut short by an interval timer when it hangs in Python, and by the
supervisor (which knows which probe was running and restarts the worker with
that probe skipped) when it hangs or crashes in native code.

``python -m worker.child.probe --json`` runs the same probes in a fresh interpreter and
prints a line per probe: ``kiln doctor`` runs it (under ``worker.python`` when that is
set, in the environment a worker gets) through ``worker.checks.proberun``, which plays the
supervisor's part for a crash or a native hang.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Callable, Optional

import numpy as np

# Order matters: later probes need to know whether CUDA works.
PROBES = ("cuda", "cpu", "moderngl", "gsplat", "nvdiffrast", "sam3d")


class ProbeTimeout(Exception):
    pass


@contextmanager
def time_limit(seconds: float):
    """Raise ProbeTimeout in the main thread after ``seconds`` (Python-level hangs only)."""

    def on_alarm(signum, frame):
        raise ProbeTimeout(f"timed out after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _tiny_cameras(size: int = 32):
    from pipeline.camera.cameras import intrinsics, look_at
    from pipeline.types import Cameras

    return Cameras(viewmats=look_at((0.0, 0.0, 2.0))[None], Ks=intrinsics(40.0, size, size)[None],
                   width=size, height=size)


def _tiny_mesh():
    from pipeline.types import Mesh

    v = np.array([[-0.3, -0.3, 0.0], [0.3, -0.3, 0.0], [0.0, 0.3, 0.0]], np.float32)
    f = np.array([[0, 1, 2], [0, 2, 1]], np.int32)  # both windings: culling must not matter
    return Mesh(vertices=v, faces=f)


def _tiny_gaussians():
    from pipeline.types import Gaussians

    return Gaussians(means=np.zeros((1, 3), np.float32), scales=np.full((1, 3), 0.1, np.float32),
                     quats=np.array([[1, 0, 0, 0]], np.float32), opacities=np.array([0.9], np.float32),
                     colors=np.array([[1.0, 0.2, 0.1]], np.float32))


def _check_render(backend: str, device: str) -> tuple[bool, str]:
    from pipeline.views.render_views import render_gaussians

    views = render_gaussians(_tiny_gaussians(), _tiny_cameras(), backend=backend, device=device)
    centre = float(views.alpha[0, 16, 16])
    if not np.isfinite(views.rgb).all() or centre < 0.5 or float(views.alpha[0, 0, 0]) > 0.05:
        return False, f"tiny render came out wrong (centre alpha {centre:.3f})"
    return True, "ok"


def _check_raster(backend: str, device: str, driver: dict | None = None) -> tuple[bool, str]:
    """Two triangles through a fresh context of ``backend``; ``driver`` (when given) receives
    the GL driver's renderer and version."""
    from pipeline.raster.rasterize import raster_context, rasterize_views

    with raster_context(backend, device) as rc:
        r = rasterize_views(rc, _tiny_mesh(), _tiny_cameras())
        if driver is not None:
            driver.update(rc.driver())
    hit = r.tri_id[0, 14:18, 14:18]
    if not (hit >= 0).all() or r.tri_id[0, 0, 0] != -1:
        return False, "tiny rasterization came out wrong (triangle not where the camera puts it)"
    return True, "ok"


def nvidia_driver_missing() -> Optional[str]:
    """Why CUDA cannot work here when the NVIDIA driver's library cannot even be loaded, else
    None (then torch decides). Asked first so that a machine without a GPU starts its
    worker without importing torch (~2 s and ~500 MB before any job asks for it)."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver here (libcuda.so.1 cannot be loaded)"
    return None


def probe_cuda(ctx: dict) -> tuple[bool, str]:
    if ctx["device"] == "cpu":
        return False, "worker.device is 'cpu'"
    missing = nvidia_driver_missing()
    if missing:
        return False, missing
    import torch

    if not torch.cuda.is_available():
        return False, (f"torch {torch.__version__} sees no CUDA device"
                       + ("" if torch.version.cuda else " (CPU-only build)"))
    # before the kernel runs: a wrong result on a visible device is a broken GPU, not a missing one
    ctx["cuda_devices"] = [{"name": torch.cuda.get_device_name(i),
                            "capability": "%d.%d" % torch.cuda.get_device_capability(i)}
                           for i in range(torch.cuda.device_count())]
    x = torch.arange(8, device="cuda", dtype=torch.float32)
    if float((x * 2).sum().item()) != 56.0:
        return False, "a CUDA kernel returned a wrong result"
    ctx["device_name"] = torch.cuda.get_device_name(0)
    return True, "ok"


def probe_cpu(ctx: dict) -> tuple[bool, str]:
    return _check_render("cpu", "cpu")


def probe_moderngl(ctx: dict) -> tuple[bool, str]:
    driver: dict = {}
    ok, reason = _check_raster("moderngl", "cpu", driver)
    if ok:
        ctx["gl"] = driver
    return ok, reason


def _probe_cuda_backend(ctx: dict, module: str, missing: str, check) -> tuple[bool, str]:
    """A GPU backend is tried only with CUDA present and its package installed."""
    if not ctx["results"].get("cuda"):
        return False, "needs CUDA"
    import importlib.util

    if importlib.util.find_spec(module) is None:
        return False, missing
    return check()


def probe_gsplat(ctx: dict) -> tuple[bool, str]:
    return _probe_cuda_backend(ctx, "gsplat", "gsplat is not installed",
                               lambda: _check_render("gsplat", "cuda"))


def probe_nvdiffrast(ctx: dict) -> tuple[bool, str]:
    return _probe_cuda_backend(ctx, "nvdiffrast", "nvdiffrast is not installed (diffrp-nvdiffrast)",
                               lambda: _check_raster("nvdiffrast", "cuda"))


def probe_sam3d(ctx: dict) -> tuple[bool, str]:
    try:
        from pipeline.recon.sam3d import probe_sam3d as probe
    except ImportError as e:
        return False, f"SAM 3D Objects support is not available ({e})"
    ok, reason = probe(ctx["settings"])
    return bool(ok), str(reason or ("ok" if ok else "unavailable"))


FUNCS: dict[str, Callable[[dict], tuple[bool, str]]] = {
    "cuda": probe_cuda, "cpu": probe_cpu, "moderngl": probe_moderngl,
    "gsplat": probe_gsplat, "nvdiffrast": probe_nvdiffrast, "sam3d": probe_sam3d,
}


def run_probe(name: str, ctx: dict, timeout_s: float) -> tuple[bool, str]:
    """Run one probe; never raises (the reason carries the exception)."""
    ok, reason, _ = run_probe_detailed(name, ctx, timeout_s)
    return ok, reason


def run_probe_detailed(name: str, ctx: dict, timeout_s: float,
                       before: Callable[[], None] | None = None) -> tuple[bool, str, bool]:
    """``run_probe`` plus whether the probe broke (raised or timed out) rather than
    answering no: a backend that is absent is not a backend that is broken. ``before``
    runs first, inside the time limit (tests fire faults there)."""
    broke = False
    try:
        with time_limit(timeout_s):
            if before is not None:
                before()
            ok, reason = FUNCS[name](ctx)
    except ProbeTimeout as e:
        ok, reason, broke = False, str(e), True
    except Exception as e:  # a probe failing is information, not an error
        ok, reason, broke = False, f"{type(e).__name__}: {e}", True
    ctx["results"][name] = ok
    return ok, reason[:400], broke


# --------------------------------------------------------------------------- python -m worker.child.probe

# the package each GPU backend probe needs; its installed version goes into the report
_PACKAGES = {"gsplat": "gsplat", "nvdiffrast": "nvdiffrast"}
_DISTRIBUTIONS = {"gsplat": ("gsplat",), "nvdiffrast": ("diffrp-nvdiffrast", "nvdiffrast")}


def _info(name: str, ctx: dict) -> dict:
    """What a report shows beside ok/reason: CUDA devices, a backend's package version."""
    if name == "cuda":
        return {"devices": ctx.get("cuda_devices", [])}
    if name == "moderngl":
        return dict(ctx.get("gl", {}))
    if name in _PACKAGES:
        import importlib.util
        from importlib import metadata

        out: dict = {"installed": importlib.util.find_spec(_PACKAGES[name]) is not None}
        for dist in _DISTRIBUTIONS[name]:
            try:
                out["version"] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
        return out
    return {}


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in FUNCS:
            raise SystemExit(f"worker.child.probe: {what} {item!r} must be NAME=VALUE with NAME one of "
                             f"{', '.join(PROBES)}")
        out[name] = value
    return out


def main(argv=None) -> int:
    """Run the probes in this process, in PROBES order; with --json one JSON object per
    line on stdout (``start`` before a probe, ``result`` after, ``done`` at the end) and
    everything else, native libraries' output included, on stderr."""
    import argparse
    import json
    import os
    import sys
    import time

    p = argparse.ArgumentParser(prog="python -m worker.child.probe", description=(
        "Run a worker's start-up probes in this interpreter, as a worker would: " + ", ".join(PROBES)))
    p.add_argument("names", nargs="*", metavar="PROBE", help="probes to run (default: all)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="worker.device")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a probe may take (default 120)")
    p.add_argument("--limit", action="append", default=[], metavar="PROBE=SECONDS",
                   help="another time limit for one probe")
    p.add_argument("--skip", action="append", default=[], metavar="PROBE=REASON",
                   help="count PROBE as failed with REASON without running it (it crashed a previous run)")
    p.add_argument("--settings-json", help="the settings (Settings.to_dict() as JSON); default settings otherwise")
    p.add_argument("--json", action="store_true", help="JSON lines for a program (kiln doctor)")
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in FUNCS]
    if unknown:
        p.error(f"unknown probe(s) {', '.join(unknown)}; choose from {', '.join(PROBES)}")
    limits = {k: float(v) for k, v in _pairs(args.limit, "--limit").items()}
    skips = _pairs(args.skip, "--skip")
    wanted = set(args.names or PROBES)

    out = sys.stdout
    if args.json:
        # the protocol keeps fd 1 to itself; a library printing (a JIT build does) goes to stderr
        sys.stdout.flush()
        out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)

    def say(obj: dict) -> None:
        if args.json:
            out.write(json.dumps(obj) + "\n")
        elif obj["event"] == "result":
            out.write(f"probe {obj['probe']}: {'ok' if obj['ok'] else obj['reason']} ({obj['seconds']} s)\n")
        out.flush()

    from kiln.settings import Settings, from_dict

    from worker.child.faults import FaultPlan, fire

    settings = from_dict(json.loads(args.settings_json)) if args.settings_json else Settings()
    faults = FaultPlan.from_env()   # tests only: KILN_TEST_FAULTS="segv@probe:moderngl"
    fault_at = faults.probe_faults() if faults else {}
    ctx = {"device": args.device, "results": {}, "settings": settings}
    for name in PROBES:
        if name in skips:
            ctx["results"][name] = False
            continue
        if name not in wanted:
            continue
        limit = limits.get(name, args.timeout)
        say({"event": "start", "probe": name, "limit": limit})
        t0 = time.perf_counter()
        kind = fault_at.get(name)
        ok, reason, broke = run_probe_detailed(name, ctx, limit, (lambda: fire(kind)) if kind else None)
        say({"event": "result", "probe": name, "ok": ok, "reason": reason, "broke": broke,
             "seconds": round(time.perf_counter() - t0, 3), "info": _info(name, ctx)})
    say({"event": "done"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
