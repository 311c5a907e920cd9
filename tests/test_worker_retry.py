"""The supervisor's decisions without processes: the retry table, the job's progress
number, the crash memory, and the messages that cross the process boundary."""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path

import pytest

from kiln.records import Backends, Capabilities
from kiln.settings import Settings
from kiln.stages import FIT_STAGES, MODEL_STAGES, SCENE_STEPS, STAGES, UNBAKED_STAGES, WEIGHTS, stages_for
from worker import messages
from worker.pool.crashcounts import CrashCounts
from worker.pool.jobrecord import JobRecord
from worker.jobs.jobstore import JobStatus
from worker.pool.progress import job_progress
from worker.pool.retry import FALLBACK, OOM_CHUNK_SCALE, Decision, Failure, decide, used_gpu

SAFE = "retrying once with safe backends (CPU renderer, moderngl rasterizer, CPU device)"
CRASH = "worker crashed with SIGSEGV during stage 'bake'"


def retry(why, what, **how):
    return Decision("retry", f"{why}; {what}", **how)


def fail(message):
    return Decision("fail", message)


CANCELLED_RETRY = "; not retried: the job was cancelled"

# (failure, decision): one row per rule of worker.pool.retry's table
TABLE = {
    "cancel": (Failure("cancel", "cancelled"),
               Decision("cancel", "cancelled by user", log="cancelled: the worker running it was stopped")),
    "cancel with a reason": (Failure("cancel", "cancelled", cancel_reason="cancelled: nobody watched"),
                             Decision("cancel", "cancelled: nobody watched",
                                      log="cancelled: the worker running it was stopped")),
    "input is never retried": (Failure("input", "stage 'mesh' rejected its input: E: x", used_gpu=True),
                               fail("stage 'mesh' rejected its input: E: x")),
    "oom: smaller chunks once": (
        Failure("oom", "CUDA out of memory during stage 'bake'", error="OutOfMemoryError: x"),
        retry("CUDA out of memory during stage 'bake'", "retrying once with chunk scale 0.5",
              chunk_scale=OOM_CHUNK_SCALE, retried="oom")),
    "oom retries even with retries off": (
        Failure("oom", "CUDA out of memory during stage 'bake'", retry_allowed=False),
        retry("CUDA out of memory during stage 'bake'", "retrying once with chunk scale 0.5",
              chunk_scale=OOM_CHUNK_SCALE, retried="oom")),
    "oom: then fails": (
        Failure("oom", "CUDA out of memory during stage 'bake'", error="OutOfMemoryError: x",
                oom_retried=True, chunk_scale=0.5),
        fail("CUDA out of memory during stage 'bake', also after retrying with chunk scale 0.5: "
             "OutOfMemoryError: x")),
    "oom crossed by a cancel": (
        Failure("oom", "CUDA out of memory during stage 'bake'", cancel_requested=True),
        Decision("cancel", "cancelled by user",
                 log="CUDA out of memory during stage 'bake'" + CANCELLED_RETRY)),
    "oom failing after its retry ignores a cancel": (
        Failure("oom", "CUDA out of memory during stage 'bake'", error="E", oom_retried=True,
                chunk_scale=0.5, cancel_requested=True),
        fail("CUDA out of memory during stage 'bake', also after retrying with chunk scale 0.5: E")),
    "error on the GPU: safe backends once": (
        Failure("error", "stage 'bake' failed: E", used_gpu=True),
        retry("stage 'bake' failed: E", SAFE, overrides=FALLBACK, retried="error")),
    "error on the CPU fails": (Failure("error", "stage 'bake' failed: E", used_gpu=False),
                               fail("stage 'bake' failed: E")),
    "error with retries off fails": (
        Failure("error", "stage 'bake' failed: E", used_gpu=True, retry_allowed=False),
        fail("stage 'bake' failed: E")),
    "error after an error retry fails": (
        Failure("error", "stage 'bake' failed: E", used_gpu=True, error_retried=True),
        fail("stage 'bake' failed: E")),
    "error on already changed settings fails": (
        Failure("error", "stage 'bake' failed: E", used_gpu=True, has_overrides=True),
        fail("stage 'bake' failed: E")),
    "crash: safe backends once": (Failure("crash", CRASH, crash_count=1),
                                  retry(CRASH, SAFE, overrides=FALLBACK, retried="crash")),
    "crash with unknown input (count 0) retries": (
        Failure("crash", CRASH, crash_count=0),
        retry(CRASH, SAFE, overrides=FALLBACK, retried="crash")),
    "crash with retries off": (Failure("crash", CRASH, crash_count=1, retry_allowed=False),
                               fail(CRASH)),
    "crash on the retry": (
        Failure("crash", CRASH, crash_count=2, crash_retried=True, previous="worker hung"),
        fail(f"{CRASH}; this was the retry with safe backends after: worker hung; not retried again")),
    "crash of a repeat offender": (
        Failure("crash", CRASH, crash_count=3),
        fail(f"{CRASH}; not retried: this input has now crashed a worker 3 times")),
    "crash crossed by a cancel": (Failure("crash", CRASH, crash_count=1, cancel_requested=True),
                                  Decision("cancel", "cancelled by user", log=CRASH + CANCELLED_RETRY)),
    "crash crossed by a cancel with a reason": (
        Failure("crash", CRASH, crash_count=1, cancel_requested=True, cancel_reason="cancelled: shutting down"),
        Decision("cancel", "cancelled: shutting down", log=CRASH + CANCELLED_RETRY)),
    "crash after an oom retry still retries": (
        Failure("crash", CRASH, crash_count=1, oom_retried=True, chunk_scale=0.5),
        retry(CRASH, SAFE, overrides=FALLBACK, retried="crash")),
}


