"""What an engine is to the dispatcher (``worker.engines`` lists the engines): a leaf, so the
dispatcher can name the protocol without importing the engines, which import the pool's
slots and errors."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from worker.child.workerconfig import WorkerConfig
    from worker.pool.slots import WorkerSlot


class Engine(Protocol):
    """Starts worker processes for the dispatcher (under its lock)."""

    name: str

    def slots(self, var_dir: Path) -> list[WorkerSlot]:
        """The pool's slots, none started yet; what an earlier server left behind is cleared
        first. Raises ``worker.errors.WorkerStartError`` when there is nowhere to run."""

    def spawn(self, slot: WorkerSlot, cfg: WorkerConfig) -> None:
        """Start a worker in ``slot`` (its state becomes 'starting'); raises when it cannot."""

    def close(self) -> None:
        """Release what the engine holds once every slot is discarded (the dispatcher stopped)."""
