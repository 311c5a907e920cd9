"""Checks every stage runs on its inputs, so bad data fails at a stage boundary
with a message naming the array, not deep inside a kernel."""

from __future__ import annotations

from typing import Sequence

import numpy as np


class StageInputError(ValueError):
    """A stage was given data it cannot work on. The message says what and why."""


def is_tensor(arr) -> bool:
    """A torch tensor (without importing torch: a process that never loaded it has none)."""
    return type(arr).__module__.split(".")[0] == "torch" and hasattr(arr, "device")


def check_array(name: str, arr, dtype=None, shape: Sequence | None = None,
                allow_tensor: bool = False) -> None:
    """``arr`` is a numpy array (or, with ``allow_tensor``, a torch tensor on any device) of
    ``dtype`` and ``shape`` (None in ``shape``: any size on that axis)."""
    tensor = allow_tensor and is_tensor(arr)
    if not (tensor or isinstance(arr, np.ndarray)):
        what = "a numpy array or torch tensor" if allow_tensor else "a numpy array"
        raise StageInputError(f"{name} must be {what}, got {type(arr).__name__}")
    if dtype is not None:
        got = str(arr.dtype).removeprefix("torch.") if tensor else arr.dtype.name
        if got != np.dtype(dtype).name:
            raise StageInputError(f"{name} must have dtype {np.dtype(dtype).name}, got {got}")
    if shape is not None:
        shape = tuple(shape)
        if arr.ndim != len(shape) or any(s is not None and s != a for s, a in zip(shape, arr.shape)):
            want = "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")"
            raise StageInputError(f"{name} must have shape {want}, got {tuple(arr.shape)}")


def check_finite(name: str, arr) -> None:
    """No NaN or inf in ``arr`` (numpy array or torch tensor; a tensor is checked where it is)."""
    if is_tensor(arr):
        import torch

        if arr.numel() and not bool(torch.isfinite(arr).all()):
            bad = int((~torch.isfinite(arr)).sum())
            raise StageInputError(f"{name} contains {bad} non-finite values (NaN or inf)")
    elif arr.size and not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr)).sum())
        raise StageInputError(f"{name} contains {bad} non-finite values (NaN or inf)")


def check_int(name: str, value, lo: int, hi: int) -> None:
    """An integer (not a bool) in lo..hi. For a stage's own limits (memory, a divisor that
    must not be zero), not for a setting's range: those are checked when settings are built."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise StageInputError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
