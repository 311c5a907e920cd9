"""What a running server tells its operators: Prometheus metrics and one JSON line per job event.

The dispatcher calls a ``JobEvents`` at each change of a job and of a worker (under its lock:
every method here is quick and never blocks on the network). ``JobEvents`` itself does nothing,
so the dispatcher works without any of this; ``Telemetry`` counts into its own
``prometheus_client`` registry (one per supervisor, so two in one process, as in the tests, do
not collide) and writes the JSON lines to a rotating file through a logger of its own that
does not reach the console: the console stays as it was.

A line: ``{"ts", "event", "job", "kind", "stage", "duration_s", "outcome", "reason", "session",
"attempt", "worker"}``, every key always there (null when it does not apply). ``session`` is a
hash of the job's session name: the name is derived from the browser's cookie and its tab, and
a log is read by more people than the server's own files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:
    from worker.jobs.jobstore import JobStatus

# seconds; stages run from tens of milliseconds (export) to many minutes (uv on a big mesh, SAM 3D)
STAGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


def session_hash(session: str) -> str:
    """A stable, short stand-in for a session name in logs (never the name itself)."""
    return hashlib.sha256(session.encode()).hexdigest()[:16]


class JobEvents:
    """What the dispatcher reports; these do nothing (no metrics, no log)."""

    def queued(self, st: JobStatus, note: str = "") -> None: ...
    def started(self, st: JobStatus, attempt: int, worker: int) -> None: ...
    def stage(self, st: JobStatus, previous: Optional[str]) -> None: ...
    def retried(self, st: JobStatus, reason: str) -> None: ...
    def ended(self, st: JobStatus) -> None: ...
    def worker_restarted(self, cause: str) -> None: ...
    def removed(self, st: JobStatus, why: str) -> None: ...
    def cache_removed(self, count: int) -> None: ...
    def disk_figures(self, cache: int, jobs: int, other: int, cache_budget: int, jobs_budget: int) -> None: ...
    def close(self) -> None: ...


class Telemetry(JobEvents):
    """Metrics and the JSON job log. ``job_log``: the file (rotated past ``log_bytes``,
    ``log_files`` old ones kept), None for none. ``clock``: for durations (monotonic)."""

    def __init__(self, job_log: Optional[Path] = None, log_bytes: int = 16 << 20, log_files: int = 5,
                 clock: Callable[[], float] = time.monotonic):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.clock = clock
        r = self.registry = CollectorRegistry()
        self.jobs = Counter("kiln_jobs", "Jobs that ended, by kind and outcome (done, failed, cancelled)",
                            ["kind", "outcome"], registry=r)
        self.queue = Gauge("kiln_queue_length", "Jobs waiting for a worker", registry=r)
        self.running = Gauge("kiln_jobs_running", "Jobs on a worker now", registry=r)
        self.workers_ready = Gauge("kiln_workers_ready", "Workers ready or busy", registry=r)
        self.stages = Histogram("kiln_stage_seconds", "Seconds a stage ran (stages that ended, "
                                "as the supervisor saw them)", ["kind", "stage"], buckets=STAGE_BUCKETS, registry=r)
        self.restarts = Counter("kiln_worker_restarts", "Workers that ended and were replaced, by cause",
                                ["cause"], registry=r)
        self.disk = Gauge("kiln_disk_bytes", "Disk used: cache (reconstruction cache), jobs (job store), "
                          "sessions_files (tabs' photos and Gradio's files, counted with jobs)", ["area"], registry=r)
        self.budget = Gauge("kiln_disk_budget_bytes", "Disk budgets: cache (app.cache_max_mb), "
                            "jobs (app.jobs_max_mb)", ["area"], registry=r)
        self.freed = Counter("kiln_disk_removed", "Ended jobs and cache entries removed by the disk budgets",
                             ["what"], registry=r)
        self._since: dict[str, float] = {}      # job id -> when its current stage began
        self.log: Optional[logging.Logger] = None
        if job_log is not None:
            from logging.handlers import RotatingFileHandler

            Path(job_log).parent.mkdir(parents=True, exist_ok=True)
            # a logger outside logging's tree: nothing propagates to the console's handlers
            self.log = logging.Logger(f"kiln.jobevents.{id(self)}", logging.INFO)
            handler = RotatingFileHandler(job_log, maxBytes=log_bytes, backupCount=log_files, encoding="utf-8")
            handler.setFormatter(logging.Formatter("%(message)s"))
            self.log.addHandler(handler)

    # -- the registry's callbacks, read at each scrape ------------------------------
    def bind(self, queue_length: Callable[[], int], running: Callable[[], int],
             workers_ready: Callable[[], int]) -> None:
        self.queue.set_function(queue_length)
        self.running.set_function(running)
        self.workers_ready.set_function(workers_ready)

    def render(self) -> bytes:
        """The metrics in Prometheus' text format."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def disk_figures(self, cache: int, jobs: int, other: int, cache_budget: int, jobs_budget: int) -> None:
        self.disk.labels("cache").set(cache)
        self.disk.labels("jobs").set(jobs)
        self.disk.labels("sessions_files").set(other)
        self.budget.labels("cache").set(cache_budget)
        self.budget.labels("jobs").set(jobs_budget)

    # -- events ------------------------------------------------------------------------
    def _line(self, event: str, st: JobStatus, **kw) -> None:
        if self.log is None:
            return
        rec = {"ts": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
               "event": event, "job": st.id, "kind": st.kind, "stage": st.stage, "duration_s": None,
               "outcome": None, "reason": None, "session": session_hash(st.session), "attempt": st.attempts or None,
               "worker": st.worker}
        rec.update(kw)
        self.log.info(json.dumps(rec, sort_keys=False, default=str))

    def queued(self, st: JobStatus, note: str = "") -> None:
        self._line("queued", st, reason=note or None)

    def started(self, st: JobStatus, attempt: int, worker: int) -> None:
        self._since[st.id] = self.clock()
        self._line("started", st, stage=None, attempt=attempt, worker=worker)

    def _stage_ended(self, st: JobStatus, stage: Optional[str], outcome: str) -> None:
        t0 = self._since.pop(st.id, None)
        if stage is None or t0 is None:
            return
        took = max(0.0, self.clock() - t0)
        self.stages.labels(st.kind, stage).observe(took)
        self._line("stage", st, stage=stage, duration_s=round(took, 3), outcome=outcome)

    def stage(self, st: JobStatus, previous: Optional[str]) -> None:
        self._stage_ended(st, previous, "done")
        self._since[st.id] = self.clock()

    def retried(self, st: JobStatus, reason: str) -> None:
        self._since.pop(st.id, None)
        self._line("retried", st, reason=reason)

    def ended(self, st: JobStatus) -> None:
        self._stage_ended(st, st.stage, st.state)
        self.jobs.labels(st.kind, st.state).inc()
        total = (st.finished - st.created) if st.finished and st.created else None
        self._line("ended", st, outcome=st.state, reason=st.error if st.state != "done" else None,
                   duration_s=round(total, 3) if total is not None else None)

    def worker_restarted(self, cause: str) -> None:
        self.restarts.labels(cause).inc()

    def removed(self, st: JobStatus, why: str) -> None:
        self.freed.labels("job").inc()
        self._line("removed", st, outcome="removed", reason=why)

    def cache_removed(self, count: int) -> None:
        if count:
            self.freed.labels("cache_entry").inc(count)

    def close(self) -> None:
        if self.log is not None:
            for h in list(self.log.handlers):
                h.close()
                self.log.removeHandler(h)
