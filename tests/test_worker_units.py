"""The worker package's pieces that need no process: job store, GLB check, fault specs,
environment preparation, error classification, message size cap."""

from __future__ import annotations

import json
import os
import pickle
import stat

import numpy as np
import pytest

from kiln.atomic import atomic_write
from kiln.glb import GLBError, check_glb_light
from kiln.records import Capabilities
from kiln.settings import Settings
from worker.child import env as wenv
from worker.child.faults import Fault, FaultPlan, parse
from worker.jobs.jobstore import (JobStatus, JobStore, atomic_write_json, load_inputs, load_settings,
                             safe_session)
from worker.messages import Failed, Ready
from worker.child.process import MAX_MESSAGE_BYTES, Sender, classify_error
from worker.pool.slots import describe_exit
from worker_helpers import image

# --------------------------------------------------------------------------- job store


def test_job_directory_round_trips_inputs_and_settings(tmp_path):
    store = JobStore(tmp_path)
    rgb, mask = image(seed=3, size=64)
    st = store.create(rgb, mask, Settings(seed=5), "sess-1")
    d = store.job_dir(st.id)
    assert d == tmp_path / "sess-1" / st.id
    back_rgb, back_mask = load_inputs(d)
    assert np.array_equal(back_rgb, rgb) and np.array_equal(back_mask, mask)
    assert json.loads((d / "settings.json").read_text()) == Settings(seed=5).to_dict()
    assert load_settings(d) == Settings(seed=5)
    assert store.read_status(st.id).state == "queued"
    assert (d / "outputs").is_dir()
    # a second store (a restarted server) finds it by id alone
    assert JobStore(tmp_path).read_status(st.id).id == st.id


