"""A handle on one job, in the manner of ``concurrent.futures.Future``.

``Supervisor.submit`` returns one; ``Supervisor.job(job_id)`` makes one for a job
submitted earlier, even by a server that has since restarted (the web UI keeps job ids
in its session store and reattaches with them). A handle is a job id plus the
supervisor that knows the job; any number of them may exist for one job.

    job = sup.submit(rgb, mask, settings)
    for ev in job.follow():
        print(ev.stage, ev.progress)
    st = job.result()        # JobStatus of a done job; raises JobFailed / JobCancelled
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

from worker.jobs.jobstore import CANCELLED, DONE, Event, JobStatus

if TYPE_CHECKING:
    from worker.pool.dispatcher import Dispatcher


class JobError(RuntimeError):
    """The job did not end done; ``status`` is how it ended."""

    def __init__(self, status: JobStatus):
        super().__init__(f"job {status.id} {status.state}: {status.error}")
        self.status = status


class JobFailed(JobError):
    """The job ended failed; ``status.error`` says why."""


class JobCancelled(JobError):
    """The job was cancelled."""


class Job:
    def __init__(self, dispatcher: "Dispatcher", job_id: str):
        self._d = dispatcher
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Job) and other.id == self.id and other._d is self._d

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def dir(self) -> Path:
        """The job's directory (``worker.jobs.jobstore`` describes what is in it)."""
        return self._d.store.job_dir(self.id)

    def status(self) -> JobStatus:
        """A snapshot of the job's status."""
        return self._d.status(self.id)

    def done(self) -> bool:
        """Whether the job has ended (done, failed or cancelled)."""
        return self.status().terminal

    def wait(self, timeout: Optional[float] = None) -> JobStatus:
        """Block until the job ends or ``timeout`` passes; returns the status either way."""
        return self._d.wait(self.id, timeout)

    def result(self, timeout: Optional[float] = None) -> JobStatus:
        """The final status of a job that ended done. Raises JobFailed or JobCancelled when
        it ended otherwise, TimeoutError when it has not ended within ``timeout``."""
        st = self.wait(timeout)
        if not st.terminal:
            raise TimeoutError(f"job {self.id} is still {st.state}")
        if st.state == DONE:
            return st
        raise (JobCancelled if st.state == CANCELLED else JobFailed)(st)

    def events(self, since_seq: int = 0, timeout: Optional[float] = None) -> list[Event]:
        """Events with ``seq > since_seq``, oldest first. With ``timeout``, wait up to that
        long for at least one (or for the job to end)."""
        return self._d.events(self.id, since_seq, timeout)

    def follow(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Yield the job's events as they happen until it ends (or ``timeout`` passes)."""
        seq = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            evs = self.events(seq, timeout=1.0 if left is None else min(left, 1.0))
            for ev in evs:
                seq = ev.seq
                yield ev
            if self.status().terminal and not self.events(seq):
                return

    def cancel(self, timeout: float = 5.0, reason: str = "") -> bool:
        """Cancel the job if it is queued or running (a running job's worker is killed and
        replaced); waits up to ``timeout`` for that. True when the job ended cancelled.
        ``reason``: what the job's status says instead of "cancelled by user" (e.g. the
        page's "cancelled: no page of this browser followed it for 120 s")."""
        return self._d.cancel(self.id, timeout, reason)

    def log(self, max_bytes: int = 64_000) -> str:
        """The tail of the job's human-readable log."""
        return self._d.store.read_log(self.id, max_bytes)
