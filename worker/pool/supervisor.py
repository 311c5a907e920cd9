"""The supervisor: lives in the app (or CLI) process, owns the job queue and the workers.

It never imports ``pipeline/`` or touches CUDA. Workers are started with the
``spawn`` start method in ``worker.pool.slots.WorkerSlot``s, each with its own pair of
queues that die with it. A dispatcher thread (``worker.pool.dispatcher``) drains the
workers' messages, hands queued jobs to idle workers, watches deadlines and exit
codes, and turns every way a worker can die into a job that ends ``failed`` with a
reason a person can read, followed by a fresh worker:

* killed by a signal / exited: "worker crashed with SIGSEGV during stage 'bake'";
* hung (a stage silent for ``worker.stage_timeout_s``): SIGTERM, SIGKILL after a
  grace period, then treated as a crash;
* frozen (a busy worker that neither used CPU time nor sent a message for
  ``worker.stall_timeout_s``, e.g. stopped by SIGSTOP or deadlocked; see
  ``worker.pool.liveness``): stopped the same way, then treated as a crash;
* CUDA error: the worker reports it and exits (its CUDA context is poisoned);
* cancel: the worker running the job is killed and replaced.

Which failures are tried again, and how (safe backends, a smaller chunk scale), is
``worker.pool.retry``'s table.

Typical use (the CLI)::

    with Supervisor(settings, jobs_dir, cache_dir) as sup:
        job = sup.submit(rgb, mask, settings)      # a worker.pool.jobhandle.Job
        for ev in job.follow():
            print(ev.stage, ev.progress)
        st = job.status()
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

from kiln.atomic import remove_stale_temps
from kiln.digest import files_digest, input_digest
from kiln.records import Capabilities
from kiln.settings import Settings
from kiln.settings import load as load_settings

from worker.child import env as env_mod
from worker.pool import resume
from worker.pool.dispatcher import Dispatcher, WorkerStartError
from worker.child.faults import FaultPlan
from worker.pool.jobhandle import Job
from worker.pool.jobrecord import JobRecord
from worker.jobs.jobstore import QUEUED, RUNNING, Event, JobStatus, JobStore, append_log, check_inputs, safe_session
from worker.jobs.jobstore import load_inputs as load_job_inputs
from worker.jobs.jobstore import load_settings as load_job_settings
from worker.engines import Engine, make_engine
from worker.upkeep.budget import Budgets
from worker.upkeep.health import HEALTH_JOB_PIXELS, Health, judge
from worker.upkeep.housekeeper import Housekeeper
from worker.upkeep.telemetry import Telemetry

if TYPE_CHECKING:
    from worker.jobs.bakeinputs import CheckedBake

__all__ = ["QueueFullError", "Supervisor", "WorkerStartError"]

log = logging.getLogger("kiln.worker")


class QueueFullError(RuntimeError):
    """More jobs are waiting than ``worker.max_queue`` allows."""


class Supervisor:
    """Job queue + crash-isolated workers. Thread-safe; see the module docstring."""

    def __init__(self, settings: Optional[Settings] = None, jobs_dir: Optional[Path] = None,
                 cache_dir: Optional[Path] = None, *, var_dir: Optional[Path] = None,
                 faults: Optional[FaultPlan] = None, poll_s: float = 0.02,
                 engine: Optional[Engine] = None):
        self.settings = settings or load_settings()
        self.jobs_dir = Path(jobs_dir if jobs_dir is not None else self.settings.app.jobs_dir)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.var_dir = Path(var_dir) if var_dir is not None else self.jobs_dir.resolve().parent
        self.store = JobStore(self.jobs_dir)
        # workers inherit this process's environment: one extension cache for all of them
        env_mod.share_extension_env()
        # Test-only fault hook: a constructor argument or KILN_TEST_FAULTS, nothing else.
        self.faults = faults if faults is not None else FaultPlan.from_env()
        # where the workers run: ``worker.engine`` (local processes, or a Ray cluster)
        self.engine = engine if engine is not None else make_engine(self.settings)
        self._dispatcher = Dispatcher(self.settings, self.store, self.cache_dir, self.var_dir,
                                      self.faults, poll_s, self.engine)
        # metrics and the JSON job log (worker.upkeep.telemetry); the disk budgets' thread
        app = self.settings.app
        job_log = (None if app.job_log == "off" else
                   Path(app.job_log) if app.job_log else self.var_dir / "logs" / "jobs.jsonl")
        self.telemetry = Telemetry(job_log, int(app.job_log_mb * 2**20), app.job_log_files)
        self.telemetry.bind(self.queue_length, lambda: self.load()[0],
                            lambda: sum(1 for w in self.workers() if w["state"] in ("idle", "busy")))
        self._dispatcher.events_out = self.telemetry
        self.upkeep = Housekeeper(self._dispatcher, self.store, self.cache_dir, Budgets.from_settings(app),
                                  self.telemetry)
        self._dispatcher.on_ended = self.upkeep.poke
        self._started = False

    @property
    def metrics(self) -> dict:
        """{'last_ready': wall time a worker last became ready}."""
        return self._dispatcher.metrics

    # ------------------------------------------------------------------ lifecycle
    def start(self, wait: bool = True, timeout: Optional[float] = None) -> "Supervisor":
        """Recover jobs a previous run left behind, spawn the workers and (by default)
        wait until each has reported its capabilities or given up. When that wait fails
        (WorkerStartError, Ctrl-C) everything started is stopped again before it raises:
        the caller never got a supervisor to shut down."""
        d = self._dispatcher
        with d.lock:
            if self._started:
                return self
            self._started = True
            # what a server killed mid-write left: half-written temporaries, never read
            for root in (self.jobs_dir, self.cache_dir):
                if root is not None and root.is_dir():
                    for tmp in remove_stale_temps(root):
                        log.info("removed a temporary file a stopped process left: %s", tmp)
            for staging in self.store.remove_abandoned():
                log.info("removed a job folder a stopped server left half-made: %s", staging)
            for st in self.store.scan():
                d.jobs[st.id] = JobRecord(status=st, dir=self.store.job_dir(st.id))
            # what the previous server left queued or running (each record's own status, so
            # settling it updates what clients read)
            left = [r.status for r in d.jobs.values() if r.status.state in (QUEUED, RUNNING)]
            try:
                slots = self.engine.slots(self.var_dir)
            except BaseException:
                self._started = False   # nothing was started: a later start() may try again
                raise
            d.start(slots)
            for st in left:   # after d.start: the crash counts are loaded, the slots exist
                self._resume_or_settle(st)
        self.upkeep.start()
        if wait:
            try:
                self.wait_ready(timeout)
            except BaseException:
                self.shutdown()
                raise
        return self

    def _resume_or_settle(self, st: JobStatus) -> None:
        """A job the previous server left queued or running: queued again, or failed saying
        why (``worker.pool.resume``). Under the dispatcher's lock."""
        d = self._dispatcher
        enabled = self.settings.worker.resume_interrupted
        digest = self.store.read_digest(st.id)
        job_dir = self.store.job_dir(st.id)
        settings, problem = None, None
        if enabled:
            try:
                settings = load_job_settings(job_dir)
            except (OSError, ValueError, TypeError, KeyError) as e:
                problem = f"its settings cannot be read ({type(e).__name__})"
            if digest is None and problem is None:
                digest, problem = self._digest_again(st, job_dir)
        crashes = d.crashes.add(digest) if enabled and digest and st.state == RUNNING and not problem else 0
        decision = resume.decide(st, enabled, crashes, problem)
        log.warning("job %s: %s", st.id, decision.message)
        if not decision.resume:
            self.store.settle_failed(st, decision.message)
            return
        assert settings is not None and digest is not None
        append_log(job_dir, decision.message)
        job = JobRecord(status=st, dir=job_dir, settings=settings, digest=digest, attempt=st.attempts)
        d.enqueue(job, note=decision.message)

    def _digest_again(self, st: JobStatus, job_dir: Path) -> tuple[Optional[str], Optional[str]]:
        """(digest, None) worked out from an image job's stored inputs (a job an older Kiln
        queued, or one whose server died before it wrote the digest); else (None, why not)."""
        if st.kind != "image":
            return None, "its input digest was not kept (a job from an older Kiln)"
        try:
            rgb, mask = load_job_inputs(job_dir)
        except (OSError, ValueError) as e:
            return None, f"its inputs cannot be read ({type(e).__name__})"
        digest = input_digest(rgb, mask)
        self.store.write_digest(st.id, digest)
        return digest, None

    def wait_ready(self, timeout: Optional[float] = None) -> None:
        """Block until every worker is ready or has given up; raise WorkerStartError
        when none is ready."""
        if timeout is None:
            timeout = 60.0 + 6 * self.settings.worker.probe_timeout_s
        self._dispatcher.wait_ready(timeout)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the workers (gracefully, then by force) and fail jobs that cannot finish now."""
        d = self._dispatcher
        with d.lock:
            if not self._started or d.stopping:
                return
            d.stopping = True
        self.upkeep.stop()
        d.stop(timeout)
        self.telemetry.close()

    def __enter__(self) -> "Supervisor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ jobs
    def submit(self, rgb: np.ndarray, mask: np.ndarray, settings: Optional[Settings] = None,
               session: str = "cli", more_masks: tuple[np.ndarray, ...] = ()) -> Job:
        """Queue a job. rgb: (H, W, 3) uint8; mask: (H, W) bool. Returns its handle.
        ``more_masks``: more objects of the same photo (each (H, W) bool): the job makes one
        scene of them all (``pipeline.scene.photo_scene``), which needs a reconstruction that
        places objects (``kiln.stages.scene_problem``).

        Raises ValueError for malformed inputs (and a scene its backend cannot lay out),
        QueueFullError when too many wait.
        """
        from kiln.stages import scene_problem

        settings = settings or self.settings
        if more_masks:   # what cannot make a scene is refused before anything else
            problem = scene_problem(settings.reconstruct.backend)
            if problem:
                raise ValueError(problem)
            for m in more_masks:
                check_inputs(rgb, m)
        self._check_open()
        check_inputs(rgb, mask)
        self._check_room()
        st = self.store.create(rgb, mask, settings, session, more_masks=tuple(more_masks))
        digest = input_digest(rgb, mask)
        if more_masks:
            digest = files_digest([digest.encode(), *(input_digest(rgb, m).encode() for m in more_masks)], [])
        return self._enqueue(st, settings, digest)

    def submit_bake(self, bake: CheckedBake, settings: Optional[Settings] = None,
                    session: str = "cli") -> Job:
        """Queue a bake job (a model someone made, checked by ``worker.jobs.bakeinputs.check_bake``).
        Its files are copied into the job's folder first, so the job owns them. Raises
        QueueFullError when too many wait."""
        self._check_open()
        settings = settings or self.settings
        self._check_room()
        st = self.store.create_bake(bake.request, bake.copies, settings, session, bake.rgb, bake.mask)
        files = [self.store.job_dir(st.id) / "inputs" / name for name in sorted(bake.copies)]
        parts = [json.dumps(bake.request.to_dict(), sort_keys=True).encode()]
        if bake.rgb is not None and bake.mask is not None:
            parts.append(input_digest(bake.rgb, bake.mask).encode())
        return self._enqueue(st, settings, files_digest(parts, files))

    def submit_fit(self, bake: CheckedBake, settings: Optional[Settings] = None,
                   session: str = "cli") -> Job:
        """Queue a fit job: the photo's camera of a model fitted to its mask, nothing baked
        (``bake`` from ``worker.jobs.bakeinputs.check_fit``). Its outputs are 'camera' (the
        camera.json ``kiln bake --camera`` reads) and 'camera_fit' (the silhouette over the
        photo); its stats' ``camera_fit`` the figures. Raises ValueError without a photo,
        QueueFullError when too many wait."""
        self._check_open()
        if not bake.request.photo or bake.rgb is None or bake.mask is None:
            raise ValueError("fitting the camera needs the photo and its mask")
        settings = settings or self.settings
        self._check_room()
        st = self.store.create_bake(bake.request, bake.copies, settings, session, bake.rgb, bake.mask, kind="fit")
        files = [self.store.job_dir(st.id) / "inputs" / name for name in sorted(bake.copies)]
        parts = [b"fit", json.dumps(bake.request.to_dict(), sort_keys=True).encode(),
                 input_digest(bake.rgb, bake.mask).encode()]
        return self._enqueue(st, settings, files_digest(parts, files))

    def _check_open(self) -> None:
        if not self._started or self._dispatcher.stopping:
            raise RuntimeError("the supervisor is not running; call start() first")

    def _check_room(self) -> None:
        d = self._dispatcher
        limit = self.settings.worker.max_queue
        with d.lock:
            if len(d.queue) >= limit:
                raise QueueFullError(f"{len(d.queue)} jobs are already waiting (worker.max_queue"
                                     f" = {limit}); try again later")

    def _enqueue(self, st: JobStatus, settings: Settings, digest: str) -> Job:
        d = self._dispatcher
        self.store.write_digest(st.id, digest)   # a resumed job keeps its crash count's key
        job = JobRecord(status=st, dir=self.store.job_dir(st.id), settings=settings, digest=digest)
        with d.lock:
            d.enqueue(job)
        return Job(d, st.id)

    def job(self, job_id: str) -> Job:
        """The handle of a job submitted earlier, by this server or one before it;
        KeyError for an id no job has."""
        with self._dispatcher.lock:
            known = job_id in self._dispatcher.jobs
        if not known:
            self.store.job_dir(job_id)   # raises KeyError
        return Job(self._dispatcher, job_id)

    def run(self, rgb: np.ndarray, mask: np.ndarray, settings: Optional[Settings] = None,
            session: str = "cli", on_event: Optional[Callable[[Event], None]] = None,
            timeout: Optional[float] = None) -> JobStatus:
        """Submit, follow (calling ``on_event`` for each event) and return the final status."""
        job = self.submit(rgb, mask, settings, session)
        for ev in job.follow(timeout):
            if on_event is not None:
                on_event(ev)
        return job.status()

    def find(self, rgb: np.ndarray, mask: np.ndarray, settings: Settings, session: str) -> Optional[Job]:
        """The newest job of ``session`` for this input and these settings that is done (its
        GLB still on disk) or still queued or running (one a restart resumed); None when there
        is none (``kiln run --resume``: an image done before is not made again)."""
        digest, want = input_digest(rgb, mask), settings.to_dict()
        for st in reversed(self.jobs(session)):
            if st.kind != "image" or st.state in ("failed", "cancelled"):
                continue
            if st.state == "done" and not Path(st.outputs.get("glb", "")).is_file():
                continue
            if self.store.read_digest(st.id) != digest:
                continue
            try:
                same = load_job_settings(self.store.job_dir(st.id)).to_dict() == want
            except (OSError, ValueError, TypeError, KeyError):
                same = False
            if same:
                return Job(self._dispatcher, st.id)
        return None

    def jobs(self, session: Optional[str] = None) -> list[JobStatus]:
        """Jobs of one session (all sessions when None), oldest first, including earlier runs'."""
        want = safe_session(session) if session is not None else None
        d = self._dispatcher
        with d.lock:
            out = [JobStatus.from_dict(j.status.to_dict()) for j in d.jobs.values()
                   if want is None or j.status.session == want]
        out.sort(key=lambda s: (s.created, s.id))
        return out

    # ------------------------------------------------------------------ the pool
    def capabilities(self) -> Optional[Capabilities]:
        """What the first worker that got ready reported (``kiln.records.Capabilities``:
        device, which probes passed, why the others did not); None before any did."""
        d = self._dispatcher
        with d.lock:
            for s in d.slots:
                if s.caps is not None:
                    return s.caps
        return None

    def workers(self) -> list[dict]:
        """One dict per worker slot: slot, pid, state, gpu, job, restarts, startup_s, broken,
        heartbeat_age_s, capabilities (as last reported, a ``Capabilities`` or None), log
        (path of the worker's log)."""
        now = time.monotonic()
        d = self._dispatcher
        with d.lock:
            return [s.info(now, s.job.status.id if s.job else None) for s in d.slots]

    def health(self) -> Health:
        """Whether this server can take a job now (``worker.upkeep.health``): a worker ready,
        room on the job store's and the cache's disks; with the figures."""
        from worker.jobs.inputs import job_bytes

        running, queued = self.load()
        places = [self.jobs_dir] + ([self.cache_dir] if self.cache_dir is not None else [])
        last, b = self.upkeep.last, self.upkeep.budgets
        disk = {} if last is None else {
            "cache_mb": round(last.cache_bytes / 2**20, 1), "cache_budget_mb": round(b.cache_bytes / 2**20, 1),
            "jobs_mb": round((last.jobs_bytes + last.other_bytes) / 2**20, 1),
            "jobs_budget_mb": round(b.jobs_bytes / 2**20, 1)}
        return judge(self.workers(), places, job_bytes(HEALTH_JOB_PIXELS, self.settings.bake.texture_size),
                     queued, running, disk)

    def queue_length(self) -> int:
        d = self._dispatcher
        with d.lock:
            return len(d.queue)

    def load(self) -> tuple[int, int]:
        """(jobs running on a worker, jobs waiting for one), as of now."""
        d = self._dispatcher
        with d.lock:
            return sum(1 for s in d.slots if s.job is not None), len(d.queue)

    def running(self) -> list[JobStatus]:
        """The jobs on a worker now (copies of their statuses), in slot order."""
        d = self._dispatcher
        with d.lock:
            return [JobStatus.from_dict(s.job.status.to_dict()) for s in d.slots if s.job is not None]

    def queue_place(self, job_id: str) -> Optional[int]:
        """The job's place in the queue (1: next to get a worker); None when it is not
        waiting (running, ended, or unknown)."""
        d = self._dispatcher
        with d.lock:
            return next((i + 1 for i, j in enumerate(d.queue) if j.status.id == job_id), None)
