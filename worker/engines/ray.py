"""The Ray engine: Kiln's workers on the nodes of a Ray cluster (``worker.engine: ray``).

Each slot of the pool is a host actor (``worker.engines.rayhost.WorkerHost``) that holds one
unit of ``worker.ray_resource`` (a GPU) on whichever node Ray places it, and runs the local
engine's worker process there. ``RaySlot`` is a ``worker.pool.slots.WorkerSlot`` whose process is on
that node: the dispatcher drives it exactly like a local one (same messages, deadlines, words,
retry rule) and the slot turns each call into a call on its host.

How Ray's own recovery maps onto Kiln's (``docs/cluster.md``):

* hosts are made with ``max_restarts=0`` and ``max_task_retries=0``: Ray never runs a job
  again by itself. Kiln's retry rule (``worker.pool.retry``: once, with safe backends, unless the
  input crashed a worker before) decides, and a retry goes back to Kiln's queue, whose next
  free slot may be on another node. Ray's defaults (3 retries of a task on a crash) would run
  an input that segfaults the worker four times and never with the safe backends.
* a worker's crash, hang, freeze or cancel kills the worker process, never the host: the slot
  starts the next worker in the same, warm host. A host lost with its node (or killed) is a
  crash of the job it ran ("worker was lost with its Ray node ..."), and the slot asks Ray for
  a new host, which Ray places on any node with a free unit of the resource.
* the hosts belong to this server's Ray job: when the server dies, Ray ends them and their
  workers exit (they watch their parent); the next server resumes or settles the jobs as
  ``worker.pool.resume`` says, as after a local crash.

Ray is imported only here, and this module only when ``worker.engine`` is ``ray``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Optional

from kiln.settings import Settings

from worker.engines import jobfiles
from worker.errors import WorkerStartError
from worker.engines.raymessages import HostInfo, HostReport, WorkerMessage
from worker.jobs.jobstore import append_log
from worker.messages import Ready, Run
from worker.pool.slots import WorkerSlot, cut_tail, describe_exit
from worker.child.workerconfig import WorkerConfig

log = logging.getLogger("kiln.worker")

POLL_WAIT_S = 0.5        # a host's poll answers at once when the worker said something, else after this
HOST_KILL_GRACE_S = 10.0  # a host that has not ended its worker this long after SIGKILL is killed itself
HOST_CONCURRENCY = 4     # poll waits while send / terminate / kill come in


def import_ray() -> Any:
    """Ray, or the error that says how to get it."""
    try:
        import ray
    except ImportError as e:
        raise WorkerStartError("worker.engine is ray but Ray is not installed here: "
                               "pip install 'kiln3d[ray]' (docs/cluster.md)") from e
    return ray


class RayEngine:
    """Host actors on a Ray cluster; see the module docstring."""

    name = "ray"

    def __init__(self, settings: Settings):
        self.settings = settings
        self.address = settings.worker.ray_address or "auto"
        self.resource = settings.worker.ray_resource
        self.shared = settings.worker.ray_transfer == "shared"
        self.hosts: list[RaySlot] = []
        self._connected_here = False
        self._host_class: Any = None

    def slots(self, var_dir: Path) -> list[WorkerSlot]:
        """Join the cluster (unless this process already has) and make one slot per unit of
        the resource it has (``worker.count`` when set)."""
        ray = import_ray()
        if not ray.is_initialized():
            _check_reachable(self.address)
            try:
                ray.init(address=self.address, namespace="kiln", log_to_driver=False)
            except Exception as e:  # ConnectionError, a bad address: say which cluster
                raise WorkerStartError(f"could not join the Ray cluster at {self.address!r} "
                                       f"(worker.ray_address): {type(e).__name__}: {e}") from e
            self._connected_here = True
        total = int(ray.cluster_resources().get(self.resource, 0))
        if total < 1:
            raise WorkerStartError(
                f"the Ray cluster at {self.address!r} has no '{self.resource}' resource "
                f"(worker.ray_resource); start its nodes with --num-gpus, or with "
                f"--resources='{{\"{self.resource}\": 1}}' (docs/cluster.md)")
        from worker.engines.rayhost import WorkerHost

        # Ray never retries or restarts on its own: Kiln's retry rule decides (module docstring)
        opts: dict[str, Any] = dict(max_restarts=0, max_task_retries=0, max_concurrency=HOST_CONCURRENCY,
                                    num_cpus=0)
        if self.resource == "GPU":
            opts["num_gpus"] = 1
        elif self.resource == "CPU":
            opts["num_cpus"] = 1
        else:
            opts["resources"] = {self.resource: 1}
        self._host_class = ray.remote(WorkerHost).options(**opts)
        count = self.settings.worker.count or total
        self.hosts = [RaySlot(i, self) for i in range(count)]
        log.info("Ray engine: %d worker(s) on the cluster at %s, one '%s' each", count, self.address,
                 self.resource)
        return list(self.hosts)

    def new_host(self) -> Any:
        return self._host_class.remote(self.settings.worker.ray_scratch)

    def spawn(self, slot: WorkerSlot, cfg: WorkerConfig) -> None:
        assert isinstance(slot, RaySlot)
        slot.start(cfg)

    def close(self) -> None:
        ray = import_ray()
        for slot in self.hosts:
            slot.drop_host()
        if self._connected_here and ray.is_initialized():
            ray.shutdown()
        self._connected_here = False


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail at once, saying so, when a HOST:PORT address does not answer: ``ray.init`` would
    retry for ever. ("auto" finds a local cluster or fails by itself; ray:// has its own limit.)"""
    import socket

    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise WorkerStartError(f"the Ray cluster at {address!r} (worker.ray_address) does not answer: "
                               f"{e}; start it with `ray start --head` (docs/cluster.md)") from e


