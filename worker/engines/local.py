"""The local engine: worker processes spawned on this machine, one per visible GPU (one on a
CPU machine, or ``worker.count``), each pinned to its GPU with ``CUDA_VISIBLE_DEVICES``.

Each worker is ``worker.child.process.worker_main`` in a ``spawn``-context child (no fork: the
parent's handles stay its own), under ``worker.python`` when that is set. Its pid is recorded
beside its log (``worker.pool.leftovers``) so that the next server can kill one that a dead server
left stopped.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from dataclasses import replace
from pathlib import Path

from kiln.settings import Settings

from worker.child import env as env_mod
from worker.child import interpreter
from worker.pool import leftovers
from worker.pool.slots import WorkerSlot
from worker.child.workerconfig import WorkerConfig

log = logging.getLogger("kiln.worker")


class LocalEngine:
    """Spawned worker processes on this machine."""

    name = "local"

    def __init__(self, settings: Settings):
        self.settings = settings
        self._ctx = mp.get_context("spawn")

    def slots(self, var_dir: Path) -> list[WorkerSlot]:
        workers_dir = var_dir / "workers"
        for pid in leftovers.kill_leftovers(workers_dir) if workers_dir.is_dir() else ():
            log.warning("killed worker %d, left running (stopped) by a server that is gone", pid)
        gpus = [] if self.settings.worker.device == "cpu" else env_mod.detect_gpus()
        count = self.settings.worker.count or max(1, len(gpus))
        return [WorkerSlot(i, gpus[i % len(gpus)] if gpus else None, workers_dir / f"worker-{i}.log")
                for i in range(count)]

    def spawn(self, slot: WorkerSlot, cfg: WorkerConfig) -> None:
        foreign = interpreter.foreign_interpreter(self.settings.worker.python)  # None unless set
        cfg = replace(cfg, interpreter=foreign)
        with interpreter.spawning(self._ctx, foreign.python if foreign else None):
            slot.spawn(self._ctx, cfg)
        if slot.proc is not None and slot.proc.pid:
            leftovers.record(slot.log_path.parent, slot.index, slot.proc.pid, os.getpid())

    def close(self) -> None:
        pass
