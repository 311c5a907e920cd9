"""Several workers, GPU pinning, and the supervisor's own death."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from worker.child.faults import FaultPlan
from worker.jobs.jobstore import JobStore
from worker.pool.supervisor import Supervisor, WorkerStartError
from worker_helpers import image, small_settings

TESTS = Path(__file__).resolve().parent


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead, just unreaped
    except FileNotFoundError:
        return False


def test_one_worker_per_visible_gpu_and_a_crash_stays_in_its_worker(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # two "GPUs"; worker.count 0 = one each
    # the long job hangs in its bake until cancelled, so it is certainly running while its
    # neighbour crashes, however fast the machine bakes
    plan = FaultPlan(["segv@reconstruct:session=bad", "hang@bake:session=long"])
    with Supervisor(small_settings(), tmp_path / "jobs", None, faults=plan) as sup:
        ws = sup.workers()
        assert [w["gpu"] for w in ws] == ["0", "1"]
        # each worker saw only its own device before it imported torch
        assert [w["capabilities"].cuda_visible_devices for w in ws] == ["0", "1"]
        long = sup.submit(*image(), small_settings(), session="long")
        for ev in long.follow(timeout=60):
            if ev.stage == "bake":
                break
        busy = next(w for w in sup.workers() if w["job"] == long.id)
        bad = sup.submit(*image(seed=5), small_settings(worker__retry_with_fallback=False),
                         session="bad")
        st = bad.wait(timeout=60)
        assert st.state == "failed"
        assert st.error == "worker crashed with SIGSEGV during stage 'reconstruct'"
        assert st.worker != busy["slot"]
        assert long.status().state == "running"  # the neighbour's crash did not touch it
        after = {w["slot"]: w for w in sup.workers()}
        assert after[busy["slot"]]["pid"] == busy["pid"] and after[busy["slot"]]["restarts"] == 0
        assert after[busy["slot"]]["job"] == long.id
        assert after[st.worker]["restarts"] == 1
        # what the page's wait in line goes by: the job on a worker, with its start
        (on_worker,) = sup.running()
        assert on_worker.id == long.id and on_worker.state == "running" and on_worker.started is not None
        assert long.cancel()
        assert long.status().state == "cancelled"


SERVER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from worker.child.faults import FaultPlan
    from worker.pool.supervisor import Supervisor
    from worker_helpers import image, small_settings

    if __name__ == "__main__":
        # the job sleeps in its bake, so it is surely mid-bake when the server is killed
        sup = Supervisor(small_settings(), {jobs!r}, None, faults=FaultPlan(["hang@bake"])).start()
        job = sup.submit(*image(), small_settings())
        for ev in job.follow():
            if ev.stage == "bake":
                break
        print(sup.workers()[0]["pid"], job.id, flush=True)
        time.sleep(600)
""")


