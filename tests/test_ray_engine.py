"""Kiln's workers on a Ray cluster (``worker.engine: ray``, docs/cluster.md), on loopback.

One two-node cluster (``ray.cluster_utils.Cluster``: the session's head, conftest's
``ray_head``, and a second node of this module's, each with one unit of a custom resource
standing in for a GPU) and one supervisor on it serve the module:
a cluster takes ~15-20 s to come up on 2 cores and each worker ~10 s to start. Faults are
picked by session name (``worker.child.faults``), as in test_worker_faults. Every wait has a time
limit and waits for a state, a stage or a file, never for a guessed time. The node test
removes the second node, so it runs last. Each test has images of its own (seeds 11, 21, ...):
Kiln's crash memory is keyed on the input, so an image that crashed in one test would be
refused by the retry rule in the next.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from worker.child.faults import FaultPlan
from worker.jobs.jobstore import CANCELLED, DONE, FAILED
from worker.pool.supervisor import Supervisor
from worker_helpers import image, small_settings

# run alone (the timing mark, docs/testing.md): every job here has a 4 s stall window
pytestmark = pytest.mark.timing(reason="worker.stall_timeout_s is 4 s for every job here")

# Read by Ray when it is imported, so set first. On Linux, Ray swaps 127.0.0.1 for the host's
# routable address and the test hangs dialling it unless told not to; no usage report either
# (nothing outside can be reached). Only Ray reads these.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kiln3d[ray]')")

RESOURCE = "kiln_gpu"   # conftest's ray_head (RAY_RESOURCE) gives its head one unit of it
JOB_TIMEOUT = 120
PLAN = FaultPlan([
    "hang@bake:session=hold",              # stays in its bake until cancelled
    "segv@mesh:attempt=1:session=segv",    # crashes once, the retry is fine
    "segv@mesh:session=segv-always",       # crashes every time
    "hang@bake:attempt=1:session=node",    # in its bake when its node goes; the retry is fine
    "freeze@mesh:attempt=1:session=freeze",  # SIGSTOPs itself once, the retry is fine
])
STALL_S = 4   # worker.stall_timeout_s here: a stopped worker is found within seconds


def ray_settings(**changes):
    return small_settings(worker__engine="ray", worker__ray_resource=RESOURCE, **changes)


@pytest.fixture(scope="module")
def env(tmp_path_factory, ray_head):
    """The session's head (conftest's ``ray_head``) and a second node of this module's."""
    root = tmp_path_factory.mktemp("ray")
    cluster = ray_head
    second = cluster.add_node(num_cpus=2, resources={RESOURCE: 1}, node_ip_address="127.0.0.1")
    sup = None
    try:
        cluster.wait_for_nodes(timeout=60)
        settings = ray_settings(worker__ray_address=cluster.address, worker__ray_scratch=str(root / "nodes"),
                                worker__stall_timeout_s=STALL_S)
        sup = Supervisor(settings, root / "jobs", root / "cache", faults=PLAN)
        sup.start(timeout=180)
        yield SimpleNamespace(sup=sup, root=root, cluster=cluster, second=second, settings=settings)
    finally:
        if sup is not None:
            sup.shutdown()
        if second in cluster.worker_nodes:   # the node test removes it; otherwise it goes here
            cluster.remove_node(second)


