"""The short soak (bench/soak.py): 20 jobs from two script clients through a real server
while random workers get SIGSEGV, SIGKILL and SIGSTOP and the server itself is killed with
kill -9 and restarted once. Nothing may be lost or stuck, and nothing may be left behind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# run alone (the timing mark, docs/testing.md): the soak's workers have a 5 s stall window
pytestmark = pytest.mark.timing(reason="workers with a 5 s stall window under random SIGSTOPs")

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("gradio_client")


def _soak_module():
    """bench/soak.py, loaded from its file: bench/ on sys.path would shadow the worker package
    (bench/worker.py) in every worker the test process spawns afterwards."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kiln_bench_soak", ROOT / "bench" / "soak.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod     # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_a_short_soak_loses_nothing(tmp_path):
    run_soak = _soak_module().run_soak

    report = run_soak(jobs=20, clients=2, restarts=1, workers=1, seed=1, work=tmp_path, deadline_s=900)
    print(report.table())
    assert report.restarts == 1 and sum(report.faults.values()) >= 3, report.table()
    assert report.count("lost") == 0 and not report.stuck, report.table()
    assert report.count("done") + report.count("failed") == 20, report.table()
    assert all(o.reason for o in report.outcomes if o.state == "failed"), report.table()
    assert not report.orphans and not report.temp_files and not report.bad_entries, report.table()
    assert report.ok, report.table()
