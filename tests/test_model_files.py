"""Reading other tools' files (pipeline.io): splat PLYs in the INRIA 3DGS layout, meshes
through trimesh, cameras; the real files in ../shared/fixtures and synthetic ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import trimesh

from pipeline.io.export import export_gaussians_ply
from pipeline.views.gaussian_math import SH_C0
from pipeline.io import mesh_file, splat_ply
from pipeline.io.camera_file import at_photo_size, camera_from_focal, read_camera
from pipeline.types import Gaussians, SourceCamera
from pipeline.validate import StageInputError

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
TRAIN = FIXTURES / "splats" / "train-1000.ply"
HUMAN = FIXTURES / "sam3d-human-object"
needs_train = pytest.mark.skipif(not TRAIN.is_file(), reason=f"real splat fixture missing: {TRAIN}")
needs_human = pytest.mark.skipif(not HUMAN.is_dir(), reason=f"real SAM 3D fixtures missing: {HUMAN}")


def _gaussians(n=50, seed=0) -> Gaussians:
    rng = np.random.default_rng(seed)
    return Gaussians(means=rng.normal(size=(n, 3)).astype(np.float32),
                     scales=rng.uniform(0.01, 0.2, (n, 3)).astype(np.float32),
                     quats=rng.normal(size=(n, 4)).astype(np.float32),
                     opacities=rng.uniform(0.05, 0.95, n).astype(np.float32),
                     colors=rng.uniform(0.05, 0.95, (n, 3)).astype(np.float32))


# ----------------------------------------------------------------------------- splats

@needs_train
def test_a_real_sh3_splat_reads_with_its_activations():
    from plyfile import PlyData

    got = splat_ply.read_splat(TRAIN)
    v = PlyData.read(str(TRAIN))["vertex"].data     # an independent reader of the same file
    assert len(got.gaussians) == 1000 and got.sh_degree == 3 and "SH degree 3" in got.note
    np.testing.assert_allclose(got.gaussians.means, np.stack([v["x"], v["y"], v["z"]], 1), rtol=1e-6)
    np.testing.assert_allclose(got.gaussians.opacities, 1 / (1 + np.exp(-v["opacity"].astype(np.float64))),
                               rtol=1e-5)
    np.testing.assert_allclose(got.gaussians.scales, np.exp(np.stack([v[f"scale_{i}"] for i in range(3)], 1)),
                               rtol=1e-5)
    q = np.stack([v[f"rot_{i}"] for i in range(4)], 1)       # w, x, y, z, kept unnormalised
    np.testing.assert_allclose(got.gaussians.quats, q)
    assert 0.6 < np.linalg.norm(q, axis=1).min() < 0.7
    dc = np.stack([v[f"f_dc_{i}"] for i in range(3)], 1)
    np.testing.assert_allclose(got.gaussians.colors, np.clip(0.5 + SH_C0 * dc, 0, 1), atol=1e-6)


def test_kilns_own_splat_round_trips(tmp_path):
    g = _gaussians()
    back = splat_ply.read_splat(export_gaussians_ply(g, tmp_path / "g.ply"))
    assert back.sh_degree == 0
    for name in ("means", "scales", "quats", "opacities", "colors"):
        np.testing.assert_allclose(getattr(back.gaussians, name), getattr(g, name), rtol=2e-5, atol=2e-6)


def _write_ply(path, names, rows, fmt="binary_little_endian", extra=""):
    header = f"ply\nformat {fmt} 1.0\nelement vertex {len(rows)}\n"
    header += "".join(f"property float {n}\n" for n in names) + extra + "end_header\n"
    path.write_bytes(header.encode() + np.asarray(rows, "<f4").tobytes())
    return path


def test_a_missing_property_is_named(tmp_path):
    names = ["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1", "scale_2",
             "rot_0", "rot_1", "rot_2"]                     # rot_3 missing
    p = _write_ply(tmp_path / "s.ply", names, np.zeros((4, len(names))))
    with pytest.raises(StageInputError, match="missing property rot_3"):
        splat_ply.read_splat(p)


@pytest.mark.parametrize("case,word", [("truncated", "truncated"), ("ascii", "ascii"),
                                        ("faces", "pass it as --mesh"), ("nan", "non-finite"),
                                        ("rest", "f_rest")])
def test_bad_splat_files_say_what_is_wrong(tmp_path, case, word):
    names = list(splat_ply.REQUIRED)
    rows = np.zeros((3, len(names)))
    rows[:, names.index("rot_0")] = 1
    if case == "truncated":
        p = _write_ply(tmp_path / "s.ply", names, rows)
        p.write_bytes(p.read_bytes()[:-10])
    elif case == "ascii":
        p = _write_ply(tmp_path / "s.ply", names, rows, fmt="ascii")
    elif case == "faces":
        p = _write_ply(tmp_path / "s.ply", names, rows, extra="element face 1\nproperty list uchar int vertex_indices\n")
    elif case == "nan":
        rows[1, 0] = np.nan
        p = _write_ply(tmp_path / "s.ply", names, rows)
    else:
        p = _write_ply(tmp_path / "s.ply", names + ["f_rest_0", "f_rest_1"], np.zeros((3, len(names) + 2)))
    with pytest.raises(StageInputError, match=word):
        splat_ply.read_splat(p)


# ----------------------------------------------------------------------------- meshes

def _textured_box():
    tm = trimesh.creation.box(extents=(1, 0.6, 0.4))
    tm = tm.unwrap() if hasattr(tm, "unwrap") else tm
    return tm


@pytest.mark.parametrize("ext", [".glb", ".obj", ".ply", ".stl"])
def test_each_format_reads_positions_and_faces(tmp_path, ext):
    tm = trimesh.creation.icosphere(subdivisions=2)
    tm.visual.vertex_colors = np.tile([200, 100, 50, 255], (len(tm.vertices), 1)).astype(np.uint8)
    path = tmp_path / f"m{ext}"
    if ext == ".glb":   # glTF's COLOR_0 is linear: Kiln's exporter converts, trimesh's does not
        from pipeline.io.export import export_glb
        from pipeline.types import Mesh

        colours = np.tile(np.float32([200 / 255, 100 / 255, 50 / 255]), (len(tm.vertices), 1))
        export_glb(Mesh(tm.vertices.astype(np.float32), tm.faces.astype(np.int32), vertex_colors=colours),
                   None, path)
    else:
        tm.export(path)
    got = mesh_file.read_mesh(path)
    assert got.format == ext[1:] and got.mesh.num_faces == len(tm.faces)
    assert got.mesh.vertices.dtype == np.float32 and got.mesh.faces.dtype == np.int32
    if ext in (".ply", ".glb"):
        # PLY holds sRGB bytes; glTF holds linear colours, brought back to sRGB
        np.testing.assert_allclose(got.mesh.vertex_colors[0], [200 / 255, 100 / 255, 50 / 255], atol=0.01)


def test_a_textured_glb_keeps_its_uvs_and_texture(tmp_path):
    from PIL import Image

    tm = trimesh.creation.box()
    uv = np.random.default_rng(0).uniform(0.1, 0.9, (len(tm.vertices), 2))
    img = Image.fromarray(np.tile(np.arange(64, dtype=np.uint8)[None, :, None], (32, 1, 3)))
    tm.visual = trimesh.visual.TextureVisuals(uv=uv, image=img)
    tm.export(tmp_path / "t.glb")
    got = mesh_file.read_mesh(tmp_path / "t.glb")
    assert got.texture is not None and got.texture.shape == (32, 64, 3)
    np.testing.assert_allclose(got.mesh.uvs, uv, atol=1e-6)          # Kiln's v = 0 bottom, like trimesh's


def test_a_point_cloud_ply_is_a_splat(tmp_path):
    trimesh.PointCloud(np.random.default_rng(0).normal(size=(100, 3))).export(tmp_path / "p.ply")
    with pytest.raises(StageInputError, match="looks like a splat or point cloud; pass it as --splat"):
        mesh_file.read_mesh(tmp_path / "p.ply")


def test_bad_meshes_are_refused_with_a_reason(tmp_path, monkeypatch):
    tm = trimesh.creation.box()
    tm.vertices[0] = np.nan
    tm.export(tmp_path / "nan.obj")
    with pytest.raises(StageInputError, match="non-finite"):
        mesh_file.read_mesh(tmp_path / "nan.obj")
    (tmp_path / "x.fbx").write_bytes(b"x")
    with pytest.raises(StageInputError, match="unknown mesh type .fbx"):
        mesh_file.read_mesh(tmp_path / "x.fbx")
    (tmp_path / "junk.glb").write_bytes(b"not a glb at all")
    with pytest.raises(StageInputError, match="cannot be read"):
        mesh_file.read_mesh(tmp_path / "junk.glb")
    trimesh.creation.box().export(tmp_path / "big.stl")
    from kiln import limits

    monkeypatch.setattr(limits, "MAX_MODEL_FILE_BYTES", 100)   # the one limit both readers check
    with pytest.raises(StageInputError, match="GiB"):
        mesh_file.read_mesh(tmp_path / "big.stl")


@needs_human
def test_the_real_sam3d_meshes_read():
    body = mesh_file.read_mesh(HUMAN / "human_sam3d_body.ply")
    assert body.mesh.num_faces == 36874 and body.mesh.vertex_colors is not None
    bench = mesh_file.read_mesh(HUMAN / "bench_sam3d.glb")
    assert bench.mesh.num_faces == 227278 and bench.mesh.uvs is None and bench.mesh.vertex_colors is None
    assert -2.8 < bench.mesh.vertices[:, 2].min() < bench.mesh.vertices[:, 2].max() < -2.4   # camera frame


# ----------------------------------------------------------------------------- cameras

def test_a_focal_length_camera_in_opengl_frame_sees_what_is_in_front():
    cam = camera_from_focal(1000.0, 800, 600, frame="opengl")
    px, z = cam.project(np.array([[0.0, 0.0, -2.0], [0.1, 0.1, -2.0]]))
    np.testing.assert_allclose(px[0], [400, 300])              # the image centre
    assert (z > 0).all() and px[1, 0] > 400 and px[1, 1] < 300  # +x right, +y up in the image
    with pytest.raises(StageInputError, match="frame"):
        camera_from_focal(1000.0, 800, 600, frame="directx")
    with pytest.raises(StageInputError, match="positive"):
        camera_from_focal(-5, 800, 600)


def test_a_report_camera_reads_and_scales_to_the_photo(tmp_path):
    cam = camera_from_focal(500.0, 400, 300, principal=(190.0, 160.0))
    (tmp_path / "report.json").write_text(json.dumps({"stats": {"source_camera": cam.to_dict()}}))
    got = read_camera(tmp_path / "report.json")
    np.testing.assert_allclose(got.K, cam.K)
    half = at_photo_size(got, 200, 150)
    np.testing.assert_allclose(half.K[:2], cam.K[:2] / 2)
    with pytest.raises(StageInputError, match="another shape"):
        at_photo_size(got, 200, 200)
    (tmp_path / "bad.json").write_text(json.dumps({"K": [[1, 0, 0]]}))
    with pytest.raises(StageInputError, match="needs K, viewmat, width and height"):
        read_camera(tmp_path / "bad.json")
    assert isinstance(got, SourceCamera)
