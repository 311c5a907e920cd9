"""What the supervisor and a Ray host actor (``worker.engines.rayhost``) hand each other.

Frozen dataclasses, serialised by Ray (by reference to this module, which every node imports
from its own Kiln install). The worker's own messages (``worker.messages``) travel inside
them unchanged, so the dispatcher reads a worker on a Ray node exactly as a local one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from worker.messages import Done, Failed, Heartbeat, Probing, Progress, Ready, Started

# what a worker process says (``worker.messages``, worker -> supervisor)
WorkerMessage = Union[Heartbeat, Probing, Ready, Started, Progress, Done, Failed]


@dataclass(frozen=True)
class JobFiles:
    """Files of one job's folder, by path relative to it (posix, never leaving it).

    To the node: ``inputs/...`` and ``settings.json``. Back: ``outputs/...`` and
    ``result.json`` of an attempt that ended done, and ``log``: the lines the attempt
    appended there (appended to the job's own log, never replacing it)."""

    job: str
    files: tuple[tuple[str, bytes], ...]

    @property
    def size(self) -> int:
        return sum(len(data) for _, data in self.files)


@dataclass(frozen=True)
class HostInfo:
    """Where a host actor runs: its Ray node (id and address), its own pid and the folder
    its workers' logs and jobs' scratch copies live in on that node."""

    node_id: str
    node_ip: str
    pid: int
    root: str


@dataclass(frozen=True)
class HostReport:
    """One answer to ``WorkerHost.poll``.

    messages: what the worker sent since the last report, oldest first.
    files: the results of jobs that ended in this report (object-store transfer), to be
        written into their folders before ``messages`` are read.
    exitcode: the worker's exit status once it has exited (negative: the signal); None while
        it runs. Nothing more comes from this worker after a report with an exit code.
    cpu_idle_s: while it runs a job, seconds since the worker (with its children) last gained
        CPU time, measured on its node (``worker.pool.liveness``); None otherwise.
    proc_state: its scheduler state as last seen ('running', 'sleeping', 'stopped', ...).
    log_tail: the end of the worker's own log, once it has exited.
    """

    messages: tuple[WorkerMessage, ...] = ()
    files: tuple[JobFiles, ...] = ()
    exitcode: Optional[int] = None
    exited: bool = False
    cpu_idle_s: Optional[float] = None
    proc_state: str = "unknown"
    log_tail: str = ""
