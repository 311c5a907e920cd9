"""``worker.ray_transfer: shared`` on a one-node loopback Ray cluster: the worker on the node
reads its inputs from the job's own folder and writes its GLB there (a filesystem every node
mounts at the same path, as docs/cluster.md sets it up); nothing travels through the object
store and no copy is made in the node's scratch folder. test_ray_engine covers the default,
``object_store``, on two nodes. Every wait has a time limit.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker.jobs.jobstore import DONE
from worker.pool.supervisor import Supervisor
from worker_helpers import image, small_settings

# no deadline of its own: marked like test_ray_engine, so a run of either mark starts one Ray head
pytestmark = pytest.mark.timing(reason="shares the Ray head with test_ray_engine")

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kiln3d[ray]')")

RESOURCE = "kiln_gpu"   # conftest's ray_head (RAY_RESOURCE) gives its head one unit of it
JOB_TIMEOUT = 120


def test_a_job_runs_in_its_own_folder_on_a_shared_filesystem(tmp_path, ray_head):
    cluster = ray_head   # the session's one-node cluster (conftest), the head alone
    assert not cluster.worker_nodes
    scratch = tmp_path / "node"
    settings = small_settings(worker__engine="ray", worker__ray_resource=RESOURCE,
                              worker__ray_address=cluster.address, worker__ray_transfer="shared",
                              worker__ray_scratch=str(scratch))
    with Supervisor(settings, tmp_path / "jobs", tmp_path / "cache") as sup:
        sup.start(timeout=180)
        job = sup.submit(*image(71), settings, session="shared")
        st = job.wait(JOB_TIMEOUT)
    assert st.state == DONE, st.error
    glb = Path(st.outputs["glb"])
    assert glb.is_file() and glb.is_relative_to(job.dir) and glb.read_bytes()[:4] == b"glTF"
    assert "on Ray node 127.0.0.1" in (job.dir / "log").read_text()
    assert (job.dir / "result.json").is_file()
    # the shared folder was used as it is: no copy of the job on the node
    assert not (scratch / "jobs").exists() or not any((scratch / "jobs").iterdir())
