"""Benchmark the process boundary: worker start, per-job overhead, crash recovery.

    .venv/bin/python bench/worker.py [--repeat 3]

Prints one table:
* spawn -> ready: ``Supervisor.start()`` until the worker has probed its backends
  and reported (fresh interpreter, torch import, probes, pipeline imports);
* per-job overhead: a small job through a warm worker, submit -> done as the caller
  sees it, minus the time ``run_pipeline`` itself took inside the worker (so the
  pipeline's own run-to-run variance on a busy machine does not pollute it); the
  same job called in-process is listed beside it for scale;
* crash recovery: a job whose worker SIGSEGVs at the start of 'reconstruct', with a
  normal job queued behind it: crash -> crash detected, detected -> new worker
  ready, crash -> next job running.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SMALL = {"views.count": 4, "views.resolution": 128, "bake.texture_size": 256, "bake.steps": 10,
         "reconstruct.resolution": 64, "reconstruct.num_gaussians": 2000, "worker.count": 1}


def _inputs():
    from kiln.examples import draw_object

    return draw_object(256, seed=1)


def bench_spawn(settings, root: Path, repeat: int) -> list[float]:
    from worker.pool.supervisor import Supervisor

    out = []
    for i in range(repeat):
        sup = Supervisor(settings, root / f"spawn{i}" / "jobs", None)
        t0 = time.perf_counter()
        sup.start()
        out.append(time.perf_counter() - t0)
        sup.shutdown()
    return out


def bench_overhead(settings, root: Path, repeat: int) -> tuple[list[float], list[float]]:
    from pipeline.run import run_pipeline
    from pipeline.types import ImageInput
    from worker.pool.supervisor import Supervisor

    rgb, mask = _inputs()
    inproc = []
    for i in range(repeat + 1):
        t0 = time.perf_counter()
        run_pipeline(ImageInput(rgb=rgb, mask=mask), settings, root / f"inproc{i}")
        if i:  # the first call pays imports and first-use costs
            inproc.append(time.perf_counter() - t0)
    via, overhead, worker_side = [], [], []
    with Supervisor(settings, root / "overhead" / "jobs", None) as sup:
        for i in range(repeat + 1):
            t0 = time.perf_counter()
            st = sup.run(rgb, mask, settings)
            wall = time.perf_counter() - t0
            if st.state != "done":
                raise SystemExit(f"job failed: {st.error}")
            if i:
                via.append(wall)
                # everything but the pipeline call itself: input files, queues, dispatch,
                # GLB checks on both sides, status writes, event delivery
                job = st.stats.job
                overhead.append(wall - job.pipeline_s)
                worker_side.append(job.worker_job_s - job.pipeline_s)
    return inproc, via, overhead, worker_side


def bench_crash(settings, root: Path, repeat: int) -> list[tuple[float, float, float]]:
    from worker.child.faults import FaultPlan
    from worker.pool.supervisor import Supervisor

    rgb, mask = _inputs()
    bad_settings = settings.override({"worker.retry_with_fallback": False})
    out = []
    plan = FaultPlan(["segv@reconstruct:session=crash"])
    with Supervisor(settings, root / "crash" / "jobs", None, faults=plan) as sup:
        sup.run(rgb, mask, settings)  # warm
        for _ in range(repeat):
            sup.wait_ready()
            bad = sup.submit(rgb, mask, bad_settings, session="crash")
            nxt = sup.submit(rgb, mask, settings, session="next")
            st = bad.wait(timeout=120)
            assert st.error.startswith("worker crashed with SIGSEGV"), st.error
            evs = bad.events()
            t_crash = next(e.time for e in evs if e.stage == "reconstruct")
            t_detect = evs[-1].time
            running = None
            for e in nxt.follow(timeout=120):
                if e.state == "running" and running is None:
                    running = e.time
            t_ready = sup.metrics["last_ready"]
            out.append((t_detect - t_crash, t_ready - t_detect, running - t_crash))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    from kiln.settings import load

    settings = load(overrides=SMALL)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        spawn = bench_spawn(settings, root, args.repeat)
        inproc, via, overhead, worker_side = bench_overhead(settings, root, args.repeat)
        crash = bench_crash(settings, root, args.repeat)

    med = statistics.median
    rows = [
        ("worker spawn -> ready", med(spawn), min(spawn), max(spawn)),
        ("small job, in-process run_pipeline", med(inproc), min(inproc), max(inproc)),
        ("small job, through the worker", med(via), min(via), max(via)),
        ("per-job overhead (submit->done - pipeline)", med(overhead), min(overhead), max(overhead)),
        ("  of which inside the worker", med(worker_side), min(worker_side), max(worker_side)),
        ("crash -> crash detected", med([c[0] for c in crash]), min(c[0] for c in crash),
         max(c[0] for c in crash)),
        ("crash detected -> new worker ready", med([c[1] for c in crash]), min(c[1] for c in crash),
         max(c[1] for c in crash)),
        ("crash -> next job running", med([c[2] for c in crash]), min(c[2] for c in crash),
         max(c[2] for c in crash)),
    ]
    print(f"{'measure':42s} {'median s':>9s} {'min s':>8s} {'max s':>8s}   (n={args.repeat})")
    for name, m, lo, hi in rows:
        fmt = lambda v: f"{v:8.3f}" if v is not None else f"{'':8s}"  # noqa: E731
        print(f"{name:42s} {m:9.3f} {fmt(lo)} {fmt(hi)}")


if __name__ == "__main__":
    main()
