"""One progress number for a whole job, from the progress of the stage it is in."""

from __future__ import annotations

from typing import Sequence

from kiln.stages import WEIGHTS

UNKNOWN_STAGE_WEIGHT = 0.1   # a stage kiln.stages does not list still moves the bar


def job_progress(stages: Sequence[str], stage: str, fraction: float, before: float = 0.0) -> float:
    """0..1 over ``stages`` (the job's, in order) when ``fraction`` of ``stage`` is done,
    weighting each stage by its share of a job's time. Never below ``before`` (the job's
    progress so far), so a retried attempt does not move the bar back."""
    if stage not in stages:
        # a stage the job's list does not name has no place on the bar: leave it where it is
        # (counting it after every listed stage put the bar at 100 % while work went on)
        return before
    weight = {s: WEIGHTS.get(s, UNKNOWN_STAGE_WEIGHT) for s in stages}
    total = sum(weight[s] for s in stages) or 1.0
    done = 0.0
    for s in stages:
        if s == stage:
            break
        done += weight[s]
    fraction = min(max(fraction, 0.0), 1.0)
    return max(before, min(1.0, (done + weight[stage] * fraction) / total))
