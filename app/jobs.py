"""Running a tab's jobs: submit once the worker pool is up, follow, cancel when the tab goes
away; which jobs each session is following."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from kiln.settings import Settings

from .messages import public_text

log = logging.getLogger(__name__)

WAITING_FOR_POOL = "Waiting for the worker pool to start…"


def watch_job(job, poll_s: float = 0.25) -> Iterator[Any]:
    """Yield the status of ``job`` (a ``worker.jobhandle.Job``) whenever its sequence
    number changes, ending with a terminal status (done / failed / cancelled)."""
    seen = -1
    while True:
        st = job.status()
        if st.seq != seen or st.terminal:
            seen = st.seq
            yield st
        if st.terminal:
            return
        time.sleep(poll_s)


def follow_job(ctx, session: str, rgb: np.ndarray, mask: np.ndarray, settings: Settings,
               poll_s: float = 0.25) -> Iterator[tuple[str, Any]]:
    """Submit a job for ``session`` once the worker pool is up, then follow it.

    ``ctx``: an ``app.context.AppContext``; rgb (H, W, 3) uint8, mask (H, W) bool.
    Yields ``(note, None)`` while the pool starts or when the job cannot be
    submitted (the note says why), then ``("", JobStatus)`` whenever the job
    changes, ending with its terminal status. Closing the generator before that
    (the tab went away, or Cancel stopped the Gradio event) cancels the job, so
    its worker is freed for others.
    """
    while not ctx.sup_ready.is_set():
        # a yield per second lets Gradio drop a closed tab's generator while it waits
        yield WAITING_FOR_POOL, None
        ctx.sup_ready.wait(1.0)
    sup = ctx.sup
    if sup is None:
        yield ctx.sup_error or "the worker pool is not running", None
        return
    try:
        job = sup.submit(rgb, mask, settings, session=session)
    except Exception as e:  # noqa: BLE001 - queue full or a refused input: the person reads why
        log.warning("submit failed: %s", e)
        yield f"Could not start the job: {public_text(str(e))}", None
        return
    finally:
        del rgb, mask   # full size, up to app.max_pixels: the job store has them now
    ctx.summaries[job.id] = settings_summary(settings)
    ctx.active.add(session, job.id)
    last = None
    try:
        for last in watch_job(job, poll_s):
            yield "", last
    finally:
        ctx.active.discard(session, job.id)
        if last is None or not last.terminal:
            try:
                job.cancel()
            except Exception:  # noqa: BLE001 - the person is gone; the log keeps the reason
                log.exception("cancel of %s failed", job.id)


def settings_summary(settings: Settings) -> str:
    """'texture 1024px opt, 16 views, simplify 0.95, seed 0': what a person chose for a job."""
    b = settings.bake
    tex = f"texture {b.texture_size}px {b.mode}" if b.enabled else "vertex colours"
    ply = ", +ply" if settings.export.gaussians_ply else ""
    return f"{tex}, {settings.views.count} views, simplify {settings.mesh.simplify_ratio:g}, seed {settings.seed}{ply}"


@dataclass
class ActiveJobs:
    """session -> the jobs it is following, so Cancel finds them whatever the page holds;
    plus the sessions whose Generate is still waiting in Gradio's queue for a slot."""

    jobs: dict = field(default_factory=dict)      # session -> set of job ids
    pending: set = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set_pending(self, session: str, on: bool) -> None:
        with self.lock:
            (self.pending.add if on else self.pending.discard)(session)

    def take_pending(self, session: str) -> bool:
        """True (and forget it) when the session had a Generate waiting."""
        with self.lock:
            if session in self.pending:
                self.pending.discard(session)
                return True
            return False

    def add(self, session: str, job_id: str) -> None:
        """The session's Generate got its job: no longer pending."""
        with self.lock:
            self.pending.discard(session)
            self.jobs.setdefault(session, set()).add(job_id)

    def discard(self, session: str, job_id: str) -> None:
        with self.lock:
            ids = self.jobs.get(session, set())
            ids.discard(job_id)
            if not ids:
                self.jobs.pop(session, None)

    def get(self, session: str) -> list[str]:
        """The session's running jobs, oldest id first."""
        with self.lock:
            return sorted(self.jobs.get(session, ()))
