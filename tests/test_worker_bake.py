"""Bake jobs (``kiln bake``) keep every guarantee an image job has: they own copies of their
files, report their stages, survive a crash by the retry rule, cancel at once, and a
server restart settles one it left running."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from worker.jobs.bakeinputs import BakeFiles, check_bake
from worker.child.faults import FaultPlan
from worker.jobs.jobstore import JobStore, load_request
from worker.pool.supervisor import Supervisor
from worker_helpers import small_settings

PLAN = FaultPlan(["segv@uv:attempt=1:session=flaky", "segv@read:session=segv", "hang@bake:session=cancel"])
JOB_TIMEOUT = 120


def _coloured_mesh(path: Path, seed: int = 0) -> Path:
    """A small mesh with vertex colours of its own (enough for a bake without splat or photo)."""
    import trimesh

    tm = trimesh.creation.icosphere(subdivisions=3, radius=0.5)
    rng = np.random.default_rng(seed)
    tm.visual.vertex_colors = (rng.uniform(0, 255, (len(tm.vertices), 4))).astype(np.uint8)
    tm.export(path)
    return path


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("bake-jobs")
    sup = Supervisor(small_settings(), root / "jobs", root / "cache", faults=PLAN)
    try:
        sup.start()
        yield sup, root
    finally:
        sup.shutdown()


def _bake(root: Path, name: str, seed: int = 0):
    mesh = _coloured_mesh(root / f"{name}.ply", seed)
    return check_bake(BakeFiles(mesh=mesh), small_settings()), mesh


def test_a_bake_job_owns_its_files_and_runs_its_stages(env):
    sup, root = env
    bake, mesh = _bake(root, "owned")
    job = sup.submit_bake(bake, small_settings(), session="owned")
    mesh.unlink()   # the person's file may go: the job has its own copy
    st = job.wait(timeout=JOB_TIMEOUT)
    assert st.state == "done", st.error
    assert st.kind == "bake"
    assert [s for s in ("read", "mesh", "uv", "bake", "export") if s in st.timings] == \
        ["read", "mesh", "uv", "bake", "export"]
    assert load_request(job.dir).names["mesh"] == "owned.ply"
    assert (job.dir / "inputs" / "mesh" / "owned.ply").is_file()
    model = st.stats.pipeline.model
    assert model.mesh_format == "ply" and model.uvs == "new" and model.faces_in == 1280
    assert st.stats.pipeline.bake.texels_from["fallback"] > 0.9
    assert Path(st.outputs["glb"]).stat().st_size > 0


def test_a_crash_in_a_bake_job_is_retried_by_the_same_rule(env):
    sup, root = env
    bake, _ = _bake(root, "flaky", seed=1)
    st = sup.submit_bake(bake, small_settings(), session="flaky").wait(timeout=JOB_TIMEOUT)
    assert st.state == "done", st.error
    assert st.attempts == 2
    assert st.stats.earlier_attempts == ("worker crashed with SIGSEGV during stage 'uv'",)


def test_a_bake_job_that_crashes_each_time_fails_naming_the_stage(env):
    sup, root = env
    bake, _ = _bake(root, "segv", seed=2)
    st = sup.submit_bake(bake, small_settings(worker__retry_with_fallback=False),
                         session="segv").wait(timeout=JOB_TIMEOUT)
    assert st.state == "failed" and st.error == "worker crashed with SIGSEGV during stage 'read'"


@pytest.mark.timing(reason="the cancel must take under 5 s")
def test_a_running_bake_job_is_cancelled_at_once(env):
    sup, root = env
    bake, _ = _bake(root, "cancel", seed=3)
    job = sup.submit_bake(bake, small_settings(), session="cancel")
    deadline = time.monotonic() + JOB_TIMEOUT
    while job.status().stage != "bake":
        assert time.monotonic() < deadline and not job.status().terminal
        time.sleep(0.05)
    t0 = time.monotonic()
    assert job.cancel()
    assert time.monotonic() - t0 < 5.0
    assert job.status().state == "cancelled"


def test_a_restart_finds_a_bake_job_left_running(tmp_path):
    from worker.pool import resume

    store = JobStore(tmp_path / "jobs")
    bake, _ = _bake(tmp_path, "orphan")
    st = store.create_bake(bake.request, bake.copies, small_settings(), "old")
    st.state, st.stage = "running", "read"
    store.write_status(st)
    (left,) = JobStore(tmp_path / "jobs").interrupted()
    assert left.kind == "bake"
    assert resume.decide(left, True, 1).message == "resumed: the server stopped during stage 'read'"
    assert resume.decide(left, False, 0).message == "interrupted: the server stopped during stage 'read'"


def _textured_box(folder: Path):
    import trimesh
    from PIL import Image

    tm = trimesh.creation.box(extents=(0.6, 0.8, 0.5))
    uv = (tm.vertices[:, :2] + 0.5).clip(0, 1)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    tm.visual = trimesh.visual.TextureVisuals(uv=uv, image=image)
    folder.mkdir(parents=True, exist_ok=True)
    return tm


def test_a_mesh_s_companion_files_travel_with_it_into_the_job(tmp_path):
    """An OBJ's MTL and texture, a glTF's buffer: copied beside the job's mesh under their own
    names, so the job reads the mesh with its texture from its own folder."""
    from pipeline.io.mesh_file import read_mesh

    tm = _textured_box(tmp_path / "obj")
    tm.export(tmp_path / "obj" / "box.obj")   # writes box.obj, material.mtl, material_0.png
    (tmp_path / "gltf").mkdir()
    tm.export(tmp_path / "gltf" / "box.gltf")  # writes box.gltf and its buffer (gltf_buffer_0.bin)
    store = JobStore(tmp_path / "jobs")
    for mesh, extra in ((tmp_path / "obj" / "box.obj", {".mtl", ".png"}), (tmp_path / "gltf" / "box.gltf", {".bin"})):
        checked = check_bake(BakeFiles(mesh=mesh), small_settings())
        assert {Path(n).suffix for n in checked.copies} == {mesh.suffix} | extra, checked.copies
        st = store.create_bake(checked.request, checked.copies, small_settings(), "companions")
        copy = read_mesh(store.job_dir(st.id) / "inputs" / checked.request.mesh)
        assert copy.texture is not None and copy.mesh.uvs is not None, mesh.suffix
        assert checked.request.uvs == "keep"    # usable UVs of its own: kept
