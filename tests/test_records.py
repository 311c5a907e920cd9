"""The typed records that cross the process boundary (kiln/records.py, worker/child/workerconfig.py):
their JSON forms, job directories written before they existed, and the pickled forms a
spawned worker receives."""

from __future__ import annotations

import json
import pickle
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from kiln.records import (PROBED, Backends, BakeStats, CameraFitReport, Capabilities, JobStats, JobTimes,
                          PipelineStats, WorkerReport)
from kiln.settings import Settings
from worker.child.interpreter import ForeignInterpreter
from worker.jobs.jobstore import JobStatus, JobStore, load_settings
from worker.child.probe import PROBES
from worker.child.workerconfig import WorkerConfig

# Three jobs written by Kiln at commit 4722fc8, before these records, through a real
# supervisor (tests/worker_helpers.small_settings with bake.texture_size auto; a test fault
# plan): 'retried' crashed in stage mesh (segv) and was done on its retry, 'failed' raised in
# stage uv, 'nobake' ran without a bake. Their json files, as they were written.
OLD_JOBS = Path(__file__).parent / "data" / "jobs_before_records"

BAKE = BakeStats(mode="opt", psnr_db=25.2, l1=0.033, pixels=11983, texels_seen_fraction=0.9,
                 texels_chart_fraction=0.35, timings={"fast": 0.1, "opt": 0.05}, fast_psnr_db=28.1,
                 opt_texture_size=64, photo_projection=True, photo_texels_fraction=0.06,
                 photo_pixels_per_texel=2.5, texture_size_suggested=1024,
                 warnings=("the photo holds more detail",))
PIPELINE = PipelineStats(backends=Backends("gsplat", "nvdiffrast", "cuda:1", 0.5), reconstruction_cached=True,
                         reconstruct_faces=23784, gaussians=2000,
                         source_camera={"projection": "orthographic", "width": 128, "height": 128,
                                        "viewmat": [[1.0, 0.0], [0.0, 1.0]], "K": [[84.0, 0.0], [0.0, 1.0]]},
                         views_cached=False, faces=1188, vertices=596, texture_size_auto=512, bake=BAKE,
                         glb_bytes=154132, reconstruction_cache_error="OSError: disk full")
FIT = CameraFitReport(source_camera={"projection": "perspective", "width": 320, "height": 240,
                                     "viewmat": [[1.0, 0.0], [0.0, 1.0]], "K": [[300.0, 0.0], [0.0, 1.0]]},
                      iou=0.6752, coverage=0.9621, inside=0.6931, objective=0.81, seconds=2.32, case="canonical",
                      tie_break={"decided_by": "photo", "tied": 2, "photo_margin": 0.08})
CAPS = Capabilities(device="NVIDIA H100", cuda=True, cpu=True, moderngl=True, gsplat=False, nvdiffrast=True,
                    sam3d=False, reasons={"gsplat": "build failed", "sam3d": "not installed"},
                    probe_s={"cuda": 1.5, "cpu": 0.2}, torch_cuda="12.8", toolkit="CUDA 12.8 at /usr/local/cuda",
                    torch_extensions_dir="/var/ext", torch_cuda_arch_list="9.0", cuda_visible_devices="0",
                    python="/opt/py/bin/python", python_prefix="/opt/py", pipeline_error="ImportError: x")


@pytest.mark.parametrize("record", [
    CAPS, Capabilities(), Backends(), Backends("gsplat", "nvdiffrast", "cuda", 0.5), BAKE,
    BakeStats(mode="fast", psnr_db=30.0, l1=0.01, pixels=10, texels_seen_fraction=1.0, texels_chart_fraction=0.5),
    PIPELINE, PipelineStats(), JobTimes(), JobTimes(pipeline_s=1.0, worker_job_s=1.5, queued_s=0.1, total_s=2.0),
    WorkerReport(timings={"mesh": 0.1}, job=JobTimes(pipeline_s=1.0, worker_job_s=1.1), stats=PIPELINE,
                 check={"faces": 1188, "texture_size": [512, 512]}),
    JobStats(), JobStats(job=JobTimes(total_s=0.2)),
    JobStats(pipeline=PIPELINE, glb_check={"bytes": 3}, job=JobTimes(total_s=1.0), earlier_attempts=("a", "b")),
    FIT, CameraFitReport(source_camera={"width": 1}, iou=1.0, coverage=1.0, inside=1.0, objective=1.0, seconds=0.1,
                         case="posed"),
    WorkerReport(timings={"read": 0.1, "fit": 2.3}, job=JobTimes(pipeline_s=2.4), stats=PipelineStats(), check={},
                 camera_fit=FIT),
    JobStats(pipeline=PipelineStats(), job=JobTimes(total_s=3.0), camera_fit=FIT),
], ids=lambda r: type(r).__name__)
def test_every_record_survives_its_json_form(record):
    data = json.loads(json.dumps(record.to_dict()))   # what a file holds
    assert type(record).from_dict(data) == record


def test_json_forms_are_the_flat_ones_kiln_always_wrote():
    flat = PIPELINE.to_dict()
    # the bake's stats sit beside the pipeline's, under their report names
    assert flat["bake_psnr_db"] == 25.2 and flat["bake_mode"] == "opt" and flat["warnings"] == [
        "the photo holds more detail"] and "bake" not in flat
    assert flat["backends"] == {"render": "gsplat", "rasterize": "nvdiffrast", "device": "cuda:1",
                                "chunk_scale": 0.5}
    # a value that is not there is left out, not written as null
    bare = PipelineStats().to_dict()
    assert "views_cached" not in bare and "bake_mode" not in bare and "texture_size_auto" not in bare
    assert "warnings" not in replace(BAKE, warnings=(), texture_size_suggested=None).to_dict()
    assert JobStats().to_dict() == {} and JobStats(job=JobTimes(total_s=0.2)).to_dict() == {"job": {"total_s": 0.2}}
    report = WorkerReport(timings={}, job=JobTimes(), stats=PIPELINE, check={}).to_dict()
    assert report["backends"] == flat["backends"] and report["reconstruction_cached"] is True