@pytest.mark.parametrize("failure,expected", TABLE.values(), ids=TABLE.keys())
def test_retry_table(failure, expected):
    assert decide(failure) == expected


@pytest.mark.parametrize("kind", ["hang", "frozen", "cuda"])
def test_hangs_freezes_and_cuda_errors_are_crashes(kind):
    row = Failure("crash", CRASH, crash_count=1)
    for f in (row, replace(row, crash_count=2), replace(row, crash_retried=True),
              replace(row, retry_allowed=False), replace(row, cancel_requested=True)):
        assert decide(replace(f, kind=kind)) == decide(f)


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown failure kind"):
        decide(Failure("gremlins", "?"))


def test_used_gpu_reads_the_backends_an_attempt_reported():
    assert not used_gpu(None)   # the attempt never resolved its backends
    assert not used_gpu(Backends(device="cpu", render="cpu", rasterize="moderngl"))
    assert used_gpu(Backends(device="cuda:0"))
    assert used_gpu(Backends(device="cpu", render="gsplat"))
    assert used_gpu(Backends(device="cpu", rasterize="nvdiffrast"))


def test_a_job_record_describes_its_failure_from_its_history():
    job = JobRecord(status=JobStatus(id="j", session="s", backends=Backends(device="cuda:0")), dir=Path("."),
                    settings=Settings().override({"worker.retry_with_fallback": False}), overrides={"a": 1},
                    chunk_scale=0.5, retried={"oom", "crash"}, notes=["first", "second"])
    f = job.failure("crash", CRASH, crash_count=2)
    assert f == Failure("crash", CRASH, used_gpu=True, crash_count=2, crash_retried=True,
                        oom_retried=True, error_retried=False, has_overrides=True, chunk_scale=0.5,
                        cancel_requested=False, retry_allowed=False, previous="second")


# --------------------------------------------------------------------------- progress


def test_stage_weights_cover_every_job_type_s_stages():
    assert set(WEIGHTS) == set(STAGES) | set(MODEL_STAGES) | set(FIT_STAGES) | set(SCENE_STEPS)
    assert sum(WEIGHTS[s] for s in STAGES) == pytest.approx(1.0)
    assert stages_for(True) == STAGES and stages_for(False) == UNBAKED_STAGES
    assert stages_for(True, "bake") == stages_for(False, "bake") == MODEL_STAGES
    assert stages_for(True, "fit") == FIT_STAGES
    assert set(UNBAKED_STAGES) < set(STAGES)
    # a scene: its first stage as its kind's, then the scene's own
    assert stages_for(True, "bake", scene=True) == ("read",) + SCENE_STEPS
    assert stages_for(False, "image", scene=True) == ("reconstruct",) + SCENE_STEPS


