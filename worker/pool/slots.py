"""Worker slots: one position in the pool, holding at most one spawned worker process.

A slot outlives the processes in it. It keeps what must survive a restart (the GPU it
is pinned to, the probes that crashed a worker in two starts in a row and are skipped
from then on, the last
capability report, restart and start-failure counts) and, per process, the two
queues, the state and the clocks its deadlines are measured from.

The supervisor decides what a worker does and what its death means for a job; the
slot knows how to start, read, watch, stop and dispose of the process, so that no
process, pipe or zombie outlives it. Not thread-safe: the supervisor calls it under
its lock.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from multiprocessing.process import BaseProcess
from multiprocessing.queues import SimpleQueue
from pathlib import Path
from typing import Any, Iterator, Literal, Optional

from kiln.records import Capabilities

from worker.child import process as process_mod
from worker.pool.liveness import LivenessProbe
from worker.messages import Heartbeat, Probing, Ready
from worker.child.workerconfig import WorkerConfig

log = logging.getLogger("kiln.worker")

KILL_GRACE_S = 1.0          # SIGTERM -> SIGKILL
STARTUP_FAILURES_LIMIT = 3  # consecutive failed starts before a slot gives up
STOP_GRACE_S = 5.0          # a worker that said it will exit (CUDA error) gets this long
# A probe that crashed its worker this many starts in a row is skipped from then on; one
# crash may be a fluke (a driver hiccup, a JIT build racing another process), so the next
# start probes again.
PROBE_CRASHES_LIMIT = 2


# 'down' (no process) | 'starting' (probing backends) | 'idle' | 'busy' (running a job) |
# 'stopping' (it said it will exit, e.g. after a CUDA error)
SlotState = Literal["down", "starting", "idle", "busy", "stopping"]


def describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"crashed with {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class WorkerSlot:
    """One position in the pool; ``state`` is a ``SlotState``, ``job`` the job it runs
    while 'busy'."""

    def __init__(self, index: int, gpu: Optional[str], log_path: Path):
        self.index = index
        self.gpu = gpu
        self.log_path = log_path
        self.skip_probes: dict[str, str] = {}   # probe name -> why it is skipped
        self.probe_crashes: dict[str, int] = {}  # probe name -> starts in a row it crashed
        self.starts = 0                         # processes spawned in this slot
        self.failures = 0                       # consecutive failed starts
        self.restarts = 0                       # processes lost after they were ready
        self.next_spawn = 0.0                   # no start before this (monotonic), a back-off
        self.broken: Optional[str] = None       # why the slot gave up for good
        self.caps: Optional[Capabilities] = None   # last capability report, kept across restarts
        self._reset()

    def _reset(self) -> None:
        self.proc: Optional[BaseProcess] = None
        self.inbox: Optional[SimpleQueue[Any]] = None     # supervisor -> worker
        self.outbox: Optional[SimpleQueue[Any]] = None    # worker -> supervisor
        self.state: SlotState = "down"
        self.job: Any = None                    # the supervisor's record of the job it runs
        self.spawned = 0.0
        self.startup_s: Optional[float] = None
        self.last_msg = 0.0                     # any message, heartbeats included
        self.last_progress = 0.0                # the running job's last event: its stage deadline
        self.probe: Optional[str] = None        # the start-up probe running now
        self.liveness: Optional[LivenessProbe] = None   # CPU-time sampler while busy
        self.frozen_status: Optional[str] = None       # process state when judged frozen
        self.phase = "starting"                 # what a starting worker does, for error messages
        self.phase_since = 0.0
        self.kill_reason: Optional[str] = None
        self.term_sent = 0.0
        self.kill_sent = False
        self.stop_since = 0.0

    # ------------------------------------------------------------------ process
    def spawn(self, ctx, cfg: WorkerConfig) -> None:
        """Start a worker with fresh queues; ``cfg``: its configuration (this slot's
        index, GPU, log and skipped probes in it)."""
        self._reset()
        inbox, outbox = ctx.SimpleQueue(), ctx.SimpleQueue()
        try:
            proc = ctx.Process(target=process_mod.worker_main, args=(cfg, inbox, outbox),
                               name=f"kiln-worker-{self.index}", daemon=True)
            proc.start()
        except BaseException:
            _close_queues(inbox, outbox)
            raise
        self.proc, self.inbox, self.outbox, self.state = proc, inbox, outbox, "starting"
        self.starts += 1
        self.spawned = self.last_msg = self.phase_since = time.monotonic()

    def exit_code(self) -> Optional[int]:
        """The dead worker's exit status (negative: the signal that killed it); None when unknown."""
        return self.proc.exitcode if self.proc is not None else None

    def exit_description(self) -> str:
        """How the worker ended, in words that follow "worker" ("crashed with SIGSEGV")."""
        return describe_exit(self.exit_code())

    @property
    def exited(self) -> bool:
        """The process is gone (``is_alive`` also reaps it, so it leaves no zombie)."""
        return self.proc is not None and not self.proc.is_alive()

    def messages(self) -> Iterator[object]:
        """What the worker has sent, oldest first, without blocking. Each message is one
        pipe write under PIPE_BUF, so a worker that died mid-send left none half-written;
        the parent holds both pipe ends, so what a dead worker sent is still readable."""
        while self.outbox is not None:
            try:
                if self.outbox.empty():
                    return
                msg = self.outbox.get()
            except (EOFError, OSError, ValueError):
                return
            self.last_msg = time.monotonic()
            yield msg

    def send(self, msg) -> bool:
        """Put one of ``worker.messages``' requests in the worker's inbox; False when its
        pipe is gone."""
        if self.inbox is None:
            return False
        try:
            self.inbox.put(msg)
            return True
        except (OSError, ValueError):
            return False

    def kill(self, reason: str) -> None:
        """SIGTERM now (the worker's faulthandler logs its stacks), SIGKILL after
        ``KILL_GRACE_S`` (see ``watch``). ``reason`` says what its exit will mean."""
        self.kill_reason = reason
        self.term_sent = time.monotonic()
        if self.proc is None:
            return
        try:
            self.proc.terminate()
            if reason == "frozen" and self.proc.pid is not None:
                # a stopped process keeps SIGTERM pending; SIGCONT lets it act on it and
                # its faulthandler log where it was stuck
                os.kill(self.proc.pid, signal.SIGCONT)
        except (OSError, ValueError):
            pass

    def discard(self) -> None:
        """Reap the process, close its queues' pipes and forget the per-process state."""
        proc = self.proc
        if proc is not None:
            proc.join(0.5)
            if proc.is_alive():
                proc.kill()
                proc.join(2)
            try:
                proc.close()  # its sentinel fd
            except ValueError:
                pass  # still running after SIGKILL (stuck in the kernel); nothing more to do
        _close_queues(self.inbox, self.outbox)
        self._reset()

    # ------------------------------------------------------------------ bookkeeping
    def note(self, msg, now: float) -> bool:
        """Take a start-up or liveness message (Heartbeat, Probing, Ready); False for a
        job's message."""
        if isinstance(msg, Heartbeat):
            return True
        if isinstance(msg, Probing):
            if self.probe is not None:   # the one before ended without killing the worker
                self.probe_crashes.pop(self.probe, None)
            # name None: probing is over, the worker imports the stages' libraries
            self.probe = msg.name
            self.phase = f"probe {self.probe}" if self.probe else "importing the stage libraries"
            self.phase_since = now
            return True
        if isinstance(msg, Ready):
            self.probe_crashes.clear()   # every probe that ran ended without a crash
            self.probe, self.caps, self.state = None, msg.caps, "idle"
            self.startup_s = round(now - self.spawned, 3)
            self.failures = 0
            log.info("worker %d (pid %s) ready in %.2f s; working: %s", self.index, msg.pid,
                     self.startup_s, ", ".join(msg.caps.working()) or "nothing")
            return True
        return False

    def watch(self, now: float, probe_timeout_s: float, heartbeat_limit: float,
              stage_timeout: float, stall_timeout: float = 0.0) -> None:
        """Kill a worker that overran its deadline, or a busy one that has shown no sign of
        life (no CPU time, no message) for ``stall_timeout`` s (0: not checked); SIGKILL
        one that outlived SIGTERM."""
        if self.proc is None:
            return
        if self.kill_reason:
            if not self.kill_sent and now - self.term_sent > KILL_GRACE_S:
                self.proc.kill()
                self.kill_sent = True
            return
        if self.state == "starting":
            if self.probe and now - self.phase_since > probe_timeout_s + 5:
                self.kill("probe-timeout")  # the probe's own timer did not fire: stuck in native code
            elif not self.probe and now - self.last_msg > heartbeat_limit + 30:
                self.kill("startup-timeout")
        elif self.state == "busy":
            if now - self.last_progress > stage_timeout:
                self.kill("hang")
            elif stall_timeout > 0 and self._stalled(now, stall_timeout):
                self.kill("frozen")
        elif self.state == "idle":
            if now - self.last_msg > heartbeat_limit:
                self.kill("unresponsive")
        elif self.state == "stopping" and now - self.stop_since > STOP_GRACE_S:
            self.kill("stopping")

    def _stalled(self, now: float, stall_timeout: float) -> bool:
        pid = self.proc.pid if self.proc is not None else None
        if pid is None:
            return False
        if self.liveness is None:
            # four samples per window, at most one a second: reading /proc is cheap, not free
            self.liveness = LivenessProbe(pid, min(1.0, stall_timeout / 4), now)
        silent = self.liveness.sample(now, max(self.last_msg, self.last_progress))
        if silent <= stall_timeout:
            return False
        self.frozen_status = self.liveness.status
        log.error("worker %d (pid %s) shows no sign of life for %.1f s (state %s): frozen",
                  self.index, pid, silent, self.frozen_status)
        return True

    def start_ended(self, desc: str) -> Optional[str]:
        """Judge a worker that died while starting (call before ``discard``). When a probe
        killed it, that probe is skipped from now on and None is returned (restart at
        once); otherwise what went wrong, for ``count_start_failure``."""
        if self.probe is not None and self.kill_reason != "startup-timeout":
            if self.kill_reason == "probe-timeout":
                # stuck in native code for probe_timeout_s: another try costs as long again
                why = "probe timed out"
            else:
                n = self.probe_crashes[self.probe] = self.probe_crashes.get(self.probe, 0) + 1
                if n < PROBE_CRASHES_LIMIT:
                    log.warning("worker %d: probe %s %s; restarting and probing it again",
                                self.index, self.probe, desc)
                    return None
                why = f"probe {desc}" + (" twice in a row" if n == 2 else f" {n} times in a row")
            self.skip_probes[self.probe] = f"{why} (see {self.log_path.name})"
            log.warning("worker %d: %s probe %s; restarting without it", self.index, self.probe, why)
            return None
        if self.kill_reason == "startup-timeout":
            return f"stopped responding while {self.phase} and was killed"
        return f"{desc} while {self.phase}"

    def count_start_failure(self, what: str) -> None:
        """Back off before the next start; give up after ``STARTUP_FAILURES_LIMIT`` in a row."""
        self.failures += 1
        self.next_spawn = time.monotonic() + min(30.0, 2.0 ** self.failures)
        if self.failures >= STARTUP_FAILURES_LIMIT:
            self.broken = f"worker {self.index} failed to start {self.failures} times: {what}"

    @property
    def start_marker(self) -> str:
        """How each start of this slot's worker begins in its log (``process.worker_main``)."""
        return f"--- worker {self.index} pid "

    def log_tail(self, lines: int, marker: Optional[str] = None) -> str:
        """The worker log's last ``lines`` lines (from ``marker`` on when it is there)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, self.log_path.stat().st_size - 200_000))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return cut_tail(text, lines, marker)

    def info(self, now: float, job_id: Optional[str]) -> dict:
        """What ``Supervisor.workers`` reports; ``job_id``: the job it runs."""
        return {"slot": self.index, "pid": self.proc.pid if self.proc else None, "state": self.state,
                "gpu": self.gpu, "job": job_id,
                "restarts": self.restarts, "startup_s": self.startup_s, "broken": self.broken,
                "heartbeat_age_s": round(now - self.last_msg, 2) if self.proc else None,
                "capabilities": self.caps, "log": str(self.log_path)}


def cut_tail(text: str, lines: int, marker: Optional[str] = None) -> str:
    """The last ``lines`` lines of a log's ``text``, from the last ``marker`` on when it is there."""
    if marker is not None:
        i = text.rfind(marker)
        if i >= 0:
            text = text[i:]
    return "\n".join(text.splitlines()[-lines:])


def _close_queues(*queues) -> None:
    for q in queues:
        if q is not None:
            try:
                q.close()
            except (OSError, AttributeError):
                pass
