"""The type checker: mypy (pinned in pyproject's ``test`` extra) over app/ worker/ pipeline/
kiln/ as pyproject's ``[tool.mypy]`` configures it, lenient for the code as it grew and strict
for the typed records that cross the process boundary. CI runs it as part of the test suite
(``.ci/run`` -> ``./run.sh test``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10: the pyproject check below is left out
    tomllib = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parent.parent

# the records that cross the process boundary and the modules that define their wire: strict
STRICT = ("kiln.records", "worker.child.workerconfig", "worker.messages", "worker.child.interpreter", "pipeline.backends",
          "worker.engines.raymessages", "worker.engines.jobfiles")


def _mypy(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    if "No module named mypy" in proc.stderr:
        raise AssertionError(f"mypy is not installed in {sys.prefix}: pip install -e '.[test]'")
    return proc


def test_mypy_passes_over_the_four_layers():
    proc = _mypy()    # files and options from pyproject.toml
    assert proc.returncode == 0, proc.stdout[-12000:] + proc.stderr[-2000:]


def test_the_records_pass_mypy_strict():
    if tomllib is not None:
        overrides = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]
        strict = next(o for o in overrides if o.get("disallow_untyped_defs"))
        assert set(strict["module"]) == set(STRICT), "pyproject's strict override and STRICT differ"
    files = [m.replace(".", "/") + ".py" for m in STRICT]
    # mypy's own --strict, on these files alone (what they import is checked by the run above)
    proc = _mypy("--strict", "--follow-imports=silent", *files)
    assert proc.returncode == 0, proc.stdout[-12000:] + proc.stderr[-2000:]
