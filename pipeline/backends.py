"""Which renderer, rasterizer and torch device a job uses: decided here, once.

``resolve_backends`` turns the settings (``worker.device``, ``views.backend``,
``rasterize.backend``, each possibly ``auto``) and what the worker's start-up
probes found into a ``Backends``; ``unmet_requirements`` says which of those
choices this worker cannot honour; ``torch_device`` is the one check of a
device string that the stages run before they touch torch. The worker, the
self-test and the stages ask these functions instead of repeating the rules.

Pure Python at import (torch is imported inside ``torch_device``), so the
worker's supervisor side can use it without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from kiln.records import Backends, Capabilities

from pipeline.validate import StageInputError

if TYPE_CHECKING:
    import torch

    from kiln.settings import Settings

__all__ = ["Backends", "CUDA_ONLY", "RASTER_BACKENDS", "RENDER_BACKENDS", "check_backend", "requirements",
           "resolve_backends", "torch_device", "unmet_requirements"]

RENDER_BACKENDS = ("cpu", "gsplat")
RASTER_BACKENDS = ("moderngl", "nvdiffrast")
# backends with no CPU path: they need a CUDA device and their own probe to pass
CUDA_ONLY = ("gsplat", "nvdiffrast")


def resolve_backends(settings: Settings, capabilities: Optional[Capabilities] = None,
                     chunk_scale: float = 1.0) -> Backends:
    """Pick backends: explicit settings win; ``auto`` takes the GPU path only when the
    capability probe (worker start-up) said it works.

    capabilities: the worker's probe results, None = nothing probed (nothing works).
    chunk_scale: the attempt's (``Backends.chunk_scale``).
    """
    caps = capabilities or Capabilities()
    device = settings.worker.device
    if device == "auto":
        device = "cuda" if caps.cuda else "cpu"
    on_gpu = device == "cuda"
    render = settings.views.backend
    if render == "auto":
        render = "gsplat" if (on_gpu and caps.gsplat) else "cpu"
    raster = settings.rasterize.backend
    if raster == "auto":
        raster = "nvdiffrast" if (on_gpu and caps.nvdiffrast) else "moderngl"
    return Backends(render=render, rasterize=raster, device=device, chunk_scale=float(chunk_scale))


def requirements(settings: Settings, backends: Backends) -> list[tuple[str, str]]:
    """(capability, what needs it) for every probe a job with these backends relies on.
    Stages a job skips (no bake: no views, no rasterizer) need nothing."""
    need = []
    if backends.device.startswith("cuda"):
        need.append(("cuda", f"device '{backends.device}'"))
    if settings.bake.enabled and backends.render == "gsplat":
        need.append(("gsplat", "render backend 'gsplat'"))
    if settings.bake.enabled:
        need.append((backends.rasterize, f"rasterizer '{backends.rasterize}'"))
    if settings.reconstruct.backend == "sam3d":
        need.append(("sam3d", "reconstruction backend 'sam3d'"))
    return need


def needed_capabilities(settings: Settings, capabilities: Optional[Capabilities] = None) -> set[str]:
    """The probes a job with these settings relies on where the probes found
    ``capabilities`` (None: nothing probed, so ``auto`` picks the CPU twins and only what the
    settings name is needed). The one rule for the worker, ``kiln doctor`` and ``kiln selftest``."""
    return {cap for cap, _ in requirements(settings, resolve_backends(settings, capabilities))}


def unmet_requirements(settings: Settings, backends: Backends, capabilities: Capabilities) -> Optional[str]:
    """Why this worker cannot run the job with ``backends`` (the first unmet need, with the
    probe's reason), or None when it can."""
    for cap, what in requirements(settings, backends):
        if not capabilities.works(cap):
            return (f"settings ask for {what}, which does not work on this worker: "
                    f"{capabilities.reasons.get(cap, 'probe failed')}")
    return None


def check_backend(kind: str, backend: str) -> None:
    """Refuse a backend name the stage does not have. kind: "render" or "rasterizer"."""
    names = RENDER_BACKENDS if kind == "render" else RASTER_BACKENDS
    if backend not in names:
        raise StageInputError(f"unknown {kind} backend {backend!r}; choose one of {', '.join(names)}")


def torch_device(device: str, stage: str, backend: Optional[str] = None) -> torch.device:
    """``device`` as a ``torch.device`` a stage can use here, or StageInputError saying why not.

    stage: the stage's name for messages ("render", "bake"); backend: the stage's backend,
    when it is one of ``CUDA_ONLY`` the device must be CUDA.
    """
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise StageInputError(f"{stage} device {device!r} is not a torch device: {e}") from None
    if dev.type not in ("cpu", "cuda"):
        raise StageInputError(f"{stage} device must be 'cpu' or 'cuda[:n]', got {device!r}")
    if backend in CUDA_ONLY and dev.type != "cuda":
        raise StageInputError(f"{stage} backend '{backend}' runs only on CUDA, but device is "
                              f"{device!r}; use backend 'cpu' or a CUDA device")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise StageInputError(f"{stage} device {device!r} requested but CUDA is not available here "
                                  f"(torch {torch.__version__}); use device 'cpu' and backend 'cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise StageInputError(f"{stage} device {device!r} does not exist; "
                                  f"{torch.cuda.device_count()} CUDA device(s) visible")
    return dev