def wait_for(job, pred, timeout: float = JOB_TIMEOUT):
    """The job's status once ``pred(status)`` holds; fails after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    seq = 0
    while time.monotonic() < deadline:
        st = job.status()
        if pred(st):
            return st
        assert not st.terminal, f"job ended {st.state} ({st.error}) before the condition held"
        evs = job.events(seq, timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        seq = evs[-1].seq if evs else seq
    raise AssertionError(f"condition not reached within {timeout} s: {job.status()}")


def node_of(sup, slot: int) -> str:
    return next(w["node"] for w in sup.workers() if w["slot"] == slot)


def ready(sup) -> None:
    """Every worker is up (one that crashed has restarted)."""
    sup.wait_ready(timeout=JOB_TIMEOUT)
    deadline = time.monotonic() + JOB_TIMEOUT
    while any(w["state"] not in ("idle", "busy") for w in sup.workers() if not w["broken"]):
        assert time.monotonic() < deadline, sup.workers()
        time.sleep(0.1)   # polling a state with a deadline, not guessing a duration


def test_one_worker_per_resource_unit_one_host_per_node(env):
    workers = env.sup.workers()
    assert [w["slot"] for w in workers] == [0, 1]
    assert all(w["state"] == "idle" and w["capabilities"].cpu for w in workers), workers
    assert len({w["node"] for w in workers}) == 2, workers   # one unit of kiln_gpu per node


def test_jobs_run_on_both_nodes_and_cancel_kills_the_worker(env):
    sup = env.sup
    ready(sup)
    held = sup.submit(*image(11), env.settings, session="hold")
    st = wait_for(held, lambda s: s.stage == "bake")
    other = sup.submit(*image(12), env.settings, session="spread")
    done = other.wait(JOB_TIMEOUT)
    assert done.state == DONE, done.error
    assert {st.worker, done.worker} == {0, 1}
    assert node_of(sup, st.worker) != node_of(sup, done.worker)
    assert Path(done.outputs["glb"]).is_file() and Path(done.outputs["glb"]).is_relative_to(other.dir)
    assert (other.dir / "result.json").is_file()
    assert "on Ray node 127.0.0.1" in other.log()

    pid = next(w["pid"] for w in sup.workers() if w["slot"] == st.worker)
    assert held.cancel(timeout=30)
    end = held.status()
    assert end.state == CANCELLED and end.error == "cancelled by user"
    assert "cancelled: the worker running it was stopped" in held.log()
    ready(sup)
    assert next(w["pid"] for w in sup.workers() if w["slot"] == st.worker) != pid   # a fresh worker
    assert not (held.dir / "outputs" / "model.glb").exists()


def test_a_segfault_gets_its_reason_and_kiln_s_retry_rule_not_ray_s(env):
    sup = env.sup
    ready(sup)
    once = sup.submit(*image(21), env.settings, session="segv").wait(JOB_TIMEOUT)
    assert once.state == DONE, once.error
    assert once.attempts == 2
    assert "after: worker crashed with SIGSEGV during stage 'mesh'" in once.message
    assert once.backends.render == "cpu" and once.backends.device == "cpu"   # the safe backends

    always = sup.submit(*image(22), env.settings, session="segv-always").wait(JOB_TIMEOUT)
    assert always.state == FAILED
    # two attempts, Kiln's: Ray retried nothing (max_retries/max_task_retries 0)
    assert always.attempts == 2
    assert always.error.startswith("worker crashed with SIGSEGV during stage 'mesh'; this was the retry "
                                   "with safe backends after: worker crashed with SIGSEGV")
    assert "Fatal Python error: Segmentation fault" in sup.job(always.id).log(400_000)

    ready(sup)
    after = sup.submit(*image(23), env.settings, session="after").wait(JOB_TIMEOUT)
    assert after.state == DONE and after.attempts == 1, after.error


def test_the_same_files_as_the_local_engine(env, tmp_path):
    """The GLB and every other format asked for (the Gaussians' .ply, OBJ, STL, PLY mesh) come
    back from the node into the job's own folder, the same as the local engine writes them."""
    from dataclasses import replace

    rgb, mask = image(31)
    ready(env.sup)
    export = replace(env.settings.export, formats=("glb", "obj", "stl", "ply"), gaussians_ply=True)
    on_ray = env.sup.submit(rgb, mask, replace(env.settings, export=export), session="same").wait(JOB_TIMEOUT)
    assert on_ray.state == DONE, on_ray.error
    local_settings = small_settings(worker__count=1)
    with Supervisor(local_settings, tmp_path / "jobs", tmp_path / "cache") as local:
        here = local.run(rgb, mask, replace(local_settings, export=export), timeout=JOB_TIMEOUT)
    assert here.state == DONE, here.error
    assert sorted(on_ray.outputs) == sorted(here.outputs) == ["glb", "mesh_ply", "obj", "ply", "stl"]
    ray_dir = env.sup.job(on_ray.id).dir
    for key, path in on_ray.outputs.items():
        assert Path(path).is_relative_to(ray_dir), (key, path)
        if key != "obj":   # a zip records its members' times
            assert Path(path).read_bytes() == Path(here.outputs[key]).read_bytes(), key


def test_a_frozen_worker_is_found_by_its_cpu_time_on_its_node_and_its_job_retried(env):
    """The worker stops itself (SIGSTOP) mid-stage: the host on its node reads its CPU time,
    the supervisor names the freeze and replaces the worker, and the retry finishes."""
    sup = env.sup
    ready(sup)
    st = sup.submit(*image(61), env.settings, session="freeze").wait(JOB_TIMEOUT)
    assert st.state == DONE and st.attempts == 2, st.error
    assert st.stats.earlier_attempts[0].startswith(
        f"worker froze during stage 'mesh': it used no CPU time and sent nothing for {STALL_S} s"), \
        st.stats.earlier_attempts
    ready(sup)


def test_a_node_removed_mid_job_has_its_job_retried_on_the_other_node(env):
    sup = env.sup
    ready(sup)
    jobs = [sup.submit(*image(41 + i), env.settings, session="node") for i in range(2)]
    running = [wait_for(j, lambda s: s.stage == "bake") for j in jobs]
    second = env.second.node_id
    on_second = next(j for j, st in zip(jobs, running) if second[:12] in node_of(sup, st.worker))
    on_head = next(j for j in jobs if j is not on_second)
    env.cluster.remove_node(env.second)
    # the job on the lost node fails its attempt as a crash and goes back to Kiln's queue
    wait_for(on_second, lambda s: s.attempts == 1 and s.state == "queued", timeout=90)
    assert "was lost with its Ray host" in on_second.log()
    assert on_head.cancel(timeout=30)   # frees the head's worker for the retry
    st = on_second.wait(JOB_TIMEOUT)
    assert st.state == DONE, st.error
    assert st.attempts == 2 and "lost with its Ray host" in st.message
    assert second[:12] not in node_of(sup, st.worker)


SERVER = """
import json, os, sys, time
sys.path.insert(0, {tests!r})
from kiln.atomic import atomic_write
from worker.pool.supervisor import Supervisor
from worker_helpers import image, small_settings
settings = small_settings(worker__engine="ray", worker__ray_resource={resource!r}, worker__count=1,
                          worker__ray_address={address!r}, worker__ray_scratch={scratch!r})
sup = Supervisor(settings, {jobs!r}, None).start(timeout=120)
job = sup.submit(*image(51), settings, session="restart")
atomic_write({info!r}, json.dumps({{"job": job.id, "worker": sup.workers()[0]["pid"]}}).encode())
time.sleep(600)   # killed with SIGKILL by the test long before
"""


def _until(what: str, check, timeout: float = JOB_TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.1)   # polling a file or a process with a deadline, not guessing a duration


def test_a_server_killed_mid_job_has_its_job_resumed_by_the_next(env, tmp_path):
    """The server is the Ray driver: killed (-9), Ray ends its host, whose worker exits; the next
    server resumes the job from the job store, as after a local crash."""
    import json
    import signal
    import subprocess
    import sys

    from worker.jobs.jobstore import JobStore

    env.sup.shutdown()   # frees the cluster's resource units for the servers below
    jobs, info = tmp_path / "jobs", tmp_path / "info.json"
    code = SERVER.format(tests=str(Path(__file__).parent), resource=RESOURCE, address=env.cluster.address,
                         scratch=str(env.root / "nodes"), jobs=str(jobs), info=str(info))
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "KILN_TEST_FAULTS":
                                                                 "hang@bake:session=restart"})
    try:
        _until("the first server's job", info.is_file)
        started = json.loads(info.read_text())
        store = JobStore(jobs)
        _until("its job in stage bake", lambda: store.read_status(started["job"]).stage == "bake")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    # its worker, on the node, exits once Ray has ended the host it was a child of
    _until("the old worker gone", lambda: not Path(f"/proc/{started['worker']}").exists()
           or "Z" in Path(f"/proc/{started['worker']}/stat").read_text().rsplit(")", 1)[1].split()[:1])
    settings = ray_settings(worker__ray_address=env.cluster.address, worker__count=1,
                            worker__ray_scratch=str(env.root / "nodes"))
    with Supervisor(settings, jobs, None).start(timeout=JOB_TIMEOUT) as sup:
        st = sup.job(started["job"]).wait(JOB_TIMEOUT)
    assert st.state == DONE, st.error
    assert "resumed: the server stopped during stage 'bake'" in store.read_log(st.id)
