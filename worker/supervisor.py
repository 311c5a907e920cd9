"""The supervisor: lives in the app (or CLI) process, owns the job queue and the workers.

It never imports ``pipeline/`` or touches CUDA. Workers are started with the
``spawn`` start method, each with its own pair of queues that die with it. A
dispatcher thread drains the workers' messages, hands queued jobs to idle
workers, watches deadlines and exit codes, and turns every way a worker can die
into a job that ends ``failed`` with a reason a person can read, followed by a
fresh worker:

* killed by a signal / exited: "worker crashed with SIGSEGV during stage 'bake'";
  retried once with safe backends when ``worker.retry_with_fallback`` allows,
  unless the same input already crashed a worker twice;
* hung (a stage silent for ``worker.stage_timeout_s``): SIGTERM, SIGKILL after a
  grace period, then treated as a crash;
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
from . import process as process_mod
from .faults import FaultPlan
from .glb import GLBError, check_glb_light
from .jobstore import Event, JobStatus, JobStore, append_log, atomic_write_json, check_inputs

log = logging.getLogger("kiln.worker")

# Settings a crashed job is retried with: the CPU twin of every GPU backend.
FALLBACK = {"views.backend": "cpu", "rasterize.backend": "moderngl", "worker.device": "cpu"}
FALLBACK_TEXT = "CPU renderer, moderngl rasterizer, CPU device"
OOM_CHUNK_SCALE = 0.5
# Rough share of a job's time per stage, for one overall progress number.
STAGE_WEIGHTS = {"reconstruct": 0.30, "render_views": 0.15, "mesh": 0.05, "uv": 0.15,
                 "bake": 0.30, "export": 0.05}
STAGE_ORDER = tuple(STAGE_WEIGHTS)
KILL_GRACE_S = 1.0          # SIGTERM -> SIGKILL
STARTUP_FAILURES_LIMIT = 3  # consecutive failed starts before a slot gives up
EVENTS_KEPT = 2000          # per running job
EVENTS_KEPT_FINISHED = 200


class QueueFullError(RuntimeError):
    """More jobs are waiting than ``worker.max_queue`` allows."""


class WorkerStartError(RuntimeError):
    """No worker could be started; the message carries the reason and the log's tail."""


def describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"crashed with {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


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
    def retry_allowed(self) -> bool:
        return bool(self.settings.get("worker", {}).get("retry_with_fallback", True))


class _Slot:
    """One worker position. The process in it comes and goes; the slot stays."""

    def __init__(self, index: int, gpu: Optional[str]):
        self.index = index
        self.gpu = gpu
        self.skip_probes: dict = {}
        self.failures = 0            # consecutive failed starts
        self.restarts = 0
        self.next_spawn = 0.0
        self.broken: Optional[str] = None
        self.caps: Optional[dict] = None   # last reported, kept across restarts
        self.reset()

    def reset(self) -> None:
        self.proc = None
        self.inbox = None
        self.outbox = None
        self.state = "down"          # down | starting | idle | busy | stopping
        self.job: Optional[_Job] = None
        self.spawned = 0.0
        self.ready_at = 0.0
        self.startup_s = None
        self.last_msg = 0.0
        self.last_progress = 0.0
        self.probe: Optional[str] = None
        self.probe_since = 0.0
        self.kill_reason: Optional[str] = None
        self.term_sent = 0.0
        self.kill_sent = 0.0
        self.stop_since = 0.0