def test_reading_is_lenient_about_other_versions():
    assert Backends.from_dict({"device": "cuda:0"}) == Backends(device="cuda:0")   # no chunk_scale yet
    assert PipelineStats.from_dict({"faces": 3, "from_the_future": 1}) == PipelineStats(faces=3)
    assert JobStats.from_dict({"job": {"total_s": 1}}).pipeline is None          # a failed job's
    assert Capabilities.from_dict({"cpu": True, "reasons": {"gsplat": "no"}}).working() == ("cpu",)


def test_capabilities_answer_for_the_probes_workers_run():
    assert set(PROBED) == set(PROBES)
    assert CAPS.working() == ("cuda", "cpu", "moderngl", "nvdiffrast")
    assert CAPS.works("nvdiffrast") and not CAPS.works("gsplat")
    with pytest.raises(ValueError, match="no start-up probe is called 'opengl'"):
        CAPS.works("opengl")


def test_job_directories_from_before_the_records_still_load(tmp_path):
    root = tmp_path / "jobs"
    shutil.copytree(OLD_JOBS, root)
    store = JobStore(root)
    found = {st.session: st for st in store.scan()}
    assert sorted(found) == ["failed", "nobake", "retried"]

    retried = found["retried"]
    assert retried.backends == Backends("cpu", "moderngl", "cpu", 1.0)
    p = retried.stats.pipeline
    assert (p.faces, p.texture_size_auto, p.views_cached, p.reconstruction_cached) == (1188, 512, True, True)
    assert p.bake.mode == "opt" and p.bake.photo_projection and p.bake.timings["opt"] == 0.051
    assert p.source_camera["projection"] == "orthographic"
    assert retried.stats.earlier_attempts == ("worker crashed with SIGSEGV during stage 'mesh'",)
    assert retried.stats.job == JobTimes(pipeline_s=0.7237, worker_job_s=0.7274, queued_s=0.006, total_s=8.347)
    assert retried.stats.glb_check["texture_size"] == [512, 512]

    failed = found["failed"]
    assert failed.stats.pipeline is None and failed.stats.job.total_s == 0.24
    nobake = found["nobake"]
    assert nobake.stats.pipeline.bake is None and nobake.stats.pipeline.views_cached is None

    for st in found.values():
        raw = json.loads((store.job_dir(st.id) / "status.json").read_text())
        assert "kind" not in raw
        raw["kind"] = "image"                 # what every job was before bake jobs came
        assert st.to_dict() == raw            # read and written again: nothing lost, nothing added
        assert isinstance(load_settings(store.job_dir(st.id)), Settings)
    for name in ("retried", "nobake"):
        raw = json.loads((store.job_dir(found[name].id) / "result.json").read_text())
        report = store.read_result(found[name].id)
        assert report.to_dict() == raw and report.stats == found[name].stats.pipeline
    assert store.read_result(failed.id) is None


def test_a_status_with_no_attempt_yet_round_trips():
    raw = JobStatus(id="x", session="s").to_dict()
    assert raw["backends"] == {} and raw["stats"] == {}     # as earlier versions wrote it
    assert JobStatus.from_dict(raw).backends is None


def test_worker_config_crosses_the_spawn_pickled_and_reads_its_settings():
    settings = Settings().override({"worker.device": "cpu", "worker.heartbeat_s": 0.5,
                                    "worker.probe_timeout_s": 9})
    cfg = WorkerConfig(settings=settings, slot=2, gpu="1", log_path="/var/workers/worker-2.log", parent_pid=7,
                       skip_probes={"gsplat": "probe crashed"}, faults_enabled=True,
                       probe_faults={"moderngl": "segv"},
                       interpreter=ForeignInterpreter(python="/opt/py/bin/python", sys_path=("/opt/py/lib",)))
    back = pickle.loads(pickle.dumps(cfg, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == cfg and back.settings == settings
    assert (back.device, back.heartbeat_s, back.probe_timeout_s) == ("cpu", 0.5, 9.0)
    assert back.probe_fault("moderngl") == "segv" and back.probe_fault("cuda") is None
    assert replace(back, faults_enabled=False).probe_fault("moderngl") is None


def test_a_fits_report_is_the_camera_file_a_fit_writes():
    """CameraFitReport's JSON form is the fit's own report (``CameraFit.report``), which the
    fit writes as camera.json and ``kiln bake --camera`` reads: one form, one set of keys."""
    import numpy as np

    from pipeline.camera.camera_fit import CameraFit
    from pipeline.io.camera_file import camera_from_focal

    cam = camera_from_focal(300.0, 320, 240)
    fit = CameraFit(camera=cam, iou=0.67521, coverage=0.9621, inside=0.6931, objective=0.81, seconds=2.321,
                    case="posed")
    report = CameraFitReport.from_dict(fit.report())
    assert report.to_dict() == fit.report()
    again = CameraFit.from_report(report.to_dict(), cam)
    assert (again.iou, again.coverage, again.inside, again.case) == (0.6752, 0.9621, 0.6931, "posed")
    assert np.allclose(again.camera.K, cam.K)
    assert report.figures() == {k: v for k, v in fit.report().items() if k != "source_camera"}
