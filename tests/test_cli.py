"""The `kiln` command line: help, input handling and clear errors, end to end."""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent

# small settings so a whole CLI job takes seconds on 2 cores
SMALL = ["--set", "reconstruct.resolution=64", "--set", "reconstruct.num_gaussians=3000",
         "--set", "views.resolution=128", "--views", "4", "--texture-size", "256",
         "--set", "bake.steps=10"]


def kiln(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "kiln.cli", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout)


def _workdirs(tmp_path):
    return ["--set", f"app.jobs_dir={tmp_path / 'jobs'}", "--set", f"app.cache_dir={tmp_path / 'cache'}"]


@pytest.fixture
def toy(tmp_path):
    from kiln.examples import write_examples

    write_examples(tmp_path / "ex", size=256)
    return tmp_path / "ex"


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
    code = ("import sys, kiln.cli as c\n"
            "try:\n    c.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'gradio', 'trimesh', 'cv2', 'pipeline.run') if m in sys.modules]\n"
            "print(heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.strip().endswith("[]"), r.stdout


def test_settings_command_lists_ranges():
    r = kiln("settings")
    assert r.returncode == 0
    assert "mesh.simplify_ratio" in r.stdout and "0.0..0.999" in r.stdout


def test_corrupt_image_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    r = kiln("run", bad, "-o", tmp_path / "o.glb")
    assert r.returncode == 2
    assert "bad.png" in r.stderr and "Traceback" not in r.stderr


def test_opaque_image_without_mask_says_pass_mask(toy, tmp_path):
    r = kiln("run", toy / "toy_rgb.png", "-o", tmp_path / "o.glb")
    assert r.returncode == 2
    assert "--mask" in r.stderr and "no mask" in r.stderr


def test_mask_size_mismatch(toy, tmp_path):
    Image.fromarray(np.zeros((10, 10), np.uint8)).save(tmp_path / "m.png")
    r = kiln("run", toy / "toy_rgb.png", "--mask", tmp_path / "m.png", "-o", tmp_path / "o.glb")
    assert r.returncode == 2 and "must match" in r.stderr


@pytest.mark.parametrize("flags,needle", [
    (["--texture-size", "3"], "bake.texture_size"),
    (["--simplify-ratio", "1.2"], "mesh.simplify_ratio"),
    (["--set", "bake.colour=red"], "unknown setting 'bake.colour'"),
])
def test_bad_settings_are_named(toy, tmp_path, flags, needle):
    r = kiln("run", toy / "toy.png", "-o", tmp_path / "o.glb", *flags)
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_empty_mask_is_a_clear_error(toy, tmp_path):
    Image.fromarray(np.zeros((256, 256), np.uint8)).save(tmp_path / "empty.png")
    r = kiln("run", toy / "toy_rgb.png", "--mask", tmp_path / "empty.png", "-o", tmp_path / "o.glb",
             "--in-process", *_workdirs(tmp_path))
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
    r = kiln(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "total" in r.stderr and "reconstruct" in r.stderr      # timing table
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
    r = kiln("run", toy / "toy_rgb.png", "--mask", toy / "toy_mask.png", "-o", out, "--no-bake", "--ply",
             *SMALL, *_workdirs(tmp_path), "--in-process")
    assert r.returncode == 0, r.stderr[-3000:]
    mesh = list(trimesh.load(out).geometry.values())[0]
    cols = mesh.visual.vertex_colors
    assert cols.shape[0] == len(mesh.vertices) and cols[:, :3].std() > 5   # not one flat colour
    assert out.with_suffix(".ply").stat().st_size > 1000
