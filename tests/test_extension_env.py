"""One extension cache and one architecture list for every Kiln process.

gsplat and nvdiffrast JIT-compile for minutes; torch keys its build cache by folder and
flags, so a job worker, a selftest child and doctor's probe child that saw different
``TORCH_EXTENSIONS_DIR`` / ``TORCH_CUDA_ARCH_LIST`` would each compile again. These tests
look at what the spawned processes actually receive."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from worker.child import env as wenv
from worker.checks import selftest
from worker.pool.supervisor import Supervisor
from worker_helpers import small_settings


def _fake_nvidia_smi(folder: Path, caps: list[str]) -> Path:
    """An ``nvidia-smi`` that answers the compute-capability query only (``-L`` fails, so
    the supervisor still sees no GPU to pin and runs a CPU worker)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    lines = "\\n".join(caps)
    script.write_text("#!/bin/sh\n"
                      'case "$*" in *compute_cap*) printf "' + lines + '\\n"; exit 0;; esac\n'
                      "exit 9\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def test_the_users_values_win():
    env = {"TORCH_EXTENSIONS_DIR": "/mine", "TORCH_CUDA_ARCH_LIST": "8.0 9.0+PTX", "PATH": "/nowhere"}
    assert wenv.extension_env(env) == {"TORCH_EXTENSIONS_DIR": "/mine", "TORCH_CUDA_ARCH_LIST": "8.0 9.0+PTX"}


def test_defaults_are_the_project_folder_and_the_gpus_own_architectures(tmp_path):
    bin_dir = _fake_nvidia_smi(tmp_path / "bin", ["9.0", "8.6", "9.0"])
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin"}
    out = wenv.extension_env(env)
    assert out["TORCH_EXTENSIONS_DIR"] == str(wenv.PROJECT_EXTENSIONS_DIR)
    assert wenv.PROJECT_EXTENSIONS_DIR == Path(__file__).resolve().parent.parent / "var" / "torch_extensions"
    assert out["TORCH_CUDA_ARCH_LIST"] == "8.6;9.0"     # each architecture once, oldest first
    # pinned to the second GPU only: its architecture only
    assert wenv.extension_env(dict(env, CUDA_VISIBLE_DEVICES="1"))["TORCH_CUDA_ARCH_LIST"] == "8.6"


def test_no_gpu_means_no_arch_list(tmp_path):
    out = wenv.extension_env({"PATH": str(tmp_path)})      # no nvidia-smi at all
    assert "TORCH_CUDA_ARCH_LIST" not in out and out["TORCH_EXTENSIONS_DIR"]


@pytest.fixture
def fake_gpu_machine(tmp_path, monkeypatch):
    """This process's environment as a GPU machine's with no user values (restored after)."""
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    bin_dir = _fake_nvidia_smi(tmp_path / "bin", ["9.0"])
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return {"TORCH_EXTENSIONS_DIR": str(wenv.PROJECT_EXTENSIONS_DIR), "TORCH_CUDA_ARCH_LIST": "9.0"}


class _Seen(Exception):
    """Stops doctor once its probe child's environment is known."""


def _report_build_env(_settings) -> dict:
    """Runs in a selftest child: what it was given."""
    return {"ok": True, "note": f"{os.environ.get('TORCH_EXTENSIONS_DIR')}|{os.environ.get('TORCH_CUDA_ARCH_LIST')}"}


@pytest.mark.slow
def test_job_workers_selftest_children_and_doctor_probes_share_one_cache(fake_gpu_machine, tmp_path,
                                                                          monkeypatch):
    want = fake_gpu_machine
    # a job worker (spawned by the supervisor) reports what it received
    with Supervisor(small_settings(), tmp_path / "jobs", None, var_dir=tmp_path / "var") as sup:
        caps = sup.capabilities()
    assert caps.torch_extensions_dir == want["TORCH_EXTENSIONS_DIR"]
    assert caps.torch_cuda_arch_list == want["TORCH_CUDA_ARCH_LIST"]
    # a selftest twin child, in a process of its own
    out = selftest.run_isolated(_report_build_env, small_settings(), timeout=120)
    assert out["note"] == f"{want['TORCH_EXTENSIONS_DIR']}|{want['TORCH_CUDA_ARCH_LIST']}"
    # doctor's probe child is started with this environment
    from worker.checks import doctor

    seen = {}

    def fake_run_probes(names, limits, python, env, device, settings_json):
        seen.update(env)
        raise _Seen


    monkeypatch.setattr(doctor, "run_probes", fake_run_probes)
    with pytest.raises(_Seen):
        doctor.run_checks(small_settings(), timeout=5, env=dict(os.environ))
    assert {k: seen.get(k) for k in want} == want
