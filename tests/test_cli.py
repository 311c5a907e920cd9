"""The `kiln` command line: help, input handling and clear errors, end to end."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cli_helpers import kiln_in_process
ROOT = Path(__file__).resolve().parent.parent

# small settings so a whole CLI job takes seconds on 2 cores
SMALL = ["--set", "reconstruct.resolution=64", "--set", "reconstruct.num_gaussians=3000",
         "--set", "views.resolution=128", "--views", "4", "--texture-size", "256",
         "--set", "bake.steps=10"]


def kiln(*args, cwd=None, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "app.cli.cli", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


def kiln_on_a_terminal(*args, timeout=300):
    """Run kiln with stderr on a pseudo-terminal, as in an interactive shell.
    Returns (exit code, stdout, what the terminal showed)."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.cli", *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    shown = []

    def pump():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal has closed it
                return
            if not data:
                return
            shown.append(data)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    out = proc.communicate(timeout=timeout)[0]
    reader.join(15)
    os.close(master)
    return proc.returncode, out, b"".join(shown).decode(errors="replace").replace("\r\n", "\n")


BAR = re.compile(r"\d+\.\ds  (\w+)\s+\[([#-]+)\]")


def bars_per_stage(terminal: str) -> dict:
    """{stage: [filled cells of each redraw of its bar]}, checking each stage kept one line."""
    out: dict = {}
    for line in terminal.split("\n"):
        stages_here = set()
        for m in BAR.finditer(line):
            out.setdefault(m.group(1), []).append(m.group(2).count("#"))
            stages_here.add(m.group(1))
        assert len(stages_here) <= 1, f"two stages drawn on one line: {line!r}"
    return out


def _workdirs(tmp_path):
    return ["--set", f"app.jobs_dir={tmp_path / 'jobs'}", "--set", f"app.cache_dir={tmp_path / 'cache'}"]


@pytest.mark.timing(reason="--help must take under 5 s")
def test_help_is_fast_and_lists_commands():
    t0 = time.perf_counter()
    r = kiln("--help")
    dt = time.perf_counter() - t0
    assert r.returncode == 0
    for word in ("run", "serve", "doctor", "settings"):
        assert word in r.stdout
    assert dt < 5.0, f"--help took {dt:.1f}s: something heavy is imported at start-up"
    r = kiln("run", "--help")
    assert "--simplify-ratio" in r.stdout and "--no-bake" in r.stdout and "--bake-mode" in r.stdout


