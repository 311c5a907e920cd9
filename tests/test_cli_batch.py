"""`kiln run a.png b.png c.png --mask-dir masks/ -o out/`: one worker takes the images in
turn, one line each, a summary table, exit 1 when any failed."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from cli_helpers import kiln_in_process

ROOT = Path(__file__).resolve().parent.parent

SMALL = ["--set", "reconstruct.resolution=64", "--set", "reconstruct.num_gaussians=3000",
         "--set", "views.resolution=128", "--views", "4", "--no-bake"]


def test_several_images_through_one_worker(toy, tmp_path, monkeypatch):
    ex = toy
    photos, masks = tmp_path / "photos", tmp_path / "masks"
    photos.mkdir()
    masks.mkdir()
    rgb = np.asarray(Image.open(ex / "toy_rgb.png").convert("RGB"))
    obj = np.asarray(Image.open(ex / "toy_mask.png").convert("L")) > 127
    # a: its own transparency; b: an RGBA mask whose colour channels hold other data (read
    # by its alpha); c: a soft grey mask (thresholded, and said); d: a photo that trips a
    # stage in the worker (a test fault bound to d's input digest): it fails alone
    Image.open(ex / "toy.png").save(photos / "a.png")
    for name in "bcd":
        Image.fromarray(rgb).save(photos / f"{name}.jpg", quality=95)
    Image.fromarray(np.dstack([np.full_like(rgb, 240), np.where(obj, 255, 0).astype(np.uint8)]),
                    "RGBA").save(masks / "b.png")
    soft = np.where(obj, 220, 20).astype(np.uint8)
    soft[::9, ::7] = 128
    Image.fromarray(soft).save(masks / "c_mask.png")
    # (shifted by a pixel: same photo as b, so the mask must make d's digest its own)
    Image.fromarray(np.where(np.roll(obj, 1, axis=1), 255, 0).astype(np.uint8)).save(masks / "d-mask.png")
    from kiln.digest import input_digest
    from kiln.settings import ReconstructSettings
    from worker.jobs.inputs import RunItem, load
    d = load(RunItem(photos / "d.jpg", masks / "d-mask.png", tmp_path / "d.glb"), 10**7, ReconstructSettings())
    # read by the CLI's supervisor (worker.child.faults.FaultPlan.from_env)
    monkeypatch.setenv("KILN_TEST_FAULTS", f"error@reconstruct:input={input_digest(d.rgb, d.mask)[:16]}")

    out, report = tmp_path / "out", tmp_path / "report.json"
    images = [photos / n for n in ("a.png", "b.jpg", "c.jpg", "d.jpg")]
    # the CLI in this process (its worker is still a process of its own): the test is about
    # the batch, not about the CLI's own process, which test_ctrl_c_in_a_batch_... covers
    r = kiln_in_process("run", *images, "--mask-dir", masks, "-o", out, "--report", report, *SMALL,
                        "--set", f"app.jobs_dir={tmp_path / 'jobs'}", "--set", f"app.cache_dir={tmp_path / 'cache'}")
    assert r.returncode == 1, r.stderr[-3000:]          # one of them failed
    assert "Traceback" not in r.stderr
    # piped: one line per image, in order, plus the thresholding note said before the start
    lines = [ln for ln in r.stderr.splitlines() if re.match(r"\[\d/4\] ", ln)]
    assert [ln.split()[1] for ln in lines] == ["a.png", "b.jpg", "c.jpg", "d.jpg"], r.stderr
    assert [ln.split()[2] for ln in lines] == ["done", "done", "done", "failed"], r.stderr
    assert "c.jpg: mask" in r.stderr and "thresholded at 120" in r.stderr
    assert "injected fault" in lines[3]
    # the summary table on stdout
    assert re.search(r"^d\.jpg\s+failed\s+[\d.]+\s+-\s+.*injected fault", r.stdout, re.M), r.stdout
    assert re.search(r"^a\.png\s+done\s+[\d.]+\s+\d+\s+" + re.escape(str(out / "a.glb")), r.stdout, re.M)
    assert "4 images: 3 done, 1 failed" in r.stdout
    assert sorted(p.name for p in out.iterdir()) == ["a.glb", "b.glb", "c.glb"]
    # one worker for all four
    log = (tmp_path / "workers" / "worker-0.log").read_text()
    assert log.count(" starting ") == 1, log
    # each job got the mask the rule reads: b's alpha, not its bright colour channels
    rep = json.loads(report.read_text())
    assert [e["state"] for e in rep["images"]] == ["done", "done", "done", "failed"]
    job_masks = sorted((tmp_path / "jobs" / "cli").glob("*/inputs/mask.png"),
                       key=lambda p: json.loads((p.parent.parent / "status.json").read_text())["created"])
    coverages = [float((np.asarray(Image.open(p).convert("L")) > 127).mean()) for p in job_masks]
    assert len(coverages) == 4
    assert coverages[1] == float(obj.mean()) and coverages[2] == float((soft >= 120).mean())


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)   # as a terminal's foreground job has it


def test_ctrl_c_in_a_batch_cancels_the_running_image_and_skips_the_rest(toy, tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("a.png", "b.png"):
        shutil.copy(tmp_path / "ex" / "toy.png", photos / name)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.cli", "run", str(photos / "a.png"), str(photos / "b.png"),
                             "-o", str(tmp_path / "out"), "--set", "reconstruct.resolution=64",
                             "--set", "reconstruct.num_gaussians=3000", "--set", "views.resolution=128",
                             "--views", "4", "--texture-size", "256", "--set", "bake.steps=5000",
                             "--set", f"app.jobs_dir={tmp_path / 'jobs'}",
                             "--set", f"app.cache_dir={tmp_path / 'cache'}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)
    try:
        # piped, a batch prints nothing until an image ends: watch the job's own status
        deadline = time.monotonic() + 600
        stage = None
        while stage != "bake" and time.monotonic() < deadline and proc.poll() is None:
            for st in (tmp_path / "jobs" / "cli").glob("*/status.json"):
                try:
                    stage = json.loads(st.read_text()).get("stage")
                except (OSError, ValueError):
                    pass   # replaced atomically, but may not exist yet
            time.sleep(0.05)
        assert stage == "bake", proc.communicate()[1] if proc.poll() is not None else "no bake in 600 s"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "[1/2] a.png  cancelled" in err and "kiln: cancelled job " in err and "Traceback" not in err
    assert re.search(r"^a\.png\s+cancelled", out, re.M) and re.search(r"^b\.png\s+not run", out, re.M), out
    assert "2 images: 1 cancelled, 1 not run" in out
    assert not (tmp_path / "out" / "a.glb").exists() and not (tmp_path / "out" / "b.glb").exists()
    [status] = (tmp_path / "jobs" / "cli").glob("*/status.json")
    assert json.loads(status.read_text())["state"] == "cancelled"


def test_resume_takes_what_the_job_store_has_done(toy, tmp_path):
    """`kiln run ... --resume` again after an interruption: images done before with the same
    settings are taken from the job store (not made again), the rest are made. Each `kiln run`
    runs in this process (a worker of its own each, as from a shell): the job store is what
    carries one run's work to the next, not the CLI's process."""
    ex = toy
    store = ["--set", f"app.jobs_dir={tmp_path / 'jobs'}", "--set", f"app.cache_dir={tmp_path / 'cache'}"]

    def kiln(*args):
        r = kiln_in_process("run", *args, *SMALL, *store)
        assert r.returncode == 0, r.stderr[-3000:]
        return r

    kiln(ex / "toy.png", "-o", tmp_path / "first.glb")                  # the run that got through one image
    r = kiln(ex / "toy.png", ex / "pebble.png", "-o", tmp_path / "out", "--resume")
    assert re.search(r"\[1/2\] toy.png  done .*\(already done in job \S+\)", r.stderr), r.stderr
    assert r.stderr.count("already done") == 1                            # pebble was made
    assert (tmp_path / "out" / "toy.glb").read_bytes() == (tmp_path / "first.glb").read_bytes()
    assert (tmp_path / "out" / "pebble.glb").is_file()
    jobs = list((tmp_path / "jobs" / "cli").glob("*/status.json"))
    assert len(jobs) == 2
    # other settings are another job; without --resume every image is made again
    r = kiln(ex / "toy.png", "-o", tmp_path / "seeded.glb", "--seed", "7", "--resume")
    assert "already done" not in r.stderr
    kiln(ex / "toy.png", "-o", tmp_path / "again.glb")
    assert len(list((tmp_path / "jobs" / "cli").glob("*/status.json"))) == 4