class HostProcess:
    """What the dispatcher and ``WorkerSlot`` read of a slot's process, for one on a Ray node."""

    def __init__(self, slot: RaySlot):
        self._slot = slot
        self.pid: Optional[int] = None   # on the host's node

    @property
    def exitcode(self) -> Optional[int]:
        return self._slot.exit_code()

    def is_alive(self) -> bool:
        return not self._slot.exited

    def kill(self) -> None:
        self._slot.kill_worker()

    def join(self, timeout: Optional[float] = None) -> None:
        if self._slot.where is None:
            return   # never placed on a node: nothing runs that could end
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while not self._slot.exited and time.monotonic() < deadline:
            self._slot.pump(min(0.5, max(0.0, deadline - time.monotonic())))


class RaySlot(WorkerSlot):
    """A slot whose worker runs in a host actor on a Ray node (module docstring)."""

    def __init__(self, index: int, engine: RayEngine):
        self.engine = engine
        self.host: Any = None                   # the actor, kept across worker restarts
        self.where: Optional[HostInfo] = None   # its node, once it answered
        self.tail = ""                          # the last worker log the host sent
        super().__init__(index, None, Path(f"ray-worker-{index}.log"))

    def _reset(self) -> None:
        super()._reset()
        self._ref: Any = None          # the host call being waited for: spawn, then polls
        self._pending: list[WorkerMessage] = []
        self._exited = False
        self._exitcode: Optional[int] = None
        self.lost: Optional[str] = None   # why the host is gone, when it is
        self._cpu_idle = 0.0           # the host's last CPU-time reading while busy ...
        self._cpu_at = time.monotonic()  # ... received then (monotonic, here)
        self._proc_state = "unknown"

    # ------------------------------------------------------------------ the worker's life
    def start(self, cfg: WorkerConfig) -> None:
        self._reset()
        if self.host is None:
            self.host = self.engine.new_host()
            self.where = None
        self._ref = self.host.spawn.remote(cfg)
        self.proc = HostProcess(self)   # type: ignore[assignment]  # quacks like a Process
        self.state = "starting"
        self.starts += 1
        self.spawned = self.last_msg = self.phase_since = time.monotonic()

    @property
    def exited(self) -> bool:
        self.pump()
        return self.proc is not None and self._exited

    def exit_code(self) -> Optional[int]:
        return self._exitcode

    def exit_description(self) -> str:
        return self.lost if self.lost else describe_exit(self._exitcode)

    def pump(self, wait: float = 0.0) -> None:
        """Take the host's answer if it has come (waiting up to ``wait`` s), and ask again."""
        if self.proc is None or self._exited or self._ref is None:
            return
        ray = import_ray()
        ready, _ = ray.wait([self._ref], timeout=wait)
        if not ready:
            return
        try:
            answer = ray.get(ready[0])
        except ray.exceptions.RayError as e:
            self._lose(e)
            return
        if isinstance(answer, HostInfo):
            self.where = answer
            log.info("worker %d starts on Ray node %s (%s), host pid %d", self.index, answer.node_ip,
                     answer.node_id[:12], answer.pid)
        else:
            self._take(answer)
        if not self._exited:
            self._ref = self.host.poll.remote(POLL_WAIT_S)

    def _take(self, report: HostReport) -> None:
        for files in report.files:
            job = self.job
            if job is not None and job.status.id == files.job:
                jobfiles.write_results(files, job.dir)
        self._pending.extend(report.messages)
        self._cpu_at = time.monotonic()
        self._cpu_idle = report.cpu_idle_s or 0.0
        self._proc_state = report.proc_state
        if report.exited:
            self._exited, self._exitcode = True, report.exitcode
            self.tail = report.log_tail

    def _lose(self, error: BaseException) -> None:
        """The host is gone (its node removed, the actor killed): the worker with it."""
        first = (str(error).strip().splitlines() or [""])[0][:200]
        self.lost = f"was lost with its Ray host ({type(error).__name__}: {first})"
        log.error("worker %d %s", self.index, self.lost)
        self.drop_host()
        self._exited = True

    def drop_host(self) -> None:
        if self.host is not None:
            try:
                import_ray().kill(self.host, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead, or the cluster is gone
                pass
        self.host, self.where = None, None

    def messages(self):
        self.pump()
        while self._pending:
            self.last_msg = time.monotonic()
            msg = self._pending.pop(0)
            if isinstance(msg, Ready) and isinstance(self.proc, HostProcess):
                self.proc.pid = msg.pid   # the worker's pid on its node
            yield msg

    def send(self, msg) -> bool:
        if self.host is None or self._exited or self.where is None:
            return False
        files = None
        if isinstance(msg, Run):
            job_dir = Path(msg.dir)
            if not self.engine.shared:
                files = jobfiles.pack_inputs(msg.job, job_dir)
            append_log(job_dir, f"on Ray node {self.where.node_ip} ({self.where.node_id[:12]}), "
                                f"host pid {self.where.pid}")
            self._cpu_idle, self._cpu_at = 0.0, time.monotonic()
        self.host.send.remote(msg, files)
        return True

    def kill(self, reason: str) -> None:
        self.kill_reason = reason
        self.term_sent = time.monotonic()
        if self.host is not None and not self._exited:
            self.host.terminate.remote(reason == "frozen")

    def kill_worker(self) -> None:
        """SIGKILL the worker on its node (``watch`` escalates to the host if that is not heard)."""
        if self.host is not None and not self._exited:
            self.host.kill.remote()

    def watch(self, now: float, probe_timeout_s: float, heartbeat_limit: float,
              stage_timeout: float, stall_timeout: float = 0.0) -> None:
        super().watch(now, probe_timeout_s, heartbeat_limit, stage_timeout, stall_timeout)
        if self.kill_reason and not self._exited and now - self.term_sent > HOST_KILL_GRACE_S:
            # neither SIGTERM nor SIGKILL was heard of: the host (or its node) is stuck too
            self._lose(TimeoutError(f"its host did not end the worker within {HOST_KILL_GRACE_S:g} s "
                                    f"of being asked; the host was killed"))

    def _stalled(self, now: float, stall_timeout: float) -> bool:
        cpu_silent = self._cpu_idle + (now - self._cpu_at)   # grows when the host stops answering too
        silent = min(cpu_silent, now - max(self.last_msg, self.last_progress))
        if silent <= stall_timeout:
            return False
        self.frozen_status = self._proc_state
        log.error("worker %d on Ray node %s shows no sign of life for %.1f s (state %s): frozen",
                  self.index, self.where.node_ip if self.where else "?", silent, self.frozen_status)
        return True

    def start_ended(self, desc: str) -> Optional[str]:
        if self.where is None and self.kill_reason == "startup-timeout":
            return (f"was not placed on any Ray node: none has a free '{self.engine.resource}' "
                    f"(worker.ray_resource)")
        return super().start_ended(desc)

    def discard(self) -> None:
        if not self._exited and self.host is not None:
            self.kill_worker()   # only at shutdown, after its join timed out
        self._reset()

    def log_tail(self, lines: int, marker: Optional[str] = None) -> str:
        return cut_tail(self.tail, lines, marker)

    def info(self, now: float, job_id: Optional[str]) -> dict:
        out = super().info(now, job_id)
        out["node"] = (f"{self.where.node_ip} ({self.where.node_id[:12]})" if self.where else None)
        out["log"] = (f"{self.where.root}/workers/ on that node" if self.where else None)
        return out
