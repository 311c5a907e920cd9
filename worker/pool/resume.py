"""What becomes of a job a previous server left queued or running (kill -9, the OOM killer, a
reboot): queued again, or settled as failed, and the words that say which and why.

A job that was *running* when the server went down may be what took it down, so that counts
as one crash of its input (``worker.pool.crashcounts``, the same count the retry rule reads): an
input that has crashed a worker or the server before is not resumed again. A job that was
only waiting cannot have caused it and is always resumed (when resuming is on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from worker.jobs.jobstore import RUNNING, JobStatus


@dataclass(frozen=True)
class Resume:
    """resume: queue the job again; message: its status says this (why it failed, when not)."""

    resume: bool
    message: str


def where_it_stopped(st: JobStatus) -> str:
    if st.state != RUNNING:
        return "before the job started"
    return f"during stage '{st.stage}'" if st.stage else "while the job was starting"


def decide(st: JobStatus, enabled: bool, crash_count: int, problem: Optional[str] = None) -> Resume:
    """``st``: the job as the dead server left it (queued or running). ``enabled``: the setting
    ``worker.resume_interrupted``. ``crash_count``: its input's crashes, this interruption
    included when it was running. ``problem``: why it cannot be resumed (its settings or inputs
    unreadable), None when it can."""
    stopped = f"interrupted: the server stopped {where_it_stopped(st)}"
    if not enabled:
        return Resume(False, stopped)
    if problem:
        return Resume(False, f"{stopped}; not resumed: {problem}")
    if st.state == RUNNING and crash_count > 1:
        return Resume(False, f"{stopped}; not resumed: this input was running when a worker or "
                             f"the server went down {crash_count} times")
    return Resume(True, f"resumed: the server stopped {where_it_stopped(st)}")
