"""Kiln on a Ray cluster, on loopback: throughput on 1 vs 2 nodes, and the cost per job
against the local engine, for both ways of running jobs on Ray.

    .venv/bin/python bench/cluster.py [--jobs 6]

Each node of a ``ray.cluster_utils.Cluster`` on this machine has one unit of a custom resource
standing in for a GPU. Rows:

* ``local``: the local engine, one worker process (today's default);
* ``ray actor``: Kiln's Ray engine (``worker.engines.ray``): a warm host actor per resource
  unit, whose worker process stays up between jobs;
* ``ray task``: the alternative it was measured against: one Ray task per job with
  ``max_calls=1`` (a fresh Ray worker process per job, as Ray does for GPU tasks by default),
  which runs a whole worker start-up (environment, probes, pipeline imports) and then the job
  in that process, its inputs and outputs through the object store.

Columns: start-up (until the workers are ready; a task has none, it pays per job), the wall
time of N distinct small jobs submitted at once and the throughput, and one more job alone on
the warm system: its wall time (submit -> done as the caller sees it), the pipeline's own time
inside the worker, and the difference: the overhead per job. On a 2-core machine two loopback
nodes share the same two cores, so the second node adds little throughput here; on real nodes
each brings its own GPU and cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SMALL = {"views.count": 4, "views.resolution": 128, "bake.texture_size": 256, "bake.steps": 10,
         "reconstruct.resolution": 64, "reconstruct.num_gaussians": 2000}
RESOURCE = "kiln_gpu"


@dataclass
class Row:
    engine: str
    nodes: int
    startup_s: float
    batch_s: float
    jobs: int
    alone_s: float
    pipeline_s: float

    @property
    def per_min(self) -> float:
        return 60.0 * self.jobs / self.batch_s


def _inputs(i: int):
    from kiln.examples import draw_object

    return draw_object(192, "toy" if i % 2 else "pebble", seed=100 + i)


def _settings(**over):
    from kiln.settings import load

    return load(overrides={**SMALL, **over})


def supervisor_row(label: str, nodes: int, settings, root: Path, n: int) -> Row:
    """The local engine or the Ray engine, through a Supervisor (no cache: every job computes)."""
    from worker.pool.supervisor import Supervisor

    sup = Supervisor(settings, root / "jobs", None)
    t0 = time.perf_counter()
    sup.start(timeout=300)
    startup = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        jobs = [sup.submit(*_inputs(i), settings, session="bench") for i in range(n)]
        ends = [j.wait(600) for j in jobs]
        batch = time.perf_counter() - t0
        bad = [e for e in ends if e.state != "done"]
        if bad:
            raise RuntimeError(f"{label}: {bad[0].state}: {bad[0].error}")
        t0 = time.perf_counter()
        alone = sup.submit(*_inputs(n), settings, session="bench").wait(600)
        alone_s = time.perf_counter() - t0
        if alone.state != "done":
            raise RuntimeError(f"{label}: {alone.error}")
        return Row(label, nodes, startup, batch, n, alone_s, alone.stats.job.pipeline_s or 0.0)
    finally:
        sup.shutdown()


def task_job(cfg, run, files):
    """One job in a fresh Ray worker process: a whole worker start-up, then the job (the
    alternative to warm hosts; runs on the node)."""
    from worker.child import env as env_mod
    from worker.child import process
    from worker.engines import jobfiles, rayhost

    rayhost._undo_ray_thread_cap()   # as the host does: the node's cores, not Ray's 1
    env_notes = env_mod.prepare(os.environ, None, cfg.device)
    sent: list = []

    class Outbox:
        put = sent.append

    send = process.Sender(Outbox())
    caps = process._probe_all(cfg, send, env_notes)
    process._import_pipeline(cfg)
    scratch = Path(tempfile.mkdtemp(prefix="kiln-task-"))
    jobfiles.unpack_inputs(files, scratch)
    process._run_job(replace(run, dir=str(scratch)), cfg, caps, send, {})
    done = any(type(m).__name__ == "Done" for m in sent)
    out = jobfiles.pack_results(run.job, scratch, done)
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    return done, out


def task_row(nodes: int, settings, root: Path, n: int) -> Row:
    import ray

    from kiln.records import WorkerReport
    from worker.engines import jobfiles
    from worker.jobs.jobstore import JobStore
    from worker.messages import Run
    from worker.child.workerconfig import WorkerConfig

    # Ray's defaults for a GPU task made explicit: a fresh process per task; no retries (Kiln's rule)
    remote = ray.remote(resources={RESOURCE: 1}, num_cpus=0, max_calls=1, max_retries=0)(task_job)
    store = JobStore(root / "jobs")
    cfg = WorkerConfig(settings=settings, slot=0, gpu=None, log_path=str(root / "task-worker.log"),
                       parent_pid=os.getpid())

    def run_jobs(first: int, count: int) -> list[float]:
        refs, ids = [], []
        for i in range(first, first + count):
            st = store.create(*_inputs(i), settings, "bench")
            ids.append(st.id)
            run = Run(job=st.id, dir=str(store.job_dir(st.id)), attempt=1)
            refs.append(remote.remote(cfg, run, jobfiles.pack_inputs(st.id, store.job_dir(st.id))))
        pipeline = []
        for job_id, (done, files) in zip(ids, ray.get(refs, timeout=900)):
            if not done:
                raise RuntimeError(f"ray task: job {job_id} failed; see its log")
            jobfiles.write_results(files, store.job_dir(job_id))
            report = WorkerReport.from_dict(__import__("json").loads(
                (store.job_dir(job_id) / "result.json").read_text()))
            pipeline.append(report.job.pipeline_s or 0.0)
        return pipeline

    t0 = time.perf_counter()
    run_jobs(0, n)
    batch = time.perf_counter() - t0
    t0 = time.perf_counter()
    pipeline = run_jobs(n, 1)
    return Row("ray task", nodes, 0.0, batch, n, time.perf_counter() - t0, pipeline[0])


def cluster(nodes: int):
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {RESOURCE: 1},
                                                     "node_ip_address": "127.0.0.1"})
    for _ in range(nodes - 1):
        c.add_node(num_cpus=2, resources={RESOURCE: 1}, node_ip_address="127.0.0.1")
    c.wait_for_nodes(timeout=120)
    return c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=6, help="small jobs per batch (default 6)")
    args = ap.parse_args(argv)
    os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    import ray

    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows.append(supervisor_row("local", 1, _settings(**{"worker.count": 1}), root / "local", args.jobs))
        for nodes in (1, 2):
            c = cluster(nodes)
            try:
                over = {"worker.engine": "ray", "worker.ray_address": c.address,
                        "worker.ray_resource": RESOURCE, "worker.ray_scratch": str(root / f"scratch{nodes}")}
                rows.append(supervisor_row("ray actor", nodes, _settings(**over), root / f"actor{nodes}",
                                           args.jobs))
                ray.init(address=c.address, log_to_driver=False)
                try:
                    rows.append(task_row(nodes, _settings(), root / f"task{nodes}", args.jobs))
                finally:
                    ray.shutdown()
            finally:
                c.shutdown()
    print(f"\n{args.jobs} small jobs per batch (distinct inputs, no cache), one unit of '{RESOURCE}' per "
          "node, loopback, this machine's cores shared by every node\n")
    print("| engine | nodes | start-up s | batch wall s | jobs/min | one job alone s | its pipeline s "
          "| overhead per job s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.engine} | {r.nodes} | {r.startup_s:.1f} | {r.batch_s:.1f} | {r.per_min:.1f} | "
              f"{r.alone_s:.2f} | {r.pipeline_s:.2f} | {r.alone_s - r.pipeline_s:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
