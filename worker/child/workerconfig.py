"""What the supervisor hands a worker process when it spawns it: one ``WorkerConfig``.

It is ``worker.child.process.worker_main``'s first argument, pickled by the spawn start method
like the messages on the worker's queues (``worker.messages``), so the worker unpickles it
before it has done anything else, under another interpreter too (``worker.python``): this
module and what it imports (``kiln.settings``, ``worker.child.interpreter``) are pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from kiln.settings import Settings

from worker.child.interpreter import ForeignInterpreter


@dataclass(frozen=True)
class WorkerConfig:
    """One worker process's configuration.

    settings: the pool's settings (the worker's probes and its ``worker.*`` values read them;
        each job brings its own from its directory).
    slot: the worker's position in the pool (``worker.pool.slots.WorkerSlot.index``).
    gpu: the CUDA_VISIBLE_DEVICES entry the worker is pinned to; None leaves it alone.
    log_path: the worker's own log, where its fds 1 and 2 and faulthandler go.
    parent_pid: the supervisor's process; the worker exits when its parent changes.
    skip_probes: probe name -> why it is not run again (it crashed earlier starts of the slot).
    faults_enabled: tests only: fire the faults ``Run.fault`` names (else ignored).
    probe_faults: tests only: start-up step (probe name or "imports") -> fault kind to fire.
    interpreter: how to run under ``worker.python``; None under Kiln's own interpreter.
    """

    settings: Settings
    slot: int
    gpu: Optional[str]
    log_path: str
    parent_pid: int
    skip_probes: Mapping[str, str] = field(default_factory=dict)
    faults_enabled: bool = False
    probe_faults: Mapping[str, str] = field(default_factory=dict)
    interpreter: Optional[ForeignInterpreter] = None

    @property
    def device(self) -> str:
        """``worker.device``: "auto" | "cpu" | "cuda"."""
        return self.settings.worker.device

    @property
    def heartbeat_s(self) -> float:
        return self.settings.worker.heartbeat_s

    @property
    def probe_timeout_s(self) -> float:
        return self.settings.worker.probe_timeout_s

    def probe_fault(self, step: str) -> Optional[str]:
        """The test fault to fire in start-up step ``step``, if any."""
        return self.probe_faults.get(step) if self.faults_enabled else None
