"""Fault rules (``worker.child.faults``) refused when they cannot fire as written."""

from __future__ import annotations

import pytest

from worker.child import faults


def test_a_torn_write_needs_a_job_stage():
    """``torn_write`` tears a file in a job's folder: at a start-up step (no job, no folder) it
    would leave its temporary in the worker's working directory, where nothing cleans it up;
    the rule is refused when parsed, and the same rule at a job stage is taken."""
    with pytest.raises(ValueError, match="torn_write.*job stage"):
        faults.parse("torn_write@probe:imports")
    assert [r.spec for r in faults.parse("torn_write@bake:attempt=1")] == ["torn_write@bake"]
