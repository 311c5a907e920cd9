"""Is a busy worker still alive? Judged from outside, without the worker's help.

Heartbeats alone cannot tell: a native call that holds the GIL (xatlas unwrapping a big
mesh holds it for minutes) silences the heartbeat thread exactly like a stopped or
deadlocked process does. What tells them apart is CPU time: a busy native call burns
it, a process that is stopped (SIGSTOP), deadlocked, or stuck in the kernel does not.
So the supervisor samples the worker's CPU time (its own plus its children's, so a JIT
build in a compiler subprocess counts) and its scheduler state with psutil, and calls
the worker frozen only when it has neither used CPU time nor sent a message for
``worker.stall_timeout_s``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import psutil


class LivenessProbe:
    """Samples one worker process. ``sample(now, last_msg)`` -> seconds the process has
    shown no sign of life (no CPU time gained, no message sent)."""

    def __init__(self, pid: int, interval_s: float, now: Optional[float] = None):
        import psutil

        self._psutil = psutil
        self.pid = pid
        self.interval_s = interval_s
        try:
            self._proc: Optional[psutil.Process] = psutil.Process(pid)
        except psutil.Error:
            self._proc = None   # already gone: the exit code will say what happened
        self._cpu: Optional[float] = None
        self.last_cpu_growth = time.monotonic() if now is None else now
        self._next = 0.0
        self.status = "unknown"   # the last scheduler state seen ('running', 'stopped', ...)

    def _cpu_seconds(self) -> Optional[float]:
        """User + system CPU seconds of the process and every living descendant."""
        psutil = self._psutil
        if self._proc is None:
            return None
        try:
            with self._proc.oneshot():
                t = self._proc.cpu_times()
                self.status = self._proc.status()
                total = t.user + t.system + t.children_user + t.children_system
            for child in self._proc.children(recursive=True):
                try:
                    c = child.cpu_times()
                    total += c.user + c.system
                except psutil.Error:
                    continue   # exited between the listing and the read
            return total
        except psutil.Error:
            return None

    def sample(self, now: float, last_msg: float) -> float:
        """Seconds since the worker last showed a sign of life, as of ``now`` (monotonic).
        Reads /proc at most every ``interval_s``; between reads the last result stands."""
        if now >= self._next:
            self._next = now + self.interval_s
            cpu = self._cpu_seconds()
            # one clock tick (10 ms) of resolution: any growth at all counts as work
            if cpu is not None and (self._cpu is None or cpu > self._cpu):
                self.last_cpu_growth = now
            if cpu is not None:
                self._cpu = cpu
        return now - max(self.last_cpu_growth, last_msg)

    def reset(self, now: float) -> None:
        """Start the silence over (a new job was handed to the worker)."""
        self.last_cpu_growth = now
