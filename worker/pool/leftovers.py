"""Workers an earlier server left behind.

A worker exits by itself when its server dies (it watches its parent), unless it cannot run:
a worker stopped (SIGSTOP, a debugger) when the server is killed stays stopped for ever, an
orphan holding memory and, on a GPU, a CUDA context. So each worker's pid is written beside
its log with its server's pid, and a supervisor that starts kills any recorded worker that
still runs without its server (found by the soak: ``bench/soak.py``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from kiln.atomic import atomic_write


def record(folder: Path, slot: int, worker_pid: int, server_pid: int) -> None:
    """Note that ``worker_pid`` serves ``server_pid`` in ``slot``."""
    atomic_write(Path(folder) / f"worker-{slot}.pid", f"{worker_pid} {server_pid}\n".encode(), fsync=False)


def kill_leftovers(folder: Path) -> list[int]:
    """SIGKILL every recorded worker whose server is gone (it was reparented), checked by its
    command line so a reused pid is never touched; forget the records. Returns the pids killed."""
    killed = []
    for f in Path(folder).glob("worker-*.pid"):
        try:
            worker_pid, server_pid = (int(v) for v in f.read_text().split())
        except (OSError, ValueError):
            worker_pid = server_pid = -1
        if worker_pid > 0 and _is_orphaned_worker(worker_pid, server_pid):
            try:
                os.kill(worker_pid, signal.SIGKILL)   # SIGKILL ends a stopped process too
                killed.append(worker_pid)
            except ProcessLookupError:
                pass
        f.unlink(missing_ok=True)
    return killed


def _is_orphaned_worker(pid: int, server_pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    state, ppid = fields[0], int(fields[1])
    return state != "Z" and ppid != server_pid and b"spawn_main" in cmd
