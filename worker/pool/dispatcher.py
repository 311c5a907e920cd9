"""The dispatcher: the supervisor's thread and the state it guards.

It drains the workers' messages, hands queued jobs to idle workers, watches deadlines
and exit codes, and turns every way a worker can die into a failure described in
words a person can read; ``worker.pool.retry.decide`` says what becomes of the job, and a
fresh worker takes the dead one's place. Everything here runs under one lock (the
dispatcher's thread, and the public API's calls through ``Supervisor`` and ``Job``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from types import EllipsisType
from typing import TYPE_CHECKING, Callable, Optional

from kiln.atomic import remove_stale_temps
from kiln.glb import GLBError, check_glb_light
from kiln.records import JobStats, JobTimes
from kiln.settings import Settings

from worker.pool.crashcounts import CrashCounts
from worker.child.faults import FaultPlan
from worker.pool.jobrecord import EVENTS_KEPT, EVENTS_KEPT_FINISHED, JobRecord, event_of, where
from worker.jobs.jobstore import (CANCELLED, DONE, FAILED, QUEUED, RUNNING, Event, JobState, JobStatus,
                       JobStore, append_log)
from worker.messages import Done, Failed, Progress, Ready, Run, Started, Stop
from worker.pool.progress import job_progress
from worker.pool.retry import CANCELLED_BY_USER, CRASH_KINDS, Decision, FailureKind, decide
from worker.pool.slots import WorkerSlot
from worker.child.workerconfig import WorkerConfig
from worker.errors import WorkerStartError
from worker.upkeep.telemetry import JobEvents

if TYPE_CHECKING:
    from worker.engines.base import Engine

log = logging.getLogger("kiln.worker")


class Dispatcher:
    """Job records, the queue, the worker slots and the thread that moves jobs between them."""

    def __init__(self, settings: Settings, store: JobStore, cache_dir: Optional[Path],
                 var_dir: Path, faults: Optional[FaultPlan], poll_s: float, engine: Engine):
        self.settings = settings
        self.engine = engine   # where workers run (``worker.engines``)
        self.store = store
        self.cache_dir = cache_dir
        self.var_dir = var_dir
        self.faults = faults
        self._poll_s = poll_s
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self._wake = threading.Event()
        self.jobs: dict[str, JobRecord] = {}
        self.queue: deque[JobRecord] = deque()
        self.slots: list[WorkerSlot] = []
        self._thread: Optional[threading.Thread] = None
        self.stopping = False
        self.crashes = CrashCounts(store.root / ".crash_counts.json")
        self._heartbeat_limit = max(10.0, 10 * settings.worker.heartbeat_s)
        self.metrics: dict = {"last_ready": None}   # wall time a worker last became ready
        # told of every job and worker change: metrics and the JSON job log (worker.upkeep.telemetry)
        self.events_out: JobEvents = JobEvents()
        self.on_ended: Callable[[], None] = lambda: None   # a job ended (the disk budgets' pass)

    # ------------------------------------------------------------------ lifecycle
    def start(self, slots: list[WorkerSlot]) -> None:
        """Spawn a worker in every slot and start the thread (under the lock)."""
        self.crashes.load()
        self.slots = slots
        for s in slots:
            self._spawn(s)
        self._thread = threading.Thread(target=self._loop, name="kiln-supervisor", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float) -> None:
        """Block until every worker is ready or has given up; raise WorkerStartError
        when none is ready."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                ready = [s for s in self.slots if s.state in ("idle", "busy")]
                settled = all(s.broken or s.state in ("idle", "busy") for s in self.slots)
                left = deadline - time.monotonic()
                if settled or left <= 0:
                    break
                self.cond.wait(min(left, 0.5))
            if ready:
                return
            if settled:
                why = "; ".join(s.broken or "" for s in self.slots)
            else:
                why = (f"no worker became ready within {timeout:.0f} s ("
                       + "; ".join(f"worker {s.index}: {s.state}" for s in self.slots) + ")")
            slot = self.slots[0]
            tail = slot.log_tail(30, slot.start_marker)   # its last start
            raise WorkerStartError(why + (f"\n{slot.log_path}:\n{tail}" if tail else ""))

    def stop(self, timeout: float) -> None:
        """Stop the thread and the workers (gracefully, then by force), and end every job
        that cannot finish now. The caller has set ``stopping`` (under the lock)."""
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self.lock:
            for s in self.slots:
                if s.proc is None:
                    continue
                self._drain(s)  # a result the worker already reported still counts
                if not (s.state == "idle" and s.send(Stop())):
                    s.kill("shutdown")
            deadline = time.monotonic() + timeout
            for s in self.slots:
                if s.proc is not None:
                    s.proc.join(max(0.1, deadline - time.monotonic()))
                    s.discard()
            for job in list(self.jobs.values()):
                if job.status.terminal:
                    continue
                if job.cancel_requested:   # its worker was being stopped for the cancel anyway
                    self._finish(job, CANCELLED, job.cancel_reason or CANCELLED_BY_USER)
                    continue
                if job.status.state == RUNNING:
                    reason = f"the server shut down {where(job.status.stage)}"
                elif job.attempt:
                    reason = "the server shut down before the job's retry started"
                else:
                    reason = "the server shut down before the job started"
                self._finish(job, FAILED, reason)
            self.queue.clear()
            self.engine.close()
            self.cond.notify_all()

    # ------------------------------------------------------------------ jobs in and out
    def enqueue(self, job: JobRecord, note: str = "") -> None:
        """Take a new job (under the lock): queued, or failed at once when it cannot run.
        ``note`` leads its status message (a job resumed after a server crash says so)."""
        self.jobs[job.status.id] = job
        # checked here, under the lock: shutdown may have run while the job's files were
        # written, and a job queued after it would wait for ever
        if self.stopping:
            self._finish(job, FAILED, "the server shut down before the job started")
            return
        if all(s.broken for s in self.slots):
            self._finish(job, FAILED, "no worker is available: " + "; ".join(s.broken or "" for s in self.slots))
            return
        ahead = len(self.queue)
        self.queue.append(job)
        queued = f"queued ({ahead} ahead)" if ahead else "queued"
        self._emit(job, state=QUEUED, message=f"{note}; {queued}" if note else queued, force_write=bool(note))
        self.events_out.queued(job.status, note)
        self._wake.set()

    def status(self, job_id: str) -> JobStatus:
        """A snapshot of the job's status (KeyError for an unknown id)."""
        with self.lock:
            job = self.jobs.get(job_id)
            if job is not None:
                return JobStatus.from_dict(job.status.to_dict())
        return self.store.read_status(job_id)

    def wait(self, job_id: str, timeout: Optional[float] = None) -> JobStatus:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                job = self.jobs.get(job_id)
                if job is None or job.status.terminal:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self.cond.wait(0.5 if left is None else min(left, 0.5))
        return self.status(job_id)

    def events(self, job_id: str, since_seq: int = 0, timeout: Optional[float] = None) -> list[Event]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                job = self.jobs.get(job_id)
                if job is None:
                    st = self.store.read_status(job_id)
                    return [event_of(st)] if st.seq > since_seq else []
                out = [e for e in job.events if e.seq > since_seq]
                if out or job.status.terminal or deadline is None:
                    if not out and job.status.seq > since_seq:
                        out = [event_of(job.status)]  # older events were trimmed
                    return out
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self.cond.wait(min(left, 0.5))

    def cancel(self, job_id: str, timeout: float, reason: str = "") -> bool:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None or job.status.terminal:
                return False
            job.cancel_requested = True
            job.cancel_reason = why = job.cancel_reason or reason
            if job in self.queue:
                self.queue.remove(job)
                self._finish(job, CANCELLED, f"{why} (before it started)" if why
                             else "cancelled before it started")
                return True
            slot = next((s for s in self.slots if s.job is job), None)
            if slot is None:  # not expected: a job that is not terminal is queued or on a slot
                self._finish(job, CANCELLED, why or "cancelled")
                return True
            if slot.kill_reason is None:
                slot.kill("cancel")
        self._wake.set()
        return self.wait(job_id, timeout).state == CANCELLED

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        while True:
            with self.lock:
                if self.stopping:
                    return
                try:
                    self._tick()
                except Exception:  # the dispatcher must outlive any bug in one tick
                    log.exception("supervisor tick failed")
            self._wake.wait(self._poll_s)
            self._wake.clear()

    def _tick(self) -> None:
        for s in self.slots:
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
        try:
            # the engine fills in what depends on where the worker runs (its interpreter,
            # its parent: this process, or a Ray host actor)
            cfg = WorkerConfig(
                settings=self.settings, slot=s.index, gpu=s.gpu, log_path=str(s.log_path),
                parent_pid=os.getpid(), skip_probes=dict(s.skip_probes),
                faults_enabled=self.faults is not None,
                probe_faults=self.faults.probe_faults(s.starts + 1) if self.faults else {})
            self.engine.spawn(s, cfg)
        except Exception as e:  # e.g. out of file descriptors: back off, then retry
            self._start_failed(s, f"could not be spawned ({type(e).__name__}: {e})")

    def _drain(self, s: WorkerSlot) -> None:
        for msg in s.messages():
            try:
                self._handle(s, msg)
            except Exception:
                log.exception("bad message from worker %d: %r", s.index, msg)

    def _handle(self, s: WorkerSlot, msg) -> None:
        now = time.monotonic()
        if s.note(msg, now):
            if isinstance(msg, Ready):
                self.metrics["last_ready"] = time.time()
                self.cond.notify_all()
            return
        job = s.job
        if job is None or msg.job != job.status.id:
            return  # a late message about a job this worker no longer owns
        if isinstance(msg, Started):
            job.status.backends = msg.backends
        elif isinstance(msg, Progress):
            s.last_progress = now
            self._on_progress(job, msg)
        elif isinstance(msg, Done):
            s.job, s.state = None, "idle"
            self._on_done(job, msg)
        elif isinstance(msg, Failed):
            s.job = None
            if msg.kind == "cuda":
                s.state, s.stop_since = "stopping", now   # it exits by itself; see WorkerSlot.watch
            else:
                s.state = "idle"
            self._on_failed(job, msg)

    def _assign(self) -> None:
        for s in self.slots:
            if not self.queue:
                return
            if s.state != "idle" or s.kill_reason:
                continue
            job = self.queue[0]
            attempt = job.attempt + 1
            # the seed from the job's own settings (its settings.json's, held in the record)
            fault = (self.faults.pick(job.status.session, attempt, job.digest, job.settings.seed)
                     if self.faults else None)
            run = Run(job=job.status.id, dir=str(job.dir), attempt=attempt, overrides=job.overrides,
                      chunk_scale=job.chunk_scale,
                      cache_dir=str(self.cache_dir) if self.cache_dir else None, fault=fault,
                      kind=job.status.kind)
            if not s.send(run):
                continue
            self.queue.popleft()
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
            self._emit(job, state=RUNNING, stage=None, message=what, force_write=True)
            self.events_out.started(st, attempt, s.index)

    def _on_exit(self, s: WorkerSlot) -> None:
        code, desc = s.exit_code(), s.exit_description()
        job, reason, was, frozen_status = s.job, s.kill_reason, s.state, s.frozen_status
        if was == "starting":
            what = s.start_ended(desc)   # before discard(): it needs the probe that ran
            s.discard()
            if what is not None:
                self._start_failed(s, what)
            self.cond.notify_all()
            return
        tail = s.log_tail(60, job.log_marker) if job is not None else ""
        s.discard()
        if job is not None:
            # a worker killed inside atomic_write leaves its half-written temporary; the
            # job folder is read again (resume, history), so nothing half-made may stay
            for tmp in remove_stale_temps(job.dir):
                log.info("removed a temporary file the dead worker left: %s", tmp)
        s.restarts += 1
        if reason != "shutdown":
            self.events_out.worker_restarted("cuda" if was == "stopping" else reason or "crash")
        if job is None:
            if reason not in ("cancel", "shutdown") and was != "stopping":
                log.warning("worker %d %s while idle (%s)", s.index, desc, reason or "no job")
            return
        stage = job.status.stage
        if reason == "cancel" or job.cancel_requested:
            self._apply(job, decide(job.failure("cancel", "cancelled")))
            return
        how = {-signal.SIGTERM: "SIGTERM", -signal.SIGKILL: "SIGKILL"}.get(code or 0, desc)
        kind: FailureKind
        if reason == "hang":
            kind, why = "hang", (f"worker hung {where(stage)}: no progress for {job.stage_timeout:g} s "
                                 f"(worker.stage_timeout_s); it was stopped with {how}")
        elif reason == "frozen":
            kind, why = "frozen", (f"worker froze {where(stage)}: it used no CPU time and sent nothing "
                                   f"for {job.stall_timeout:g} s (worker.stall_timeout_s; process "
                                   f"state '{frozen_status}'); it was stopped with {how}")
        else:
            kind, why = "crash", f"worker {desc} {where(stage)}"
        if tail:
            append_log(job.dir, "worker log around the failure:\n" + tail)
        self._failed(job, kind, why)

    def _start_failed(self, s: WorkerSlot, what: str) -> None:
        s.count_start_failure(what)
        self.events_out.worker_restarted("start_failed")
        log.error("worker %d %s (%d in a row; see %s)", s.index, what, s.failures, s.log_path)
        if s.broken:
            self._fail_if_no_workers()
        self.cond.notify_all()

    def _fail_if_no_workers(self) -> None:
        if any(not s.broken for s in self.slots):
            return
        why = "; ".join(s.broken or "" for s in self.slots)
        while self.queue:
            self._finish(self.queue.popleft(), FAILED, f"no worker could start: {why}")

    # ------------------------------------------------------------------ job outcomes
    def _on_progress(self, job: JobRecord, msg: Progress) -> None:
        progress = job_progress(job.stages, msg.stage, float(msg.fraction), job.status.progress)
        text = f"{msg.stage}: {msg.message}" if msg.message else msg.stage
        self._emit(job, stage=msg.stage, progress=progress, message=text,
                   stage_progress=min(max(float(msg.fraction), 0.0), 1.0))

    def _on_done(self, job: JobRecord, msg: Done) -> None:
        if job.status.kind == "fit":
            self._on_fitted(job, msg)
            return
        if msg.glb is None:
            self._finish(job, FAILED, "the worker reported no GLB")
            return
        glb = Path(msg.glb)
        try:
            light = check_glb_light(glb)
        except GLBError as e:
            reason = f"the result failed its check after stage 'export': {e}"
            append_log(job.dir, reason)
            self._finish(job, FAILED, reason)
            return
        # the other files it says it wrote are offered for download as they are: each must be there
        lacking = [w for w in map(_lacking, [msg.ply, *(msg.extra or {}).values()]) if w]
        if lacking:
            reason = f"the result failed its check after stage 'export': {'; '.join(lacking)}"
            append_log(job.dir, reason)
            self._finish(job, FAILED, reason)
            return
        report = self.store.read_result(job.status.id)
        st = job.status
        st.outputs = {"glb": str(glb)}
        if msg.ply:
            st.outputs["ply"] = msg.ply
        st.outputs.update(msg.extra or {})
        if report is not None:
            st.timings = dict(report.timings)
            st.stats = JobStats(pipeline=report.stats, glb_check=report.check, job=report.job,
                                earlier_attempts=tuple(job.notes))
            st.backends = report.stats.backends
        else:   # the worker said done but left no report: the supervisor's own check stands in
            st.timings = {}
            st.stats = JobStats(glb_check=light, earlier_attempts=tuple(job.notes))
        msg_text = "done" + (f" (after: {job.notes[-1]})" if job.notes else "")
        self._finish(job, DONE, msg_text, progress=1.0)

    def _on_fitted(self, job: JobRecord, msg: Done) -> None:
        """A fit job's end: its camera and picture there, and its report with the fit in it."""
        outputs = dict(msg.extra or {})
        lacking = [_lacking(outputs[k]) if k in outputs else f"its {k} was not reported" for k in ("camera", "camera_fit")]
        lacking = [w for w in lacking if w]
        report = self.store.read_result(job.status.id) if not lacking else None
        if not lacking and (report is None or report.camera_fit is None):
            lacking = ["its report holds no fitted camera"]
        if lacking or report is None or report.camera_fit is None:
            reason = f"the fit failed its check after stage 'fit': {'; '.join(lacking)}"
            append_log(job.dir, reason)
            self._finish(job, FAILED, reason)
            return
        st = job.status
        st.outputs = outputs
        st.timings = dict(report.timings)
        st.stats = JobStats(pipeline=report.stats, job=report.job, earlier_attempts=tuple(job.notes),
                            camera_fit=report.camera_fit)
        st.backends = report.stats.backends
        self._finish(job, DONE, "done" + (f" (after: {job.notes[-1]})" if job.notes else ""), progress=1.0)

    def _on_failed(self, job: JobRecord, msg: Failed) -> None:
        stage, err = msg.stage, msg.error
        if stage:
            job.status.stage = stage
        first = err.strip().splitlines()[0] if err.strip() else "unknown error"
        if msg.kind == "oom":
            why = f"CUDA out of memory {where(stage)}"
        elif msg.kind == "cuda":
            why = (f"CUDA error {where(stage)}: {first}; the worker was restarted to get a fresh "
                   "CUDA context")
        elif msg.kind == "input":
            why = (f"stage '{stage}' rejected its input: {first}" if stage
                   else f"the job could not start: {first}")
        else:
            why = f"stage '{stage}' failed: {first}" if stage else f"the job could not start: {first}"
        self._failed(job, msg.kind if msg.kind in ("oom", "cuda", "input") else "error", why, first)

    def _failed(self, job: JobRecord, kind: FailureKind, why: str, error: str = "") -> None:
        """An attempt failed: a crash-like failure counts against the input (and is logged
        as it happened); then the retry policy decides."""
        count = 0
        if kind in CRASH_KINDS:
            count = self.crashes.add(job.digest) if job.digest else 0
            append_log(job.dir, why)
        self._apply(job, decide(job.failure(kind, why, error, count)), why)

    def _apply(self, job: JobRecord, d: Decision, why: str = "") -> None:
        if d.action == "fail":
            self._finish(job, FAILED, d.message)
            return
        if d.action == "cancel":
            append_log(job.dir, d.log or d.message)
            self._finish(job, CANCELLED, d.message)
            return
        if d.retried is not None:
            job.retried.add(d.retried)
        if d.overrides is not None:
            job.overrides = dict(d.overrides)
        if d.chunk_scale is not None:
            job.chunk_scale = d.chunk_scale
        job.notes.append(why)
        append_log(job.dir, d.log or d.message)
        self.queue.appendleft(job)
        self._emit(job, state=QUEUED, message=d.message, force_write=True)
        self.events_out.retried(job.status, why)
        self._wake.set()

    def _finish(self, job: JobRecord, state: JobState, message: str,
                progress: Optional[float] = None) -> None:
        st = job.status
        st.finished = time.time()
        times: JobTimes = replace(st.stats.job, total_s=round(st.finished - st.created, 3))
        if st.started is not None:
            times = replace(times, queued_s=round(st.started - st.created, 3))
        st.stats = replace(st.stats, job=times)
        st.timings = {**st.timings, "total_s": round(st.finished - st.created, 3)}   # = times.total_s
        if times.queued_s is not None:
            st.timings["queued_s"] = times.queued_s
        if state != DONE:
            st.error = message
        if state in (FAILED, CANCELLED):
            append_log(job.dir, f"{state}: {message}")
        self._emit(job, state=state, message=message, progress=progress, force_write=True)
        self.events_out.ended(st)
        self.on_ended()
        # a long-running server keeps every job's record; only recent events of finished ones
        del job.events[:-EVENTS_KEPT_FINISHED]

    def _emit(self, job: JobRecord, state: Optional[JobState] = None,
              stage: Optional[str] | EllipsisType = ...,
              progress: Optional[float] = None, message: Optional[str] = None,
              stage_progress: Optional[float] = None, force_write: bool = False) -> None:
        st = job.status
        changed = force_write
        if state is not None and state != st.state:
            st.state, changed = state, True
        if stage is not ... and stage != st.stage:
            previous = st.stage
            st.stage, st.stage_progress, changed = stage, 0.0, True
            if stage is not None:
                self.events_out.stage(st, previous)
        if stage_progress is not None:
            st.stage_progress = float(stage_progress)
        if progress is not None:
            st.progress = float(progress)
        if message is not None:
            st.message = message
        st.seq += 1
        job.events.append(event_of(st, time.time()))
        if len(job.events) > EVENTS_KEPT:
            del job.events[: len(job.events) - EVENTS_KEPT]
        # Written on every event so the seq on disk is never behind one a client saw (a
        # restarted server continues from it); fsync only for state/stage changes.
        self.store.write_status(st, fsync=changed)
        self.cond.notify_all()


def _lacking(path: Optional[str]) -> str:
    """What is wrong with an output file the worker reported: '' when it is there and holds
    bytes, else "model.stl is missing" or "model.stl is empty (0 bytes)"."""
    if not path:
        return ""
    name = Path(path).name
    if not Path(path).is_file():
        return f"{name} is missing"
    try:
        size = Path(path).stat().st_size
    except OSError:
        return f"{name} is missing"
    return "" if size > 0 else f"{name} is empty (0 bytes)"
