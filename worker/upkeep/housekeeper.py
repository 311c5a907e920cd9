"""The supervisor's housekeeping thread: keeps the job store and the cache under their budgets
(``worker.upkeep.budget``) while the server runs, and keeps the disk figures of the metrics.

It runs a pass when the supervisor starts, after jobs end (at most every ``MIN_GAP_S``) and
every ``interval_s`` otherwise (the age rule needs time to pass, not events). Files are
deleted outside the dispatcher's lock (deleting a few GB takes a while); the lock is held only
to copy the job records and to mark a removed job's record, so a page reading the job sees
the files gone and the reason together.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from worker.jobs.jobstore import RUNNING, JobStatus, JobStore
from worker.upkeep.budget import Budgets, PruneReport, Removal, prune
from worker.upkeep.telemetry import JobEvents

if TYPE_CHECKING:
    from worker.pool.dispatcher import Dispatcher

log = logging.getLogger("kiln.worker")

MIN_GAP_S = 5.0        # between passes woken by jobs ending: a burst of ends is one pass


class Housekeeper:
    """``protected() -> job ids``: results a page shows now (the app sets it; none by default).
    ``also_count``: folders counted with the job store (the app's tabs' photos and Gradio's
    files). ``clock``: wall time, as in job statuses (a test or a bench advances it)."""

    def __init__(self, dispatcher: Dispatcher, store: JobStore, cache_dir: Optional[Path], budgets: Budgets,
                 events: JobEvents, clock: Callable[[], float] = time.time, interval_s: float = 300.0):
        self.dispatcher = dispatcher
        self.store = store
        self.cache_dir = cache_dir
        self.budgets = budgets
        self.events = events
        self.clock = clock
        self.interval_s = interval_s
        self.protected: Callable[[], set[str]] = set
        self.also_count: list[Path] = []
        self.after_pass: list[Callable[[set[str]], object]] = []
        self.last: Optional[PruneReport] = None
        self._sizes: dict[str, int] = {}     # job id -> bytes (an ended job's does not change)
        self._pass = threading.Lock()        # one pass at a time (the thread, a CLI's or test's call)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def run_once(self, now: Optional[float] = None, dry_run: bool = False) -> PruneReport:
        """One pass; ``now`` defaults to ``clock()``."""
        with self._pass:
            now = self.clock() if now is None else now
            d = self.dispatcher
            with d.lock:
                jobs = [JobStatus.from_dict(r.status.to_dict()) for r in d.jobs.values()]
            starts = [st.started for st in jobs if st.state == RUNNING and st.started is not None]
            # sizes of jobs no longer known (forgotten by another pass) would count for ever
            known = {st.id for st in jobs}
            for gone in [k for k in self._sizes if k not in known]:
                del self._sizes[gone]
            report = prune(self.store, self.cache_dir, self.budgets, now, jobs, self.protected,
                           self.also_count, min(starts) if starts else None, self._sizes, dry_run,
                           on_removed=None if dry_run else self._removed)
            if not dry_run:
                self.events.cache_removed(len(report.cache))
                for e in report.cache:
                    log.info("cache entry removed (app.cache_max_mb): %s, %.1f MB", e.path.name, e.bytes / 2**20)
            self.events.disk_figures(report.cache_bytes, report.jobs_bytes, report.other_bytes,
                                     self.budgets.cache_bytes, self.budgets.jobs_bytes)
            self.last = report
            if not dry_run and self.after_pass:
                removed_ids = {removal.id for removal in report.jobs}
                live = {st.id for st in jobs if st.removed is None and st.id not in removed_ids}
                for hook in self.after_pass:
                    try:
                        hook(live)
                    except Exception:   # a hook's failure must not stop the budgets' passes
                        log.exception("after-pass hook failed")
            return report

    def _removed(self, r: Removal, new: Optional[JobStatus]) -> None:
        d = self.dispatcher
        with d.lock:
            rec = d.jobs.get(r.id)
            if new is None:
                d.jobs.pop(r.id, None)
            elif rec is not None:
                rec.status.removed, rec.status.removed_why, rec.status.seq = new.removed, new.removed_why, new.seq
                rec.events.clear()
        if new is not None:
            log.info("job %s: files removed (%s), %.1f MB", r.id, r.why, r.bytes / 2**20)
            self.events.removed(new, r.why)

    # -- the thread -------------------------------------------------------------------
    def poke(self) -> None:
        """A job ended: a pass soon."""
        self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="kiln-housekeeper", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _loop(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            gap = MIN_GAP_S - (time.monotonic() - last)
            if gap > 0 and self._stop.wait(gap):
                return
            try:
                self.run_once()
            except Exception:   # the next pass tries again; a disk error must not end the thread
                log.exception("disk budget pass failed")
            last = time.monotonic()
            self._wake.wait(self.interval_s)
            self._wake.clear()
