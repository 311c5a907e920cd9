"""One content hash for a job's input, shared by the crash memory (which input keeps
crashing workers) and the stage cache (which reconstruction belongs to which input)."""

from __future__ import annotations

import hashlib

import numpy as np


def input_digest(rgb: np.ndarray, mask: np.ndarray) -> str:
    """SHA-256 hex of the image and mask, each with its shape (the same bytes in another
    shape are another input)."""
    h = hashlib.sha256()
    for a in (rgb, mask):
        h.update(str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def files_digest(parts: list[bytes], files: list) -> str:
    """SHA-256 hex of ``parts`` (a request's own bytes) and the files' contents, in order."""
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    for path in files:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0end")
    return h.hexdigest()
