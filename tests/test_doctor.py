"""``kiln doctor`` on this machine and against staged problems (fake nvcc, stale
locks, small /dev/shm, a CUDA device requested where there is none)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from kiln.settings import Settings
from worker.checks import doctor
from worker.checks.proberun import run_probes


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return res.returncode == 0 and "GPU " in res.stdout


def _fake_nvcc(folder: Path, release: str = "9.1") -> Path:
    """A stand-in toolkit whose nvcc reports an old CUDA release, as on the old tool's machine."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    nvcc = bin_dir / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
                    f"echo 'Cuda compilation tools, release {release}, V{release}.85'\n")
    nvcc.chmod(0o755)
    return bin_dir


def _json_run(capsys, *argv) -> tuple[int, dict]:
    code = doctor.main(["--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def _check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["name"] == name)


def test_default_config_passes_here_without_touching_cuda(capsys, monkeypatch):
    """Full run (subprocess probes included). The doctor process itself must not
    initialise CUDA or even ask torch about it."""
    torch = pytest.importorskip("torch")

    def boom(*a, **k):
        raise AssertionError("the doctor process touched CUDA")

    monkeypatch.setattr(torch.cuda, "_lazy_init", boom)
    monkeypatch.setattr(torch.cuda, "is_available", boom)
    code, report = _json_run(capsys, "--timeout", "120")
    assert code == 0, [c for c in report["checks"] if c["status"] == "fail"]
    assert report["ok"] and not report["quick"]
    names = [c["name"] for c in report["checks"]]
    for n in ("python", "torch", "gpus", "nvcc", "CUDA_HOME", "extension cache", "/dev/shm",
              "moderngl/EGL", "gsplat", "nvdiffrast", "sam2", "sam3d"):
        assert n in names
    assert _check(report, "moderngl/EGL")["status"] == "ok"   # rendered one triangle in a subprocess
    if not _has_gpu():
        assert "not available: no CUDA" in _check(report, "gsplat")["detail"]
    assert report["summary"].startswith("kiln doctor: ok")


@pytest.mark.timing(reason="the summary must take under 15 s")
def test_summary_is_one_quick_line(capsys):
    t0 = time.perf_counter()
    code = doctor.main(["--summary"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(out) == 1
    assert out[0].startswith("kiln doctor: ok |") and "moderngl ok" in out[0]
    assert time.perf_counter() - t0 < 15


def test_nvcc_mismatch_is_flagged_with_the_fix(tmp_path, monkeypatch, capsys):
    bin_dir = _fake_nvcc(tmp_path / "cuda-9.1")
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "HOME": str(tmp_path)}
    # the old tool's situation: nvcc 9.1 first on PATH, torch built for CUDA 11.8
    c = doctor.check_nvcc("11.8", env)
    assert c.status == "warn" and "CUDA 9.1" in c.detail and "mismatch" in c.detail
    assert "export CUDA_HOME=/usr/local/cuda-11.8 PATH=/usr/local/cuda-11.8/bin:$PATH" in c.fix
    # when the pipeline needs a JIT build and no matching toolkit exists, it is a failure
    assert doctor.check_nvcc("11.8", env, needed=True).status == "fail"
    # a matching nvcc is fine
    ok_dir = _fake_nvcc(tmp_path / "cuda-11.8", release="11.8")
    assert doctor.check_nvcc("11.8", {"PATH": str(ok_dir)}).status == "ok"

    # end to end with the installed torch: its CUDA version against the fake nvcc 9.1
    torch_cuda = doctor.check_torch(import_torch=False).data.get("cuda")
    if not torch_cuda:
        pytest.skip("installed torch is a CPU build: no CUDA version to compare with")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    code, report = _json_run(capsys, "--quick")
    nvcc = _check(report, "nvcc")
    assert nvcc["status"] in ("warn", "fail")
    assert f"is CUDA 9.1 but torch is built for CUDA {torch_cuda}" in nvcc["detail"]
    assert any(f.startswith("export CUDA_HOME=") and f.endswith("/bin:$PATH") for f in nvcc["fix"])
    assert code == 0   # the default config on a CPU machine compiles nothing


def test_stale_lock_is_found_with_rm_command(tmp_path, monkeypatch, capsys):
    ext = tmp_path / "ext"
    stale = ext / "py311_cu130" / "gsplat_cuda" / "lock"
    fresh = ext / "py311_cu130" / "nvdiffrast_plugin" / "lock"
    for p in (stale, fresh):
        p.parent.mkdir(parents=True)
        p.write_text("")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    env = {"TORCH_EXTENSIONS_DIR": str(ext), "HOME": str(tmp_path)}
    c = doctor.check_extension_cache(env, tmp_path)
    assert c.status == "warn" and str(stale) in c.detail and str(fresh) not in c.detail
    assert c.fix == [f"rm -f {stale}"]
    assert doctor.check_extension_cache(env, tmp_path, needed=True).status == "fail"
    os.remove(stale)
    c = doctor.check_extension_cache(env, tmp_path)
    assert c.status == "info" and str(fresh) in c.detail   # recent: a build may be running

    os.utime(fresh, (old, old))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    code, report = _json_run(capsys, "--quick")
    cache = _check(report, "extension cache")
    assert cache["status"] == "warn" and f"rm -f {fresh}" in cache["fix"]


@pytest.mark.skipif(_has_gpu(), reason="this machine has a GPU, so worker.device=cuda is satisfiable")
def test_cuda_requested_on_cpu_machine_fails(capsys):
    code = doctor.main(["--quick", "--set", "worker.device=cuda"])
    out = capsys.readouterr().out
    assert code == 1
    assert "[FAIL] worker.device" in out and "fix: --set worker.device=auto" in out
    assert "1 problem(s): worker.device" in out


def test_needed_backend_missing_fails(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "moderngl" else real(name, *a))
    c = doctor.check_moderngl(quick=True, needed=True)
    assert c.status == "fail" and "not installed" in c.detail and "pip install moderngl" in c.fix[0]
    assert doctor.main(["--quick", "--set", "rasterize.backend=moderngl"]) == 1
    capsys.readouterr()
    # without texture baking nothing rasterizes, so it is only a warning
    assert doctor.main(["--quick", "--set", "rasterize.backend=moderngl", "--set", "bake.enabled=false"]) == 0


def test_sam3d_backend_without_package_fails(tmp_path, capsys):
    code = doctor.main(["--quick", "--set", "reconstruct.backend=sam3d"])
    out = capsys.readouterr().out
    assert code == 1 and "[FAIL] sam3d" in out and "reconstruct.sam3d_config is empty" in out
    (tmp_path / "pipeline.yaml").write_text(
        "_target_: sam3d_objects.pipeline.inference_pipeline_pointmap.InferencePipelinePointMap\n")
    code = doctor.main(["--quick", "--set", "reconstruct.backend=sam3d",
                        "--set", f"reconstruct.sam3d_config={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 1 and "sam3d_objects package is not installed" in out


def test_sam2_checkpoints_are_listed(tmp_path):
    (tmp_path / "sam2_hiera_large.pt").write_bytes(b"x")
    (tmp_path / "sam2.1_hiera_small.pt").write_bytes(b"x")
    c = doctor.check_sam2(Settings(), str(tmp_path))
    if c.status == "warn":   # sam2 not installed here: still lists what it found
        assert "sam2.1_hiera_small.pt" in c.detail
    else:
        assert c.status == "ok" and "sam2.1 small (sam2.1_hiera_small.pt)" in c.detail
        assert "configs/sam2.1/sam2.1_hiera_s.yaml" in c.detail
    assert [f["path"] for f in c.data["found"]] == [str(tmp_path / "sam2.1_hiera_small.pt"),
                                                   str(tmp_path / "sam2_hiera_large.pt")]
    missing = Settings().override({"app.sam2_checkpoint": str(tmp_path / "gone.pt")})
    c = doctor.check_sam2(missing, str(tmp_path))
    assert c.status == "warn" and "does not exist" in c.detail


def test_small_shm_warns_with_docker_hint():
    c = doctor.check_shm("/dev/shm", min_bytes=1 << 60)
    assert c.status == "warn" and "--shm-size" in c.fix[0]
    assert doctor.check_shm("/dev/shm", min_bytes=1).status == "ok"


@pytest.mark.timing(reason="a 1 s probe timeout, and the whole under 60 s")
def test_probes_report_crash_and_timeout_and_the_rest_still_run():
    """The worker's own probes in a child (worker.checks.proberun): a probe that kills its process
    or hangs in native code (SIGSTOP: no Python alarm can fire) is that probe's result, and
    the probes after it run in a fresh child."""
    env = dict(os.environ, KILN_TEST_FAULTS="segv@probe:cuda,freeze@probe:moderngl")
    t0 = time.perf_counter()
    got = run_probes(["cuda", "moderngl", "gsplat"], {"moderngl": 1}, sys.executable, env)
    assert got["cuda"].broke and got["cuda"].reason.startswith("crashed with SIGSEGV")
    assert got["moderngl"].broke and got["moderngl"].reason == "timed out after 1 s"
    assert time.perf_counter() - t0 < 60
    # the restarted child counts the crashed probe as failed: gsplat is told CUDA is missing
    assert not got["gsplat"].ok and not got["gsplat"].broke and got["gsplat"].reason == "needs CUDA"

    # a hang in Python is cut short by the child itself, which then goes on
    env["KILN_TEST_FAULTS"] = "hang@probe:cuda"
    got = run_probes(["cuda", "moderngl"], {"cuda": 1}, sys.executable, env)
    assert got["cuda"].broke and got["cuda"].reason == "timed out after 1 s"
    assert got["moderngl"].ok, got["moderngl"]

    got = run_probes(["cuda", "moderngl"], {}, "/nonexistent/python")
    assert all(o.broke and "could not be run" in o.reason for o in got.values())


def test_probe_protocol_keeps_stdout_for_itself():
    """Whatever a library prints while a probe runs (a JIT build does) goes to stderr,
    so the doctor reads only the probes' lines."""
    code = ("import os, sys, worker.child.probe as p\n"
            "def noisy(ctx):\n"
            "    print('noise from Python'); os.write(1, b'noise from native code\\n'); return True, 'ok'\n"
            "p.FUNCS['cpu'] = noisy\n"
            "sys.exit(p.main(['--json', 'cpu']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [m["event"] for m in lines] == ["start", "result", "done"] and lines[1]["ok"]
    assert "noise from Python" in r.stderr and "noise from native code" in r.stderr


def test_a_machine_without_a_gpu_probes_every_backend_without_importing_torch():
    """No NVIDIA driver: the CUDA probe says so without torch, and the CPU renderer and the
    rasterizer are probed torch-free, so a worker starts ~2 s sooner (torch comes with the
    stage libraries after "ready", and only when the settings bake)."""
    from worker.child.probe import nvidia_driver_missing

    if nvidia_driver_missing() is None:
        pytest.skip("this machine has an NVIDIA driver: its CUDA probe asks torch")
    code = ("import json, sys\n"
            "from worker.child.probe import PROBES, run_probe\n"
            "from kiln.settings import load\n"
            "ctx, got = {'device': 'auto', 'results': {}, 'settings': load()}, {}\n"
            "for n in PROBES:\n"
            "    got[n] = run_probe(n, ctx, 120)\n"
            "    ctx['results'][n] = got[n][0]\n"
            "print(json.dumps({'results': got, 'torch': 'torch' in sys.modules}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["results"]["cuda"] == [False, "no NVIDIA driver here (libcuda.so.1 cannot be loaded)"]
    assert got["results"]["cpu"] == [True, "ok"] and got["results"]["moderngl"] == [True, "ok"]
    assert got["results"]["gsplat"] == got["results"]["nvdiffrast"] == [False, "needs CUDA"]
    assert got["torch"] is False


def _venv(where: Path, parent_packages: bool) -> Path:
    """A second interpreter without Kiln installed; with ``parent_packages`` it reaches this
    venv's packages through a .pth line (as a model's own env would hold torch)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True,
                   capture_output=True, timeout=120)
    python = where / "bin" / "python"
    if parent_packages:
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        Path(site, "kiln_parent_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_probes_run_under_worker_python(tmp_path, capsys):
    """With worker.python set, the probes run where the workers will: that interpreter."""
    second = _venv(tmp_path / "second", parent_packages=True)
    code, report = _json_run(capsys, "--set", f"worker.python={second}", "--timeout", "120")
    assert code == 0, [c for c in report["checks"] if c["status"] == "fail"]
    assert _check(report, "moderngl/EGL")["status"] == "ok"
    assert _check(report, "worker.python")["status"] == "ok"
    bare = _venv(tmp_path / "bare", parent_packages=False)   # no numpy: the probes cannot even start
    got = run_probes(["cuda", "moderngl"], {}, str(bare))
    assert all(o.broke and "ModuleNotFoundError" in o.reason for o in got.values()), got


def test_rembg_is_reported_from_its_model_file_and_packages(tmp_path, monkeypatch):
    """No model: info (optional), or warn when app.auto_mask names rembg; a model without the
    packages: warn with the install line; both: ok, nothing loaded."""
    import importlib.util

    c = doctor.check_rembg(Settings(), str(tmp_path))
    assert c.status == "info" and "kiln models fetch rembg" in c.fix[0]
    forced = Settings().override({"app.auto_mask": "rembg"})
    assert doctor.check_rembg(forced, str(tmp_path)).status == "warn"
    (tmp_path / "u2net.onnx").write_bytes(b"x")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rembg" else real(name, *a))
    c = doctor.check_rembg(Settings(), str(tmp_path))
    assert c.status == "warn" and "rembg is not installed" in c.detail and "kiln3d[rembg]" in c.fix[0]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    c = doctor.check_rembg(Settings(), str(tmp_path))
    assert c.status == "ok" and "u2net.onnx" in c.detail and c.data["present"]
