"""`kiln run` refuses unusable inputs (and a full disk) before any job is made, pairs
images with masks for a batch, and names a full disk in words."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cli_helpers import kiln_in_process
from kiln.settings import ReconstructSettings
from worker.jobs.inputs import InputProblem, NoSpace, RunItem, load, plan, writing_to

ROOT = Path(__file__).resolve().parent.parent


def kiln(*args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "app.cli.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


def _workdirs(tmp_path):
    return ["--set", f"app.jobs_dir={tmp_path / 'jobs'}", "--set", f"app.cache_dir={tmp_path / 'cache'}"]


def _no_worker_started(tmp_path) -> bool:
    """No job was made and no worker is left running. ``kiln run`` spawns its worker before
    it checks the inputs (the start overlaps the checks) and stops it on a refusal; the
    tests run the CLI in this process (``kiln_in_process``), so its worker would be our child."""
    import multiprocessing as mp

    jobs = tmp_path / "jobs"
    made = [p for p in jobs.rglob("status.json")] if jobs.exists() else []
    return not made and not mp.active_children()


def _save(path: Path, arr: np.ndarray, mode: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr, mode).save(path)
    return path


# -- refused before any job is made (exit 2, no traceback) ----------------------------

def test_a_1x1_image_with_a_mask_is_refused_up_front(tmp_path):
    img = _save(tmp_path / "one.png", np.full((1, 1, 3), 200, np.uint8))
    mask = _save(tmp_path / "one_m.png", np.full((1, 1), 255, np.uint8))
    r = kiln_in_process("run", img, "--mask", mask, "-o", tmp_path / "o.glb", *_workdirs(tmp_path))
    assert r.returncode == 2, r.stderr
    assert "one.png is only 1x1 pixels" in r.stderr and "Traceback" not in r.stderr
    assert _no_worker_started(tmp_path)


def _speck(shape):
    m = np.zeros(shape, np.uint8)
    m[10:12, 10:12] = 255
    return m


@pytest.mark.parametrize("make,needle", [
    (lambda s: np.zeros(s, np.uint8), "is empty"),
    (lambda s: np.full(s, 255, np.uint8), "covers the whole image"),
    (_speck, "only 4 object pixel(s)"),                          # the reconstruct stage's own check
    (lambda s: np.zeros((s[0], s[1] + 1), np.uint8), "they must match"),
], ids=["empty", "full", "speck", "size"])
def test_unusable_masks_are_refused_up_front(toy, tmp_path, make, needle):
    mask = _save(tmp_path / "m.png", make((256, 256)))
    r = kiln_in_process("run", toy / "toy_rgb.png", "--mask", mask, "-o", tmp_path / "o.glb", *_workdirs(tmp_path))
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "m.png" in r.stderr and "Traceback" not in r.stderr
    assert _no_worker_started(tmp_path)


def test_the_worker_starts_while_the_inputs_are_checked_and_stops_on_a_refusal(toy, tmp_path, monkeypatch):
    """The worker's start (~2 s) overlaps the input checks: it is spawned before they begin;
    a refusal still exits 2 with its reason, no job made and no worker left."""
    import multiprocessing as mp

    import app.cli.cli as cli_mod

    at_check: list[int] = []
    validate = cli_mod._validate

    def counting(*a, **k):
        at_check.append(len(mp.active_children()))
        return validate(*a, **k)

    monkeypatch.setattr(cli_mod, "_validate", counting)
    mask = _save(tmp_path / "m.png", np.zeros((256, 256), np.uint8))
    r = kiln_in_process("run", toy / "toy_rgb.png", "--mask", mask, "-o", tmp_path / "o.glb", *_workdirs(tmp_path))
    assert r.returncode == 2 and "is empty" in r.stderr, r.stderr
    assert at_check == [1], "the worker was not spawned before the checks"
    assert _no_worker_started(tmp_path)


def test_a_line_thinner_than_the_builtin_grid_is_kept_not_refused():
    """A 2-pixel line across a 512 px photo leaves no cell of the silhouette grid at
    coverage 0.5 (160 cells over 492 px). It used to be refused up front as "too thin";
    ``pipeline.recon.thin_parts`` keeps such parts now, so the same up-front check (the
    backend's own, run before a worker starts) accepts it, one pixel wide too."""
    from kiln.settings import load as load_settings
    from worker.jobs.inputs import check_reconstructable

    for width in (1, 2):
        line = np.zeros((512, 512), bool)
        line[256:256 + width, 10:502] = True
        check_reconstructable(np.zeros((512, 512, 3), np.uint8), line, load_settings().reconstruct)


def test_a_mask_emptied_by_the_stage_downscale_is_refused_up_front(tmp_path):
    img = _save(tmp_path / "big.png", np.full((1024, 1024, 3), 90, np.uint8))
    m = np.zeros((1024, 1024), np.uint8)
    m[::8, ::8] = 255                  # 16 384 object pixels, none survives a 4x area downscale
    mask = _save(tmp_path / "dots.png", m)
    r = kiln_in_process("run", img, "--mask", mask, "-o", tmp_path / "o.glb", "--set", "reconstruct.max_image_side=256",
             *_workdirs(tmp_path))
    assert r.returncode == 2, r.stderr
    assert "after downscaling the image to 256x256" in r.stderr and "Traceback" not in r.stderr
    assert _no_worker_started(tmp_path)


def test_rgba_mask_is_read_by_its_alpha(toy):
    rgb = np.asarray(Image.open(toy / "toy_rgb.png").convert("RGB"))
    obj = np.asarray(Image.open(toy / "toy_mask.png").convert("L")) > 127
    rgba = np.dstack([np.full_like(rgb, 230), np.where(obj, 255, 0).astype(np.uint8)])
    _save(toy / "sam3d.png", rgba, "RGBA")
    got = load(RunItem(toy / "toy_rgb.png", toy / "sam3d.png", Path("o.glb")), 10**7, ReconstructSettings())
    assert np.array_equal(got.mask, obj)
    assert "alpha channel" in got.notes[0] and f"{100 * obj.mean():.1f} %" in got.notes[0]


# -- pairing images with masks and outputs -----------------------------------------------

def test_plan_single_image(tmp_path):
    items, batch = plan(["a/photo.jpg"], "m.png", None, None)
    assert not batch and items == [RunItem(Path("a/photo.jpg"), Path("m.png"), Path("photo.glb"))]
    (tmp_path / "out").mkdir()
    [item], _ = plan(["photo.jpg"], None, None, str(tmp_path / "out"))
    assert item.output == tmp_path / "out" / "photo.glb"
    with pytest.raises(InputProblem, match="must end in .glb"):
        plan(["photo.jpg"], None, None, "photo.obj")


def test_plan_batch_finds_masks_by_name(tmp_path):
    masks = tmp_path / "masks"
    for name in ("a.png", "b_mask.PNG", "c-mask.jpg"):
        _save(masks / name, np.zeros((4, 4), np.uint8))
    images = [str(tmp_path / n) for n in ("a.jpg", "b.png", "c.webp", "d.png")]
    items, batch = plan(images, None, str(masks), str(tmp_path / "out"))
    assert batch
    assert [i.mask.name if i.mask else None for i in items] == ["a.png", "b_mask.PNG", "c-mask.jpg", None]
    assert [i.output for i in items] == [tmp_path / "out" / f"{s}.glb" for s in "abcd"]
    # the mask folder may be the images' own folder: an image is never its own mask
    _save(tmp_path / "e.png", np.zeros((4, 4, 3), np.uint8))
    _save(tmp_path / "e_mask.png", np.zeros((4, 4), np.uint8))
    [item], _ = plan([str(tmp_path / "e.png")], None, str(tmp_path), None)
    assert item.mask == tmp_path / "e_mask.png" and item.output == Path("e.glb")


@pytest.mark.parametrize("images,mask,mask_dir,out,match", [
    (["a.png", "b.png"], "m.png", None, None, "--mask-dir"),
    (["a.png", "b.png"], None, None, "x.glb", "names a folder"),
    (["x/a.png", "y/a.jpg"], None, None, None, "would both be written to a.glb"),
    (["a.png"], None, "no/such/folder", None, "is not a folder"),
])
def test_plan_batch_mistakes(images, mask, mask_dir, out, match):
    with pytest.raises(InputProblem, match=match):
        plan(images, mask, mask_dir, out)


def test_a_batch_with_one_bad_input_starts_nothing(toy, tmp_path):
    masks = tmp_path / "masks"
    masks.mkdir()
    r = kiln_in_process("run", toy / "toy.png", toy / "toy_rgb.png", "--mask-dir", masks, "-o", tmp_path / "out",
             *_workdirs(tmp_path))
    assert r.returncode == 2, r.stderr
    assert "1 of 2 inputs cannot be used, so nothing was started" in r.stderr
    assert "toy_rgb.png has no transparency and" in r.stderr and "toy_rgb_mask.png" in r.stderr
    assert _no_worker_started(tmp_path) and not (tmp_path / "out").exists()


# -- a full disk ---------------------------------------------------------------------------

@pytest.fixture
def tiny_disk(tmp_path):
    """A 16 KiB tmpfs (a real file system that fills up); needs root and mount(2)."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_is_named_before_the_worker_starts(toy, tmp_path, tiny_disk):
    out = tiny_disk / "models" / "toy.glb"
    r = kiln_in_process("run", toy / "toy.png", "-o", out, *_workdirs(tmp_path))
    assert r.returncode == 1, r.stderr
    assert f"kiln: error: no space left on {out.parent} (" in r.stderr and "free" in r.stderr
    assert "Traceback" not in r.stderr and _no_worker_started(tmp_path)


def test_a_disk_that_fills_during_the_run_is_named(toy, tmp_path, tiny_disk):
    # the check before the start is switched off, so the kernel's ENOSPC meets the
    # GLB's copy at the end of the job
    out = tiny_disk / "toy.glb"
    code = ("import sys, worker.jobs.inputs as ri\n"
            "ri.check_space = lambda places, need: None\n"
            "from app.cli.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    small = ["--set", "reconstruct.resolution=64", "--set", "reconstruct.num_gaussians=3000",
             "--set", "views.resolution=128", "--views", "4", "--texture-size", "256", "--set", "bake.steps=5"]
    r = subprocess.run([sys.executable, "-c", code, "run", str(toy / "toy.png"), "-o", str(out), *small,
                        *_workdirs(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"kiln: error: no space left on {tiny_disk}" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists() and not list(tiny_disk.glob(".*tmp*"))   # no torn or temporary file left


def test_writing_to_names_the_place():
    with pytest.raises(NoSpace, match=r"^no space left on /some/dir"):
        with writing_to(Path("/some/dir")):
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(NoSpace, match=r"^no space left on /other"):
        with writing_to(Path("/some/dir")):
            raise OSError(errno.ENOSPC, "No space left on device", "/other/file.png")
    with pytest.raises(PermissionError):
        with writing_to(Path("/some/dir")):
            raise PermissionError(errno.EACCES, "Permission denied")


def test_a_worker_that_met_a_full_disk_is_named():
    """The worker's error text is turned into the same sentence."""
    from types import SimpleNamespace

    from app.cli.clirunner import WorkerRunner
    from worker.jobs.inputs import Loaded

    status = SimpleNamespace(state="failed", terminal=True, message="", outputs={}, timings={}, stats=None,
                             error="stage 'export' failed: OSError: [Errno 28] No space left on device: "
                                   "'/data/jobs/cli/j1/outputs/model.glb'")

    class Sup:
        def submit(self, *a, **k):   # a worker.pool.jobhandle.Job's calls, answered by a stand-in
            return SimpleNamespace(id="j1", follow=lambda: iter(()), status=lambda: status,
                                   dir=Path("/data/jobs/cli/j1"))

    runner = WorkerRunner(SimpleNamespace(app=SimpleNamespace(jobs_dir="/data/jobs")))
    runner.sup = Sup()
    item = Loaded(rgb=np.zeros((16, 16, 3), np.uint8), mask=np.zeros((16, 16), bool))
    with pytest.raises(NoSpace, match=r"^no space left on /data/jobs/cli/j1/outputs.*job j1 failed"):
        runner.run(item, Path("o.glb"), display=None)
