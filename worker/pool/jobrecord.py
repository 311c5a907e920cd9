"""The dispatcher's record of one job: its status, its recent events and what its earlier
attempts did (what ``worker.pool.retry`` decides from)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from kiln.settings import Settings
from kiln.stages import stages_for

from worker.jobs.jobstore import Event, JobStatus
from worker.pool.retry import Failure, FailureKind, used_gpu

EVENTS_KEPT = 2000          # per running job
EVENTS_KEPT_FINISHED = 200


def where(stage: Optional[str]) -> str:
    return f"during stage '{stage}'" if stage else "before its first stage"


def event_of(st: JobStatus, at: Optional[float] = None) -> Event:
    """The event that brought the job to ``st`` (at ``at``, else when it last changed)."""
    return Event(job_id=st.id, seq=st.seq, time=at if at is not None else (st.finished or st.created),
                 state=st.state, stage=st.stage, progress=st.progress, message=st.message,
                 stage_progress=st.stage_progress)


@dataclass
class JobRecord:
    """status: what the job's clients see. settings: the job's own (as in its settings.json;
    a job an earlier server ran has ended, and keeps the defaults here: nothing reads them).
    digest: its input's (``kiln.digest.input_digest``). events: its recent ``Event``s.
    attempt: attempts started. overrides / chunk_scale: what the next attempt changes (a
    retry's). retried: the kinds of retry done ('crash', 'oom', 'error'). notes: why each
    earlier attempt failed."""

    status: JobStatus
    dir: Path
    settings: Settings = field(default_factory=Settings)
    digest: str = ""
    events: list[Event] = field(default_factory=list)
    attempt: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)
    chunk_scale: float = 1.0
    retried: set[str] = field(default_factory=set)
    # Set by cancel(): a retry already on its way (a failure report or a crash that
    # crossed the cancel) must end the job instead of queueing it again.
    cancel_requested: bool = False
    cancel_reason: str = ""     # Job.cancel(reason=...); "" = by the user
    notes: list[str] = field(default_factory=list)

    @property
    def stages(self) -> tuple[str, ...]:
        return stages_for(self.settings.bake.enabled, self.status.kind, scene=self.scene)

    @cached_property
    def scene(self) -> bool:
        """Whether the job makes a scene of several objects (its stages are a scene's), as
        its folder says: read once, whichever way the record was made (submitted, resumed)."""
        from worker.jobs.jobstore import is_scene

        return is_scene(self.dir, self.status.kind)

    @property
    def stage_timeout(self) -> float:
        return self.settings.worker.stage_timeout_s

    @property
    def stall_timeout(self) -> float:
        return self.settings.worker.stall_timeout_s

    @property
    def retry_allowed(self) -> bool:
        return self.settings.worker.retry_with_fallback

    @property
    def log_marker(self) -> str:
        """The line the worker prints into its own log when it starts this attempt."""
        return f"=== job {self.status.id} attempt {self.attempt} ==="

    def failure(self, kind: FailureKind, why: str, error: str = "", crash_count: int = 0) -> Failure:
        """What ``worker.pool.retry.decide`` needs to know about this attempt's failure."""
        return Failure(kind=kind, why=why, error=error,
                       used_gpu=used_gpu(self.status.backends), crash_count=crash_count,
                       crash_retried="crash" in self.retried, oom_retried="oom" in self.retried,
                       error_retried="error" in self.retried, has_overrides=bool(self.overrides),
                       chunk_scale=self.chunk_scale, cancel_requested=self.cancel_requested,
                       cancel_reason=self.cancel_reason,
                       retry_allowed=self.retry_allowed, previous=self.notes[-1] if self.notes else "")
