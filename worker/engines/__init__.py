"""Where Kiln's worker processes run: the seam between the dispatcher and the machines.

The dispatcher (``worker.dispatcher``) owns every rule about jobs: the queue, deadlines,
what a worker's death means, the retry rule. An engine owns only where and how a worker
process is started, and gives the dispatcher ``worker.slots.WorkerSlot``s to drive:

* ``local`` (``worker.engines.local``): spawned processes on this machine, one per
  visible GPU (today's pool);
* ``ray`` (``worker.engines.ray``): the same worker process (``worker.process``), started
  on a node of a Ray cluster by a small host actor that holds one GPU (``docs/cluster.md``).

The setting ``worker.engine`` chooses; Ray is imported only when it is chosen.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kiln.settings import Settings

    from worker.slots import WorkerSlot
    from worker.workerconfig import WorkerConfig


class Engine(Protocol):
    """Starts worker processes for the dispatcher (under its lock)."""

    name: str

    def slots(self, var_dir: Path) -> list[WorkerSlot]:
        """The pool's slots, none started yet; what an earlier server left behind is cleared
        first. Raises ``worker.dispatcher.WorkerStartError`` when there is nowhere to run."""

    def spawn(self, slot: WorkerSlot, cfg: WorkerConfig) -> None:
        """Start a worker in ``slot`` (its state becomes 'starting'); raises when it cannot."""

    def close(self) -> None:
        """Release what the engine holds once every slot is discarded (the dispatcher stopped)."""


def make_engine(settings: Settings) -> Engine:
    """The engine ``settings.worker.engine`` names; nothing is started or connected yet."""
    if settings.worker.engine == "ray":
        from worker.engines.ray import RayEngine

        return RayEngine(settings)
    from worker.engines.local import LocalEngine

    return LocalEngine(settings)
