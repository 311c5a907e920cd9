"""The supervisor: lives in the app (or CLI) process, owns the job queue and the workers.

It never imports ``pipeline/`` or touches CUDA. Workers are started with the
``spawn`` start method in ``worker.slots.WorkerSlot``s, each with its own pair of
queues that die with it. A dispatcher thread drains the workers' messages, hands
queued jobs to idle workers, watches deadlines and exit codes, and turns every way
a worker can die into a job that ends ``failed`` with a reason a person can read,
followed by a fresh worker:

* killed by a signal / exited: "worker crashed with SIGSEGV during stage 'bake'";
  retried once with safe backends when ``worker.retry_with_fallback`` allows,
  unless the same input already crashed a worker twice;
* hung (a stage silent for ``worker.stage_timeout_s``): SIGTERM, SIGKILL after a
  grace period, then treated as a crash;
* frozen (a busy worker that neither used CPU time nor sent a message for
  ``worker.stall_timeout_s``, e.g. stopped by SIGSTOP or deadlocked; see
  ``worker.liveness``): stopped the same way, then treated as a crash;
* CUDA error: the worker reports it and exits (its CUDA context is poisoned);
  CUDA out of memory: retried once with a smaller chunk scale, then failed;
* cancel: the worker running the job is killed and replaced.

Typical use (the CLI)::

    with Supervisor(settings, jobs_dir, cache_dir) as sup:
        job_id = sup.submit(rgb, mask, settings)
        for ev in sup.follow(job_id):
            print(ev.stage, ev.progress)
        st = sup.status(job_id)
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from kiln.settings import Settings
from kiln.settings import load as load_settings

from . import env as env_mod
from . import interpreter
from .faults import FaultPlan
from kiln.glb import GLBError, check_glb_light
from .jobstore import (Event, JobStatus, JobStore, append_log, atomic_write_json, check_inputs,
                       safe_session)
from .slots import WorkerSlot, copy_json, describe_exit

log = logging.getLogger("kiln.worker")

# Settings a crashed job is retried with: the CPU twin of every GPU backend.
FALLBACK = {"views.backend": "cpu", "rasterize.backend": "moderngl", "worker.device": "cpu"}
FALLBACK_TEXT = "CPU renderer, moderngl rasterizer, CPU device"
OOM_CHUNK_SCALE = 0.5
# Rough share of a job's time per stage, for one overall progress number.
STAGE_WEIGHTS = {"reconstruct": 0.30, "render_views": 0.15, "mesh": 0.05, "uv": 0.15,
                 "bake": 0.30, "export": 0.05}
STAGE_ORDER = tuple(STAGE_WEIGHTS)
EVENTS_KEPT = 2000          # per running job
EVENTS_KEPT_FINISHED = 200


class QueueFullError(RuntimeError):
    """More jobs are waiting than ``worker.max_queue`` allows."""


class WorkerStartError(RuntimeError):
    """No worker could be started; the message carries the reason and the log's tail."""


def _where(stage: Optional[str]) -> str:
    return f"during stage '{stage}'" if stage else "before its first stage"


