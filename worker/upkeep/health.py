"""The health answer a load balancer asks for (``/healthz``): can this server take a job now?

Healthy when a worker is ready (idle or busy) and the job store's and the cache's disks each
have room for one more job (``worker.jobs.inputs.job_bytes`` of a 4 MP photo at the configured
texture size). Otherwise unhealthy, with the reasons in words. The answer is a small dict; the
web server turns it into JSON with 200 or 503.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

# the photo a job is sized for when the health check asks whether one fits (4 MP, a phone's
# photo scaled down; the real check before a job uses the job's own image)
HEALTH_JOB_PIXELS = 1 << 22
MB = 1 << 20


def disk_free(path: Path) -> int:
    """Free bytes on the disk holding ``path`` (its nearest existing parent). Tests replace it."""
    p = Path(path).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


@dataclass(frozen=True)
class Health:
    ok: bool
    reasons: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"status": "ok" if self.ok else "unavailable", "reasons": list(self.reasons), **self.details}


def judge(workers: Sequence[dict], places: Sequence[Path], need: int, queue: int = 0, running: int = 0,
          disk: Optional[dict[str, Any]] = None) -> Health:
    """``workers``: ``Supervisor.workers()``; ``places``: the folders a job writes to."""
    reasons = []
    ready = sum(1 for w in workers if w.get("state") in ("idle", "busy"))
    broken = [w["broken"] for w in workers if w.get("broken")]
    if not ready:
        if workers and len(broken) == len(workers):
            reasons.append("no worker could start: " + "; ".join(broken))
        else:
            reasons.append(f"no worker is ready ({len(workers) - len(broken)} starting or restarting)")
    free = {}
    for place in places:
        got = disk_free(place)
        free[str(place)] = round(got / MB, 1)
        if got < need:
            reasons.append(f"no room for a job on the disk of {place}: {got / MB:.0f} MB free, "
                           f"a job needs up to {need / MB:.0f} MB")
    details: dict[str, Any] = {"workers": {"ready": ready, "broken": len(broken), "total": len(workers)},
                               "queue": queue, "running": running,
                               "disk": {"free_mb": free, "job_needs_mb": round(need / MB, 1), **(disk or {})}}
    return Health(not reasons, tuple(reasons), details)


def not_started(why: str) -> Health:
    """The answer while there is no supervisor yet (starting) or it failed to start."""
    return Health(False, (why,), {})
