"""The Ray host actor: runs one Kiln worker process on a Ray node and relays it.

One host holds one unit of the worker's Ray resource (a GPU) and stays up while the workers in
it come and go: a crash, a freeze or a cancel kills the worker process, never the host, so the
next worker starts on a warm node without Ray scheduling anything. The worker is the local
engine's own: ``worker.child.process.worker_main`` in a ``spawn``-context child of the host, with its
two queues, its log on the node, and its pid recorded for ``worker.pool.leftovers``. The host runs no
native code of Kiln's, so what kills a worker (SIGSEGV in a kernel, a CUDA error, SIGSTOP) is
seen from outside it, with the exit status that names the signal; Ray's own report of a dead
worker process does not say which signal it was.

The host judges nothing: it passes the worker's messages on in ``HostReport``s, with what only
its node can measure (the worker's exit status, its CPU time while busy, its log), and does what
the supervisor asks (start, send a message, terminate, kill). Every rule stays in the dispatcher.

Ray is not imported here, except for the node id in ``info``: this class is turned into an
actor by ``worker.engines.ray``. Threaded actor: ``poll`` waits while ``send`` and ``terminate``
come in, so every method holds ``self._lock`` around the worker's state.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Union

from worker.child import interpreter
from worker.pool import leftovers
from worker.engines import jobfiles
from worker.engines.raymessages import HostInfo, HostReport, JobFiles, WorkerMessage
from worker.pool.liveness import LivenessProbe
from worker.messages import Done, Failed, Run, Stop
from worker.pool.slots import WorkerSlot
from worker.child.workerconfig import WorkerConfig

LOG_TAIL_BYTES = 64_000


@dataclass
class _HostJob:
    """The attempt running here: its id, its folder on the server, its copy on this node (None:
    the folder is shared, the worker uses it directly)."""

    id: str
    dir: Path
    scratch: Optional[Path]


class WorkerHost:
    """One worker process at a time on this node; see the module docstring."""

    def __init__(self, scratch_root: str = ""):
        base = Path(scratch_root) if scratch_root else Path(tempfile.gettempdir()) / "kiln-ray"
        self.root = base
        (base / "workers").mkdir(parents=True, exist_ok=True)
        (base / "jobs").mkdir(exist_ok=True)
        # a worker an earlier host left stopped (SIGSTOP) outlives it: end it (worker.pool.leftovers)
        self.leftovers_killed = leftovers.kill_leftovers(base / "workers")
        _undo_ray_thread_cap()
        self._ctx = mp.get_context("spawn")
        self._lock = threading.RLock()
        self._slot: Optional[WorkerSlot] = None
        self._job: Optional[_HostJob] = None
        self._liveness: Optional[LivenessProbe] = None
        self._last_msg = time.monotonic()

    def info(self) -> HostInfo:
        import ray

        ctx = ray.get_runtime_context()
        return HostInfo(node_id=ctx.get_node_id(), node_ip=ray.util.get_node_ip_address(),
                        pid=os.getpid(), root=str(self.root))

    # ------------------------------------------------------------------ the worker
    def spawn(self, cfg: WorkerConfig) -> HostInfo:
        """Start a worker with ``cfg`` made local: its log on this node, this host as its
        parent, ``worker.python`` resolved here. The GPU is the one Ray gave this actor
        (``CUDA_VISIBLE_DEVICES``, inherited), so the worker pins none itself."""
        with self._lock:
            self._end_worker()
            log_path = self.root / "workers" / f"worker-{cfg.slot}-{os.getpid()}.log"
            foreign = interpreter.foreign_interpreter(cfg.settings.worker.python)
            cfg = replace(cfg, gpu=None, log_path=str(log_path), parent_pid=os.getpid(),
                          interpreter=foreign)
            slot = WorkerSlot(cfg.slot, None, log_path)
            with interpreter.spawning(self._ctx, foreign.python if foreign else None):
                slot.spawn(self._ctx, cfg)
            if slot.proc is not None and slot.proc.pid:
                # named by this host's pid: several hosts (servers) may share a node
                leftovers.record(self.root / "workers", os.getpid(), slot.proc.pid, os.getpid())
            self._slot, self._job, self._liveness = slot, None, None
            self._last_msg = time.monotonic()
            return self.info()

    def pid(self) -> Optional[int]:
        with self._lock:
            proc = self._slot.proc if self._slot is not None else None
            return proc.pid if proc is not None else None

    def send(self, msg: Union[Run, Stop], files: Optional[JobFiles] = None) -> bool:
        """Hand the worker ``msg``; a ``Run`` with ``files`` runs on a copy of the job's inputs
        in this node's scratch folder (``worker.ray_transfer: object_store``)."""
        with self._lock:
            slot = self._slot
            if slot is None:
                return False
            if isinstance(msg, Run):
                server_dir, scratch = Path(msg.dir), None
                if files is not None:
                    scratch = self.root / "jobs" / msg.job
                    jobfiles.unpack_inputs(files, scratch)
                    cache = str(self.root / "cache") if msg.cache_dir else None
                    msg = replace(msg, dir=str(scratch), cache_dir=cache)
                self._job, self._liveness = _HostJob(msg.job, server_dir, scratch), None
            return slot.send(msg)

    def terminate(self, frozen: bool = False) -> None:
        """SIGTERM the worker (its faulthandler logs its stacks); ``frozen``: SIGCONT too, so
        a stopped worker acts on it."""
        with self._lock:
            if self._slot is not None and self._slot.proc is not None:
                self._slot.kill("frozen" if frozen else "terminate")

    def kill(self) -> None:
        """SIGKILL the worker (ends a stopped one too)."""
        with self._lock:
            if self._slot is not None and self._slot.proc is not None:
                try:
                    self._slot.proc.kill()
                except (OSError, ValueError):
                    pass

    def close(self) -> None:
        with self._lock:
            self._end_worker()

    def _end_worker(self) -> None:
        if self._slot is not None:
            self._slot.discard()
            self._slot = None
        if self._job is not None and self._job.scratch is not None:
            shutil.rmtree(self._job.scratch, ignore_errors=True)
        self._job = None

    # ------------------------------------------------------------------ reports
    def poll(self, wait_s: float) -> HostReport:
        """What the worker said since the last poll; waits up to ``wait_s`` for something."""
        deadline = time.monotonic() + wait_s
        messages: list[WorkerMessage] = []
        files: list[JobFiles] = []
        while True:
            with self._lock:
                slot = self._slot
                if slot is None:
                    return HostReport(exited=True, log_tail="no worker is running on this host")
                self._drain(slot, messages, files)
                if slot.exited:
                    self._drain(slot, messages, files)   # what it said just before it died
                    return self._exit_report(slot, messages, files)
                if messages or time.monotonic() >= deadline:
                    idle, state = self._cpu_idle()
                    return HostReport(tuple(messages), tuple(files), cpu_idle_s=idle, proc_state=state)
            time.sleep(0.02)

    def _drain(self, slot: WorkerSlot, messages: list[WorkerMessage], files: list[JobFiles]) -> None:
        for msg in slot.messages():
            self._last_msg = time.monotonic()
            job = self._job
            if isinstance(msg, (Done, Failed)) and job is not None and msg.job == job.id:
                if job.scratch is not None:
                    files.append(jobfiles.pack_results(job.id, job.scratch, isinstance(msg, Done)))
                    if isinstance(msg, Done):
                        msg = replace(msg, glb=self._on_server(job, msg.glb) if msg.glb else None,
                                      ply=self._on_server(job, msg.ply) if msg.ply else None,
                                      extra={k: self._on_server(job, v) for k, v in (msg.extra or {}).items()})
                    shutil.rmtree(job.scratch, ignore_errors=True)
                self._job, self._liveness = None, None
            messages.append(msg)   # type: ignore[arg-type]  # a worker sends only WorkerMessages

    @staticmethod
    def _on_server(job: _HostJob, path: str) -> str:
        assert job.scratch is not None
        return str(job.dir / Path(path).relative_to(job.scratch))

    def _exit_report(self, slot: WorkerSlot, messages: list[WorkerMessage],
                     files: list[JobFiles]) -> HostReport:
        code = slot.exit_code()
        job = self._job
        if job is not None and job.scratch is not None:
            files.append(jobfiles.pack_results(job.id, job.scratch, done=False))
        tail = _tail(slot.log_path)
        self._end_worker()
        return HostReport(tuple(messages), tuple(files), exitcode=code, exited=True, log_tail=tail)

    def _cpu_idle(self) -> tuple[Optional[float], str]:
        """While a job runs: seconds since the worker last gained CPU time, and its state."""
        slot = self._slot
        if self._job is None or slot is None or slot.proc is None or slot.proc.pid is None:
            return None, "unknown"
        now = time.monotonic()
        if self._liveness is None:
            self._liveness = LivenessProbe(slot.proc.pid, 0.5, now)
        self._liveness.sample(now, 0.0)
        return round(now - self._liveness.last_cpu_growth, 3), self._liveness.status


def _undo_ray_thread_cap() -> None:
    """Ray sets OMP_NUM_THREADS to an actor's CPU count (1 for this host, which asks for none)
    unless the node's environment set it. The worker does the CPU stages (xatlas, scipy, torch
    on CPU) and gets the node's cores as a local worker does: the cap goes, unless the node's own
    environment (the raylet's) has it."""
    raylet = os.environ.get("RAY_RAYLET_PID", "")
    try:
        names = {item.split(b"=", 1)[0] for item in Path(f"/proc/{raylet}/environ").read_bytes().split(b"\0")}
    except (OSError, ValueError):
        return
    if raylet and b"OMP_NUM_THREADS" not in names:
        os.environ.pop("OMP_NUM_THREADS", None)


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
