"""`kiln ARGS` run in the test process: for the tests about what the CLI says and its exit
status (a refusal, a help text), not about a process of its own (a worker, Ctrl-C, start-up
time, what gets imported). It saves each such test an interpreter start (issue 35).

The answer reads like ``subprocess.run(..., capture_output=True, text=True)``'s: returncode,
stdout, stderr. An exception that would have ended a subprocess with a traceback is raised
here instead, so the test fails either way."""

from __future__ import annotations

import io
import subprocess
from contextlib import redirect_stderr, redirect_stdout


def kiln_in_process(*args) -> subprocess.CompletedProcess:
    """``kiln ARGS`` through ``app.cli.cli.main``; argparse's exits become the return code."""
    from app.cli.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:     # argparse: --help (0), a usage error (2)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return subprocess.CompletedProcess(["kiln", *argv], code, out.getvalue(), err.getvalue())