@pytest.mark.timing(reason="the orphaned worker must exit within 10 s")
def test_server_killed_mid_job_orphan_worker_exits_and_job_is_recovered(tmp_path):
    script = tmp_path / "server.py"
    jobs = tmp_path / "jobs"
    script.write_text(SERVER.format(tests=str(TESTS), jobs=str(jobs)))
    server = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=TESTS.parent)
    try:
        line = server.stdout.readline()
        assert line, "server did not start a job"
        worker_pid, job_id = int(line.split()[0]), line.split()[1]
        assert _alive(worker_pid)
        os.kill(server.pid, signal.SIGKILL)  # no shutdown, no atexit: the worst case
        server.wait(10)
        deadline = time.monotonic() + 10
        while _alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker_pid), "orphaned worker kept running"
    finally:
        if server.poll() is None:
            server.kill()
    store = JobStore(jobs)
    assert store.read_status(job_id).state == "running"  # what the dead server left behind

    # the next server resumes it (counted as one crash of its input) and it completes, with
    # the GLB an uninterrupted run of the same input and seed makes
    with Supervisor(small_settings(), jobs, None) as sup:
        sup.start()
        resumed = sup.job(job_id)
        first = resumed.status()
        assert first.state in ("queued", "running", "done"), first
        st = resumed.wait(timeout=120)
        assert st.state == "done", st.error
        assert "resumed: the server stopped during stage 'bake'" in store.read_log(job_id)
        glb = Path(st.outputs["glb"]).read_bytes()
        fresh = sup.submit(*image(), small_settings(), session="fresh").wait(timeout=120)
        assert fresh.state == "done", fresh.error
        assert glb == Path(fresh.outputs["glb"]).read_bytes()

    # the same input running when the server went down again: not resumed a second time
    again = store.read_status(job_id)
    again.state, again.stage = "running", "bake"
    store.write_status(again)
    # start() settles what the last server left before it returns, whether or not it waits
    # for its worker; this supervisor runs no job, so it does not wait for one (issue 35)
    sup = Supervisor(small_settings(), jobs, None).start(wait=False)
    try:
        st = sup.job(job_id).status()
        assert st.state == "failed", st
        assert st.error == ("interrupted: the server stopped during stage 'bake'; not resumed: this input "
                            "was running when a worker or the server went down 2 times")
    finally:
        sup.shutdown()


@pytest.mark.timing(reason="shutdown must take under 10 s")
def test_shutdown_ends_running_and_queued_jobs_with_a_reason(tmp_path):
    # the running job hangs in render_views, so shutdown always finds it there
    sup = Supervisor(small_settings(), tmp_path / "jobs", None,
                     faults=FaultPlan(["hang@render_views:session=running"])).start()
    running = sup.submit(*image(), small_settings(), session="running")
    queued = sup.submit(*image(), small_settings())
    for ev in running.follow(timeout=60):
        if ev.stage == "render_views":
            break
    pid = sup.workers()[0]["pid"]
    t0 = time.monotonic()
    sup.shutdown()
    assert time.monotonic() - t0 < 10
    assert not _alive(pid)
    store = JobStore(tmp_path / "jobs")
    assert store.read_status(running.id).error == "the server shut down during stage 'render_views'"
    assert store.read_status(queued.id).error == "the server shut down before the job started"
    with pytest.raises(RuntimeError, match="not running"):
        sup.submit(*image(), small_settings())


def test_a_probe_that_crashes_the_worker_only_disables_its_backend(tmp_path):
    # The old tool's failure: a native rasterizer segfaulting on first use. Here it costs
    # two worker starts (the second probes again) and that backend, not the server.
    plan = FaultPlan(["segv@probe:moderngl"])
    with Supervisor(small_settings(), tmp_path / "jobs", None, faults=plan) as sup:
        caps = sup.capabilities()
        assert caps.moderngl is False and caps.cpu is True
        assert caps.reasons["moderngl"] == ("probe crashed with SIGSEGV twice in a row "
                                               "(see worker-0.log)")
        assert sup._dispatcher.slots[0].starts == 3   # crashed, crashed again, started without it
        st = sup.run(*image(), small_settings(), timeout=60)
        assert st.state == "failed"
        assert st.error == ("the job could not start: StageInputError: settings ask for rasterizer "
                            "'moderngl', which does not work on this worker: probe crashed with "
                            "SIGSEGV twice in a row (see worker-0.log)")
        st = sup.run(*image(), small_settings(bake__enabled=False), timeout=60)
        assert st.state == "done", st.error


def test_a_probe_that_crashed_once_is_probed_again_and_keeps_its_backend(tmp_path):
    # A one-off crash while the first worker probes moderngl (a driver hiccup): the next
    # start probes it again, it works, and the backend stays on.
    plan = FaultPlan(["segv@probe:moderngl:attempt=1"])
    with Supervisor(small_settings(), tmp_path / "jobs", None, faults=plan) as sup:
        caps = sup.capabilities()
        assert caps.moderngl is True, caps.reasons
        assert "moderngl" not in caps.reasons
        slot = sup._dispatcher.slots[0]
        assert slot.starts == 2 and slot.skip_probes == {}
        st = sup.run(*image(), small_settings(rasterize__backend="moderngl"), timeout=60)
        assert st.state == "done", st.error
        assert st.backends.rasterize == "moderngl"


