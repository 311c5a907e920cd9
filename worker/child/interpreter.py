"""Workers under another Python interpreter (``worker.python``), e.g. SAM 3D Objects' own env.

The app stays in Kiln's venv; only the spawned worker runs under the model's interpreter,
with that interpreter's torch and compiled extensions. Two things make that work with the
``spawn`` start method:

* ``set_executable``: the spawn context starts children with ``spawn.get_executable()``,
  a process-wide value, so ``spawning`` sets it only while one worker is started (under a
  lock) and puts the previous one back.
* ``sys.path``: a spawned child replaces its own ``sys.path`` with the parent's before it
  unpickles its target, so it would import Kiln's venv packages under the other
  interpreter. The supervisor therefore asks the interpreter for its own ``sys.path``
  once (``native_sys_path``) and passes it in the worker's configuration
  (``ForeignInterpreter`` in ``worker.child.workerconfig.WorkerConfig``); the worker adopts it
  (``adopt_path``) before it imports anything but the standard library and the pure-Python
  modules its configuration is made of (``worker.child.workerconfig``, ``kiln.settings``). Kiln's
  source tree is appended so ``worker``/``pipeline``/``kiln`` import from it (the other
  interpreter has no editable install of Kiln).

Standard library only: the supervisor imports this module.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing.spawn as mp_spawn
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

PROJECT_ROOT = str(Path(__file__).resolve().parents[2])   # holds worker/, pipeline/, kiln/
MIN_VERSION = (3, 10)                                         # pyproject's requires-python
_LOCK = threading.Lock()
_PATH_CACHE: dict[tuple[str, int], list[str]] = {}   # (path, mtime) -> its sys.path


class InterpreterError(RuntimeError):
    """``worker.python`` does not name a usable Python interpreter."""


@dataclass(frozen=True)
class ForeignInterpreter:
    """A worker's interpreter other than Kiln's own (``worker.python``), as the worker needs
    it before its first import.

    python: the executable, an absolute path (not resolved through symlinks).
    sys_path: that interpreter's own ``sys.path`` (``native_sys_path``).
    project_root: Kiln's source tree (holds worker/, pipeline/, kiln/), put on the path too.
    """

    python: str
    sys_path: tuple[str, ...]
    project_root: str = PROJECT_ROOT


def resolve(python: str) -> Optional[str]:
    """The interpreter ``worker.python`` names, as an absolute path, or None when it is
    empty (the worker runs under Kiln's own interpreter). Raises InterpreterError."""
    if not python:
        return None
    path = Path(python).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    if not path.exists():
        raise InterpreterError(f"worker.python {python!r} does not exist; set it to the python "
                               "executable of the model's environment (e.g. /opt/sam3d/bin/python)")
    if path.is_dir() or not os.access(path, os.X_OK):
        raise InterpreterError(f"worker.python {python!r} is not an executable file")
    # not resolved through symlinks: a venv's bin/python is a link whose target would lose the venv
    return str(path)


def native_sys_path(python: str, timeout: float = 60.0) -> list[str]:
    """The interpreter's own ``sys.path`` (its stdlib and site-packages, .pth files applied),
    and its version; cached per (path, mtime). Raises InterpreterError."""
    try:
        key = (python, os.stat(python).st_mtime_ns)
    except OSError as e:
        raise InterpreterError(f"worker.python {python!r}: {e}") from None
    if key in _PATH_CACHE:
        return list(_PATH_CACHE[key])
    code = "import sys, json; print(json.dumps({'path': sys.path, 'version': list(sys.version_info[:3])}))"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout,
                             cwd="/", check=True).stdout
        info = json.loads(out.strip().splitlines()[-1])
    except subprocess.CalledProcessError as e:
        raise InterpreterError(f"worker.python {python!r} failed to start: "
                               f"{(e.stderr or '').strip()[-300:]}") from None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        raise InterpreterError(f"worker.python {python!r} could not be run: {type(e).__name__}: {e}") from None
    if tuple(info["version"][:2]) < MIN_VERSION:
        raise InterpreterError(f"worker.python {python!r} is Python {'.'.join(map(str, info['version']))}; "
                               f"Kiln's worker needs {'.'.join(map(str, MIN_VERSION))} or newer")
    # '' (the current directory of that -c run) is not part of the worker's path
    path = [p for p in info["path"] if p]
    _PATH_CACHE[key] = path
    return list(path)


def foreign_interpreter(python: str) -> Optional[ForeignInterpreter]:
    """What a worker needs to run under ``worker.python``; None for Kiln's own interpreter
    (``python`` empty). Raises InterpreterError."""
    exe = resolve(python)
    if exe is None:
        return None
    return ForeignInterpreter(python=exe, sys_path=tuple(native_sys_path(exe)))


@contextlib.contextmanager
def spawning(ctx: Any, python: Optional[str]) -> Iterator[None]:
    """Start spawn-context children under ``python`` inside this block (None: unchanged).

    The child still unpickles its target with the parent's ``sys.path``, so Kiln's
    source tree must be on it; it is appended when an editable install kept it off."""
    if not python:
        yield
        return
    with _LOCK:
        if PROJECT_ROOT not in sys.path:
            sys.path.append(PROJECT_ROOT)
        previous = mp_spawn.get_executable()
        ctx.set_executable(python)
        try:
            yield
        finally:
            ctx.set_executable(previous)


def adopt_path(interp: Optional[ForeignInterpreter]) -> None:
    """In the worker, first thing: use the interpreter's own ``sys.path`` (plus Kiln's
    tree) instead of the parent's, and forget modules that came from the parent's
    paths, so later imports (torch above all) come from this interpreter's env.
    None (Kiln's own interpreter): nothing to do."""
    if interp is None or not interp.sys_path:
        return
    root = interp.project_root
    new_path = [p for p in interp.sys_path if p != root] + [root]
    allowed = [os.path.realpath(p) for p in new_path]
    sys.path[:] = new_path
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if not f or name == "__main__":
            continue
        real = os.path.realpath(f)
        # only third-party packages: the standard library already in use stays (two
        # copies of e.g. threading would be worse than one from the parent's prefix)
        third_party = f"{os.sep}site-packages{os.sep}" in real or f"{os.sep}dist-packages{os.sep}" in real
        if third_party and not any(real.startswith(a.rstrip(os.sep) + os.sep) for a in allowed):
            del sys.modules[name]
    import importlib

    importlib.invalidate_caches()
