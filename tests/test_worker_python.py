"""worker.python: the worker runs under a second interpreter while the app stays here.

The second interpreter is a venv the test creates (``python -m venv --without-pip``) whose
site-packages reaches Kiln's venv through a plain ``.pth`` path line: it can import torch
and the stage libraries cheaply, but not Kiln itself (the editable install's finder is not
run from there), so the worker must find Kiln's tree the way ``worker.child.interpreter`` says.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from worker.child import interpreter
from worker.pool.supervisor import Supervisor, WorkerStartError
from worker_helpers import image, small_settings


@pytest.fixture(scope="module")
def second_python(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv2")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   capture_output=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "kiln_parent_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # Kiln itself must not be importable there: the worker gets it from worker.child.interpreter
    probe = subprocess.run([str(python), "-c", "import worker"], capture_output=True, cwd="/")
    assert probe.returncode != 0
    return python


def test_worker_config_reads_the_interpreters_own_path(second_python):
    assert interpreter.foreign_interpreter("") is None
    interp = interpreter.foreign_interpreter(str(second_python))
    assert interp.python == str(second_python)
    venv = str(second_python.parent.parent)
    assert any(p.startswith(venv) for p in interp.sys_path)      # its own site-packages
    assert interp.project_root == str(Path(__file__).resolve().parent.parent)


def test_bad_interpreter_is_named(tmp_path):
    with pytest.raises(interpreter.InterpreterError, match="does not exist"):
        interpreter.foreign_interpreter(str(tmp_path / "nope" / "python"))
    with pytest.raises(interpreter.InterpreterError, match="not an executable"):
        interpreter.foreign_interpreter(str(tmp_path))
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    script.chmod(0o755)
    with pytest.raises(interpreter.InterpreterError, match="failed to start: broken"):
        interpreter.foreign_interpreter(str(script))


def test_a_job_runs_through_a_worker_under_the_second_interpreter(tmp_path, second_python):
    import multiprocessing.spawn as mp_spawn

    before = mp_spawn.get_executable()
    settings = small_settings(worker__python=str(second_python))
    with Supervisor(settings, tmp_path / "jobs", None) as sup:
        caps = sup.capabilities()
        # the worker is that interpreter (its prefix is the second venv), the app is not
        assert caps.python == str(second_python)
        assert caps.python_prefix == str(second_python.parent.parent)
        assert sys.prefix != caps.python_prefix
        st = sup.run(*image(), settings, session="py2", timeout=180)
        assert st.state == "done", st.error
        assert Path(st.outputs["glb"]).is_file()
    # the spawn executable is this process's own again for every other spawn
    assert mp_spawn.get_executable() == before


def test_an_unusable_interpreter_fails_the_start_clearly(tmp_path):
    settings = small_settings(worker__python=str(tmp_path / "missing" / "python"))
    with pytest.raises(WorkerStartError, match="worker.python .* does not exist"):
        Supervisor(settings, tmp_path / "jobs", None).start(timeout=30)


# --------------------------------------------------------------------------- kiln doctor

def test_doctor_checks_the_worker_interpreter(second_python, tmp_path):
    from worker.checks.doctor import check_worker_python

    assert check_worker_python(small_settings()).status == "info"
    ok = check_worker_python(small_settings(worker__python=str(second_python)))
    assert ok.status == "ok", ok.detail
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in ok.detail and "torch" in ok.detail
    assert ok.data["prefix"] == str(second_python.parent.parent)

    # a bare venv: no torch, no stage libraries -> fail, with the install command for that env
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True,
                   capture_output=True, timeout=120)
    bad = check_worker_python(small_settings(worker__python=str(bare / "bin" / "python"),
                                             reconstruct__backend="sam3d"))
    assert bad.status == "fail"
    assert "missing" in bad.detail and "torch" in bad.detail and "sam3d_objects is not installed" in bad.detail
    assert bad.fix[0].startswith(f"{bare / 'bin' / 'python'} -m pip install ")
    assert "'trimesh>=4.4'" in bad.fix[0] and "'torch>=2.4'" in bad.fix[0]

    gone = check_worker_python(small_settings(worker__python=str(tmp_path / "none" / "python")))
    assert gone.status == "fail" and "does not exist" in gone.detail
