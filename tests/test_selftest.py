"""``kiln selftest`` on this CPU machine: exits 0, names what it skipped and why; the
comparison code itself is exercised with the CPU twins standing in for the GPU side."""

from __future__ import annotations

import json

import pytest

from app.cli.cli import main as cli_main
from worker.checks import selftest
from worker_helpers import small_settings


def test_selftest_cli_passes_here_and_names_its_skips(capsys):
    code = cli_main(["selftest", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 == out["exit_code"]
    by = {r["check"]: r for r in out["results"]}
    job = by["whole job in a spawned worker"]
    assert job["result"] == "pass" and job["cpu_s"] > 0 and "rasterize moderngl" in job["note"]
    for name in ("gsplat vs CPU Gaussian renderer", "nvdiffrast vs moderngl, camera views",
                 "nvdiffrast vs moderngl, UV space", "bake on CUDA vs CPU",
                 "sticky CUDA error replaces the worker"):
        assert by[name]["result"] == "skip" and "no CUDA device" in by[name]["note"], by[name]
    assert by["SAM2 on CUDA vs CPU"]["result"] == "skip" and by["SAM2 on CUDA vs CPU"]["note"]


def test_a_backend_the_configuration_needs_fails_the_selftest(capsys):
    code = cli_main(["selftest", "--skip-jobs", "--set", "views.backend=gsplat"])
    text = capsys.readouterr().out
    assert code == 1
    import re

    assert re.search(r"gsplat vs CPU Gaussian renderer +FAIL", text)
    assert "the configuration needs it, but it cannot run here: no CUDA device" in text


@pytest.mark.parametrize("check", ["gsplat", "raster_views", "raster_uv", "bake"])
def test_twin_comparisons_with_the_cpu_twin_on_both_sides(monkeypatch, check):
    monkeypatch.setattr(selftest, "GPU_DEVICE", "cpu")
    monkeypatch.setattr(selftest, "GPU_RENDER", "cpu")
    monkeypatch.setattr(selftest, "GPU_RASTER", "moderngl")
    out = selftest.CHILD_CHECKS[check](small_settings())
    assert out["ok"] and out["max_diff"] == 0.0, out
    assert out["gpu_s"] > 0 and out["cpu_s"] > 0


def test_a_crashing_check_is_a_failed_result_not_the_end(monkeypatch):
    out = selftest.run_isolated("no-such-check", small_settings(), timeout=120)
    assert out["ok"] is False and "KeyError" in out["error"]
    rs = [selftest.Result("a", "fail", needed=False), selftest.Result("b", "pass", needed=True)]
    assert selftest.exit_code(rs) == 0
    rs.append(selftest.Result("c", "fail", needed=True))
    assert selftest.exit_code(rs) == 1
    assert "selftest: 2 failed (a, c)" in selftest.format_table(rs)


def _front_end_twin(settings) -> dict:
    """Stands in for a front end's check: runs in the spawned child, imported by name."""
    return {"ok": settings.seed == 7, "max_diff": 0.0, "gpu_s": 0.01, "cpu_s": 0.02, "note": "ran in a child"}


def test_a_front_ends_twin_runs_in_a_child_after_the_workers_own():
    """The worker layer cannot import app/ (SAM2 lives there): the front end hands its twin in."""
    runs = selftest.TwinCheck("front end twin", _front_end_twin, needs_cuda=False, needed=True)
    skipped = selftest.TwinCheck("needs a checkpoint", _front_end_twin, skip=lambda s: "no checkpoint")
    on_cuda = selftest.TwinCheck("needs CUDA", _front_end_twin)
    rs = selftest.run_selftest(small_settings(seed=7), skip_jobs=True, extra_twins=[runs, skipped, on_cuda])
    by = {r.check: r for r in rs}
    assert [r.check for r in rs][4:7] == ["front end twin", "needs a checkpoint", "needs CUDA"]
    assert by["front end twin"].result == "pass" and by["front end twin"].note == "ran in a child"
    assert by["needs a checkpoint"].result == "skip" and by["needs a checkpoint"].note == "no checkpoint"
    assert by["needs CUDA"].result == "skip" and "no CUDA device" in by["needs CUDA"].note
    assert selftest.exit_code(rs) == 0
    rs = selftest.run_selftest(small_settings(seed=8), skip_jobs=True, extra_twins=[runs])
    assert [r.result for r in rs if r.check == "front end twin"] == ["fail"] and selftest.exit_code(rs) == 1


def test_the_cli_selftest_adds_the_sam2_twin_from_the_front_end():
    from app.segment.sam2_selftest import SAM2_TWIN, twin_sam2

    assert SAM2_TWIN.run is twin_sam2 and SAM2_TWIN.needs_cuda and not SAM2_TWIN.needed
    empty = small_settings().override({"app.sam2_checkpoint": "/nonexistent/sam2.1_hiera_tiny.pt"})
    assert "no SAM2 checkpoint found" in SAM2_TWIN.skip(empty)
