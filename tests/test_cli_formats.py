"""`kiln run --format` / `kiln bake --format`: the other files beside each GLB, their sizes on
the output and in the report, the STL's units, the texture's format; bad values refused at
once (exit 2) naming the flag."""

from __future__ import annotations

import json
import re
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.io.texture_file import sniff
from pipeline.raster.rasterize import available_backends

from cli_helpers import kiln_in_process
needs_gl = pytest.mark.skipif("moderngl" not in available_backends(), reason="no EGL OpenGL context here")
SMALL = ["--set", "reconstruct.resolution=64", "--set", "reconstruct.num_gaussians=3000",
         "--set", "views.resolution=128", "--views", "4", "--texture-size", "256", "--bake-mode", "fast"]
WROTE = re.compile(r"^wrote (\S+) \((\d+(?:\.\d)?) (B|kB|MB)", re.M)


def kiln(*args):
    """`kiln ARGS` in this process (issue 35: an interpreter start saved per call); a job
    still runs in a worker process of its own unless ARGS say --in-process."""
    return kiln_in_process(*args)


def _workdirs(tmp_path):
    return ["--set", f"app.jobs_dir={tmp_path / 'jobs'}", "--set", f"app.cache_dir={tmp_path / 'cache'}"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from kiln.examples import write_examples

    folder = tmp_path_factory.mktemp("ex")
    write_examples(folder, size=256)
    return folder


def glb_image_bytes(path) -> bytes:
    raw = Path(path).read_bytes()
    jlen = struct.unpack_from("<I", raw, 12)[0]
    doc = json.loads(raw[20:20 + jlen])
    view = doc["bufferViews"][doc["images"][0]["bufferView"]]
    start = 20 + jlen + 8 + view.get("byteOffset", 0)
    return raw[start:start + view["byteLength"]]


def counts(path, tmp_path):
    """(vertices, faces) as trimesh reads the file (an OBJ zip unpacked first)."""
    import trimesh

    path = Path(path)
    if path.name.endswith(".obj.zip"):
        with zipfile.ZipFile(path) as z:
            z.extractall(tmp_path / "unzipped")
        path = tmp_path / "unzipped" / path.name.replace(".obj.zip", ".obj")
    m = trimesh.load(path, force="mesh")
    return len(m.vertices), len(m.faces)


@pytest.mark.parametrize("flags,needle", [
    (["--format", "foo"], "--format: 'foo' is not one of glb, obj, stl, ply"),
    (["--format", "obj,fbx"], "--format: 'fbx' is not one of"),
    (["--units", "km"], "argument --units: invalid choice: 'km'"),
    (["--texture-format", "gif"], "argument --texture-format: invalid choice: 'gif'"),
])
def test_a_bad_format_or_unit_is_refused_at_once_naming_the_flag(toy, tmp_path, flags, needle):
    for command in (["run", toy / "toy.png", "-o", tmp_path / "o.glb"],
                    ["bake", "--mesh", toy / "toy.png", "-o", tmp_path / "o.glb"]):
        r = kiln_in_process(*command, *flags, *_workdirs(tmp_path))
        assert r.returncode == 2, r.stderr
        assert needle in r.stderr and "Traceback" not in r.stderr
        assert not (tmp_path / "jobs").exists(), "refused after the job store was touched"


def test_help_names_the_formats_units_and_texture_formats():
    text = kiln_in_process("run", "--help").stdout
    for word in ("--format", "glb,obj,stl,ply", "--texture-format", "{png,jpeg,webp}", "--units", "{m,mm}",
                 ".mesh.ply", "photo.obj.zip"):
        assert word in text, word
    assert "--format" in kiln_in_process("bake", "--help").stdout


@needs_gl
@pytest.mark.slow
def test_run_writes_every_format_beside_the_glb_with_sizes_and_the_stl_scale(toy, tmp_path):
    out, report = tmp_path / "out" / "toy.glb", tmp_path / "r.json"
    r = kiln("run", toy / "toy.png", "-o", out, "--format", "obj,stl,ply", "--units", "mm",
             "--texture-format", "jpeg", "--report", report, "--set", "worker.count=1", *SMALL,
             *_workdirs(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    names = ["toy.glb", "toy.obj.zip", "toy.stl", "toy.mesh.ply"]
    wrote = WROTE.findall(r.stdout)
    assert [Path(p).name for p, _, _ in wrote] == names, r.stdout
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(names)   # no temporaries
    rep = json.loads(report.read_text())
    files = {f["format"]: f for f in rep["files"]}
    assert list(files) == ["glb", "obj", "stl", "ply"]
    for (path, size, unit), f in zip(wrote, rep["files"]):
        assert f["path"] == path and f["bytes"] == Path(path).stat().st_size > 0
        shown = float(size) * {"B": 1, "kB": 1e3, "MB": 1e6}[unit]
        assert abs(shown - f["bytes"]) <= 0.05 * f["bytes"] + 50
        # each file round-trips through trimesh with the counts its report gives
        assert counts(path, tmp_path) == (f["vertices"], f["faces"]), f["format"]
    assert files["stl"]["units"] == "mm" and files["stl"]["scale"] == 1000.0 and files["stl"]["up"] == "z"
    assert files["glb"]["texture_format"] == "jpeg" and sniff(glb_image_bytes(out)) == "jpeg"
    with zipfile.ZipFile(out.with_name("toy.obj.zip")) as z:
        # named after the output, not the job's 'model'
        assert sorted(z.namelist()) == ["toy.jpg", "toy.mtl", "toy.obj"]
    # the job's own stats say the same (sizes of the job's copies)
    assert [f["key"] for f in rep["stats"]["files"]] == ["glb", "obj", "stl", "mesh_ply"]


@needs_gl
@pytest.mark.slow
def test_a_batch_writes_each_image_s_formats_and_reports_them(toy, tmp_path):
    Image.open(toy / "toy.png").save(tmp_path / "second.png")
    out, report = tmp_path / "out", tmp_path / "r.json"
    r = kiln("run", toy / "toy.png", tmp_path / "second.png", "-o", out, "--format", "stl", "--in-process",
             "--report", report, *SMALL, *_workdirs(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["second.glb", "second.stl", "toy.glb", "toy.stl"]
    assert "-> " in r.stderr and "+ toy.stl" in r.stderr
    for image in json.loads(report.read_text())["images"]:
        formats = [(f["format"], Path(f["path"]).name, f["bytes"]) for f in image["files"]]
        stem = Path(image["image"]).stem
        assert [(fmt, name) for fmt, name, _ in formats] == [("glb", f"{stem}.glb"), ("stl", f"{stem}.stl")]
        assert all(size == (out / name).stat().st_size for _, name, size in formats)


@needs_gl
@pytest.mark.slow
def test_bake_writes_the_formats_beside_its_glb(tmp_path):
    import trimesh

    sphere = trimesh.creation.icosphere(subdivisions=3, radius=0.5)
    sphere.visual.vertex_colors = np.random.default_rng(0).integers(0, 255, (len(sphere.vertices), 4)).astype(np.uint8)
    sphere.export(tmp_path / "ball.ply")
    out, report = tmp_path / "baked.glb", tmp_path / "r.json"
    r = kiln("bake", "--mesh", tmp_path / "ball.ply", "-o", out, "--format", "ply,obj", "--texture-format", "webp",
             "--texture-size", "256", "--report", report, "--set", "worker.count=1", *_workdirs(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert [Path(p).name for p, _, _ in WROTE.findall(r.stdout)] == ["baked.glb", "baked.obj.zip", "baked.mesh.ply"]
    assert sniff(glb_image_bytes(out)) == "webp"
    rep = json.loads(report.read_text())
    for f in rep["files"]:
        assert counts(f["path"], tmp_path) == (f["vertices"], f["faces"])
    ply = trimesh.load(out.with_name("baked.mesh.ply"))
    assert ply.visual.vertex_colors[:, :3].std() > 5   # coloured from the bake, not one grey
