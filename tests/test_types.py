"""The type checker: mypy (pinned in pyproject's ``test`` extra) over app/ worker/ pipeline/
kiln/ as pyproject's ``[tool.mypy]`` configures it, lenient for the code as it grew and strict
for the typed records that cross the process boundary. CI runs it as part of the test suite
(``.ci/run`` -> ``./run.sh test``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10: the pyproject check below is left out
    tomllib = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parent.parent

# the records that cross the process boundary and the modules that define their wire: strict
STRICT = ("kiln.records", "worker.child.workerconfig", "worker.messages", "worker.child.interpreter", "pipeline.backends",
          "worker.engines.raymessages", "worker.engines.jobfiles")


def _start_mypy(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mypy", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=900)
    if "No module named mypy" in err:
        raise AssertionError(f"mypy is not installed in {sys.prefix}: pip install -e '.[test]'")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def mypy_runs():
    """Both runs start together: mypy is one thread, so on two cores the strict run costs no
    wall time beside the whole run. Each has its own cache folder (two mypy processes must
    not write one cache at once); the whole run keeps pyproject's."""
    strict_files = [m.replace(".", "/") + ".py" for m in STRICT]
    runs = {
        # files and options from pyproject.toml
        "layers": _start_mypy(),
        # mypy's own --strict, on these files alone (what they import is checked by the run above)
        "strict": _start_mypy("--strict", "--follow-imports=silent", "--cache-dir", ".mypy_cache/strict",
                              *strict_files),
    }
    yield runs
    for proc in runs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_mypy_passes_over_the_four_layers(mypy_runs):
    proc = _result(mypy_runs["layers"])
    assert proc.returncode == 0, proc.stdout[-12000:] + proc.stderr[-2000:]


def test_the_records_pass_mypy_strict(mypy_runs):
    if tomllib is not None:
        overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
        strict = next(o for o in overrides if o.get("disallow_untyped_defs"))
        assert set(strict["module"]) == set(STRICT), "pyproject's strict override and STRICT differ"
    proc = _result(mypy_runs["strict"])
    assert proc.returncode == 0, proc.stdout[-12000:] + proc.stderr[-2000:]
