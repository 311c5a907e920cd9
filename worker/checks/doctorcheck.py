"""``Check``: one line of ``kiln doctor``'s report (``worker.checks.doctor`` runs the checks;
``worker.checks.hostchecks`` and ``worker.checks.backendchecks`` hold them)."""

from __future__ import annotations

from dataclasses import dataclass, field

STATUSES = ("ok", "info", "warn", "fail")


@dataclass
class Check:
    """One line of the report. status: ok | info | warn | fail (fail = the
    configured pipeline cannot run). fix: shell commands or settings that fix it."""

    name: str
    status: str
    detail: str
    fix: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