class Supervisor:
    """Job queue + crash-isolated workers. Thread-safe; see the module docstring."""

    def __init__(self, settings: Optional[Settings] = None, jobs_dir: Optional[Path] = None,
                 cache_dir: Optional[Path] = None, *, var_dir: Optional[Path] = None,
                 faults: Optional[FaultPlan] = None, poll_s: float = 0.02):
        self.settings = settings or load_settings()
        ws = self.settings.worker
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
        self._slots: list[_Slot] = []
        self._thread: Optional[threading.Thread] = None
        self._started = False
        self._stopping = False
        self._crash_file = self.jobs_dir / ".crash_counts.json"
        self._crashes: dict[str, int] = {}
        self._heartbeat_limit = max(10.0, 10 * ws.heartbeat_s)
        self.metrics: dict = {"spawns": 0, "crashes": 0, "last_exit_detected": None,
                              "last_ready": None}

    # ------------------------------------------------------------------ lifecycle
    def start(self, wait: bool = True, timeout: Optional[float] = None) -> "Supervisor":
        """Recover jobs a previous run left behind, spawn the workers and (by default)
        wait until each has reported its capabilities or given up."""
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
            self._slots = [_Slot(i, gpus[i % len(gpus)] if gpus else None) for i in range(count)]
            for s in self._slots:
                self._spawn(s)
            self._thread = threading.Thread(target=self._loop, name="kiln-supervisor", daemon=True)
            self._thread.start()
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: Optional[float] = None, all_workers: bool = True) -> None:
        """Block until workers are ready; raise WorkerStartError if none could start."""
        if timeout is None:
            timeout = 60.0 + 6 * self.settings.worker.probe_timeout_s
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                ready = [s for s in self._slots if s.state in ("idle", "busy")]
                settled = all(s.broken or s.state in ("idle", "busy") for s in self._slots)
                if (ready and (settled or not all_workers)) or (settled and not ready):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            if not ready:
                why = "; ".join(f"worker {s.index}: {s.broken or s.state}" for s in self._slots)
                raise WorkerStartError(f"no worker became ready within {timeout:.0f} s ({why})\n"
                                       + self._worker_log_tail(self._slots[0], 30))

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
                if s.state == "idle":
                    try:
                        s.inbox.put({"type": "stop"})
                    except (OSError, ValueError):
                        s.proc.terminate()
                else:
                    s.proc.terminate()
            deadline = time.monotonic() + timeout
            for s in self._slots:
                if s.proc is None:
                    continue
                s.proc.join(max(0.1, deadline - time.monotonic()))
                if s.proc.is_alive():
                    s.proc.kill()
                    s.proc.join(2)
                self._discard(s)
            for job in list(self._jobs.values()):
                if job.status.terminal:
                    continue
                if job.status.state == "running":
                    reason = f"the server shut down {_where(job.status.stage)}"
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
        with self._lock:
            waiting = sum(1 for j in self._queue if not j.status.terminal)
            if waiting >= self.settings.worker.max_queue:
                raise QueueFullError(f"{waiting} jobs are already waiting (worker.max_queue = "
                                     f"{self.settings.worker.max_queue}); try again later")
        sdict = settings.to_dict()
        st = self.store.create(rgb, mask, sdict, session)
        job = _Job(status=st, dir=self.store.job_dir(st.id), settings=sdict,
                   digest=input_digest(rgb, mask))
        with self._lock:
            self._jobs[st.id] = job
            usable = [s for s in self._slots if not s.broken]
            if not usable:
                self._finish(job, "failed", "no worker is available: "
                             + "; ".join(s.broken or "" for s in self._slots))
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
                    return [self._event_of(st)] if st.seq > since_seq else []
                out = [e for e in job.events if e.seq > since_seq]
                if out or job.status.terminal or deadline is None:
                    if not out and job.status.seq > since_seq:
                        out = [self._event_of(job.status)]  # older events were trimmed
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
            if job in self._queue:
                self._queue.remove(job)
                self._finish(job, "cancelled", "cancelled before it started")
                return True
            slot = next((s for s in self._slots if s.job is job), None)
            if slot is None:  # between attempts; nothing runs it right now
                self._finish(job, "cancelled", "cancelled")
                return True
            if slot.kill_reason is None:
                self._kill(slot, "cancel")
        self._wake.set()
        return self.wait(job_id, timeout).state == "cancelled"

    def capabilities(self) -> dict:
        """What the first ready worker reported: device, cuda, gsplat, nvdiffrast, moderngl,
        cpu, sam3d (bools) and 'reasons' for each False."""
        with self._lock:
            for s in self._slots:
                if s.caps is not None:
                    return json.loads(json.dumps(s.caps))
        return {}

    def workers(self) -> list[dict]:
        """One dict per worker slot: slot, pid, state, gpu, job, restarts, startup_s, broken,
        heartbeat_age_s, capabilities (as last reported), log (path of the worker's log)."""
        now = time.monotonic()
        with self._lock:
            return [{"slot": s.index, "pid": s.proc.pid if s.proc else None, "state": s.state,
                     "gpu": s.gpu, "job": s.job.status.id if s.job else None,
                     "restarts": s.restarts, "startup_s": s.startup_s, "broken": s.broken,
                     "heartbeat_age_s": round(now - s.last_msg, 2) if s.proc else None,
                     "capabilities": json.loads(json.dumps(s.caps)) if s.caps else None,
                     "log": str(self._log_path(s))} for s in self._slots]

    def queue_length(self) -> int:
        with self._lock:
            return len(self._queue)

    def jobs(self, session: Optional[str] = None) -> list[JobStatus]:
        """Jobs of one session (all sessions when None), oldest first, including earlier runs'."""
        from .jobstore import safe_session

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
        now = time.monotonic()
        for s in self._slots:
            if s.proc is None:
                if not s.broken and now >= s.next_spawn:
                    try:
                        self._spawn(s)
                    except Exception as e:  # e.g. out of file descriptors: back off, then retry
                        self._start_failed(s, f"could not be spawned ({type(e).__name__}: {e})", "")
                continue
            self._drain(s)
            if s.proc is not None and not s.proc.is_alive():
                self._drain(s)  # whatever it said just before dying
                self._on_exit(s)
                continue
            self._check_deadlines(s, time.monotonic())
        self._assign()

    def _drain(self, s: _Slot) -> None:
        while s.outbox is not None:
            try:
                if s.outbox.empty():
                    return
                msg = s.outbox.get()
            except (EOFError, OSError, ValueError):
                return
            s.last_msg = time.monotonic()
            try:
                self._handle(s, msg)
            except Exception:
                log.exception("bad message from worker %d: %r", s.index, msg)

    def _handle(self, s: _Slot, msg: dict) -> None:
        kind = msg.get("type")
        now = time.monotonic()
        if kind == "hb":
            return
        if kind == "probe":
            s.probe, s.probe_since = msg["name"], now
            return
        if kind == "ready":
            s.probe = None
            s.caps = msg["caps"]
            s.state = "idle"
            s.ready_at = now
            s.startup_s = round(now - s.spawned, 3)
            s.failures = 0
            self.metrics["last_ready"] = time.time()
            log.info("worker %d (pid %s) ready in %.2f s: %s", s.index, msg.get("pid"), s.startup_s,
                     {k: v for k, v in s.caps.items() if isinstance(v, bool)})
            self._cond.notify_all()
            return
        job = s.job
        if job is None or msg.get("job") != job.status.id:
            return  # a late message about a job this worker no longer owns
        if kind == "started":
            job.status.backends = msg.get("backends", {})
            return
        if kind == "event":
            s.last_progress = now
            self._on_progress(job, msg["stage"], float(msg["fraction"]), msg.get("message", ""))
        elif kind == "done":
            s.job, s.state = None, "idle"
            self._on_done(job, msg)
        elif kind == "failed":
            s.job = None
            if msg.get("kind") == "cuda":
                s.state, s.stop_since = "stopping", now   # it exits by itself; see _check_deadlines
            else:
                s.state = "idle"
            self._on_failed(job, msg)

    def _assign(self) -> None:
        for s in self._slots:
            if not self._queue:
                return
            if s.state != "idle" or s.kill_reason:
                continue
            job = self._queue.popleft()
            job.attempt += 1
            fault = self.faults.pick(job.status.session, job.attempt) if self.faults else None
            msg = {"type": "run", "job": job.status.id, "dir": str(job.dir), "attempt": job.attempt,
                   "overrides": job.overrides, "chunk_scale": job.chunk_scale,
                   "cache_dir": str(self.cache_dir) if self.cache_dir else None, "fault": fault}
            try:
                s.inbox.put(msg)
            except (OSError, ValueError):
                self._queue.appendleft(job)
                job.attempt -= 1
                continue
            s.state, s.job = "busy", job
            s.last_progress = time.monotonic()
            st = job.status
            st.attempts, st.worker = job.attempt, s.index
            if st.started is None:
                st.started = time.time()
            what = f"running on worker {s.index}"
            if job.attempt > 1:
                what += f" (attempt {job.attempt})"
            self._emit(job, state="running", stage=None, message=what, force_write=True)

    def _check_deadlines(self, s: _Slot, now: float) -> None:
        if s.kill_reason:
            if not s.kill_sent and now - s.term_sent > KILL_GRACE_S:
                s.proc.kill()
                s.kill_sent = now
            return
        ps = self.settings.worker
        if s.state == "starting":
            if s.probe and now - s.probe_since > ps.probe_timeout_s + 5:
                self._kill(s, "probe-timeout")
            elif not s.probe and now - s.last_msg > self._heartbeat_limit + 30:
                self._kill(s, "startup-timeout")
        elif s.state == "busy" and s.job is not None:
            if now - s.last_progress > s.job.stage_timeout:
                self._kill(s, "hang")
        elif s.state == "idle":
            if now - s.last_msg > self._heartbeat_limit:
                self._kill(s, "unresponsive")
        elif s.state == "stopping" and now - s.stop_since > 5.0:
            self._kill(s, "stopping")

    def _kill(self, s: _Slot, reason: str) -> None:
        s.kill_reason = reason
        s.term_sent = time.monotonic()
        try:
            s.proc.terminate()
        except (OSError, ValueError):
            pass

    def _on_exit(self, s: _Slot) -> None:
        code = s.proc.exitcode
        self.metrics["last_exit_detected"] = time.time()
        desc = describe_exit(code)
        job, reason, was = s.job, s.kill_reason, s.state
        probe = s.probe
        tail = self._worker_log_tail(s, 60, job)
        self._discard(s)
        if was == "starting":
            if probe is not None and reason != "startup-timeout":
                # A backend probe crashed or hung the worker: start again without it.
                why = ("probe timed out" if reason == "probe-timeout" else f"probe {desc}")
                s.skip_probes[probe] = f"{why} (see {self._log_path(s).name})"
                log.warning("worker %d: %s probe %s; restarting without it", s.index, probe, why)
            else:
                self._start_failed(s, f"{desc} while starting", tail)
            self._cond.notify_all()
            return
        s.restarts += 1
        if job is None:
            if reason not in ("cancel",) and was != "stopping":
                log.warning("worker %d %s while idle (%s)", s.index, desc, reason or "no job")
            return
        stage = job.status.stage
        if reason == "cancel":
            append_log(job.dir, "cancelled: the worker running it was stopped")
            self._finish(job, "cancelled", "cancelled by user")
            return
        self.metrics["crashes"] += 1
        if reason == "hang":
            limit = job.stage_timeout
            how = "SIGTERM" if code == -signal.SIGTERM else "SIGKILL" if code == -signal.SIGKILL else desc
            why = (f"worker hung {_where(stage)}: no progress for {limit:g} s "
                   f"(worker.stage_timeout_s); it was stopped with {how}")
        elif reason == "unresponsive":
            why = f"worker stopped responding {_where(stage)} and was killed"
        else:
            why = f"worker {desc} {_where(stage)}"
        if tail:
            append_log(job.dir, "worker log around the failure:\n" + tail)
        self._crashed(job, why)

    def _start_failed(self, s: _Slot, what: str, tail: str) -> None:
        s.failures += 1
        s.next_spawn = time.monotonic() + min(30.0, 2.0 ** s.failures)
        log.error("worker %d %s (%d in a row)\n%s", s.index, what, s.failures, tail)
        if s.failures >= STARTUP_FAILURES_LIMIT:
            s.broken = f"worker {s.index} failed to start {s.failures} times: {what}"
            self._fail_if_no_workers()
        self._cond.notify_all()

    def _discard(self, s: _Slot) -> None:
        proc = s.proc
        if proc is not None:
            proc.join(0.5)
            if proc.is_alive():
                proc.kill()
                proc.join(2)
            try:
                proc.close()
            except ValueError:
                pass
        for q in (s.inbox, s.outbox):
            if q is not None:
                try:
                    q.close()
                except (OSError, AttributeError):
                    pass
        s.reset()

    def _spawn(self, s: _Slot) -> None:
        s.reset()
        s.inbox, s.outbox = self._ctx.SimpleQueue(), self._ctx.SimpleQueue()
        ws = self.settings.worker
        cfg = {"slot": s.index, "gpu": s.gpu, "device": ws.device, "heartbeat_s": ws.heartbeat_s,
               "probe_timeout_s": ws.probe_timeout_s, "log_path": str(self._log_path(s)),
               "torch_extensions_dir": str(self.var_dir / "torch_extensions"),
               "skip_probes": dict(s.skip_probes), "faults_enabled": self.faults is not None,
               "probe_faults": self.faults.probe_faults() if self.faults else {},
               "parent_pid": os.getpid(), "settings": self.settings.to_dict()}
        proc = self._ctx.Process(target=process_mod.worker_main, args=(cfg, s.inbox, s.outbox),
                                 name=f"kiln-worker-{s.index}", daemon=True)
        proc.start()
        s.proc, s.state = proc, "starting"
        s.spawned = s.last_msg = time.monotonic()
        self.metrics["spawns"] += 1

    def _log_path(self, s: _Slot) -> Path:
        return self.var_dir / "workers" / f"worker-{s.index}.log"

    def _worker_log_tail(self, s: _Slot, lines: int, job: Optional[_Job] = None) -> str:
        path = self._log_path(s)
        try:
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - 200_000))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        if job is not None:
            marker = f"=== job {job.status.id} attempt {job.attempt} ==="
            i = text.rfind(marker)
            if i >= 0:
                text = text[i:]
        return "\n".join(text.splitlines()[-lines:])

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
        here = STAGE_WEIGHTS.get(stage, 0.1) * min(max(fraction, 0.0), 1.0)
        progress = max(job.status.progress, min(1.0, (done + here) / total))
        text = f"{stage}: {message}" if message else stage
        self._emit(job, stage=stage, progress=progress, message=text,
                   stage_progress=min(max(fraction, 0.0), 1.0))

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
            gpu_path = self._used_gpu(job)
            if gpu_path and job.retry_allowed and not job.error_retried and not job.overrides:
                job.error_retried = True
                job.overrides = dict(FALLBACK)
                self._retry(job, why, f"retrying once with safe backends ({FALLBACK_TEXT})")
            else:
                self._finish(job, "failed", why)

    def _used_gpu(self, job: _Job) -> bool:
        b = job.status.backends or {}
        return (str(b.get("device", "cpu")).startswith("cuda") or b.get("render") == "gsplat"
                or b.get("rasterize") == "nvdiffrast")

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
        job.events.append(Event(job_id=st.id, seq=st.seq, time=time.time(), state=st.state,
                                stage=st.stage, progress=st.progress, message=st.message,
                                stage_progress=st.stage_progress))
        if len(job.events) > EVENTS_KEPT:
            del job.events[: len(job.events) - EVENTS_KEPT]
        # Written on every event so the seq on disk is never behind one a client saw (a
        # restarted server continues from it); fsync only for state/stage changes.
        self.store.write_status(st, fsync=changed)
        self._cond.notify_all()

    @staticmethod
    def _event_of(st: JobStatus) -> Event:
        return Event(job_id=st.id, seq=st.seq, time=st.finished or st.created, state=st.state,
                     stage=st.stage, progress=st.progress, message=st.message,
                     stage_progress=st.stage_progress)

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
