"""A quick flood against a real ``python -m app`` (the full one is ``python bench/flood.py``):
tabs past the per-client limit are refused with a reason before their image is decoded,
uploads past the hourly quota get 429, the page keeps answering, and the server's memory
stays within its bound and goes back down afterwards."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# loaded by path: putting bench/ on sys.path would let bench/app.py shadow the app package
_spec = importlib.util.spec_from_file_location(
    "kiln_bench_flood", Path(__file__).resolve().parent.parent / "bench" / "flood.py")
_flood = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_flood)
run_flood = _flood.run_flood


@pytest.mark.timing(reason="the page must keep answering within its clients' timeouts during the flood")
def test_a_flood_of_tabs_and_uploads_is_refused_politely_within_a_memory_bound():
    res = run_flood(sessions=10, uploads=12, megapixels=20.0, upload_mb=2.0, bound_mb=1024.0,
                    settings=("app.max_sessions_per_client=4", "app.upload_mb_per_client_hour=16"))
    assert res["session_outcomes"] == {"kept": 4, "refused": 6}, res
    assert "tabs with an image open here (the limit is 4)" in res["refusal_example"]
    assert res["session_dirs"] == 4                      # the kept tabs' images are on disk
    assert res["upload_codes"].get("429", 0) >= 4 and res["upload_codes"].get("200", 0) >= 1, res
    assert res["page_after"] == 200 and res["page_failures"] == 0, res
    assert res["within_bound"], res                      # peak <= baseline + 1 GB
    # a 20 MP decode is transient: what stays is far below even one decoded image per tab
    assert res["rss_final_mb"] - res["rss_baseline_mb"] < 4 * 60, res
