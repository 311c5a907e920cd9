"""An exact face count (issue 36 item 2): ``mesh.faces`` / ``--faces N`` simplifies to N faces
within 2 % instead of by a ratio, on `kiln run`, `kiln bake`, the page and the API; more
faces than the mesh has, or fewer than an outline needs, are refused with the reason."""

from __future__ import annotations

import inspect
import json

import numpy as np
import pytest
import trimesh

from kiln.limits import MIN_EXACT_FACES
from kiln.settings import Settings, SettingsError, allowed_range
from pipeline.meshing import mesh_ops
from pipeline.types import Mesh
from pipeline.validate import StageInputError


def _sphere(subdivisions: int = 5) -> Mesh:
    tm = trimesh.creation.icosphere(subdivisions=subdivisions)
    return Mesh(np.asarray(tm.vertices, np.float32), np.asarray(tm.faces, np.int32))


@pytest.mark.parametrize("faces", [500, 1234, 5000, 12001])
def test_simplify_lands_within_two_percent_of_the_count_asked(faces):
    mesh = _sphere()   # 20480 faces
    out = mesh_ops.simplify_mesh(mesh, ratio=0.95, faces=faces)
    assert abs(out.num_faces - faces) <= 0.02 * faces, out.num_faces


def test_the_ratio_alone_is_left_as_it_was():
    """Control: without a count the ratio decides, within its own 5 %."""
    mesh = _sphere()
    out = mesh_ops.simplify_mesh(mesh, ratio=0.9)
    assert abs(out.num_faces - 2048) <= 0.05 * 2048


def test_more_faces_than_the_mesh_has_are_refused_and_as_many_keep_it():
    mesh = _sphere(3)   # 1280 faces
    with pytest.raises(StageInputError, match="1281 faces asked, but the mesh has only 1280"):
        mesh_ops.simplify_mesh(mesh, ratio=0.95, faces=1281)
    assert mesh_ops.simplify_mesh(mesh, ratio=0.95, faces=1280) is mesh
    with pytest.raises(StageInputError, match="cannot keep the object's shape"):
        mesh_ops.exact_target(1280, MIN_EXACT_FACES - 1)


def test_a_count_too_small_for_the_thin_parts_is_refused_with_what_they_need():
    mesh = _sphere(4)   # 5120 faces
    keep = np.zeros(mesh.num_faces, bool)
    keep[:2500] = True   # thin parts that the lossless pass cannot shrink much
    with pytest.raises(StageInputError, match=r"cannot keep the mask's thin parts: they alone need \d+ faces; "
                                              r"ask for at least \d+"):
        mesh_ops.simplify_mesh(mesh, ratio=0.95, keep=keep, faces=200)
    # control: by a ratio, the same mesh is simplified (the kept faces decimated to their share)
    assert mesh_ops.simplify_mesh(mesh, ratio=0.95, keep=keep).num_faces < mesh.num_faces


def test_the_setting_takes_zero_or_a_count_an_outline_can_have():
    assert Settings().mesh.faces == 0 and allowed_range("mesh.faces") == (MIN_EXACT_FACES, 10_000_000)
    assert Settings().override({"mesh.faces": 800}).mesh.faces == 800
    with pytest.raises(SettingsError, match=r"allowed 0 \(off\) or 100 to"):
        Settings().override({"mesh.faces": 50})


@pytest.mark.parametrize("command", ["run", "bake"])
def test_help_says_what_faces_does(command, capsys):
    from app.cli.cli import main

    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "--faces N" in out and "within 2 %" in out, out


def test_kiln_run_faces_makes_that_many(tmp_path):
    from app.cli.cli import main
    from kiln.examples import write_examples

    write_examples(tmp_path, size=256)
    out, report = tmp_path / "toy.glb", tmp_path / "r.json"
    code = main(["run", str(tmp_path / "toy.png"), "-o", str(out), "--faces", "800", "--no-bake", "--in-process",
                 "--report", str(report), "--set", "reconstruct.resolution=64",
                 "--set", f"app.jobs_dir={tmp_path / 'jobs'}", "--set", f"app.cache_dir={tmp_path / 'cache'}"])
    assert code == 0
    faces = len(trimesh.load(out, force="mesh").faces)
    assert abs(faces - 800) <= 16, faces
    assert json.loads(report.read_text())   # the report was written


def test_kiln_bake_refuses_more_faces_than_the_mesh_has_before_any_job(tmp_path, capsys):
    from app.cli.cli import main

    tm = trimesh.creation.icosphere(subdivisions=2)   # 320 faces
    tm.vertices[:, 2] -= 3.0
    tm.visual.vertex_colors = np.full((len(tm.vertices), 4), 180, np.uint8)
    mesh = tmp_path / "ball.ply"
    tm.export(mesh)
    code = main(["bake", "--mesh", str(mesh), "--faces", "1000", "-o", str(tmp_path / "o.glb"),
                 "--set", f"app.jobs_dir={tmp_path / 'jobs'}", "--set", f"app.cache_dir={tmp_path / 'cache'}"])
    err = capsys.readouterr().err
    assert code != 0 and "--faces 1000: ball.ply has only 320 faces" in err, err
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").rglob("status.json"))


def test_the_page_and_the_api_carry_the_count():
    from dataclasses import fields

    from app.web.api.photo import generate
    from app.web.bake.bake_form import BakeForm
    from app.web.photo.form import GenerateForm

    assert GenerateForm(False, 0.95, 512, 8, "fast", 0, False, faces=900).overrides()["mesh.faces"] == 900
    assert GenerateForm(False, 0.95, 512, 8, "fast", 0, False).overrides()["mesh.faces"] is None
    assert "faces" in [f.name for f in fields(BakeForm)]
    assert BakeForm("m.ply", None, None, None, False, "auto", None, 0, faces=700).settings_values()["faces"] == 700
    assert "faces" in inspect.signature(generate).parameters
