"""The engine seam without a cluster: which engine a setting picks, the flags that set it, the
job files that travel to a Ray node and back, and that nothing imports Ray unless asked to."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kiln.settings import SettingsError, load
from worker.engines import jobfiles, make_engine
from worker.engines.local import LocalEngine
from worker.jobs.jobstore import JobStore
from worker_helpers import image, small_settings

ROOT = Path(__file__).resolve().parent.parent


def test_the_setting_picks_the_engine_and_local_is_the_default():
    assert load().worker.engine == "local"
    assert isinstance(make_engine(load()), LocalEngine)
    with pytest.raises(SettingsError, match="worker.engine.*choose one of local, ray"):
        load(overrides={"worker.engine": "spark"})
    with pytest.raises(SettingsError, match="worker.ray_transfer"):
        load(overrides={"worker.ray_transfer": "nfs"})


def test_ray_flag_of_run_and_serve_sets_the_engine_and_address():
    from app.cli.cli import build_parser
    from app.cli.cliargs import settings_from_args
    from app.web.server.launch import build_parser as serve_parser

    args = build_parser().parse_args(["run", "x.png", "--ray", "head:6379"])
    s = settings_from_args(args)
    assert (s.worker.engine, s.worker.ray_address) == ("ray", "head:6379")
    assert settings_from_args(build_parser().parse_args(["run", "x.png"])).worker.engine == "local"
    assert serve_parser().parse_args(["--ray", "auto"]).ray == "auto"


def test_without_ray_the_ray_engine_says_how_to_get_it(monkeypatch, tmp_path):
    from worker.pool.dispatcher import WorkerStartError

    monkeypatch.setitem(sys.modules, "ray", None)   # import ray raises ImportError
    engine = make_engine(small_settings(worker__engine="ray"))
    with pytest.raises(WorkerStartError, match=r"Ray is not installed here: pip install 'kiln3d\[ray\]'"):
        engine.slots(tmp_path)


def test_a_cluster_address_that_does_not_answer_fails_at_once(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'kiln3d[ray]')")
    import socket

    from worker.pool.dispatcher import WorkerStartError

    with socket.socket() as s:   # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        engine = make_engine(small_settings(worker__engine="ray", worker__ray_address=f"127.0.0.1:{port}"))
        with pytest.raises(WorkerStartError, match="does not answer"):
            engine.slots(tmp_path)


def test_app_start_and_the_supervisor_do_not_import_ray():
    code = ("import sys, app.cli.cli, app.web.server.launch, worker.pool.supervisor, worker.engines.local; "
            "sys.exit('ray' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=120).returncode == 0


def test_job_files_go_to_a_node_and_the_results_come_back(tmp_path):
    store = JobStore(tmp_path / "jobs")
    st = store.create(*image(3), small_settings(), "s")
    job_dir = store.job_dir(st.id)
    sent = jobfiles.pack_inputs(st.id, job_dir)
    assert {name for name, _ in sent.files} == {"inputs/image.png", "inputs/mask.png", "settings.json"}

    node = tmp_path / "node" / st.id
    jobfiles.unpack_inputs(sent, node)
    assert (node / "inputs" / "image.png").read_bytes() == (job_dir / "inputs" / "image.png").read_bytes()
    (node / "outputs" / "model.glb").write_bytes(b"glTF-ish")
    (node / "result.json").write_text("{}")
    (node / "log").write_text("10:00:00 stage mesh: started\n")
    (job_dir / "log").write_text("10:00:00 queued\n")

    failed = jobfiles.pack_results(st.id, node, done=False)
    assert [name for name, _ in failed.files] == ["log"]   # a failed attempt brings back its log only
    jobfiles.write_results(jobfiles.pack_results(st.id, node, done=True), job_dir)
    assert (job_dir / "outputs" / "model.glb").read_bytes() == b"glTF-ish"
    assert (job_dir / "log").read_text() == "10:00:00 queued\n10:00:00 stage mesh: started\n"   # appended
    assert not list(job_dir.rglob("*.tmp*"))


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "outputs/../../x", ""])
def test_job_files_never_leave_their_folder(tmp_path, name):
    with pytest.raises(ValueError, match="would leave its job's folder"):
        jobfiles.write_results(jobfiles.JobFiles("j", ((name, b"x"),)), tmp_path)
