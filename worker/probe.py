"""Start-up probes: which backends really work in this worker process.

Each probe runs a tiny job through the same pipeline function a real job uses
(one Gaussian rendered, two triangles rasterized) on the worker's main thread,
because that is where the real job's CUDA and GL contexts will live. A probe
that raises or returns nonsense marks its backend unusable with the reason; one
that hangs is cut short by an interval timer when it hangs in Python, and by the
supervisor (which knows which probe was running and restarts the worker with
that probe skipped) when it hangs or crashes in native code.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Callable

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
    from pipeline.cameras import intrinsics, look_at
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
    from pipeline.render_views import render_gaussians

    views = render_gaussians(_tiny_gaussians(), _tiny_cameras(), backend=backend, device=device)
    centre = float(views.alpha[0, 16, 16])
    if not np.isfinite(views.rgb).all() or centre < 0.5 or float(views.alpha[0, 0, 0]) > 0.05:
        return False, f"tiny render came out wrong (centre alpha {centre:.3f})"
    return True, "ok"


def _check_raster(backend: str, device: str) -> tuple[bool, str]:
    from pipeline.rasterize import rasterize_views

    r = rasterize_views(_tiny_mesh(), _tiny_cameras(), backend=backend, device=device)
    hit = r.tri_id[0, 14:18, 14:18]
    if not (hit >= 0).all() or r.tri_id[0, 0, 0] != -1:
        return False, "tiny rasterization came out wrong (triangle not where the camera puts it)"
    return True, "ok"


def probe_cuda(ctx: dict) -> tuple[bool, str]:
    if ctx["device"] == "cpu":
        return False, "worker.device is 'cpu'"
    import torch

    if not torch.cuda.is_available():
        return False, (f"torch {torch.__version__} sees no CUDA device"
                       + ("" if torch.version.cuda else " (CPU-only build)"))
    x = torch.arange(8, device="cuda", dtype=torch.float32)
    if float((x * 2).sum().item()) != 56.0:
        return False, "a CUDA kernel returned a wrong result"
    ctx["device_name"] = torch.cuda.get_device_name(0)
    return True, "ok"


def probe_cpu(ctx: dict) -> tuple[bool, str]:
    return _check_render("cpu", "cpu")


def probe_moderngl(ctx: dict) -> tuple[bool, str]:
    return _check_raster("moderngl", "cpu")


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
        from pipeline.sam3d import probe_sam3d as probe
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
    try:
        with time_limit(timeout_s):
            ok, reason = FUNCS[name](ctx)
    except ProbeTimeout as e:
        ok, reason = False, str(e)
    except Exception as e:  # a probe failing is information, not an error
        ok, reason = False, f"{type(e).__name__}: {e}"
    ctx["results"][name] = ok
    return ok, reason[:400]
