"""A month in minutes: thousands of jobs with the clock advanced by the bench, to see the disk
budgets hold (issue 37 item 4).

    .venv/bin/python bench/month.py [--days 30] [--jobs-per-day 120] [--jobs-mb 40] [--cache-mb 40]

What is real: the job store (``worker.jobs.jobstore``: each job's folder, its PNG inputs, its
status), the dispatcher's job records, the disk budgets (``worker.upkeep.budget`` run by the
``Housekeeper``), the metrics and the JSON job log (``worker.upkeep.telemetry``), all in this
process as in a server. What is fake, and said: the worker. A job's stages are replaced by
writing the files a job leaves (a GLB of ``--glb-kb``, a reconstruction cache entry of
``--cache-kb``, or a cache hit for a re-bake of an earlier photo) and by moving its status from
queued to running to done or failed; a tab's photo (``--photo-kb``) goes into the sessions
folder and expires after 6 hours as ``app.session_ttl_h`` has it. Sizes are scaled down from
the real ones (about 1 MB a job folder, 37 MB a cache entry) so a month fits on any disk; the
budgets are scaled with them.

The clock: each job takes ``24 h / jobs-per-day`` of simulated time (a quarter of the jobs on
the weekends, so the age rule has days to act on as well as the size rule); four run at once and four
wait, so at every pass there are queued and running jobs to spare. A budget pass runs after
every job ends, at the bench's clock, as the housekeeper's thread does after each end.

Checked after every pass: the job store (with the tabs' photos and Gradio's files) and the
cache against their budgets, as measured on disk (not as the pass reports them); that no queued
or running job lost a file; at the end, that every job is accounted for: its files there, or
its status saying when and why they went, or forgotten ``keep_jobs_days`` after that. The
server's memory (RSS) is sampled each simulated day; its growth over the second half is shown.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from kiln.settings import load  # noqa: E402
from worker.jobs.jobstore import DONE, FAILED, QUEUED, RUNNING, JobStore  # noqa: E402
from worker.pool.dispatcher import Dispatcher  # noqa: E402
from worker.pool.jobrecord import JobRecord  # noqa: E402
from worker.upkeep.budget import DAY_S, MB, Budgets, cache_entries, tree_bytes  # noqa: E402
from worker.upkeep.housekeeper import Housekeeper  # noqa: E402
from worker.upkeep.telemetry import Telemetry  # noqa: E402

AT_ONCE = 4          # jobs running at a time
WAITING = 4          # jobs queued behind them
SESSION_TTL_S = 6 * 3600.0
START = 1_800_000_000.0  # the bench's clock starts here (a Unix time in 2027)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(args) -> dict:
    rng = random.Random(args.seed)
    # no fsync: the bench measures the rules, not the disk (a server fsyncs every status change)
    os.fsync = lambda fd: None
    work = Path(tempfile.mkdtemp(prefix="kiln-month-"))
    var = work / "var"
    store = JobStore(var / "jobs")
    cache, sessions, gradio = var / "cache", var / "sessions", var / "gradio"
    for d in (cache, sessions, gradio):
        d.mkdir(parents=True)
    settings = load()
    disp = Dispatcher(settings, store, cache, var, None, 0.02, engine=None)  # type: ignore[arg-type]
    clock = {"now": START}
    tel = Telemetry(var / "logs" / "jobs.jsonl", log_bytes=4 * MB, log_files=3)
    disp.events_out = tel
    budgets = Budgets(int(args.cache_mb * MB), int(args.jobs_mb * MB), args.keep_days * DAY_S)
    hk = Housekeeper(disp, store, cache, budgets, tel, clock=lambda: clock["now"])
    hk.also_count = [sessions, gradio]
    step = DAY_S / args.jobs_per_day
    total = int(args.days * args.jobs_per_day * (5 + 2 / 4) / 7)
    rgb = np.zeros((128, 128, 3), np.uint8)
    mask = np.zeros((128, 128), bool)
    mask[32:96, 32:96] = True
    photos: list[str] = []                 # cache keys made so far (a re-bake picks one)
    live: list[str] = []                   # queued + running, oldest first
    tab_photos: deque[tuple[float, Path]] = deque()
    ids: list[str] = []
    worst = {"store": 0, "cache": 0}
    violations = {"queued/running job touched": 0}
    tally = {"done": 0, "failed": 0, "cache hits": 0}
    removals = {"size": 0, "age": 0}
    rss: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    day_seen = -1
    glb = b"\0" * (args.glb_kb * 1024)
    entry = b"\0" * (args.cache_kb * 1024)
    photo = b"\0" * (args.photo_kb * 1024)

    def submit(i: int) -> None:
        st = store.create(rgb, mask, settings, f"web-b{i % 50:02d}-t0")
        st.created = clock["now"]
        store.write_status(st)
        disp.jobs[st.id] = JobRecord(status=st, dir=store.job_dir(st.id))
        tel.queued(st)
        live.append(st.id)
        ids.append(st.id)
        (sessions / f"{st.id}.png").write_bytes(photo)
        tab_photos.append((clock["now"], sessions / f"{st.id}.png"))

    def start(job_id: str) -> None:
        st = disp.jobs[job_id].status
        st.state, st.started, st.attempts = RUNNING, clock["now"], 1
        store.write_status(st)
        tel.started(st, 1, 0)

    def finish(job_id: str) -> None:
        rec = disp.jobs[job_id]
        st = rec.status
        d = rec.dir
        if photos and rng.random() < args.rebake:        # a re-bake: the cache serves it
            p = cache / f"recon-{rng.choice(photos)}.npz"
            if p.exists():
                os.utime(p, (clock["now"], clock["now"]))
                tally["cache hits"] += 1
        else:
            key = f"{len(photos):064x}"
            (cache / f"recon-{key}.npz").write_bytes(entry)
            os.utime(cache / f"recon-{key}.npz", (clock["now"], clock["now"]))
            photos.append(key)
        ok = rng.random() > args.fail
        if ok:
            (d / "outputs" / "model.glb").write_bytes(glb)
            st.outputs = {"glb": str(d / "outputs" / "model.glb")}
        st.state, st.finished = (DONE if ok else FAILED), clock["now"]
        st.error = None if ok else "worker crashed with SIGSEGV during stage 'bake' (the bench's fake)"
        store.write_status(st)
        tel.ended(st)
        tally["done" if ok else "failed"] += 1
        live.remove(job_id)

    def check() -> None:
        for job_id in live:
            d = disp.jobs[job_id].dir
            if not (d / "inputs" / "image.png").is_file() or disp.jobs[job_id].status.removed is not None:
                violations["queued/running job touched"] += 1
        worst["store"] = max(worst["store"], tree_bytes(store.root) + tree_bytes(sessions) + tree_bytes(gradio))
        worst["cache"] = max(worst["cache"], sum(e.bytes for e in cache_entries(cache)))

    # the cache's in-use rule compares file times with job start times: the bench's files carry
    # the bench's clock (os.utime above), as a server's carry the real one
    i = 0
    while i < total or live:
        while i < total and len(live) < AT_ONCE + WAITING:
            submit(i)
            i += 1
        for job_id in live[:AT_ONCE]:
            if disp.jobs[job_id].status.state == QUEUED:
                start(job_id)
        weekend = int((clock["now"] - START) // DAY_S) % 7 >= 5
        clock["now"] += step * (4 if weekend else 1)
        finish(live[0])
        while tab_photos and clock["now"] - tab_photos[0][0] > SESSION_TTL_S:   # app.session_ttl_h
            tab_photos.popleft()[1].unlink(missing_ok=True)
        report = hk.run_once()
        for r in (report.jobs if report is not None else ()):
            if not r.forget:   # counted as they happen: most stubs are forgotten before the end
                removals["size" if "app.jobs_max_mb" in r.why else "age"] += 1
        check()
        day = int((clock["now"] - START) // DAY_S)
        if day != day_seen:
            day_seen = day
            rss.append((day, rss_mb()))
    wall = time.perf_counter() - t0

    # every job accounted for
    lost = 0
    forgotten = 0
    for job_id in ids:
        rec = disp.jobs.get(job_id)
        if rec is None:
            forgotten += 1      # its stub went keep_days after its files: the log has its end
            continue
        st = rec.status
        if st.removed is not None:
            continue
        elif st.state == DONE and not Path(st.outputs["glb"]).is_file():
            lost += 1
        elif st.state not in (DONE, FAILED):
            lost += 1
    log_lines = 0
    for p in (var / "logs").glob("jobs.jsonl*"):
        for line in p.read_text().splitlines():
            json.loads(line)
            log_lines += 1
    half = [m for d, m in rss if d >= args.days / 2]
    growth = (half[-1] - half[0]) / half[0] * 100 if len(half) >= 2 else float("nan")
    tel.close()
    return {
        "simulated days": args.days, "jobs": total, "done": tally["done"], "failed (the fake's)": tally["failed"],
        "re-bakes served by the cache": tally["cache hits"],
        "store + tabs' photos + Gradio's files, most (MB)": f"{worst['store'] / MB:.1f} of {args.jobs_mb:g}",
        "cache, most (MB)": f"{worst['cache'] / MB:.1f} of {args.cache_mb:g}",
        "jobs' files removed: over app.jobs_max_mb": removals["size"],
        "jobs' files removed: older than app.keep_jobs_days": removals["age"],
        "stubs forgotten (keep_jobs_days after removal)": forgotten,
        "queued or running jobs touched (must be 0)": violations["queued/running job touched"],
        "lost (must be 0)": lost,
        "job records in memory at the end": len(disp.jobs),
        "JSON log lines (all parse)": log_lines,
        "memory, first day / last day (MB)": f"{rss[0][1]:.0f} / {rss[-1][1]:.0f}",
        "memory growth, second half": f"{growth:+.1f} %",
        "seconds": round(wall, 1),
        "folder": str(work),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=float, default=30)
    ap.add_argument("--jobs-per-day", type=int, default=120)
    ap.add_argument("--jobs-mb", type=float, default=40, help="app.jobs_max_mb, scaled")
    ap.add_argument("--cache-mb", type=float, default=40, help="app.cache_max_mb, scaled")
    ap.add_argument("--keep-days", type=float, default=3, help="app.keep_jobs_days")
    ap.add_argument("--glb-kb", type=int, default=150)
    ap.add_argument("--cache-kb", type=int, default=600)
    ap.add_argument("--photo-kb", type=int, default=50)
    ap.add_argument("--rebake", type=float, default=0.3, help="share of jobs that re-bake an earlier photo")
    ap.add_argument("--fail", type=float, default=0.05, help="share of jobs the fake fails")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the folder (default: deleted)")
    args = ap.parse_args(argv)
    out = run(args)
    width = max(map(len, out))
    print(f"| {'':{width}} | month |\n|{'-' * (width + 2)}|---:|")
    for k, v in out.items():
        if k != "folder":
            print(f"| {k:{width}} | {v} |")
    if not args.keep:
        import shutil

        shutil.rmtree(out["folder"], ignore_errors=True)
    bad = out["lost (must be 0)"] or out["queued or running jobs touched (must be 0)"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
