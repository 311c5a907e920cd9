"""The worker's start-up probes run in a child interpreter (``python -m worker.child.probe``),
for a process that must not touch CUDA or GL itself: ``kiln doctor``.

The child is what a worker would be: the interpreter workers use (``worker.python``
or this one) and the environment ``worker.child.env.prepare`` gives them. This side plays
the supervisor's part: a probe that crashes the child (a signal, an exit) or hangs in
native code past its limit is that probe's result, and the probes after it run in a
fresh child with it counted as failed, as a restarted worker skips the probe that
killed its predecessor.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional

from worker.child.interpreter import PROJECT_ROOT

# on top of a probe's own limit (which the child enforces for Python-level hangs), before
# the child is killed: its own "timed out" answer is the better report
KILL_GRACE_S = 5.0
STARTUP_S = 120.0   # the child's imports (torch) before its first probe starts


@dataclass
class ProbeOutcome:
    """One probe as the child reported it, or as its death reported it."""

    name: str
    ok: bool
    reason: str
    broke: bool = False        # raised, timed out, or took the child down (not a plain "no")
    seconds: float = 0.0
    info: dict = field(default_factory=dict)


def _tail(path: str, n: int = 300) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
            text = f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
    if not text:
        return ""
    last = text.splitlines()[-1]
    return ": " + (last if len(last) <= n else last[:n] + "...")


def _death(proc: subprocess.Popen, err_path: str) -> str:
    code = proc.returncode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"crashed with {name}" + _tail(err_path)
    return f"exited with code {code}" + _tail(err_path)


def _kill(proc: subprocess.Popen) -> None:
    """The child and whatever it started (a compiler during a JIT build)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()


def _one_child(python: str, names: list[str], skips: dict[str, str], limits: dict[str, float],
               device: str, settings_json: Optional[str], env: Optional[Mapping],
               out: dict[str, ProbeOutcome]) -> Optional[str]:
    """Run ``names`` in one child, recording each outcome in ``out``. Returns the probe
    that was running when the child died or hung, or None when no probe is left to run
    (the child finished, or it broke outside any probe: then every probe not reported
    carries that reason)."""
    cmd = [python, "-m", "worker.child.probe", "--json", "--device", device, *names]
    cmd += [f"--limit={n}={s:g}" for n, s in limits.items()]
    cmd += [f"--skip={n}={why}" for n, why in skips.items()]
    if settings_json:
        cmd += ["--settings-json", settings_json]
    # stderr to a file: a JIT build can write more than a pipe holds while nobody reads it
    with tempfile.NamedTemporaryFile("w+", prefix="kiln-probe-", suffix=".err", delete=False) as err:
        err_path = err.name
    proc = None

    def all_broke(why: str) -> None:
        for n in names:
            out.setdefault(n, ProbeOutcome(n, False, why, True))

    try:
        with open(err_path, "w") as err_f:
            # cwd: `-m worker.child.probe` imports Kiln's tree under any interpreter (worker.python
            # has no install of Kiln); a new session so a kill reaches the child's children
            try:
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err_f, text=True,
                                        cwd=PROJECT_ROOT, start_new_session=True,
                                        env=dict(env) if env is not None else None)
            except OSError as e:
                all_broke(f"{python} could not be run: {e.strerror or e}")
                return None
        lines: queue.Queue[Optional[str]] = queue.Queue()

        def read() -> None:
            assert proc.stdout is not None   # stdout=PIPE
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, name="probe-reader", daemon=True).start()
        current, deadline = None, time.monotonic() + STARTUP_S
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                _kill(proc)
                if current is None:
                    all_broke(f"the probe process did not answer within {STARTUP_S:g} s")
                    return None
                limit = limits[current]
                out[current] = ProbeOutcome(current, False, f"timed out after {limit:g} s", True, limit)
                return current
            if line is None:
                break
            try:
                msg = json.loads(line)
            except ValueError:
                continue   # not the protocol: cannot happen on fd 1, but never fatal
            if msg.get("event") == "start":
                current = msg["probe"]
                limits.setdefault(current, float(msg.get("limit", STARTUP_S)))
                deadline = time.monotonic() + limits[current] + KILL_GRACE_S
            elif msg.get("event") == "result":
                out[msg["probe"]] = ProbeOutcome(msg["probe"], bool(msg["ok"]), msg.get("reason", ""),
                                                 bool(msg.get("broke")), float(msg.get("seconds", 0.0)),
                                                 msg.get("info") or {})
                current, deadline = None, time.monotonic() + STARTUP_S
            elif msg.get("event") == "done":
                proc.wait()
                return None
        proc.wait()
        if current is None:
            all_broke(f"the probe process {_death(proc, err_path)}")
            return None
        out[current] = ProbeOutcome(current, False, _death(proc, err_path), True)
        return current
    finally:
        if proc is not None and proc.poll() is None:
            _kill(proc)
        os.unlink(err_path)


def run_probes(names: list[str], limits: Mapping[str, float], python: str,
               env: Optional[Mapping] = None, device: str = "auto",
               settings_json: Optional[str] = None) -> dict[str, ProbeOutcome]:
    """Every probe in ``names`` (``worker.child.probe.PROBES`` order), each under its limit in
    seconds, in children started from ``python``. Never raises: a probe's crash or hang
    is its outcome, and a child that cannot even start is every probe's."""
    out: dict[str, ProbeOutcome] = {}
    skips: dict[str, str] = {}
    limits = dict(limits)
    while True:
        left = [n for n in names if n not in out]
        if not left:
            return out
        culprit = _one_child(python, left, skips, limits, device, settings_json, env, out)
        if culprit is None:
            return out
        skips[culprit] = out[culprit].reason