def test_help_does_not_import_heavy_libraries():
    code = ("import sys, app.cli.cli as c\n"
            "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'gradio', 'trimesh', 'cv2', 'pipeline.run') if m in sys.modules]\n"
            "print(heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip().endswith("[]"), r.stdout


def test_settings_command_lists_ranges():
    r = kiln_in_process("settings")
    assert r.returncode == 0
    assert "mesh.simplify_ratio" in r.stdout and "0.0..0.999" in r.stdout


def test_corrupt_image_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    r = kiln_in_process("run", bad, "-o", tmp_path / "o.glb")
    assert r.returncode == 2
    assert "bad.png" in r.stderr and "Traceback" not in r.stderr


def test_opaque_image_without_mask_says_pass_mask(toy, tmp_path):
    r = kiln_in_process("run", toy / "toy_rgb.png", "-o", tmp_path / "o.glb")
    assert r.returncode == 2
    assert "--mask" in r.stderr and "no mask" in r.stderr


def test_mask_size_mismatch(toy, tmp_path):
    Image.fromarray(np.zeros((10, 10), np.uint8)).save(tmp_path / "m.png")
    r = kiln_in_process("run", toy / "toy_rgb.png", "--mask", tmp_path / "m.png", "-o", tmp_path / "o.glb")
    assert r.returncode == 2 and "must match" in r.stderr


@pytest.mark.parametrize("flags,needle", [
    (["--texture-size", "3"], "bake.texture_size"),
    (["--simplify-ratio", "1.2"], "mesh.simplify_ratio"),
    (["--set", "bake.colour=red"], "unknown setting 'bake.colour'"),
])
def test_bad_settings_are_named(toy, tmp_path, flags, needle):
    r = kiln_in_process("run", toy / "toy.png", "-o", tmp_path / "o.glb", *flags)
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("where", ["--in-process", "--set=worker.count=1"], ids=["in-process", "worker"])
def test_empty_mask_is_a_clear_error(toy, tmp_path, where):
    # the stage rejecting its input is a user error (2) on both paths
    Image.fromarray(np.zeros((256, 256), np.uint8)).save(tmp_path / "empty.png")
    r = kiln_in_process("run", toy / "toy_rgb.png", "--mask", tmp_path / "empty.png", "-o", tmp_path / "o.glb",
             where, *_workdirs(tmp_path))
    assert r.returncode == 2, r.stderr[-2000:]
    assert "mask" in r.stderr.lower() and "empty" in r.stderr.lower() and "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("in_process", [True, False], ids=["in-process", "worker"])
def test_cli_end_to_end_textured_glb(toy, tmp_path, in_process):
    import trimesh

    out = tmp_path / "toy.glb"
    report = tmp_path / "report.json"
    args = ["run", toy / "toy.png", "-o", out, "--report", report, *SMALL, *_workdirs(tmp_path)]
    if in_process:
        args.append("--in-process")
    code, stdout, terminal = kiln_on_a_terminal(*args)
    assert code == 0, terminal[-3000:]
    assert "total" in terminal and "reconstruct" in terminal      # timing table
    assert str(out.resolve()) in stdout
    # one progress bar per stage, from empty to full: the stage's own progress, not the job's
    bars = bars_per_stage(terminal)
    assert list(bars) == ["reconstruct", "render_views", "mesh", "uv", "bake", "export"], terminal
    for stage, fills in bars.items():
        assert fills[0] == 0 and fills[-1] == 24, (stage, fills)
    scene = trimesh.load(out)
    geoms = list(scene.geometry.values())
    assert len(geoms) == 1
    tex = geoms[0].visual.material.baseColorTexture
    assert tex.size == (256, 256)
    rep = json.loads(report.read_text())
    assert set(rep["timings"]) >= {"reconstruct", "render_views", "mesh", "uv", "bake", "export"}


@pytest.mark.slow
def test_cli_no_bake_writes_vertex_colours_and_ply(toy, tmp_path):
    import trimesh

    out = tmp_path / "v.glb"
    r = kiln_in_process("run", toy / "toy_rgb.png", "--mask", toy / "toy_mask.png", "-o", out, "--no-bake",
                        "--ply", *SMALL, *_workdirs(tmp_path), "--in-process")
    assert r.returncode == 0, r.stderr[-3000:]
    mesh = list(trimesh.load(out).geometry.values())[0]
    cols = mesh.visual.vertex_colors
    assert cols.shape[0] == len(mesh.vertices) and cols[:, :3].std() > 5   # not one flat colour
    assert out.with_suffix(".ply").stat().st_size > 1000


def test_help_documents_exit_codes():
    for args in (["--help"], ["run", "--help"]):
        text = kiln_in_process(*args).stdout
        assert "exit status" in text.lower()
        for code in ("0 ", "1 ", "2 ", "130 "):
            assert code in text.split("xit status", 1)[1], (args, text)


def test_a_failed_job_exits_1_and_says_why(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_TEST_FAULTS", "segv@mesh")   # the worker still crashes in a process of its own
    r = kiln_in_process("run", toy / "toy.png", "-o", tmp_path / "o.glb", "--no-bake", *SMALL, *_workdirs(tmp_path),
                        "--set", "worker.retry_with_fallback=false")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "failed: worker crashed with SIGSEGV during stage 'mesh'" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o.glb").exists()


def test_a_worker_that_cannot_start_is_a_clear_error(toy, tmp_path):
    # The worker dies after its backend probes, importing the stages' libraries (as a native
    # library crashing on load would): no probe is blamed, the start fails 3 times, and
    # the CLI says so without a traceback.
    env = {**os.environ, "KILN_TEST_FAULTS": "exit@probe:imports"}
    r = kiln("run", toy / "toy.png", "-o", tmp_path / "o.glb", *SMALL, *_workdirs(tmp_path), env=env)
    assert r.returncode == 1, r.stderr[-3000:]
    assert ("kiln: error: the worker could not start: worker 0 failed to start 3 times: exited "
            "with status 3 while importing the stage libraries") in r.stderr
    assert "Traceback" not in r.stderr
    log = (tmp_path / "workers" / "worker-0.log").read_text()
    assert log.count(" starting ") == 3, log  # no start was spent skipping an innocent probe


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _as_in_a_terminal():
    """In the child before exec: Ctrl-C's default action, as a shell gives a foreground job.
    A test runner started in the background of a script (``./run.sh test &``, some CI
    runners) ignores SIGINT, every child inherits that, and Python then never turns
    SIGINT into KeyboardInterrupt: the job ran to the end and the CLI exited 0."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_cancels_the_job_and_stops_the_worker(toy, tmp_path):
    out = tmp_path / "o.glb"
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.cli", "run", str(toy / "toy.png"), "-o", str(out),
                             *SMALL, "--set", "bake.steps=5000", *_workdirs(tmp_path)],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_as_in_a_terminal)
    try:
        seen = ""
        for line in proc.stderr:
            seen += line
            if " bake " in line:
                break
        assert " bake " in seen, seen
        log = (tmp_path / "workers" / "worker-0.log").read_text()
        worker_pid = int(re.findall(r"pid (\d+) starting", log)[-1])
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole process group
        rest = proc.stderr.read()
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, rest
    # it waited for the worker to exit, however long that took under load
    assert "kiln: cancelled job " in rest and "Traceback" not in rest, rest
    [status] = (tmp_path / "jobs").glob("cli/*/status.json")
    st = json.loads(status.read_text())
    assert (st["state"], st["error"]) == ("cancelled", "cancelled by user")
    assert not _alive(worker_pid)
    assert not out.exists()
