"""Jobs on disk: one directory per job, so a job survives any process dying.

Layout of ``<root>/<session>/<job_id>/``::

    inputs/image.png   the photo, RGB (a bake job: only when it has one)
    inputs/mask.png    the object mask, 0 / 255
    inputs/bake.json   a bake job's ``kiln.bakerequest.BakeRequest``, with the files it names
                       (inputs/mesh/..., inputs/splat.ply, inputs/camera.json)
    settings.json      the job's full settings (kiln.settings.Settings.to_dict())
    digest             its input digest (``kiln.digest``): the key crashes are counted by, so a
                       job resumed after a server crash keeps its count (``worker.pool.resume``)
    status.json        JobStatus, rewritten atomically on every change
    result.json        what the worker reports besides the GLB (kiln.records.WorkerReport)
    log                human-readable history: supervisor notes, worker stage lines, tracebacks
    outputs/model.glb  (and model.ply when asked for, and model.obj.zip, model.stl,
                       model.mesh.ply for export.formats: kiln.formats names them)
    outputs/camera.json, outputs/camera_fit.png
                       a fitted camera and its picture (a fit job's only outputs; a bake
                       job's too when it fitted its camera: worker.jobs.bakejob)

Only the supervisor writes ``status.json``; the worker writes ``outputs/``,
``result.json`` and appends to ``log``. Every file that is replaced is written to a
temporary name first and moved over with ``os.replace``, so a reader never sees
half a file. This module reads and writes each of these files (``JobStatus.to_dict`` /
``from_dict`` for status.json). Pure Python + numpy + Pillow: the app process imports this.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final, Literal, Mapping, Optional

import numpy as np

from kiln.atomic import atomic_write, pid_alive
from kiln.bakerequest import BakeRequest
from kiln.limits import image_size_problem
from kiln.records import Backends, JobStats, WorkerReport
from kiln.settings import Settings, from_dict

# A job's state (``JobStatus.state``), written as these strings in status.json and
# compared as strings by every caller; the last three are final.
JobState = Literal["queued", "running", "done", "failed", "cancelled"]
# What a job does: "image" reconstructs a photo; "bake" textures a model someone made; "fit"
# only fits that model's camera to its photo (laid out as a bake job; no GLB).
JobKind = Literal["image", "bake", "fit"]
QUEUED: Final = "queued"
RUNNING: Final = "running"
DONE: Final = "done"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
TERMINAL: tuple[JobState, ...] = (DONE, FAILED, CANCELLED)
_SESSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_JOB_RE = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")
_STAGING_RE = re.compile(r"\.\d{8}-\d{6}-[0-9a-f]{6}\.(\d+)\.new")


@dataclass
class JobStatus:
    """A job's state as the UI and CLI see it.

    state: a ``JobState``: 'queued' | 'running' | 'done' | 'failed' | 'cancelled'.
    stage: the pipeline stage running (or that was running when it ended), None before.
    progress: 0..1 over the whole job; never decreases, not even across a retry.
    stage_progress: 0..1 within ``stage``.
    message: the latest human-readable line; error: why it failed/was cancelled.
    seq: sequence number of the last event; increases by one with every change.
    outputs: {'glb': path[, 'ply': path][, 'obj' | 'stl' | 'mesh_ply': path]} once done
        (``kiln.formats.OUTPUT_TAIL`` names the keys).
    timings: stage -> seconds of the successful attempt (as PipelineResult.timings), plus
        'queued_s' (submit -> first start) and 'total_s' (submit -> end) once it ended.
    stats: ``kiln.records.JobStats``: the pipeline's stats (done jobs), the GLB check, where
        the time went, and the failures of earlier attempts that were retried.
    attempts: how many times a worker started it; worker: the slot of the last one.
    backends: the ``kiln.records.Backends`` the last attempt used; None before one started.
    created / started / finished: Unix times.
    kind: a ``JobKind``: "image" (a photo reconstructed), "bake" (a model file textured) or
        "fit" (that model's camera fitted to its photo; outputs 'camera' and 'camera_fit').
    removed / removed_why: when (Unix time) and why the disk budget removed an ended job's
        files (``worker.upkeep.budget``); only this status and the page's note stay, so its
        history entry can say so instead of offering a broken download. None: its files are there.
    """

    id: str
    session: str
    kind: JobKind = "image"
    state: JobState = QUEUED
    stage: Optional[str] = None
    progress: float = 0.0
    stage_progress: float = 0.0
    message: str = ""
    seq: int = 0
    outputs: dict[str, str] = field(default_factory=dict)
    error: Optional[str] = None
    timings: dict[str, float] = field(default_factory=dict)
    stats: JobStats = field(default_factory=JobStats)
    attempts: int = 0
    worker: Optional[int] = None
    backends: Optional[Backends] = None
    created: float = 0.0
    started: Optional[float] = None
    finished: Optional[float] = None
    removed: Optional[float] = None
    removed_why: str = ""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def to_dict(self) -> dict[str, Any]:
        """The status.json form; a deep copy (``from_dict(to_dict())`` is a snapshot)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(outputs=dict(self.outputs), timings=dict(self.timings), stats=self.stats.to_dict(),
                   backends=self.backends.to_dict() if self.backends is not None else {})
        if self.removed is None:   # only a removed job says so: a kept job's file is as it always was
            del out["removed"], out["removed_why"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobStatus":
        """Reads what ``to_dict`` wrote, and status.json files of earlier versions: keys it
        does not know are dropped, 'backends' {} (none yet) is None."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        kw["outputs"] = dict(kw.get("outputs") or {})
        kw["timings"] = dict(kw.get("timings") or {})
        kw["stats"] = JobStats.from_dict(kw.get("stats") or {})
        kw["backends"] = Backends.from_dict(kw["backends"]) if kw.get("backends") else None
        return cls(**kw)


@dataclass(frozen=True)
class Event:
    """One change of a job, as delivered by ``Job.events``. ``seq`` is per job,
    starts at 1 and increases by one with every event."""

    job_id: str
    seq: int
    time: float
    state: JobState
    stage: Optional[str]
    progress: float
    message: str
    stage_progress: float = 0.0


def atomic_write_json(path: Path, obj: Any, fsync: bool = True) -> None:
    atomic_write(path, json.dumps(obj, indent=1, sort_keys=True, default=str).encode(), fsync)


def safe_session(session: str) -> str:
    """A session name usable as a directory name; others are replaced by a stable hash."""
    session = str(session)
    if _SESSION_RE.fullmatch(session) and session not in (".", ".."):
        return session
    import hashlib

    return "s-" + hashlib.sha256(session.encode()).hexdigest()[:16]


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


class JobStore:
    """Creates, finds and updates job directories under ``root``."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._dirs: dict[str, Path] = {}

    # -- creating and finding ------------------------------------------------
    def create(self, rgb: np.ndarray, mask: np.ndarray, settings: Settings, session: str,
               more_masks: tuple[np.ndarray, ...] = ()) -> JobStatus:
        """Write a new job's inputs and settings; returns its first (queued) status.

        rgb: (H, W, 3) uint8; mask: (H, W) bool. ``more_masks``: the other objects of a scene
        (each (H, W) bool), written as inputs/mask_2.png, mask_3.png, ...
        """
        check_inputs(rgb, mask)
        for m in more_masks:
            check_inputs(rgb, m)
        d, st = self._new(session, "image")
        _write_photo(d, rgb, mask)
        for n, m in enumerate(more_masks, start=2):
            _write_mask(d / "inputs" / f"mask_{n}.png", m)
        return self._queued(d, st, settings)

    def create_bake(self, request: BakeRequest, copies: Mapping[str, Path], settings: Settings,
                    session: str, rgb: Optional[np.ndarray] = None,
                    mask: Optional[np.ndarray] = None, kind: JobKind = "bake") -> JobStatus:
        """Write a new bake job (or a fit job, ``kind`` "fit", laid out the same): its request,
        copies of its files (name under inputs/ -> source file) and its photo when it has one;
        returns its first (queued) status."""
        if request.photo:
            check_inputs(rgb, mask)
        d, st = self._new(session, kind)
        for name, src in copies.items():
            dst = d / "inputs" / name
            if not dst.resolve().is_relative_to((d / "inputs").resolve()):
                raise ValueError(f"{name}: a job's input must stay in its folder")
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        if request.photo:
            _write_photo(d, rgb, mask)
        atomic_write_json(d / "inputs" / "bake.json", request.to_dict())
        return self._queued(d, st, settings)

    def _new(self, session: str, kind: JobKind) -> tuple[Path, JobStatus]:
        """A new job's folder, under a hidden staging name until ``_queued`` renames it:
        a server killed while writing the inputs leaves a staging folder, which the next
        one removes (``remove_abandoned``), not a job folder without a job in it."""
        session = safe_session(session)
        job_id = new_job_id()
        d = self.root / session / f".{job_id}.{os.getpid()}.new"
        (d / "inputs").mkdir(parents=True)
        (d / "outputs").mkdir()
        return d, JobStatus(id=job_id, session=session, kind=kind, created=time.time(), message="queued")

    def _queued(self, staging: Path, st: JobStatus, settings: Settings) -> JobStatus:
        """Settings and status last, then the rename that makes it a job (``scan``)."""
        atomic_write_json(staging / "settings.json", settings.to_dict())
        self._dirs[st.id] = staging
        self.write_status(st)
        final = staging.with_name(st.id)
        os.rename(staging, final)
        self._dirs[st.id] = final
        return st

    def remove_abandoned(self) -> list[Path]:
        """Delete the staging folders of jobs whose creator died before they were whole
        (never acknowledged to anyone: the request that made them got no job id). A live
        creator's are left alone (its pid is in the name). Returns what it deleted."""
        gone = []
        for d in self.root.glob("*/.*.new"):
            m = _STAGING_RE.fullmatch(d.name)
            if m is None or not d.is_dir() or pid_alive(int(m.group(1))):
                continue
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
        return gone

    def job_dir(self, job_id: str) -> Path:
        d = self._dirs.get(job_id)
        if d is not None:
            return d
        if not _JOB_RE.fullmatch(job_id or ""):
            raise KeyError(f"no such job: {job_id!r}")
        for cand in self.root.glob(f"*/{job_id}"):
            if (cand / "status.json").is_file():
                self._dirs[job_id] = cand
                return cand
        raise KeyError(f"no such job: {job_id!r}")

    def forget(self, job_id: str) -> None:
        """Drop the remembered folder of a job that was deleted (``worker.upkeep.budget``)."""
        self._dirs.pop(job_id, None)

    # -- status, log ---------------------------------------------------------
    def read_status(self, job_id: str) -> JobStatus:
        return JobStatus.from_dict(json.loads((self.job_dir(job_id) / "status.json").read_text()))

    def write_status(self, st: JobStatus, fsync: bool = True) -> None:
        atomic_write_json(self.job_dir(st.id) / "status.json", st.to_dict(), fsync)

    def append_log(self, job_id: str, line: str) -> None:
        append_log(self.job_dir(job_id), line)

    def read_log(self, job_id: str, max_bytes: int = 64_000) -> str:
        path = self.job_dir(job_id) / "log"
        if not path.is_file():
            return ""
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - max_bytes))
            return f.read().decode(errors="replace")

    def read_result(self, job_id: str) -> Optional[WorkerReport]:
        """The worker's report of a done attempt (result.json), None when there is none."""
        path = self.job_dir(job_id) / "result.json"
        return WorkerReport.from_dict(json.loads(path.read_text())) if path.is_file() else None

    # -- listing and recovery --------------------------------------------------
    def scan(self) -> list[JobStatus]:
        """Every readable job on disk, oldest first."""
        out = []
        for status_file in self.root.glob("*/*/status.json"):
            if status_file.parent.name.startswith("."):
                continue  # a job still being made (``_new``), or what a dead server left of one
            try:
                st = JobStatus.from_dict(json.loads(status_file.read_text()))
            except (OSError, ValueError, TypeError):
                continue  # a foreign or damaged directory; leave it alone
            self._dirs[st.id] = status_file.parent
            out.append(st)
        out.sort(key=lambda s: (s.created, s.id))
        return out

    def interrupted(self) -> list[JobStatus]:
        """Jobs a previous server left queued or running, oldest first. Read once when a
        supervisor starts, before any worker exists, so nothing else writes their files."""
        return [st for st in self.scan() if st.state in (QUEUED, RUNNING)]

    def settle_failed(self, st: JobStatus, reason: str) -> None:
        """End ``st`` as failed for ``reason`` (its status and its log say it)."""
        st.state, st.error, st.message = FAILED, reason, reason
        st.seq += 1
        st.finished = time.time()
        self.write_status(st)
        self.append_log(st.id, reason)

    def write_digest(self, job_id: str, digest: str) -> None:
        atomic_write(self.job_dir(job_id) / "digest", digest.encode())

    def read_digest(self, job_id: str) -> Optional[str]:
        """The job's input digest, None when it was never written (a job from before digests
        were kept, or a server that died between creating the job and queueing it)."""
        try:
            return (self.job_dir(job_id) / "digest").read_text().strip() or None
        except OSError:
            return None


