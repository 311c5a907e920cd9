"""Atomic file writes: readers see the old content or the new, never a mix, and a
crash mid-write leaves at most a hidden temporary file, never a torn output."""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import BinaryIO, Callable, Union

Payload = Union[bytes, bytearray, memoryview, Callable[[BinaryIO], None]]


def atomic_write(path: str | Path, data: Payload, fsync: bool = True, mode: int = 0o644) -> Path:
    """Write ``data`` (bytes, or a function writing to the open file) to ``path``.

    The temporary file sits in the same folder, so ``os.replace`` is a rename on
    one file system. ``mode`` is applied before the rename (outputs are meant to
    be served and downloaded).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


_TEMP_RE = re.compile(r"\..+\.(\d+)\.[0-9a-f]{8}\.tmp")


def remove_stale_temps(root: str | Path) -> list[Path]:
    """Delete the temporary files ``atomic_write`` left under ``root`` when its process was
    killed mid-write (kill -9, the OOM killer); a live writer's are left alone (the pid is in
    the name). Returns what it deleted."""
    gone = []
    for tmp in Path(root).rglob(".*.tmp"):
        m = _TEMP_RE.fullmatch(tmp.name)
        if m is None or not tmp.is_file() or pid_alive(int(m.group(1))):
            continue
        tmp.unlink(missing_ok=True)
        gone.append(tmp)
    return gone


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a writer whose leftovers must not be touched yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process: alive
        return True
    return True


def atomic_copy(src: str | Path, dst: str | Path, fsync: bool = True, mode: int = 0o644) -> Path:
    """Copy the file ``src`` to ``dst`` the way ``atomic_write`` writes: an interrupted
    copy leaves ``dst`` as it was (absent or whole), never torn."""
    import shutil

    with open(src, "rb") as f:
        return atomic_write(dst, lambda out: shutil.copyfileobj(f, out), fsync, mode)
