"""Where Kiln's worker processes run: the seam between the dispatcher and the machines.

The dispatcher (``worker.pool.dispatcher``) owns every rule about jobs: the queue, deadlines,
what a worker's death means, the retry rule. An engine owns only where and how a worker
process is started, and gives the dispatcher ``worker.pool.slots.WorkerSlot``s to drive:

* ``local`` (``worker.engines.local``): spawned processes on this machine, one per
  visible GPU (today's pool);
* ``ray`` (``worker.engines.ray``): the same worker process (``worker.child.process``), started
  on a node of a Ray cluster by a small host actor that holds one GPU (``docs/cluster.md``).

The setting ``worker.engine`` chooses; Ray is imported only when it is chosen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.engines.base import Engine

if TYPE_CHECKING:
    from kiln.settings import Settings

__all__ = ["Engine", "make_engine"]


def make_engine(settings: Settings) -> Engine:
    """The engine ``settings.worker.engine`` names; nothing is started or connected yet."""
    if settings.worker.engine == "ray":
        from worker.engines.ray import RayEngine

        return RayEngine(settings)
    from worker.engines.local import LocalEngine

    return LocalEngine(settings)
