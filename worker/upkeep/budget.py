"""Disk budgets: which ended jobs and which cache entries go, and removing them.

Three rules (settings ``app.cache_max_mb``, ``app.jobs_max_mb``, ``app.keep_jobs_days``):

* the reconstruction cache (``recon-*.npz`` and ``views-*.npz`` in ``app.cache_dir``) stays under
  its budget: the least recently used entries go first (``pipeline.cache`` touches an entry
  when it serves it), except those used since the oldest running job started: that job may
  be reading or writing them;
* the job store stays under its budget, counted together with the tabs' photos and Gradio's
  files (they expire by themselves, but they take the same disk): the oldest ended jobs' files
  go first;
* an ended job's files go ``keep_jobs_days`` after it ended, whatever the size.

Never removed: a queued or running job, nor one in ``protected`` (a result a page shows now).
A removed job keeps its ``status.json`` (with ``removed`` and ``removed_why`` set) and the
page's note (``page.json``), so its history entry says what became of it; that stub is
forgotten ``keep_jobs_days`` later. Planning is pure (``plan_jobs``, ``plan_cache``) and takes
``now`` from its caller, so a test can advance the clock; ``prune`` carries a plan out.
Pure Python: the app and the CLI import this.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from kiln.settings import AppSettings

from worker.jobs.jobstore import TERMINAL, JobStatus, JobStore, atomic_write_json

MB = 1 << 20
DAY_S = 86400.0
CACHE_PATTERNS = ("recon-*.npz", "views-*.npz")
# what a removed job keeps: its status (saying it was removed) and the page's note on it
KEPT_WHEN_REMOVED = ("status.json", "page.json")


@dataclass(frozen=True)
class Budgets:
    """The three limits in bytes and seconds (``from_settings``: the ``app.*`` settings)."""

    cache_bytes: int
    jobs_bytes: int
    keep_jobs_s: float

    @classmethod
    def from_settings(cls, app: AppSettings) -> "Budgets":
        return cls(int(app.cache_max_mb * MB), int(app.jobs_max_mb * MB), app.keep_jobs_days * DAY_S)


@dataclass(frozen=True)
class Removal:
    """One ended job whose files go (``forget``: a removed job's stub, which goes whole)."""

    id: str
    bytes: int
    why: str
    forget: bool = False


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    bytes: int
    used: float      # last use (mtime): written, or served (pipeline.cache touches it)


@dataclass
class PruneReport:
    """What a pass did (or, with ``dry_run``, would do) and the figures after it."""

    jobs: list[Removal] = field(default_factory=list)
    cache: list[CacheEntry] = field(default_factory=list)
    jobs_bytes: int = 0       # the job store, after the pass
    other_bytes: int = 0      # tabs' photos and Gradio's files, counted with the store
    cache_bytes: int = 0      # the cache, after the pass
    dry_run: bool = False

    @property
    def freed(self) -> int:
        return sum(r.bytes for r in self.jobs) + sum(e.bytes for e in self.cache)


# --------------------------------------------------------------------------- sizes

def tree_bytes(root: Path) -> int:
    """Bytes of the files under ``root`` (0 when it is not there); files vanishing meanwhile
    (another process's clean-up) are skipped."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def cache_entries(cache_dir: Optional[Path]) -> list[CacheEntry]:
    out: list[CacheEntry] = []
    if cache_dir is None or not Path(cache_dir).is_dir():
        return out
    for pattern in CACHE_PATTERNS:
        for p in Path(cache_dir).glob(pattern):
            try:
                st = p.stat()
            except OSError:
                continue
            out.append(CacheEntry(p, st.st_size, st.st_mtime))
    return out


# --------------------------------------------------------------------------- plans

def plan_jobs(jobs: Sequence[JobStatus], sizes: dict[str, int], budgets: Budgets, now: float,
              protected: Iterable[str] = (), other_bytes: int = 0) -> list[Removal]:
    """The ended jobs whose files go, in the order they go, and the removed jobs' stubs that
    are forgotten. ``sizes``: job id -> bytes on disk (a job missing from it counts 0);
    ``other_bytes``: what the tabs' photos and Gradio's files take, counted against
    ``jobs_bytes`` with the store. Queued and running jobs and ``protected`` ids are never
    chosen, even when the store stays over its budget without them."""
    keep = set(protected)
    cutoff = now - budgets.keep_jobs_s
    out: list[Removal] = []
    total = other_bytes + sum(sizes.get(st.id, 0) for st in jobs)
    removable = sorted((st for st in jobs if st.state in TERMINAL and st.id not in keep and st.removed is None),
                       key=lambda st: (st.finished or st.created, st.id))
    for st in removable:
        ended = st.finished or st.created
        if ended < cutoff:
            why = f"older than app.keep_jobs_days ({budgets.keep_jobs_s / DAY_S:g} days)"
        elif total > budgets.jobs_bytes:
            why = f"the job store was over app.jobs_max_mb ({budgets.jobs_bytes / MB:g} MB)"
        else:
            break   # oldest first: the rest are younger and fit
        size = sizes.get(st.id, 0)
        out.append(Removal(st.id, size, why))
        total -= size
    for st in jobs:
        if st.removed is not None and st.removed < cutoff and st.id not in keep:
            out.append(Removal(st.id, sizes.get(st.id, 0), "removed more than app.keep_jobs_days ago", forget=True))
    return out


def plan_cache(entries: Sequence[CacheEntry], budget_bytes: int, in_use_since: Optional[float]) -> list[CacheEntry]:
    """The least recently used entries that take the cache over ``budget_bytes``; none used
    at or after ``in_use_since`` (the oldest running job's start: it may be using them)."""
    total = sum(e.bytes for e in entries)
    out: list[CacheEntry] = []
    for e in sorted(entries, key=lambda e: (e.used, e.path.name)):
        if total <= budget_bytes:
            break
        if in_use_since is not None and e.used >= in_use_since:
            continue
        out.append(e)
        total -= e.bytes
    return out


# --------------------------------------------------------------------------- doing it

def remove_job_files(job_dir: Path, st: JobStatus, when: float, why: str) -> JobStatus:
    """Delete an ended job's files but ``KEPT_WHEN_REMOVED``, then mark its status removed
    (in that order: a process killed halfway leaves a job that is still 'not removed', which
    the next pass removes again). Returns the status as written."""
    for child in Path(job_dir).iterdir():
        if child.name in KEPT_WHEN_REMOVED:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    gone = replace(st, removed=when, removed_why=why, seq=st.seq + 1)
    atomic_write_json(Path(job_dir) / "status.json", gone.to_dict())
    return gone


def prune(store: JobStore, cache_dir: Optional[Path], budgets: Budgets, now: float,
          jobs: Sequence[JobStatus], protected: Callable[[], set[str]] = set,
          other_dirs: Sequence[Path] = (), in_use_since: Optional[float] = None,
          sizes: Optional[dict[str, int]] = None, dry_run: bool = False,
          on_removed: Optional[Callable[[Removal, Optional[JobStatus]], None]] = None) -> PruneReport:
    """Plan and carry out one pass over ``jobs`` (the store's jobs, as their owner knows
    them) and the cache. ``protected()`` is asked again right before each job goes, so a
    result a page started showing meanwhile stays. ``sizes`` (job id -> bytes) is used and
    filled in: an ended job's size does not change, so a long-running caller keeps it.
    ``on_removed(removal, new status or None when forgotten)`` runs after each job."""
    kept = {} if sizes is None else sizes        # ended jobs' sizes, kept across passes
    sizes = {}
    for st in jobs:
        if st.terminal and st.id in kept:
            sizes[st.id] = kept[st.id]
            continue
        try:
            sizes[st.id] = tree_bytes(store.job_dir(st.id))
        except KeyError:
            sizes[st.id] = 0
        if st.terminal:     # a queued or running job still grows: measured again next pass
            kept[st.id] = sizes[st.id]
    other = sum(tree_bytes(Path(d)) for d in other_dirs)
    report = PruneReport(dry_run=dry_run, other_bytes=other)
    by_id = {st.id: st for st in jobs}
    for r in plan_jobs(jobs, sizes, budgets, now, protected(), other):
        if dry_run:
            report.jobs.append(r)
            continue
        if r.id in protected():
            continue
        try:
            d = store.job_dir(r.id)
        except KeyError:
            continue
        if r.forget:
            shutil.rmtree(d, ignore_errors=True)
            store.forget(r.id)
            sizes.pop(r.id, None)
            kept.pop(r.id, None)
            new = None
        else:
            new = remove_job_files(d, by_id[r.id], now, r.why)
            sizes[r.id] = kept[r.id] = tree_bytes(d)
        report.jobs.append(r)
        if on_removed is not None:
            on_removed(r, new)
    forgotten = {r.id for r in report.jobs if r.forget}
    report.jobs_bytes = sum(sizes.get(st.id, 0) for st in jobs if st.id not in forgotten)
    if dry_run:   # nothing was deleted: what would be left
        report.jobs_bytes -= sum(r.bytes for r in report.jobs if not r.forget)
    entries = cache_entries(cache_dir)
    chosen = plan_cache(entries, budgets.cache_bytes, in_use_since)
    for e in chosen:
        if not dry_run:
            e.path.unlink(missing_ok=True)
        report.cache.append(e)
    report.cache_bytes = sum(e.bytes for e in entries) - sum(e.bytes for e in chosen)
    return report
