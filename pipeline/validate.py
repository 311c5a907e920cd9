"""Checks every stage runs on its inputs, so bad data fails at a stage boundary
with a message naming the array, not deep inside a kernel."""

from __future__ import annotations

from typing import Sequence

import numpy as np


class StageInputError(ValueError):
    """A stage was given data it cannot work on. The message says what and why."""


def check_array(name: str, arr, dtype=None, shape: Sequence | None = None) -> None:
    if not isinstance(arr, np.ndarray):
        raise StageInputError(f"{name} must be a numpy array, got {type(arr).__name__}")
    if dtype is not None and arr.dtype != np.dtype(dtype):
        raise StageInputError(f"{name} must have dtype {np.dtype(dtype).name}, got {arr.dtype.name}")
    if shape is not None:
        shape = tuple(shape)
        if arr.ndim != len(shape) or any(s is not None and s != a for s, a in zip(shape, arr.shape)):
            want = "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")"
            raise StageInputError(f"{name} must have shape {want}, got {tuple(arr.shape)}")


def check_finite(name: str, arr: np.ndarray) -> None:
    if arr.size and not np.isfinite(arr).all():
        bad = int((~np.isfinite(arr)).sum())
        raise StageInputError(f"{name} contains {bad} non-finite values (NaN or inf)")


def check_int(name: str, value, lo: int, hi: int) -> None:
    """An integer (not a bool) in lo..hi. For a stage's own limits (memory, a divisor that
    must not be zero), not for a setting's range: those are checked when settings are built."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise StageInputError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