def append_log(job_dir: Path, line: str) -> None:
    """Append a timestamped line; O_APPEND keeps lines from two processes whole."""
    stamp = time.strftime("%H:%M:%S")
    text = "".join(f"{stamp} {ln}\n" for ln in str(line).rstrip("\n").split("\n"))
    fd = os.open(Path(job_dir) / "log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode(errors="replace"))
    finally:
        os.close(fd)


def check_inputs(rgb, mask) -> None:
    """Cheap shape/dtype checks on a job's inputs, before anything is written."""
    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError("image must be a (H, W, 3) uint8 array, got "
                         f"{getattr(rgb, 'dtype', type(rgb).__name__)} {getattr(rgb, 'shape', '')}")
    if not isinstance(mask, np.ndarray) or mask.shape != rgb.shape[:2]:
        raise ValueError(f"mask must be a (H, W) array matching the image {rgb.shape[:2]}, "
                         f"got {getattr(mask, 'shape', type(mask).__name__)}")
    if mask.dtype != np.bool_:
        raise ValueError(f"mask must be bool, got {mask.dtype}")
    small = image_size_problem(rgb.shape[1], rgb.shape[0])
    if small:
        raise ValueError(small)


def load_settings(job_dir: Path) -> Settings:
    """A job's settings (settings.json, as ``JobStore.create`` wrote them)."""
    return from_dict(json.loads((Path(job_dir) / "settings.json").read_text()))


def _write_photo(d: Path, rgb, mask) -> None:
    from PIL import Image

    # compress_level 1: these files are read once by the worker; speed beats size
    Image.fromarray(np.ascontiguousarray(rgb), "RGB").save(d / "inputs" / "image.png", compress_level=1)
    _write_mask(d / "inputs" / "mask.png", mask)


def _write_mask(path: Path, mask) -> None:
    from PIL import Image

    Image.fromarray(mask.astype(np.uint8) * 255, "L").save(path, compress_level=1)


def load_request(job_dir: Path) -> BakeRequest:
    """A bake job's request (inputs/bake.json)."""
    return BakeRequest.from_dict(json.loads((Path(job_dir) / "inputs" / "bake.json").read_text()))


def is_scene(job_dir: Path, kind: str) -> bool:
    """Whether the job in ``job_dir`` makes one scene of several objects: an image job with
    more masks (inputs/mask_2.png), a bake job whose request says so; False when unreadable."""
    d = Path(job_dir) / "inputs"
    if kind == "image":
        return (d / "mask_2.png").is_file()
    if kind == "bake":
        try:
            return bool(json.loads((d / "bake.json").read_text()).get("scene", False))
        except (OSError, ValueError, AttributeError):
            return False
    return False


def load_inputs(job_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(rgb (H, W, 3) uint8, mask (H, W) bool) of a job."""
    from PIL import Image

    d = Path(job_dir) / "inputs"
    with Image.open(d / "image.png") as im:
        rgb = np.asarray(im.convert("RGB"))
    with Image.open(d / "mask.png") as im:
        mask = np.asarray(im.convert("L")) > 127
    return rgb, mask


def load_more_masks(job_dir: Path) -> list[np.ndarray]:
    """The other objects' masks of a scene photo job (inputs/mask_2.png, ...; (H, W) bool each),
    in order; empty for a job of one object."""
    from PIL import Image

    d = Path(job_dir) / "inputs"
    out = []
    n = 2
    while (d / f"mask_{n}.png").is_file():
        with Image.open(d / f"mask_{n}.png") as im:
            out.append(np.asarray(im.convert("L")) > 127)
        n += 1
    return out
