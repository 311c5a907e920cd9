"""``kiln jobs list | show ID | prune [--older-than DAYS] [--dry-run]``: the job store on disk.

``list``: every job, oldest first, with its state, kind, age and size, then what the store, the
cache and the tabs' photos and Gradio's files take against their budgets. ``show ID``: one
job's status, its files and the end of its log. ``prune``: frees space by the rules a server
follows (``worker.upkeep.budget``): ended jobs only, oldest first; never a queued or running
one (a server running beside it has its running jobs marked running on disk). ``--older-than``
stands in for ``app.keep_jobs_days`` in this run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from app.cli.cliargs import CliError, settings_from_args

MB = 1 << 20


def add_parser(sub) -> None:
    j = sub.add_parser("jobs", help="list, show and prune the job store (disk budgets: app.jobs_max_mb, "
                                    "app.keep_jobs_days, app.cache_max_mb)")
    jsub = j.add_subparsers(dest="jobs_command", required=True)
    for name, text in (("list", "every job with its state and size; the disk used against the budgets"),
                       ("show", "one job's status, files and log"),
                       ("prune", "remove ended jobs' files and cache entries by the budgets' rules")):
        p = jsub.add_parser(name, help=text)
        p.add_argument("--config", help="settings YAML (default: configs/default.yaml)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override any setting, e.g. --set app.jobs_max_mb=512")
        if name == "show":
            p.add_argument("id", help="the job's id (kiln jobs list shows them)")
        if name == "prune":
            p.add_argument("--older-than", type=float, metavar="DAYS",
                           help="remove ended jobs that ended more than DAYS ago (default: app.keep_jobs_days)")
            p.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")
        p.set_defaults(func=cmd_jobs)


def _store(settings):
    from worker.jobs.jobstore import JobStore

    root = Path(settings.app.jobs_dir)
    if not root.is_dir():
        raise CliError(f"no job store at {root} (app.jobs_dir)")
    return JobStore(root)


def _other_dirs(settings) -> list[Path]:
    """The tabs' photos and Gradio's files, where a server beside this job store keeps them
    (``app.web.server.launch``: var/sessions, var/gradio)."""
    var = Path(settings.app.jobs_dir).resolve().parent
    return [var / "sessions", var / "gradio"]


def cmd_jobs(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    return {"list": _list, "show": _show, "prune": _prune}[args.jobs_command](args, settings)


def _list(args, settings) -> int:
    from worker.upkeep.budget import Budgets, cache_entries, tree_bytes

    store = _store(settings)
    now = time.time()
    jobs = store.scan()
    total = 0
    print(f"{'id':24} {'state':10} {'kind':6} {'age':>8} {'MB':>8}  note")
    for st in jobs:
        size = tree_bytes(store.job_dir(st.id))
        total += size
        age = (now - (st.finished or st.created)) / 86400
        note = f"removed: {st.removed_why}" if st.removed is not None else (st.error or "")
        print(f"{st.id:24} {st.state:10} {st.kind:6} {age:7.1f}d {size / MB:8.1f}  {note[:80]}")
    b = Budgets.from_settings(settings.app)
    other = sum(tree_bytes(d) for d in _other_dirs(settings))
    cache = sum(e.bytes for e in cache_entries(Path(settings.app.cache_dir)))
    print(f"\n{len(jobs)} jobs; job store {total / MB:.1f} MB + tabs' photos and Gradio's files {other / MB:.1f} MB "
          f"of {b.jobs_bytes / MB:g} MB (app.jobs_max_mb); cache {cache / MB:.1f} MB of {b.cache_bytes / MB:g} MB "
          f"(app.cache_max_mb); ended jobs are kept {settings.app.keep_jobs_days:g} days (app.keep_jobs_days)")
    return 0


def _show(args, settings) -> int:
    store = _store(settings)
    try:
        st = store.read_status(args.id)
    except KeyError:
        raise CliError(f"no such job: {args.id!r}") from None
    d = store.job_dir(args.id)
    print(json.dumps(st.to_dict(), indent=1, sort_keys=True, default=str))
    print(f"\nfolder: {d}")
    for p in sorted(d.rglob("*")):
        if p.is_file():
            print(f"  {p.relative_to(d)}  {p.stat().st_size / MB:.2f} MB")
    log = store.read_log(args.id, 4000)
    if log:
        print("\nlog (end):\n" + log.rstrip())
    return 0


def _prune(args, settings) -> int:
    from dataclasses import replace

    from worker.upkeep.budget import DAY_S, Budgets, prune

    store = _store(settings)
    b = Budgets.from_settings(settings.app)
    if args.older_than is not None:
        if args.older_than < 0:
            raise CliError("--older-than: a number of days, 0 or more")
        b = replace(b, keep_jobs_s=args.older_than * DAY_S)
    jobs = store.scan()
    running = [st.started for st in jobs if st.state == "running" and st.started is not None]
    report = prune(store, Path(settings.app.cache_dir), b, time.time(), jobs, other_dirs=_other_dirs(settings),
                   in_use_since=min(running) if running else None, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for r in report.jobs:
        what = "forget the stub of" if r.forget else f"{verb} the files of"
        print(f"{what} job {r.id} ({r.bytes / MB:.1f} MB): {r.why}")
    for e in report.cache:
        print(f"{verb} cache entry {e.path.name} ({e.bytes / MB:.1f} MB): the cache was over app.cache_max_mb")
    print(f"{verb} {len([r for r in report.jobs if not r.forget])} jobs' files and {len(report.cache)} cache "
          f"entries, {report.freed / MB:.1f} MB; job store {report.jobs_bytes / MB:.1f} MB, cache "
          f"{report.cache_bytes / MB:.1f} MB")
    return 0
