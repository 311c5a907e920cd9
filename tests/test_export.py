"""pipeline.io.export: GLB contents read back both with trimesh and by parsing the GLB container
directly (what a glTF viewer sees), the 3DGS .ply read back with plyfile, and check_glb."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from pipeline.io import export as E
from pipeline.types import Gaussians, Mesh, Texture
from pipeline.validate import StageInputError


# ----------------------------------------------------------------------------- helpers


def read_glb(path):
    """(json dict, binary chunk bytes) of a GLB file, parsed by hand."""
    raw = Path(path).read_bytes()
    magic, version, length = struct.unpack("<4sII", raw[:12])
    assert magic == b"glTF" and version == 2 and length == len(raw)
    jlen, jtype = struct.unpack("<I4s", raw[12:20])
    assert jtype == b"JSON"
    doc = json.loads(raw[20:20 + jlen])
    off = 20 + jlen
    blen, btype = struct.unpack("<I4s", raw[off:off + 8])
    assert btype == b"BIN\x00"
    return doc, raw[off + 8:off + 8 + blen]


def accessor(doc, binary, index) -> np.ndarray:
    acc = doc["accessors"][index]
    view = doc["bufferViews"][acc["bufferView"]]
    dtype = {5126: np.float32, 5121: np.uint8, 5123: np.uint16, 5125: np.uint32}[acc["componentType"]]
    comps = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4}[acc["type"]]
    assert view.get("byteStride") in (None, comps * np.dtype(dtype).itemsize)
    start = view.get("byteOffset", 0) + acc.get("byteOffset", 0)
    return np.frombuffer(binary, dtype, count=acc["count"] * comps, offset=start).reshape(acc["count"], comps)


def primitive(doc):
    assert len(doc["meshes"]) == 1 and len(doc["meshes"][0]["primitives"]) == 1
    return doc["meshes"][0]["primitives"][0]


def pattern_texture(h, w) -> Texture:
    r, c = np.mgrid[0:h, 0:w]
    img = np.stack([(r * 255) // max(h - 1, 1), (c * 255) // max(w - 1, 1), (r * 7 + c * 13) % 256], -1)
    return Texture(image=img.astype(np.uint8), seen=np.ones((h, w), bool))


def quad_mesh_with_uvs(uvs) -> Mesh:
    """Two triangles sharing an edge, in the z = 0 plane, facing +z; ``uvs`` (4, 2)."""
    v = np.array([[-0.5, -0.5, 0.0], [0.5, -0.5, 0.0], [0.5, 0.5, 0.0], [-0.5, 0.5, 0.0]], np.float32)
    f = np.array([[0, 1, 2], [0, 2, 3]], np.int32)
    return Mesh(v, f, uvs=np.asarray(uvs, np.float32))


def gaussians(n=50, seed=0) -> Gaussians:
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    op = rng.uniform(0.05, 1.0, n)
    op[0] = 1.0
    return Gaussians(means=rng.uniform(-0.5, 0.5, (n, 3)).astype(np.float32),
                     scales=rng.uniform(1e-3, 0.05, (n, 3)).astype(np.float32),
                     quats=q.astype(np.float32), opacities=op.astype(np.float32),
                     colors=rng.uniform(0, 1, (n, 3)).astype(np.float32))


# ----------------------------------------------------------------------------- textured GLB


def test_textured_glb_samples_the_expected_texel(tmp_path):
    from PIL import Image

    h, w = 48, 64
    tex = pattern_texture(h, w)
    # vertex 0 sits on texel (row 10, col 50) in Kiln's convention; the others elsewhere
    texels = [(10, 50), (3, 5), (40, 60), (30, 2)]
    uvs = [((c + 0.5) / w, 1.0 - (r + 0.5) / h) for r, c in texels]
    mesh = quad_mesh_with_uvs(uvs)
    path = E.export_glb(mesh, tex, tmp_path / "out" / "model.glb")
    assert path == tmp_path / "out" / "model.glb" and path.is_file()

    # as a glTF viewer reads it: TEXCOORD_0 has (0, 0) at the image's top-left
    doc, binary = read_glb(path)
    prim = primitive(doc)
    uv_gltf = accessor(doc, binary, prim["attributes"]["TEXCOORD_0"])
    view = doc["bufferViews"][doc["images"][0]["bufferView"]]
    png = binary[view.get("byteOffset", 0):view.get("byteOffset", 0) + view["byteLength"]]
    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    assert image.shape == (h, w, 3)
    np.testing.assert_array_equal(image, tex.image)
    for k, (r, c) in enumerate(texels):
        col, row = int(uv_gltf[k, 0] * w), int(uv_gltf[k, 1] * h)
        assert (row, col) == (r, c)
        np.testing.assert_array_equal(image[row, col], tex.image[r, c])

    # material: PBR, not metallic, rough
    pbr = doc["materials"][prim["material"]]["pbrMetallicRoughness"]
    assert pbr["metallicFactor"] == 0.0 and pbr["roughnessFactor"] == pytest.approx(0.9)
    assert "baseColorTexture" in pbr
    # no axis change: positions as given, no node transform
    np.testing.assert_allclose(accessor(doc, binary, prim["attributes"]["POSITION"]), mesh.vertices)
    assert not any(k in doc["nodes"][0] for k in ("matrix", "rotation", "scale", "translation"))
    normals = accessor(doc, binary, prim["attributes"]["NORMAL"])
    np.testing.assert_allclose(normals, np.tile([0.0, 0.0, 1.0], (4, 1)), atol=1e-6)

    # and through trimesh's loader
    import trimesh

    scene = trimesh.load(path, force="scene")
    (g,) = scene.geometry.values()
    assert g.visual.material.baseColorTexture.size == (w, h)
    np.testing.assert_allclose(g.visual.uv, mesh.uvs, atol=1e-6)
    sampled = trimesh.visual.color.uv_to_color(g.visual.uv, g.visual.material.baseColorTexture)
    np.testing.assert_array_equal(sampled[:, :3], [tex.image[r, c] for r, c in texels])


def test_normals_are_smooth_across_split_seam_vertices(tmp_path):
    import trimesh

    sphere = trimesh.creation.icosphere(subdivisions=2, radius=0.4)
    # split every vertex per face, as a UV unwrap does along seams
    v = sphere.vertices[sphere.faces].reshape(-1, 3).astype(np.float32)
    f = np.arange(len(v), dtype=np.int32).reshape(-1, 3)
    mesh = Mesh(v, f, uvs=np.random.default_rng(0).uniform(size=(len(v), 2)).astype(np.float32))
    doc, binary = read_glb(E.export_glb(mesh, pattern_texture(16, 16), tmp_path / "s.glb"))
    n = accessor(doc, binary, primitive(doc)["attributes"]["NORMAL"])
    radial = v / np.linalg.norm(v, axis=1, keepdims=True)
    assert np.einsum("ij,ij->i", n, radial).min() > 0.99   # flat per-face normals would be ~0.95


# ----------------------------------------------------------------------------- vertex colours


def test_vertex_colour_glb_round_trip(tmp_path):
    import trimesh

    box = trimesh.creation.box(extents=(0.6, 0.4, 0.8))
    colours = np.random.default_rng(3).uniform(size=(len(box.vertices), 3)).astype(np.float32)
    colours[0] = [0.0, 0.5, 1.0]
    mesh = Mesh(box.vertices.astype(np.float32), box.faces.astype(np.int32), vertex_colors=colours)
    path = E.export_glb(mesh, None, tmp_path / "vc.glb")
    doc, binary = read_glb(path)
    prim = primitive(doc)
    assert "TEXCOORD_0" not in prim["attributes"]
    stored = accessor(doc, binary, prim["attributes"]["COLOR_0"])
    # COLOR_0 is linear in glTF; sRGB 0.5 is linear 0.214
    expect = np.rint(E.srgb_to_linear(colours) * 255).astype(np.uint8)
    np.testing.assert_array_equal(stored[:, :3], expect)
    assert stored[0, :3].tolist() == [0, 55, 255]
    scene = trimesh.load(path, force="scene")
    (g,) = scene.geometry.values()
    assert g.visual.kind == "vertex"
    np.testing.assert_array_equal(g.visual.vertex_colors[:, :3], expect)
    np.testing.assert_allclose(g.vertices, mesh.vertices, atol=1e-6)
    info = E.check_glb(path)
    assert info == {"faces": 12, "vertices": 8, "texture_size": None, "bytes": path.stat().st_size}


def test_plain_glb_without_colours(tmp_path):
    import trimesh

    box = trimesh.creation.box()
    path = E.export_glb(Mesh(box.vertices.astype(np.float32), box.faces.astype(np.int32)), None,
                        tmp_path / "plain.glb")
    doc, _ = read_glb(path)
    assert "COLOR_0" not in primitive(doc)["attributes"]
    assert E.check_glb(path)["faces"] == 12


def test_export_validates_inputs(tmp_path):
    mesh = quad_mesh_with_uvs(np.zeros((4, 2)))
    tex = pattern_texture(8, 8)
    with pytest.raises(StageInputError, match="uvs"):
        E.export_glb(Mesh(mesh.vertices, mesh.faces), tex, tmp_path / "a.glb")
    with pytest.raises(StageInputError, match="uint8"):
        E.export_glb(mesh, Texture(tex.image.astype(np.float32), tex.seen), tmp_path / "a.glb")
    with pytest.raises(StageInputError, match="float32"):
        E.export_glb(Mesh(mesh.vertices.astype(np.float64), mesh.faces), None, tmp_path / "a.glb")
    bad = gaussians()
    bad.scales[3, 1] = 0.0
    with pytest.raises(StageInputError, match="positive"):
        E.export_gaussians_ply(bad, tmp_path / "g.ply")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- Gaussians .ply


def test_gaussians_ply_round_trip(tmp_path):
    from plyfile import PlyData

    g = gaussians()
    path = E.export_gaussians_ply(g, tmp_path / "g.ply")
    ply = PlyData.read(str(path))
    assert not ply.text and ply.byte_order == "<"
    v = ply["vertex"]
    names = [p.name for p in v.properties]
    assert names == (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2", "opacity",
                      "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"])
    assert all(p.val_dtype in ("f4", "float32", "float") for p in v.properties)
    d = v.data
    assert len(d) == len(g)
    np.testing.assert_allclose(np.stack([d["x"], d["y"], d["z"]], 1), g.means)
    np.testing.assert_allclose(np.exp(np.stack([d[f"scale_{i}"] for i in range(3)], 1)), g.scales, rtol=1e-5)
    np.testing.assert_allclose(1 / (1 + np.exp(-d["opacity"].astype(np.float64))), g.opacities, atol=1e-6)
    assert np.isfinite(d["opacity"]).all()
    dc = np.stack([d[f"f_dc_{i}"] for i in range(3)], 1)
    np.testing.assert_allclose(0.5 + 0.28209479177387814 * dc, g.colors, atol=1e-6)
    np.testing.assert_allclose(np.stack([d[f"rot_{i}"] for i in range(4)], 1), g.quats)
    assert (d["nx"] == 0).all()


# ----------------------------------------------------------------------------- check_glb and files


def test_check_glb_rejects_missing_empty_corrupt_and_faceless(tmp_path):
    import trimesh

    with pytest.raises(E.GLBError, match="does not exist"):
        E.check_glb(tmp_path / "nope.glb")
    empty = tmp_path / "empty.glb"
    empty.write_bytes(b"")
    with pytest.raises(E.GLBError, match="empty"):
        E.check_glb(empty)
    junk = tmp_path / "junk.glb"
    junk.write_bytes(b"glTF" + np.random.default_rng(0).bytes(500))
    with pytest.raises(E.GLBError, match="cannot be read"):
        E.check_glb(junk)
    points = tmp_path / "points.glb"
    points.write_bytes(trimesh.Scene(trimesh.PointCloud(np.random.default_rng(1).uniform(size=(10, 3))))
                       .export(file_type="glb"))
    with pytest.raises(E.GLBError, match="no triangles"):
        E.check_glb(points)


def test_check_glb_rejects_non_finite_positions(tmp_path):
    import trimesh

    box = trimesh.creation.box()
    path = E.export_glb(Mesh(box.vertices.astype(np.float32), box.faces.astype(np.int32)), None,
                        tmp_path / "box.glb")
    assert E.check_glb(path)["faces"] == 12
    raw = bytearray(path.read_bytes())
    doc, _ = read_glb(path)
    acc = doc["accessors"][primitive(doc)["attributes"]["POSITION"]]
    start = 20 + struct.unpack("<I", raw[12:16])[0] + 8
    start += doc["bufferViews"][acc["bufferView"]].get("byteOffset", 0) + acc.get("byteOffset", 0)
    raw[start:start + 4] = struct.pack("<f", float("nan"))
    path.write_bytes(bytes(raw))
    with pytest.raises(E.GLBError, match="non-finite"):
        E.check_glb(path)