def test_job_progress_weights_stages_and_never_goes_back():
    assert job_progress(STAGES, "reconstruct", 0.0) == 0.0
    assert job_progress(STAGES, "reconstruct", 0.5) == pytest.approx(0.15)
    assert job_progress(STAGES, "render_views", 1.0) == pytest.approx(0.45)
    assert job_progress(STAGES, "export", 1.0) == pytest.approx(1.0)
    assert job_progress(STAGES, "bake", 2.0) == pytest.approx(0.95)      # fraction clamped
    assert job_progress(STAGES, "reconstruct", 0.1, before=0.6) == 0.6   # a retry starts over
    # without baking, the three stages share the whole bar
    assert job_progress(UNBAKED_STAGES, "mesh", 1.0) == pytest.approx(0.35 / 0.40)
    # a stage the job's list does not name leaves the bar where it was, not at 100 %
    assert job_progress(STAGES, "a stage nobody listed", 0.5, before=0.3) == 0.3


# --------------------------------------------------------------------------- crash memory


def test_crash_counts_survive_a_restart_and_a_damaged_file(tmp_path):
    path = tmp_path / ".crash_counts.json"
    counts = CrashCounts(path)
    counts.load()
    assert counts.add("a") == 1 and counts.add("a") == 2 and counts.add("b") == 1
    again = CrashCounts(path)
    again.load()
    assert again.add("a") == 3
    path.write_text("{not json")
    broken = CrashCounts(path)
    broken.load()
    assert broken.add("a") == 1


def test_crash_counts_still_count_when_the_file_cannot_be_written(tmp_path):
    (tmp_path / "ro").write_text("")   # a file where the folder should be
    counts = CrashCounts(tmp_path / "ro" / ".crash_counts.json")
    counts.load()
    assert counts.add("a") == 1 and counts.add("a") == 2


# --------------------------------------------------------------------------- messages


@pytest.mark.parametrize("msg", [
    messages.Run(job="j", dir="/d", attempt=2, overrides=dict(FALLBACK), chunk_scale=0.5,
                 cache_dir=None, fault="segv@bake"),
    messages.Stop(), messages.Heartbeat(1.5), messages.Probing("moderngl"), messages.Probing(None),
    messages.Ready(pid=7, caps=Capabilities(cpu=True, reasons={"gsplat": "needs CUDA"}, probe_s={"cpu": 0.1}),
                   startup_s=1.25),
    messages.Started(job="j", backends=Backends(device="cpu", chunk_scale=0.5)),
    messages.Progress(job="j", stage="bake", fraction=0.5, message="step 5"),
    messages.Done(job="j", glb="/d/model.glb"), messages.Failed(job="j", stage=None, kind="oom", error="E"),
], ids=lambda m: type(m).__name__)
def test_messages_survive_the_pipe(msg):
    back = pickle.loads(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == msg and type(back) is type(msg)


# --------------------------------------------------------------------------- job handles


def test_a_handle_reattaches_to_a_job_on_disk_by_id(tmp_path):
    from worker.pool.jobhandle import JobCancelled, JobFailed
    from worker.jobs.jobstore import JobStore
    from worker.pool.supervisor import Supervisor
    from worker_helpers import image, small_settings

    store = JobStore(tmp_path / "jobs")
    st = store.create(*image(), small_settings(), "web-a")
    store.append_log(st.id, "written by an earlier server")
    sup = Supervisor(small_settings(), tmp_path / "jobs", None)   # not started: no workers
    job = sup.job(st.id)
    assert job == sup.job(st.id) and job.id == st.id and job.dir == tmp_path / "jobs" / "web-a" / st.id
    assert job.status().state == "queued" and not job.done()
    assert "written by an earlier server" in job.log()
    with pytest.raises(TimeoutError, match="still queued"):
        job.result(timeout=0)
    for state, error in (("failed", JobFailed), ("cancelled", JobCancelled)):
        st.state, st.error = state, f"{state} for the test"
        store.write_status(st)
        assert job.done()
        with pytest.raises(error, match=f"{state} for the test") as info:
            job.result()
        assert info.value.status.state == state
    st.state = "done"
    store.write_status(st)
    assert job.result().state == "done"
    with pytest.raises(KeyError):
        sup.job("20990101-000000-abcdef")
    with pytest.raises(KeyError):
        sup.job("../../etc")