def test_a_job_half_made_by_a_killed_server_is_no_job_and_is_removed_at_the_next_start(tmp_path):
    """The soak found it: kill -9 between the folder and its status.json left an empty job
    folder. Now a job is made under a staging name and renamed whole."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    store = JobStore(tmp_path)
    rgb, mask = image(seed=3, size=64)
    st = store.create(rgb, mask, Settings(), "sess-1")
    assert sorted(p.name for p in (tmp_path / "sess-1").iterdir()) == [st.id]   # no staging left
    # what a server killed while writing a job's inputs leaves, and one a live process is making
    left = tmp_path / "sess-1" / f".20260101-000000-abcdef.{dead}.new"
    making = tmp_path / "sess-1" / f".20260101-000001-abcdef.{os.getpid()}.new"
    for d in (left, making):
        (d / "inputs").mkdir(parents=True)
        atomic_write_json(d / "status.json", JobStatus(id=d.name[1:23], session="sess-1").to_dict())
    fresh = JobStore(tmp_path)
    assert [s.id for s in fresh.scan()] == [st.id]          # neither is a job
    assert fresh.remove_abandoned() == [left]
    assert not left.exists() and making.is_dir()


@pytest.mark.parametrize("rgb,mask,msg", [
    (np.zeros((8, 8, 3), np.float32), np.ones((8, 8), bool), "uint8"),
    (np.zeros((8, 8), np.uint8), np.ones((8, 8), bool), "(H, W, 3)"),
    (np.zeros((8, 8, 3), np.uint8), np.ones((8, 9), bool), "matching the image"),
    (np.zeros((8, 8, 3), np.uint8), np.ones((8, 8), np.uint8), "must be bool"),
])
def test_job_inputs_are_checked_before_anything_is_written(tmp_path, rgb, mask, msg):
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        JobStore(tmp_path).create(rgb, mask, Settings(), "s")
    assert not any(tmp_path.rglob("status.json"))


def test_session_names_cannot_escape_the_store():
    assert safe_session("abc_1.x-Y") == "abc_1.x-Y"
    for bad in ("../etc", "a/b", "", ".", "..", "x" * 100, "é"):
        out = safe_session(bad)
        assert out.startswith("s-") and "/" not in out and out == safe_session(bad)


def test_unknown_or_malformed_job_id_is_a_key_error(tmp_path):
    store = JobStore(tmp_path)
    for job_id in ("20260101-000000-abcdef", "../../x", ""):
        with pytest.raises(KeyError):
            store.read_status(job_id)


def test_atomic_write_leaves_old_content_when_writing_fails(tmp_path):
    path = tmp_path / "status.json"
    atomic_write_json(path, {"v": 1})
    with pytest.raises(TypeError):
        atomic_write(path, 12345)  # fails after the temp file was opened
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]  # no temp file left behind


def test_jobs_left_unfinished_are_resumed_or_settled_with_a_reason(tmp_path):
    from worker.pool import resume

    store = JobStore(tmp_path)
    rgb, mask = image(size=32)
    queued = store.create(rgb, mask, Settings(), "a")
    running = store.create(rgb, mask, Settings(), "a")
    running.state, running.stage, running.seq = "running", "uv", 4
    store.write_status(running)
    done = store.create(rgb, mask, Settings(), "b")
    done.state = "done"
    store.write_status(done)

    left = JobStore(tmp_path).interrupted()
    assert [s.id for s in left] == [queued.id, running.id]
    q, r = left
    # resuming on: a waiting job always comes back; a running one unless its input has
    # crashed a worker or the server before (this interruption counted)
    assert resume.decide(q, True, 0) == resume.Resume(True, "resumed: the server stopped before the job started")
    assert resume.decide(r, True, 1) == resume.Resume(True, "resumed: the server stopped during stage 'uv'")
    assert resume.decide(r, True, 2) == resume.Resume(
        False, "interrupted: the server stopped during stage 'uv'; not resumed: this input was running "
               "when a worker or the server went down 2 times")
    assert resume.decide(q, True, 0, "its settings cannot be read (ValueError)").message.endswith(
        "not resumed: its settings cannot be read (ValueError)")
    # resuming off: settled as before
    assert resume.decide(r, False, 0) == resume.Resume(False, "interrupted: the server stopped during stage 'uv'")
    store.settle_failed(r, resume.decide(r, False, 0).message)
    after = store.read_status(running.id)
    assert (after.state, after.error, after.seq) == ("failed", "interrupted: the server stopped during stage 'uv'", 5)
    assert "interrupted" in store.read_log(running.id)
    assert [s.id for s in JobStore(tmp_path).interrupted()] == [queued.id]
    # the digest a resumed job keeps its crash count by
    assert store.read_digest(queued.id) is None
    store.write_digest(queued.id, "abc")
    assert store.read_digest(queued.id) == "abc"


def test_status_json_round_trip_ignores_unknown_keys():
    st = JobStatus(id="x", session="s", state="running", stage="bake", progress=0.5, seq=3)
    d = st.to_dict()
    d["from_the_future"] = 1
    assert JobStatus.from_dict(d) == st


# --------------------------------------------------------------------------- GLB check


def _glb(path):
    import trimesh

    trimesh.creation.box().export(path)
    return path


def test_glb_light_check_accepts_a_real_glb(tmp_path):
    info = check_glb_light(_glb(tmp_path / "m.glb"))
    assert info["meshes"] == 1 and info["bytes"] == (tmp_path / "m.glb").stat().st_size


@pytest.mark.parametrize("damage,msg", [
    (lambda b: b[: len(b) // 2], "truncated"),
    (lambda b: b"GLTF" + b[4:], "magic"),
    (lambda b: b"", "too small"),
    (lambda b: b[:12] + b"\x00" * (len(b) - 12), "JSON chunk"),
])
def test_glb_light_check_rejects_damaged_files(tmp_path, damage, msg):
    good = _glb(tmp_path / "m.glb").read_bytes()
    bad = tmp_path / "bad.glb"
    bad.write_bytes(damage(good))
    with pytest.raises(GLBError, match=msg):
        check_glb_light(bad)


def test_glb_light_check_missing_file(tmp_path):
    with pytest.raises(GLBError, match="does not exist"):
        check_glb_light(tmp_path / "nope.glb")


# --------------------------------------------------------------------------- faults


def test_fault_specs_parse_and_match():
    rules = parse("segv@bake, hang@uv:attempt=1:session=t1, abort@probe:moderngl")
    assert rules == [Fault("segv", "bake"), Fault("hang", "uv", attempt=1, session="t1"),
                     Fault("abort", "probe:moderngl")]
    assert FaultPlan(rules).probe_faults() == {"moderngl": "abort"}
    assert FaultPlan(rules).pick("t1", 2) == "segv@bake"  # probe rules never fire in a job
    plan = FaultPlan(["hang@uv:attempt=1:session=t1", "oom@mesh:session=t2"])
    assert plan.pick("t1", 1) == "hang@uv"
    assert plan.pick("t1", 2) is None
    assert plan.pick("t2", 5) == "oom@mesh"
    assert plan.pick("other", 1) is None
    held = FaultPlan(["hang@bake:seed=424242"])
    assert held.pick("any", 1, seed=424242) == "hang@bake"
    assert held.pick("any", 1, seed=0) is None and held.pick("any", 1) is None


@pytest.mark.parametrize("spec", ["boom@bake", "segv", "segv@bake:attempt=x", "segv@bake:colour=red",
                                  "segv@", "segv@bake:attempt"])
def test_bad_fault_specs_are_rejected(spec):
    with pytest.raises(ValueError):
        parse(spec)


def test_fault_plan_from_env_only_when_set(monkeypatch):
    monkeypatch.delenv("KILN_TEST_FAULTS", raising=False)
    assert FaultPlan.from_env() is None
    monkeypatch.setenv("KILN_TEST_FAULTS", "abort@export")
    assert FaultPlan.from_env().pick("any", 1) == "abort@export"


# --------------------------------------------------------------------------- errors, messages


def test_error_classification():
    import torch

    from pipeline.validate import StageInputError

    assert classify_error(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate")) == "oom"
    assert classify_error(RuntimeError("CUDA error: out of memory")) == "oom"
    assert classify_error(RuntimeError("CUDA error: an illegal memory access was encountered")) == "cuda"
    assert classify_error(RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED")) == "cuda"
    assert classify_error(RuntimeError("device-side assert triggered")) == "cuda"
    assert classify_error(StageInputError("mask is empty")) == "input"
    assert classify_error(ValueError("something else")) == "error"
    assert classify_error(MemoryError()) == "error"


def test_sender_keeps_messages_under_pipe_buf():
    sent = []

    class Q:
        def put(self, m):
            sent.append(m)

    Sender(Q())(Failed(job="j", stage="bake", kind="error", error="x" * 100_000))
    Sender(Q())(Ready(pid=1, caps=Capabilities(reasons={str(i): "y" * 5000 for i in range(6)}), startup_s=1.0))
    for msg in sent:
        assert len(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)) <= MAX_MESSAGE_BYTES
    assert isinstance(sent[0], Failed) and sent[0].error.startswith("xxx") and sent[0].stage == "bake"
    assert isinstance(sent[1], Ready) and set(sent[1].caps.reasons) == {str(i) for i in range(6)}


def test_exit_descriptions():
    assert describe_exit(-11) == "crashed with SIGSEGV"
    assert describe_exit(-6) == "crashed with SIGABRT"
    assert describe_exit(-9) == "crashed with SIGKILL"
    assert describe_exit(3) == "exited with status 3"


# --------------------------------------------------------------------------- environment


def _fake_toolkit(root, version: str, how: str):
    bindir = root / "bin"
    bindir.mkdir(parents=True)
    nvcc = bindir / "nvcc"
    major, minor = version.split(".")
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {major}.{minor}, V{version}.1'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    if how == "json":
        (root / "version.json").write_text(json.dumps({"cuda": {"version": f"{version}.2"}}))
    return root


def test_toolkit_matching_picks_the_version_torch_was_built_for(tmp_path):
    old = _fake_toolkit(tmp_path / "cuda-9.1", "9.1", "nvcc")
    good = _fake_toolkit(tmp_path / "cuda-11.8", "11.8", "json")
    assert wenv.toolkit_version(old) == "9.1"
    assert wenv.toolkit_version(good) == "11.8"
    home, others = wenv.find_toolkit("11.8", [old, good])
    assert home == good and others == [f"9.1 at {old}"]
    assert wenv.find_toolkit("12.1", [old, good])[0] is None


def test_prepare_points_cuda_home_and_path_at_the_matching_toolkit(tmp_path, monkeypatch):
    _fake_toolkit(tmp_path / "cuda-9.1", "9.1", "nvcc")
    good = _fake_toolkit(tmp_path / "cuda-11.8", "11.8", "json")
    monkeypatch.setattr(wenv, "torch_cuda_version", lambda: "11.8")
    monkeypatch.setattr(wenv, "toolkit_candidates", lambda env: [tmp_path / "cuda-9.1", good])
    env = {"PATH": str(tmp_path / "cuda-9.1" / "bin") + os.pathsep + "/usr/bin",
           "CUDA_HOME": str(tmp_path / "cuda-9.1")}
    notes = wenv.prepare(env, gpu="1", device="auto")
    assert env["CUDA_HOME"] == str(good)
    assert env["PATH"].split(os.pathsep)[0] == str(good / "bin")
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["TORCH_EXTENSIONS_DIR"] == str(wenv.PROJECT_EXTENSIONS_DIR) == notes["torch_extensions_dir"]
    assert env["PYTHONFAULTHANDLER"] == "1"
    assert notes["toolkit"] == f"CUDA 11.8 at {good}"


def test_prepare_for_a_cpu_worker_hides_gpus_and_keeps_a_user_extension_dir(tmp_path):
    env = {"PATH": "/usr/bin", "TORCH_EXTENSIONS_DIR": "/mine", "CUDA_VISIBLE_DEVICES": "0"}
    wenv.prepare(env, gpu=None, device="cpu")
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["TORCH_EXTENSIONS_DIR"] == "/mine"


def test_prepare_makes_openmp_threads_sleep_unless_the_person_chose(tmp_path):
    env = {"PATH": "/usr/bin"}
    notes = wenv.prepare(env, gpu=None, device="cpu")
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and notes["omp_wait_policy"] == "passive"
    env = {"PATH": "/usr/bin", "OMP_WAIT_POLICY": "ACTIVE"}
    assert wenv.prepare(env, gpu=None, device="cpu")["omp_wait_policy"] == "as set"
    assert env["OMP_WAIT_POLICY"] == "ACTIVE"
    env = {"PATH": "/usr/bin", "GOMP_SPINCOUNT": "300000"}   # libgomp's own knob: left to it
    wenv.prepare(env, gpu=None, device="cpu")
    assert "OMP_WAIT_POLICY" not in env and env["GOMP_SPINCOUNT"] == "300000"


def test_torch_in_a_prepared_process_reads_the_passive_wait_policy():
    """libgomp reads OMP_WAIT_POLICY once, when torch loads it: a process that prepares its
    environment first and imports torch after gets it (libgomp prints what it read with
    OMP_DISPLAY_ENV)."""
    import subprocess
    import sys

    code = ("import os; from worker.child.env import prepare; prepare(os.environ, None, 'cpu'); "
            "import torch; torch.ones(4).sum()")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "OMP_DISPLAY_ENV": "TRUE"}, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr
    if "OMP_WAIT_POLICY" not in out.stdout + out.stderr:
        pytest.skip("this torch's OpenMP does not print its environment (not libgomp)")
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in out.stdout + out.stderr


def test_torch_cuda_version_is_read_without_importing_torch():
    import subprocess
    import sys

    code = ("import sys; from worker.child.env import torch_cuda_version; v = torch_cuda_version(); "
            "print(repr(v), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    import torch

    assert out.stdout.split() == [repr(torch.version.cuda), "False"]


@pytest.mark.parametrize("value,expect", [("0,1", ["0", "1"]), ("", []), ("2,-1,3", ["2"]),
                                          ("GPU-abc, GPU-def", ["GPU-abc", "GPU-def"])])
def test_detect_gpus_honours_cuda_visible_devices(value, expect):
    assert wenv.detect_gpus({"CUDA_VISIBLE_DEVICES": value}) == expect


def test_detect_gpus_without_a_driver_is_empty_here():
    import shutil

    if shutil.which("nvidia-smi") or os.path.exists("/proc/driver/nvidia/gpus"):
        pytest.skip("machine has an NVIDIA driver")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    assert wenv.detect_gpus(env) == []


@pytest.mark.timing(reason="a busy process must gain CPU time within 1 s")
def test_liveness_tells_a_busy_process_from_a_stopped_one():
    import signal
    import subprocess
    import sys
    import time

    from worker.pool.liveness import LivenessProbe

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        probe = LivenessProbe(busy.pid, interval_s=0.0)
        deadline = time.monotonic() + 30
        first = probe.sample(time.monotonic(), last_msg=-1e9)
        while probe._cpu is None or probe._cpu < 0.2:   # it burns CPU without saying a word
            assert time.monotonic() < deadline
            silent = probe.sample(time.monotonic(), last_msg=-1e9)
        assert silent < 1.0 and first < 1.0 and probe.status in ("running", "sleeping")
        os.kill(busy.pid, signal.SIGSTOP)
        while probe.status != "stopped":
            assert time.monotonic() < deadline
            probe.sample(time.monotonic(), last_msg=-1e9)
        probe.sample(time.monotonic(), last_msg=-1e9)   # the CPU time it stopped at
        later = time.monotonic() + 5.0
        assert probe.sample(later, last_msg=-1e9) > 4.5   # stopped: no CPU time gained since
        assert probe.sample(later, last_msg=later - 1.0) == pytest.approx(1.0)  # a message counts
    finally:
        busy.kill()
        busy.wait()


def test_a_frozen_worker_is_settled_within_a_minute_at_default_settings():
    from kiln.settings import Settings
    from worker.pool.slots import KILL_GRACE_S

    w = Settings().worker
    # the stall window, at most one sample interval (<= 1 s) late, then SIGTERM..SIGKILL
    assert 0 < w.stall_timeout_s and w.stall_timeout_s + 1.0 + KILL_GRACE_S < 60


def test_stale_temporaries_of_a_killed_writer_are_removed_a_live_ones_kept(tmp_path):
    import os
    import subprocess
    import sys

    from kiln.atomic import remove_stale_temps

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / "a" / "b").mkdir(parents=True)
    stale = tmp_path / "a" / "b" / f".status.json.{dead}.0123abcd.tmp"
    live = tmp_path / "a" / f".result.json.{os.getpid()}.89abcdef.tmp"
    other = tmp_path / "a" / ".notes.tmp"       # not one of atomic_write's
    for p in (stale, live, other):
        p.write_text("x")
    assert remove_stale_temps(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other.exists()


def test_a_stopped_worker_whose_server_is_gone_is_killed_at_the_next_start(tmp_path):
    """A worker stopped (SIGSTOP) when its server is killed cannot notice and exit; the next
    supervisor kills it from its pid record. A worker of a live server is left alone."""
    import os
    import signal
    import subprocess
    import sys

    from worker.pool import leftovers

    # stands in for a multiprocessing worker (spawn_main in its command line); echoes its stdin,
    # so an answer after kill_leftovers shows it outlived any signal that call sent
    code = "import sys  # spawn_main\nfor line in sys.stdin:\n    print(line, end='', flush=True)"
    orphan = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    ours = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        os.kill(orphan.pid, signal.SIGSTOP)
        leftovers.record(tmp_path, 0, orphan.pid, server_pid=2 ** 22 + 7)   # a server no longer its parent
        leftovers.record(tmp_path, 1, ours.pid, server_pid=os.getpid())     # still its server's child
        assert leftovers.kill_leftovers(tmp_path) == [orphan.pid]
        assert orphan.wait(10) == -signal.SIGKILL
        ours.stdin.write("alive?\n")
        ours.stdin.flush()
        assert ours.stdout.readline() == "alive?\n" and list(tmp_path.glob("*.pid")) == []
    finally:
        for p in (orphan, ours):
            if p.poll() is None:
                p.kill()
                p.wait(10)


# --------------------------------------------------------------------------- a worker's reported files


def test_the_dispatcher_picks_a_seed_rule_by_the_jobs_own_seed(tmp_path):
    """A fault rule that picks jobs by seed fires on the job whose settings hold that seed
    (the record's settings, as its settings.json has them) and on no other."""
    from worker.engines.local import LocalEngine
    from worker.pool.dispatcher import Dispatcher
    from worker.pool.jobrecord import JobRecord
    from worker.pool.slots import WorkerSlot

    class Slot(WorkerSlot):
        def __init__(self, index):
            super().__init__(index, None, tmp_path / f"worker-{index}.log")
            self.state, self.sent = "idle", []

        def send(self, msg):
            self.sent.append(msg)
            return True

    store = JobStore(tmp_path / "jobs")
    d = Dispatcher(Settings(), store, None, tmp_path / "var", FaultPlan(["hang@bake:seed=424242"]), 0.1,
                   LocalEngine(Settings()))
    slots = [Slot(0), Slot(1)]
    d.slots = slots
    for seed in (424242, 7):
        settings = Settings().override({"seed": seed})
        st = store.create(*image(), settings, "sess-1")
        d.jobs[st.id] = rec = JobRecord(status=st, dir=store.job_dir(st.id), settings=settings)
        d.queue.append(rec)
    with d.lock:
        d._assign()
    assert [[m.fault for m in s.sent] for s in slots] == [["hang@bake"], [None]]


def _finished_with(tmp_path, outputs: dict, extra: dict, ply=None):
    """A job's status after its worker's Done message reached the dispatcher the way every
    worker message does (``Dispatcher._handle``), the worker reporting ``extra`` (output key ->
    path) and ``ply`` beside its GLB; ``outputs``: file name -> bytes written into the job's
    outputs folder before that (the GLB among them)."""
    import time

    from worker.pool.dispatcher import Dispatcher
    from worker.engines.local import LocalEngine
    from worker.pool.jobrecord import JobRecord
    from worker.messages import Done
    from worker.pool.slots import WorkerSlot

    settings = Settings()
    store = JobStore(tmp_path / "jobs")
    st = store.create(*image(), settings, "sess-1")
    job_dir = store.job_dir(st.id)
    for name, data in outputs.items():
        (job_dir / "outputs" / name).write_bytes(data)
    d = Dispatcher(settings, store, None, tmp_path / "var", None, 0.1, LocalEngine(settings))
    slot = WorkerSlot(0, None, tmp_path / "worker-0.log")
    rec = JobRecord(status=st, dir=job_dir, settings=settings)
    st.state, st.started, st.stage = "running", time.time(), "export"
    d.jobs[st.id] = rec
    slot.job, slot.state = rec, "busy"
    out = lambda name: str(job_dir / "outputs" / name) if name else None   # noqa: E731
    with d.lock:
        d._handle(slot, Done(job=st.id, glb=out("model.glb"), ply=out(ply),
                             extra={k: str(out(v)) for k, v in extra.items()}))
    assert slot.state == "idle" and slot.job is None   # the worker itself is fine: it takes the next job
    return store.read_status(st.id), store.read_log(st.id)


def _model_files(tmp_path) -> dict:
    import io

    import trimesh

    box = trimesh.creation.box()
    stl = io.BytesIO()
    box.export(stl, file_type="stl")
    return {"model.glb": _glb(tmp_path / "m.glb").read_bytes(), "model.stl": stl.getvalue(),
            "model.mesh.ply": box.export(file_type="ply")}


def test_a_reported_output_that_is_there_is_offered(tmp_path):
    files = _model_files(tmp_path)
    st, _ = _finished_with(tmp_path, files, {"stl": "model.stl", "mesh_ply": "model.mesh.ply"})
    assert st.state == "done", st.error
    assert {k: os.path.basename(v) for k, v in st.outputs.items()} == {
        "glb": "model.glb", "stl": "model.stl", "mesh_ply": "model.mesh.ply"}


@pytest.mark.parametrize("case", ["missing", "empty"])
def test_a_reported_output_missing_or_empty_fails_the_job_naming_the_file(tmp_path, case):
    """A worker that says it wrote the STL beside the GLB, when the STL is not there (or holds
    no bytes): the job fails, its reason names the file and what is wrong with it, and no
    download is offered for it."""
    files = _model_files(tmp_path)
    if case == "missing":
        del files["model.stl"]
    else:
        files["model.stl"] = b""
    st, log_text = _finished_with(tmp_path, files, {"stl": "model.stl", "mesh_ply": "model.mesh.ply"})
    want = "model.stl is missing" if case == "missing" else "model.stl is empty (0 bytes)"
    assert st.state == "failed"
    assert st.error == f"the result failed its check after stage 'export': {want}"
    assert "model.mesh.ply" not in st.error   # the file that is there is not blamed
    assert "stl" not in st.outputs and "glb" not in st.outputs
    assert want in log_text


def test_every_lacking_output_is_named_the_gaussians_ply_too(tmp_path):
    files = _model_files(tmp_path)
    files["model.mesh.ply"] = b""
    st, _ = _finished_with(tmp_path, files, {"stl": "model.stl", "mesh_ply": "model.mesh.ply", "obj": "model.obj.zip"},
                           ply="model.ply")
    assert st.state == "failed"
    assert st.error == ("the result failed its check after stage 'export': model.ply is missing; "
                        "model.mesh.ply is empty (0 bytes); model.obj.zip is missing")
