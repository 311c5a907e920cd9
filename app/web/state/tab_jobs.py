"""The active-jobs record: for each tab (or API session), the jobs it shows that have not
ended, a Generate pressed and not yet submitted and since when, a Cancel pressed since,
how its last job ended until the page has shown it (an ``Outcome``), and why its last press
was refused until the page has shown that; for each job, when
a page last followed it (the orphan reaper in ``app.web.state.browser_jobs`` reads that).

One record under one lock, so that a check and the mark it guards happen together: a tab
with a job or a waiting Generate cannot get a second one between the two (``press``).
Nothing here lives in a ``gr.State``: the record is keyed by the session name the server
derives from the browser cookie (``app.web.server.requestinfo``), so no client can name another's.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from app.web.state.job_outcome import Outcome


@dataclass
class TabJobs:
    """One tab's entry. ``pressed_at``: when its Generate, not yet submitted, was pressed
    (``time.time()``; None when none is on its way): "Done in" counts that wait.
    ``cancelling``: Cancel was pressed since that Generate, so a job it submits later is
    cancelled at once. ``refusals``: job kind -> why its last press was refused, until shown."""

    jobs: set = field(default_factory=set)
    pressed_at: Optional[float] = None
    cancelling: bool = False
    outcomes: dict = field(default_factory=dict)   # job kind -> its last Outcome not yet shown
    refusals: dict = field(default_factory=dict)   # job kind -> why its last press was refused

    @property
    def pending(self) -> bool:
        return self.pressed_at is not None

    @property
    def empty(self) -> bool:
        return (not self.jobs and self.pressed_at is None and not self.cancelling and not self.outcomes
                and not self.refusals)


@dataclass
class ActiveJobs:
    """See the module's text. ``tabs``: session -> ``TabJobs``; ``touched``: job id ->
    ``time.monotonic()`` of the last follow, for every job not known to have ended."""

    tabs: dict = field(default_factory=dict)
    touched: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    reaper: Optional[threading.Thread] = None

    # the caller holds the lock for these two
    def _tab(self, session: str) -> TabJobs:
        return self.tabs.setdefault(session, TabJobs())

    def _tidy(self, session: str) -> None:
        tab = self.tabs.get(session)
        if tab is not None and tab.empty:
            del self.tabs[session]

    # -- a Generate on its way to the worker pool ----------------------------------------
    def press(self, session: str, at: Optional[float] = None) -> bool:
        """A Generate of the tab was accepted: True, and it waits from ``at`` (default now),
        unless the tab already has a job or a waiting Generate (then False, nothing changes).
        A new press spends an earlier Cancel and drops an outcome not yet shown, so a
        Generate dropped from the queue early cannot bring the previous job's back."""
        with self.lock:
            tab = self._tab(session)
            if tab.jobs or tab.pending:
                return False
            tab.pressed_at = time.time() if at is None else float(at)
            tab.cancelling = False
            tab.outcomes.clear()
            return True

    def pending_since(self, session: str) -> Optional[float]:
        """When the tab's waiting Generate was pressed; None when none waits."""
        with self.lock:
            tab = self.tabs.get(session)
            return tab.pressed_at if tab is not None else None

    def end_pending(self, session: str) -> None:
        """The tab's Generate left the queue (its job was submitted, or it could not be)."""
        with self.lock:
            tab = self.tabs.get(session)
            if tab is not None:
                tab.pressed_at = None
                self._tidy(session)

    def take_pending(self, session: str) -> bool:
        """True (and forget it) when the session had a Generate waiting."""
        with self.lock:
            tab = self.tabs.get(session)
            if tab is None or not tab.pending:
                return False
            tab.pressed_at = None
            self._tidy(session)
            return True

    def busy(self, session: str) -> bool:
        """The tab has a job that has not ended, or a Generate waiting for one."""
        with self.lock:
            tab = self.tabs.get(session)
            return tab is not None and bool(tab.jobs or tab.pending)

    # -- the jobs a tab shows ---------------------------------------------------------------
    def add(self, session: str, job_id: str) -> None:
        """The tab shows this job (its Generate got it, or it reconnected to it)."""
        with self.lock:
            tab = self._tab(session)
            tab.pressed_at = None
            tab.jobs.add(job_id)
            self.touched[job_id] = time.monotonic()

    def discard(self, session: str, job_id: str) -> None:
        with self.lock:
            tab = self.tabs.get(session)
            if tab is not None:
                tab.jobs.discard(job_id)
                self._tidy(session)

    def get(self, session: str) -> list[str]:
        """The jobs the tab shows that have not ended, oldest id first."""
        with self.lock:
            tab = self.tabs.get(session)
            return sorted(tab.jobs) if tab is not None else []

    def touch(self, job_id: str) -> None:
        with self.lock:
            if job_id in self.touched:
                self.touched[job_id] = time.monotonic()

    def followed(self) -> dict[str, float]:
        """job id -> when a page last followed it, for every job not known to have ended."""
        with self.lock:
            return dict(self.touched)

    def finished(self, job_id: str) -> None:
        """The job ended (or was given up): no tab shows it any more."""
        with self.lock:
            self.touched.pop(job_id, None)
            for session in [s for s, tab in self.tabs.items() if job_id in tab.jobs]:
                self.tabs[session].jobs.discard(job_id)
                self._tidy(session)

    def on_show(self) -> set[str]:
        """Jobs a page shows or is about to: followed and not ended, or ended with an outcome
        a tab has not taken yet (the disk budgets never remove these: ``worker.upkeep``)."""
        with self.lock:
            ids = set(self.touched)
            for tab in self.tabs.values():
                ids.update(tab.jobs)
                ids.update(o.job_id for o in tab.outcomes.values() if o.job_id)
            return ids

    def drop_session(self, session: str) -> None:
        """The tab closed: its jobs go on (the reaper watches them), the tab forgets them,
        its waiting Generate, its Cancel and its outcome."""
        with self.lock:
            self.tabs.pop(session, None)

    # -- Cancel ---------------------------------------------------------------------------
    def request_cancel(self, session: str) -> None:
        with self.lock:
            self._tab(session).cancelling = True

    def cancel_wanted(self, session: str) -> bool:
        with self.lock:
            tab = self.tabs.get(session)
            return tab is not None and tab.cancelling

    # -- how the tab's last job ended -------------------------------------------------------
    def keep_outcome(self, session: str, outcome: "Outcome") -> None:
        """Keep ``outcome`` for the tab until the page shows it (``take_outcome``)."""
        with self.lock:
            self._tab(session).outcomes[outcome.kind] = outcome

    def take_outcome(self, session: str, kind: str = "image") -> Optional["Outcome"]:
        """The tab's outcome not yet shown, if it is of a ``kind`` job ("image" | "bake": the
        page's tab that shows it); it is then gone from the record."""
        with self.lock:
            tab = self.tabs.get(session)
            if tab is None:
                return None
            out = tab.outcomes.pop(kind, None)
            self._tidy(session)
            return out

    # -- why the tab's last press was refused -----------------------------------------------
    def keep_refusal(self, session: str, kind: str, text: str) -> None:
        """Keep why the tab's press of ``kind`` ("image" | "bake") was refused, for the
        page's progress line (the pop-up goes away; this stays until the next action)."""
        with self.lock:
            self._tab(session).refusals[kind] = text

    def take_refusal(self, session: str, kind: str) -> Optional[str]:
        with self.lock:
            tab = self.tabs.get(session)
            if tab is None:
                return None
            text = tab.refusals.pop(kind, None)
            self._tidy(session)
            return text
