"""A job's files on their way to a Ray node and back (``worker.ray_transfer: object_store``).

The job's folder stays on the server; a node gets a copy of what a worker reads (the inputs
and settings) in a scratch folder of its own, and the server gets back what the worker wrote.
Paths are checked on both ends so that no file lands outside its job's folder, and results are
written with ``kiln.atomic.atomic_write`` so a reader never sees half a GLB.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Iterable

from kiln.atomic import atomic_write

from worker.engines.raymessages import JobFiles

INPUTS = ("inputs", "settings.json")     # what a worker reads from a job's folder
RESULTS = ("outputs", "result.json")     # what it writes there (besides its log lines)
LOG = "log"


def _files_under(folder: Path, names: Iterable[str]) -> list[tuple[str, bytes]]:
    out = []
    for name in names:
        path = folder / name
        found = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else (
            [path] if path.is_file() else [])
        out += [(p.relative_to(folder).as_posix(), p.read_bytes()) for p in found]
    return out


def safe_relative(name: str) -> PurePosixPath:
    """``name`` as a path inside a job's folder; ValueError for one that would leave it."""
    rel = PurePosixPath(name)
    if rel.is_absolute() or not rel.parts or any(part in ("..", "") for part in rel.parts):
        raise ValueError(f"job file {name!r} would leave its job's folder")
    return rel


def pack_inputs(job_id: str, job_dir: Path) -> JobFiles:
    """What a worker needs of the job: its inputs and settings."""
    return JobFiles(job_id, tuple(_files_under(job_dir, INPUTS)))


def unpack_inputs(files: JobFiles, dest: Path) -> None:
    """A fresh copy of the job's inputs in ``dest`` (an earlier attempt's copy is replaced)."""
    import shutil

    shutil.rmtree(dest, ignore_errors=True)
    (dest / "outputs").mkdir(parents=True)
    for name, data in files.files:
        path = dest / safe_relative(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def pack_results(job_id: str, scratch: Path, done: bool) -> JobFiles:
    """What the attempt left in ``scratch``: its log lines, and its outputs and report when it
    ended done (an attempt that failed or crashed leaves nothing a client should read)."""
    files = _files_under(scratch, RESULTS) if done else []
    log = scratch / LOG
    if log.is_file():
        files.append((LOG, log.read_bytes()))
    return JobFiles(job_id, tuple(files))


def write_results(files: JobFiles, job_dir: Path) -> None:
    """Write what came back into the job's own folder: outputs and report atomically, the log
    lines appended."""
    for name, data in files.files:
        rel = safe_relative(name)
        if rel.as_posix() == LOG:
            fd = os.open(job_dir / LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            continue
        path = job_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
