"""Shared bits of the worker tests: small settings, distinct inputs, a CUDA tripwire."""

from __future__ import annotations

import numpy as np

from kiln.settings import Settings, load
from synthetic import make_object_image

# Keeps a whole job at a couple of seconds on a CPU.
SMALL = {"views.count": 4, "views.resolution": 128, "bake.texture_size": 256, "bake.steps": 10,
         "reconstruct.resolution": 64, "reconstruct.num_gaussians": 2000,
         "worker.heartbeat_s": 0.5}


def small_settings(**changes) -> Settings:
    over = dict(SMALL)
    over.update({k.replace("__", "."): v for k, v in changes.items()})
    return load(overrides=over)


def image(seed: int = 0, size: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """A distinct input per seed (the crash memory is keyed on input content)."""
    return make_object_image(size, "blob" if seed else "ellipse", seed)


class CudaTripwire:
    """Makes every entry into CUDA initialisation raise in this process, and remembers it.

    ``torch.cuda._lazy_init`` is what any CUDA tensor, stream or device query that
    needs a context goes through; ``is_available``/``device_count``/``init`` are the
    queries code uses to decide to go there.
    """

    NAMES = ("_lazy_init", "init", "is_available", "device_count", "current_device")

    def __init__(self):
        import torch

        self.torch = torch
        self.calls: list[str] = []
        self.saved = {}

    def __enter__(self):
        for name in self.NAMES:
            self.saved[name] = getattr(self.torch.cuda, name)

            def trap(*a, _name=name, **k):
                self.calls.append(_name)
                raise RuntimeError(f"torch.cuda.{_name} called in the app/CLI process")

            setattr(self.torch.cuda, name, trap)
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(self.torch.cuda, name, fn)