@pytest.mark.timing(reason="the worker's report must reach the pipe within a 1 s slack")
def test_shutdown_keeps_what_already_happened(tmp_path):
    # Shutdown comes before the dispatcher has read what the workers did last: a result
    # already reported still makes its job done, a cancel already under way still cancels.
    # the slow job hangs in its bake until stopped: "slow" must not depend on how fast a bake is
    sup = Supervisor(small_settings(worker__count=2), tmp_path / "jobs", None,
                     faults=FaultPlan(["hang@bake:session=slow"])).start()
    quick = sup.submit(*image(), small_settings(bake__enabled=False))
    slow = sup.submit(*image(seed=2), small_settings(), session="slow")
    for ev in quick.follow(timeout=60):
        if ev.stage == "mesh":
            break
    sup._dispatcher._tick = lambda: None  # the dispatcher stops reading the workers
    log_file = quick.dir / "log"
    deadline = time.monotonic() + 60
    while "done:" not in log_file.read_text():  # the worker logs this, then reports done
        assert time.monotonic() < deadline, "the job never finished"
        time.sleep(0.05)
    time.sleep(1.0)  # the report follows the log line at once; this is slack for a loaded machine
    assert slow.status().state == "running", slow.status()
    assert not slow.cancel(timeout=0)  # its worker is told to stop; nobody sees it exit yet
    sup.shutdown()
    store = JobStore(tmp_path / "jobs")
    st = store.read_status(quick.id)
    assert st.state == "done", st.error
    assert Path(st.outputs["glb"]).stat().st_size > 0
    st = store.read_status(slow.id)
    assert (st.state, st.error) == ("cancelled", "cancelled by user")


def test_a_job_submitted_while_the_server_shuts_down_is_not_left_queued(tmp_path):
    sup = Supervisor(small_settings(), tmp_path / "jobs", None).start(wait=False)
    create = sup.store.create

    def create_then_shutdown(*a, **k):  # shutdown lands between submit's check and its enqueue
        st = create(*a, **k)
        sup.shutdown()
        return st

    sup.store.create = create_then_shutdown
    job = sup.submit(*image(), small_settings())
    st = JobStore(tmp_path / "jobs").read_status(job.id)
    assert (st.state, st.error) == ("failed", "the server shut down before the job started")


def test_a_failed_start_stops_what_it_started(tmp_path):
    (tmp_path / "workers").write_text("")  # the workers' log folder cannot be created
    sup = Supervisor(small_settings(), tmp_path / "jobs", None)
    with pytest.raises(WorkerStartError, match="failed to start 3 times"):
        sup.start()
    assert not [t for t in threading.enumerate() if t.name == "kiln-supervisor"]
    assert mp.active_children() == []
    with pytest.raises(RuntimeError, match="not running"):
        sup.submit(*image(), small_settings())


def test_a_stopped_worker_exits_cleanly_without_teardown(tmp_path):
    """A worker told to stop ends at once (os._exit: no interpreter teardown, which took
    0.5-0.8 s with torch and Mesa loaded) and still exits 0 with its log complete."""
    sup = Supervisor(small_settings(), tmp_path / "jobs", None).start()
    job = sup.submit(*image(), small_settings(bake__enabled=False))
    assert job.wait(timeout=120).state == "done"
    slot = sup._dispatcher.slots[0]
    proc, log_path = slot.proc, slot.log_path
    codes, close = [], proc.close   # the supervisor closes the process object once it is joined

    def record_then_close():
        codes.append(proc.exitcode)
        close()

    proc.close = record_then_close
    sup.shutdown()
    assert codes == [0]
    assert log_path.read_text().rstrip().splitlines()[-1].endswith("stopping")