def input_digest(rgb: np.ndarray, mask: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in (rgb, mask):
        h.update(str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@dataclass
class _Job:
    status: JobStatus
    dir: Path
    settings: dict = field(default_factory=dict)
    digest: str = ""
    events: list = field(default_factory=list)
    attempt: int = 0
    overrides: dict = field(default_factory=dict)
    chunk_scale: float = 1.0
    crash_retried: bool = False
    oom_retried: bool = False
    error_retried: bool = False
    # Set by cancel(): a retry already on its way (a failure report or a crash that
    # crossed the cancel) must end the job instead of queueing it again.
    cancel_requested: bool = False
    notes: list = field(default_factory=list)   # earlier attempts' failures

    @property
    def stages(self) -> tuple:
        if self.settings.get("bake", {}).get("enabled", True):
            return STAGE_ORDER
        return ("reconstruct", "mesh", "export")

    @property
    def stage_timeout(self) -> float:
        return float(self.settings.get("worker", {}).get("stage_timeout_s", 600.0))

    @property
    def stall_timeout(self) -> float:
        return float(self.settings.get("worker", {}).get("stall_timeout_s", 30.0))

    @property
    def retry_allowed(self) -> bool:
        return bool(self.settings.get("worker", {}).get("retry_with_fallback", True))

    @property
    def log_marker(self) -> str:
        """The line the worker prints into its own log when it starts this attempt."""
        return f"=== job {self.status.id} attempt {self.attempt} ==="


class Supervisor:
    """Job queue + crash-isolated workers. Thread-safe; see the module docstring."""

    def __init__(self, settings: Optional[Settings] = None, jobs_dir: Optional[Path] = None,
                 cache_dir: Optional[Path] = None, *, var_dir: Optional[Path] = None,
                 faults: Optional[FaultPlan] = None, poll_s: float = 0.02):
        self.settings = settings or load_settings()
        self.jobs_dir = Path(jobs_dir if jobs_dir is not None else self.settings.app.jobs_dir)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.var_dir = Path(var_dir) if var_dir is not None else self.jobs_dir.resolve().parent
        self.store = JobStore(self.jobs_dir)
        # Test-only fault hook: a constructor argument or KILN_TEST_FAULTS, nothing else.
        self.faults = faults if faults is not None else FaultPlan.from_env()
        self._poll_s = poll_s
        self._ctx = mp.get_context("spawn")
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._jobs: dict[str, _Job] = {}
        self._queue: deque[_Job] = deque()
        self._slots: list[WorkerSlot] = []
        self._thread: Optional[threading.Thread] = None
        self._started = False
        self._stopping = False
        self._crash_file = self.jobs_dir / ".crash_counts.json"
        self._crashes: dict[str, int] = {}
        self._heartbeat_limit = max(10.0, 10 * self.settings.worker.heartbeat_s)
        self.metrics: dict = {"last_ready": None}   # wall time a worker last became ready

    # ------------------------------------------------------------------ lifecycle
    def start(self, wait: bool = True, timeout: Optional[float] = None) -> "Supervisor":
        """Recover jobs a previous run left behind, spawn the workers and (by default)
        wait until each has reported its capabilities or given up. When that wait fails
        (WorkerStartError, Ctrl-C) everything started is stopped again before it raises:
        the caller never got a supervisor to shut down."""
        with self._lock:
            if self._started:
                return self
            self._started = True
            for st in self.store.recover():
                log.warning("job %s: %s", st.id, st.error)
            for st in self.store.scan():
                self._jobs[st.id] = _Job(status=st, dir=self.store.job_dir(st.id))
            self._crashes = self._load_crashes()
            gpus = [] if self.settings.worker.device == "cpu" else env_mod.detect_gpus()
            count = self.settings.worker.count or max(1, len(gpus))
            self._slots = [WorkerSlot(i, gpus[i % len(gpus)] if gpus else None,
                                      self.var_dir / "workers" / f"worker-{i}.log")
                           for i in range(count)]
            for s in self._slots:
                self._spawn(s)
            self._thread = threading.Thread(target=self._loop, name="kiln-supervisor", daemon=True)
            self._thread.start()
        if wait:
            try:
                self.wait_ready(timeout)
            except BaseException:
                self.shutdown()
                raise
        return self

    def wait_ready(self, timeout: Optional[float] = None) -> None:
        """Block until every worker is ready or has given up; raise WorkerStartError
        when none is ready."""
        if timeout is None:
            timeout = 60.0 + 6 * self.settings.worker.probe_timeout_s
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                ready = [s for s in self._slots if s.state in ("idle", "busy")]
                settled = all(s.broken or s.state in ("idle", "busy") for s in self._slots)
                left = deadline - time.monotonic()
                if settled or left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            if ready:
                return
            if settled:
                why = "; ".join(s.broken for s in self._slots)
            else:
                why = (f"no worker became ready within {timeout:.0f} s ("
                       + "; ".join(f"worker {s.index}: {s.state}" for s in self._slots) + ")")
            slot = self._slots[0]
            tail = slot.log_tail(30, slot.start_marker)   # its last start
            raise WorkerStartError(why + (f"\n{slot.log_path}:\n{tail}" if tail else ""))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the workers (gracefully, then by force) and fail jobs that cannot finish now."""
        with self._lock:
            if not self._started or self._stopping:
                return
            self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for s in self._slots:
                if s.proc is None:
                    continue
                self._drain(s)  # a result the worker already reported still counts
                if not (s.state == "idle" and s.send({"type": "stop"})):
                    s.kill("shutdown")
            deadline = time.monotonic() + timeout
            for s in self._slots:
                if s.proc is not None:
                    s.proc.join(max(0.1, deadline - time.monotonic()))
                    s.discard()
            for job in list(self._jobs.values()):
                if job.status.terminal:
                    continue
                if job.cancel_requested:   # its worker was being stopped for the cancel anyway
                    self._finish(job, "cancelled", "cancelled by user")
                    continue
                if job.status.state == "running":
                    reason = f"the server shut down {_where(job.status.stage)}"
                elif job.attempt:
                    reason = "the server shut down before the job's retry started"
                else:
                    reason = "the server shut down before the job started"
                self._finish(job, "failed", reason)
            self._queue.clear()
            self._cond.notify_all()

    def __enter__(self) -> "Supervisor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ public API
    def submit(self, rgb: np.ndarray, mask: np.ndarray, settings: Optional[Settings] = None,
               session: str = "cli") -> str:
        """Queue a job. rgb: (H, W, 3) uint8; mask: (H, W) bool. Returns the job id.

        Raises ValueError for malformed inputs, QueueFullError when too many wait.
        """
        if not self._started or self._stopping:
            raise RuntimeError("the supervisor is not running; call start() first")
        check_inputs(rgb, mask)
        settings = settings or self.settings
        limit = self.settings.worker.max_queue
        with self._lock:
            if len(self._queue) >= limit:
                raise QueueFullError(f"{len(self._queue)} jobs are already waiting (worker.max_queue"
                                     f" = {limit}); try again later")
        sdict = settings.to_dict()
        st = self.store.create(rgb, mask, sdict, session)
        job = _Job(status=st, dir=self.store.job_dir(st.id), settings=sdict,
                   digest=input_digest(rgb, mask))
        with self._lock:
            self._jobs[st.id] = job
            # checked again here: shutdown may have run while the job's files were written,
            # and a job queued after it would wait for ever
            if self._stopping:
                self._finish(job, "failed", "the server shut down before the job started")
                return st.id
            if all(s.broken for s in self._slots):
                self._finish(job, "failed", "no worker is available: "
                             + "; ".join(s.broken for s in self._slots))
                return st.id
            ahead = len(self._queue)
            self._queue.append(job)
            self._emit(job, message=f"queued ({ahead} ahead)" if ahead else "queued")
        self._wake.set()
        return st.id

    def status(self, job_id: str) -> JobStatus:
        """A snapshot of the job's status (KeyError for an unknown id)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                return JobStatus.from_dict(job.status.to_dict())
        return self.store.read_status(job_id)

    def wait(self, job_id: str, timeout: Optional[float] = None) -> JobStatus:
        """Block until the job ends (done/failed/cancelled) or ``timeout`` passes;
        returns the status either way."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                job = self._jobs.get(job_id)
                if job is None or job.status.terminal:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(0.5 if left is None else min(left, 0.5))
        return self.status(job_id)

    def events(self, job_id: str, since_seq: int = 0, timeout: Optional[float] = None) -> list[Event]:
        """Events of a job with ``seq > since_seq``, oldest first. With ``timeout``, wait up
        to that long for at least one (or for the job to end)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                job = self._jobs.get(job_id)
                if job is None:
                    st = self.store.read_status(job_id)
                    return [_event_of(st)] if st.seq > since_seq else []
                out = [e for e in job.events if e.seq > since_seq]
                if out or job.status.terminal or deadline is None:
                    if not out and job.status.seq > since_seq:
                        out = [_event_of(job.status)]  # older events were trimmed
                    return out
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._cond.wait(min(left, 0.5))

    def follow(self, job_id: str, timeout: Optional[float] = None) -> Iterator[Event]:
        """Yield the job's events as they happen until it ends (or ``timeout`` passes)."""
        seq = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            evs = self.events(job_id, seq, timeout=1.0 if left is None else min(left, 1.0))
            for ev in evs:
                seq = ev.seq
                yield ev
            if self.status(job_id).terminal and not self.events(job_id, seq):
                return

    def run(self, rgb: np.ndarray, mask: np.ndarray, settings: Optional[Settings] = None,
            session: str = "cli", on_event: Optional[Callable[[Event], None]] = None,
            timeout: Optional[float] = None) -> JobStatus:
        """Submit, follow (calling ``on_event`` for each event) and return the final status."""
        job_id = self.submit(rgb, mask, settings, session)
        for ev in self.follow(job_id, timeout):
            if on_event is not None:
                on_event(ev)
        return self.status(job_id)

    def cancel(self, job_id: str, timeout: float = 5.0) -> bool:
        """Cancel a queued or running job; a running job's worker is killed and replaced.
        Returns True when the job ended cancelled."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.status.terminal:
                return False
            job.cancel_requested = True
            if job in self._queue:
                self._queue.remove(job)
                self._finish(job, "cancelled", "cancelled before it started")
                return True
            slot = next((s for s in self._slots if s.job is job), None)
            if slot is None:  # not expected: a job that is not terminal is queued or on a slot
                self._finish(job, "cancelled", "cancelled")
                return True
            if slot.kill_reason is None:
                slot.kill("cancel")
        self._wake.set()
        return self.wait(job_id, timeout).state == "cancelled"

    def capabilities(self) -> dict:
        """What the first ready worker reported: device, cuda, gsplat, nvdiffrast, moderngl,
        cpu, sam3d (bools) and 'reasons' for each False."""
        with self._lock:
            for s in self._slots:
                if s.caps is not None:
                    return copy_json(s.caps)
        return {}

    def workers(self) -> list[dict]:
        """One dict per worker slot: slot, pid, state, gpu, job, restarts, startup_s, broken,
        heartbeat_age_s, capabilities (as last reported), log (path of the worker's log)."""
        now = time.monotonic()
        with self._lock:
            return [s.info(now, s.job.status.id if s.job else None) for s in self._slots]

    def queue_length(self) -> int:
        with self._lock:
            return len(self._queue)

    def jobs(self, session: Optional[str] = None) -> list[JobStatus]:
        """Jobs of one session (all sessions when None), oldest first, including earlier runs'."""
        want = safe_session(session) if session is not None else None
        with self._lock:
            out = [JobStatus.from_dict(j.status.to_dict()) for j in self._jobs.values()
                   if want is None or j.status.session == want]
        out.sort(key=lambda s: (s.created, s.id))
        return out

    def log(self, job_id: str, max_bytes: int = 64_000) -> str:
        """The tail of the job's human-readable log."""
        return self.store.read_log(job_id, max_bytes)

    def job_dir(self, job_id: str) -> Path:
        return self.store.job_dir(job_id)

    # ------------------------------------------------------------------ dispatcher
    def _loop(self) -> None:
        while True:
            with self._lock:
                if self._stopping:
                    return
                try:
                    self._tick()
                except Exception:  # the dispatcher must outlive any bug in one tick
                    log.exception("supervisor tick failed")
            self._wake.wait(self._poll_s)
            self._wake.clear()

    def _tick(self) -> None:
        for s in self._slots:
            if s.proc is None:
                if not s.broken and time.monotonic() >= s.next_spawn:
                    self._spawn(s)
                continue
            self._drain(s)
            if s.exited:
                self._drain(s)  # whatever it said just before dying
                self._on_exit(s)
                continue
            s.watch(time.monotonic(), self.settings.worker.probe_timeout_s, self._heartbeat_limit,
                    s.job.stage_timeout if s.job is not None else 0.0,
                    s.job.stall_timeout if s.job is not None else 0.0)
        self._assign()

    def _spawn(self, s: WorkerSlot) -> None:
        ws = self.settings.worker
        cfg = {"device": ws.device, "heartbeat_s": ws.heartbeat_s,
               "probe_timeout_s": ws.probe_timeout_s,
               "torch_extensions_dir": str(self.var_dir / "torch_extensions"),
               "faults_enabled": self.faults is not None,
               "probe_faults": self.faults.probe_faults(s.starts + 1) if self.faults else {},
               "parent_pid": os.getpid(), "settings": self.settings.to_dict()}
        try:
            cfg.update(interpreter.worker_config(ws.python))    # {} unless worker.python is set
            with interpreter.spawning(self._ctx, cfg.get("python")):
                s.spawn(self._ctx, cfg)
        except Exception as e:  # e.g. out of file descriptors: back off, then retry
            self._start_failed(s, f"could not be spawned ({type(e).__name__}: {e})")

    def _drain(self, s: WorkerSlot) -> None:
        for msg in s.messages():
            try:
                self._handle(s, msg)
            except Exception:
                log.exception("bad message from worker %d: %r", s.index, msg)

    def _handle(self, s: WorkerSlot, msg: dict) -> None:
        now = time.monotonic()
        if s.note(msg, now):
            if msg.get("type") == "ready":
                self.metrics["last_ready"] = time.time()
                self._cond.notify_all()
            return
        kind = msg.get("type")
        job = s.job
        if job is None or msg.get("job") != job.status.id:
            return  # a late message about a job this worker no longer owns
        if kind == "started":
            job.status.backends = msg.get("backends", {})
        elif kind == "event":
            s.last_progress = now
            self._on_progress(job, msg["stage"], float(msg["fraction"]), msg.get("message", ""))
        elif kind == "done":
            s.job, s.state = None, "idle"
            self._on_done(job, msg)
        elif kind == "failed":
            s.job = None
            if msg.get("kind") == "cuda":
                s.state, s.stop_since = "stopping", now   # it exits by itself; see WorkerSlot.watch
            else:
                s.state = "idle"
            self._on_failed(job, msg)

    def _assign(self) -> None:
        for s in self._slots:
            if not self._queue:
                return
            if s.state != "idle" or s.kill_reason:
                continue
            job = self._queue[0]
            attempt = job.attempt + 1
            fault = self.faults.pick(job.status.session, attempt) if self.faults else None
            msg = {"type": "run", "job": job.status.id, "dir": str(job.dir), "attempt": attempt,
                   "overrides": job.overrides, "chunk_scale": job.chunk_scale,
                   "cache_dir": str(self.cache_dir) if self.cache_dir else None, "fault": fault}
            if not s.send(msg):
                continue
            self._queue.popleft()
            job.attempt = attempt
            s.state, s.job = "busy", job
            s.last_progress = time.monotonic()
            st = job.status
            st.attempts, st.worker = attempt, s.index
            if st.started is None:
                st.started = time.time()
            what = f"running on worker {s.index}"
            if attempt > 1:
                what += f" (attempt {attempt})"
            self._emit(job, state="running", stage=None, message=what, force_write=True)

    def _on_exit(self, s: WorkerSlot) -> None:
        code = s.proc.exitcode
        desc = describe_exit(code)
        job, reason, was, frozen_status = s.job, s.kill_reason, s.state, s.frozen_status
        if was == "starting":
            what = s.start_ended(desc)   # before discard(): it needs the probe that ran
            s.discard()
            if what is not None:
                self._start_failed(s, what)
            self._cond.notify_all()
            return
        tail = s.log_tail(60, job.log_marker) if job is not None else ""
        s.discard()
        s.restarts += 1
        if job is None:
            if reason not in ("cancel", "shutdown") and was != "stopping":
                log.warning("worker %d %s while idle (%s)", s.index, desc, reason or "no job")
            return
        stage = job.status.stage
        if reason == "cancel" or job.cancel_requested:
            append_log(job.dir, "cancelled: the worker running it was stopped")
            self._finish(job, "cancelled", "cancelled by user")
            return
        how = {-signal.SIGTERM: "SIGTERM", -signal.SIGKILL: "SIGKILL"}.get(code, desc)
        if reason == "hang":
            why = (f"worker hung {_where(stage)}: no progress for {job.stage_timeout:g} s "
                   f"(worker.stage_timeout_s); it was stopped with {how}")
        elif reason == "frozen":
            why = (f"worker froze {_where(stage)}: it used no CPU time and sent nothing for "
                   f"{job.stall_timeout:g} s (worker.stall_timeout_s; process state "
                   f"'{frozen_status}'); it was stopped with {how}")
        else:
            why = f"worker {desc} {_where(stage)}"
        if tail:
            append_log(job.dir, "worker log around the failure:\n" + tail)
        self._crashed(job, why)

    def _start_failed(self, s: WorkerSlot, what: str) -> None:
        s.count_start_failure(what)
        log.error("worker %d %s (%d in a row; see %s)", s.index, what, s.failures, s.log_path)
        if s.broken:
            self._fail_if_no_workers()
        self._cond.notify_all()

    def _fail_if_no_workers(self) -> None:
        if any(not s.broken for s in self._slots):
            return
        why = "; ".join(s.broken for s in self._slots)
        while self._queue:
            self._finish(self._queue.popleft(), "failed", f"no worker could start: {why}")

    # ------------------------------------------------------------------ job outcomes
    def _on_progress(self, job: _Job, stage: str, fraction: float, message: str) -> None:
        stages = job.stages
        total = sum(STAGE_WEIGHTS.get(x, 0.1) for x in stages) or 1.0
        done = 0.0
        for x in stages:
            if x == stage:
                break
            done += STAGE_WEIGHTS.get(x, 0.1)
        fraction = min(max(fraction, 0.0), 1.0)
        progress = max(job.status.progress, min(1.0, (done + STAGE_WEIGHTS.get(stage, 0.1) * fraction)
                                                / total))
        text = f"{stage}: {message}" if message else stage
        self._emit(job, stage=stage, progress=progress, message=text, stage_progress=fraction)

    def _on_done(self, job: _Job, msg: dict) -> None:
        glb = Path(msg["glb"])
        try:
            light = check_glb_light(glb)
        except GLBError as e:
            reason = f"the result failed its check after stage 'export': {e}"
            append_log(job.dir, reason)
            self._finish(job, "failed", reason)
            return
        result = self.store.read_result(job.status.id)
        st = job.status
        st.outputs = {"glb": str(glb)}
        if msg.get("ply"):
            st.outputs["ply"] = msg["ply"]
        st.timings = dict(result.get("timings", {}))
        st.stats = dict(result.get("stats", {}))
        st.stats["glb_check"] = result.get("check", light)
        st.stats["job"] = dict(result.get("job", {}))
        if job.notes:
            st.stats["earlier_attempts"] = list(job.notes)
        st.backends = result.get("backends", st.backends)
        msg_text = "done" + (f" (after: {job.notes[-1]})" if job.notes else "")
        self._finish(job, "done", msg_text, progress=1.0)

    def _on_failed(self, job: _Job, msg: dict) -> None:
        kind, stage, err = msg.get("kind", "error"), msg.get("stage"), msg.get("error", "")
        if stage:
            job.status.stage = stage
        first = err.strip().splitlines()[0] if err.strip() else "unknown error"
        if kind == "oom":
            why = f"CUDA out of memory {_where(stage)}"
            if not job.oom_retried:
                job.oom_retried = True
                job.chunk_scale = OOM_CHUNK_SCALE
                self._retry(job, why, f"retrying once with chunk scale {OOM_CHUNK_SCALE:g}")
            else:
                self._finish(job, "failed", f"{why}, also after retrying with chunk scale "
                                            f"{job.chunk_scale:g}: {first}")
        elif kind == "cuda":
            self._crashed(job, f"CUDA error {_where(stage)}: {first}; the worker was restarted "
                               "to get a fresh CUDA context")
        elif kind == "input":
            self._finish(job, "failed", f"stage '{stage}' rejected its input: {first}" if stage
                         else f"the job could not start: {first}")
        else:
            why = f"stage '{stage}' failed: {first}" if stage else f"the job could not start: {first}"
            if _used_gpu(job) and job.retry_allowed and not job.error_retried and not job.overrides:
                job.error_retried = True
                job.overrides = dict(FALLBACK)
                self._retry(job, why, f"retrying once with safe backends ({FALLBACK_TEXT})")
            else:
                self._finish(job, "failed", why)

    def _crashed(self, job: _Job, why: str) -> None:
        """A crash-like failure (signal, exit, hang, CUDA error): count it against the input;
        retry once with safe backends if allowed and this input is not a repeat offender."""
        count = self._crashes.get(job.digest, 0) + 1 if job.digest else 0
        if job.digest:
            self._crashes[job.digest] = count
            self._save_crashes()
        append_log(job.dir, why)
        if not job.retry_allowed:
            self._finish(job, "failed", why)
        elif job.crash_retried:
            self._finish(job, "failed", f"{why}; this was the retry with safe backends after: "
                                        f"{job.notes[-1]}; not retried again")
        elif count > 1:
            self._finish(job, "failed", f"{why}; not retried: this input has now crashed a "
                                        f"worker {count} times")
        else:
            job.crash_retried = True
            job.overrides = dict(FALLBACK)
            self._retry(job, why, f"retrying once with safe backends ({FALLBACK_TEXT})")

    def _retry(self, job: _Job, why: str, what: str) -> None:
        if job.cancel_requested:
            append_log(job.dir, f"{why}; not retried: the job was cancelled")
            self._finish(job, "cancelled", "cancelled by user")
            return
        job.notes.append(why)
        append_log(job.dir, f"{why}; {what}")
        self._queue.appendleft(job)
        self._emit(job, state="queued", message=f"{why}; {what}", force_write=True)
        self._wake.set()

    def _finish(self, job: _Job, state: str, message: str, progress: Optional[float] = None) -> None:
        st = job.status
        st.finished = time.time()
        times = dict(st.stats.get("job", {}))
        if st.started is not None:
            times["queued_s"] = round(st.started - st.created, 3)
        times["total_s"] = round(st.finished - st.created, 3)
        st.stats = {**st.stats, "job": times}
        st.timings = {**st.timings, "total_s": times["total_s"]}
        if "queued_s" in times:
            st.timings["queued_s"] = times["queued_s"]
        if state != "done":
            st.error = message
        if state in ("failed", "cancelled"):
            append_log(job.dir, f"{state}: {message}")
        self._emit(job, state=state, message=message, progress=progress, force_write=True)
        # a long-running server keeps every job's record; only recent events of finished ones
        del job.events[:-EVENTS_KEPT_FINISHED]

    def _emit(self, job: _Job, state: Optional[str] = None, stage: object = ...,
              progress: Optional[float] = None, message: Optional[str] = None,
              stage_progress: Optional[float] = None, force_write: bool = False) -> None:
        st = job.status
        changed = force_write
        if state is not None and state != st.state:
            st.state, changed = state, True
        if stage is not ... and stage != st.stage:
            st.stage, st.stage_progress, changed = stage, 0.0, True
        if stage_progress is not None:
            st.stage_progress = float(stage_progress)
        if progress is not None:
            st.progress = float(progress)
        if message is not None:
            st.message = message
        st.seq += 1
        job.events.append(_event_of(st, time.time()))
        if len(job.events) > EVENTS_KEPT:
            del job.events[: len(job.events) - EVENTS_KEPT]
        # Written on every event so the seq on disk is never behind one a client saw (a
        # restarted server continues from it); fsync only for state/stage changes.
        self.store.write_status(st, fsync=changed)
        self._cond.notify_all()

    # ------------------------------------------------------------------ crash memory
    def _load_crashes(self) -> dict:
        try:
            data = json.loads(self._crash_file.read_text())
            return {str(k): int(v) for k, v in data.items()}
        except (OSError, ValueError, AttributeError):
            return {}

    def _save_crashes(self) -> None:
        try:
            atomic_write_json(self._crash_file, self._crashes)
        except OSError as e:
            log.warning("cannot record crash counts: %s", e)


def _event_of(st: JobStatus, at: Optional[float] = None) -> Event:
    return Event(job_id=st.id, seq=st.seq, time=at if at is not None else (st.finished or st.created),
                 state=st.state, stage=st.stage, progress=st.progress, message=st.message,
                 stage_progress=st.stage_progress)


def _used_gpu(job: _Job) -> bool:
    b = job.status.backends or {}
    return (str(b.get("device", "cpu")).startswith("cuda") or b.get("render") == "gsplat"
            or b.get("rasterize") == "nvdiffrast")
