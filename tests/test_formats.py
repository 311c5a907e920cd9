"""The files besides the GLB (pipeline.io.mesh_formats, pipeline.io.outputs) and the texture's
encodings (pipeline.io.texture_file, pipeline.io.glb_texture): each read back with trimesh (the
same vertex and face counts), the STL's units and frame, the PLY's colours, the texture's
format by its magic bytes, the sizes reported; and the settings that choose them."""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from kiln import formats as F
from kiln import settings as S
from kiln.records import OutputFile
from pipeline.io import mesh_formats as M
from pipeline.io.export import export_glb
from pipeline.io.outputs import write_outputs
from pipeline.io.texture_file import encode_texture, sniff
from pipeline.types import Mesh, Texture
from pipeline.validate import StageInputError


def photo_like_texture(size=256, seed=0) -> Texture:
    """Smooth colour gradients with some grain: what a baked photo texture looks like to a codec."""
    rng = np.random.default_rng(seed)
    r, c = np.mgrid[0:size, 0:size] / size
    img = np.stack([200 * r + 30, 180 * c + 40, 120 * (1 - r * c) + 60], -1) + rng.normal(0, 4, (size, size, 3))
    return Texture(image=np.clip(img, 0, 255).astype(np.uint8), seen=np.ones((size, size), bool))


def seamed_sphere() -> Mesh:
    """A UV sphere (latitude-longitude UVs) whose seam column is split, as an unwrap splits
    vertices: the same position twice with different UVs."""
    n_lat, n_lon = 12, 24
    lat = np.linspace(0, np.pi, n_lat + 1)
    lon = np.linspace(0, 2 * np.pi, n_lon + 1)        # the last column repeats the first: the seam
    la, lo = np.meshgrid(lat, lon, indexing="ij")
    v = np.stack([np.sin(la) * np.cos(lo), np.cos(la), -np.sin(la) * np.sin(lo)], -1).reshape(-1, 3) * 0.5
    uv = np.stack([lo / (2 * np.pi), 1 - la / np.pi], -1).reshape(-1, 2)
    idx = np.arange((n_lat + 1) * (n_lon + 1)).reshape(n_lat + 1, n_lon + 1)
    a, b, c, d = idx[:-1, :-1], idx[:-1, 1:], idx[1:, :-1], idx[1:, 1:]
    faces = np.concatenate([np.stack([a, c, b], -1).reshape(-1, 3), np.stack([b, c, d], -1).reshape(-1, 3)])
    # drop the triangles that collapse at the poles (two corners at one pole vertex position)
    faces = faces[np.array([len({tuple(np.round(v[i], 6)) for i in f}) == 3 for f in faces])]
    used, faces = np.unique(faces, return_inverse=True)   # and the pole copies no triangle uses
    return Mesh(v[used].astype(np.float32), faces.reshape(-1, 3).astype(np.int32), uvs=uv[used].astype(np.float32))


def unique_positions(mesh: Mesh) -> int:
    """Distinct vertex positions (to 7 decimals: the poles' copies are 1e-16 apart)."""
    return len(np.unique(np.round(mesh.vertices[np.unique(mesh.faces)].astype(np.float64), 7), axis=0))


def glb_image(path) -> tuple[dict, bytes]:
    """(the GLB's JSON, the bytes of its first image)."""
    raw = Path(path).read_bytes()
    jlen = struct.unpack_from("<I", raw, 12)[0]
    doc = json.loads(raw[20:20 + jlen])
    binary = raw[20 + jlen + 8:]
    view = doc["bufferViews"][doc["images"][0]["bufferView"]]
    start = view.get("byteOffset", 0)
    return doc, binary[start:start + view["byteLength"]]


def load_one(path, **kw):
    import trimesh

    loaded = trimesh.load(path, **kw)
    if isinstance(loaded, trimesh.Scene):
        (loaded,) = loaded.geometry.values()
    return loaded


# ----------------------------------------------------------------------------- settings


def test_formats_are_one_setting_read_from_a_list_or_commas_and_the_glb_is_always_among_them():
    assert S.Settings().export.formats == ("glb",)
    assert S.load(None, {"export.formats": "stl, OBJ"}).export.formats == ("glb", "obj", "stl")
    assert S.load(None, {"export.formats": ["ply", "ply"]}).export.formats == ("glb", "ply")
    assert S.load(None, {"export.formats": ""}).export.formats == ("glb",)
    s = S.load(None, {"export.formats": "obj,stl,ply"})
    assert S.from_dict(s.to_dict()) == s and json.loads(s.to_json())["export"]["formats"] == ["glb", "obj", "stl", "ply"]
    assert S.allowed_values("export.formats") == F.FORMATS
    assert S.JOB_SETTINGS["formats"] == "export.formats"


@pytest.mark.parametrize("key,value,needle", [
    ("export.formats", "foo", "'foo' is not one of glb, obj, stl, ply"),
    ("export.formats", 3, "must be a list"),
    ("export.units", "km", "choose one of m, mm"),
    ("export.texture_format", "gif", "choose one of png, jpeg, webp"),
])
def test_a_bad_format_unit_or_texture_format_is_refused_naming_the_setting(key, value, needle):
    with pytest.raises(S.SettingsError) as e:
        S.load(None, {key: value})
    assert f"'{key}'" in str(e.value) and needle in str(e.value)


def test_output_names_sit_beside_the_glb():
    assert F.output_path("/o/horse.glb", "obj") == Path("/o/horse.obj.zip")
    assert F.output_path("/o/horse.glb", "mesh_ply") == Path("/o/horse.mesh.ply")
    assert F.output_path("/o/horse.glb", "stl") == Path("/o/horse.stl")
    assert F.output_key("ply") == "mesh_ply" and F.format_of("mesh_ply") == "ply"
    assert F.human_bytes(999) == "999 B" and F.human_bytes(1_234_567) == "1.2 MB"


# ----------------------------------------------------------------------------- textures


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp"])
def test_a_texture_is_encoded_as_asked_by_its_magic_bytes(fmt):
    from PIL import Image

    tex = photo_like_texture(64)
    data = encode_texture(tex.image, fmt)
    assert sniff(data) == fmt
    back = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    err = np.abs(back.astype(int) - tex.image).mean()
    assert err == 0 if fmt == "png" else err < 4, err


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp"])
def test_a_glb_holds_its_texture_in_the_format_asked(tmp_path, fmt):
    mesh, tex = seamed_sphere(), photo_like_texture()
    path = export_glb(mesh, tex, tmp_path / "m.glb", texture_format=fmt)
    doc, image = glb_image(path)
    assert sniff(image) == fmt and doc["images"][0]["mimeType"] == f"image/{fmt}"
    webp = fmt == "webp"
    assert ("EXT_texture_webp" in doc.get("extensionsRequired", [])) == webp
    assert ("EXT_texture_webp" in doc.get("extensionsUsed", [])) == webp
    texture = doc["textures"][0]
    assert (texture.get("extensions", {}).get("EXT_texture_webp", {}).get("source") == 0) == webp
    assert ("source" in texture) != webp   # required: no PNG fallback
    # the geometry survived the binary chunk being laid out again
    back = load_one(path, force="mesh", process=False)
    assert len(back.vertices) == mesh.num_vertices and len(back.faces) == mesh.num_faces
    assert np.allclose(back.vertices, mesh.vertices, atol=1e-6)
    assert back.visual.material.baseColorTexture.size == (256, 256)


def test_jpeg_and_webp_glbs_are_several_times_smaller_than_png_on_a_grainy_texture(tmp_path):
    mesh, tex = seamed_sphere(), photo_like_texture(1024)
    size = {fmt: export_glb(mesh, tex, tmp_path / f"{fmt}.glb", texture_format=fmt).stat().st_size
            for fmt in ("png", "jpeg", "webp")}
    assert size["png"] > 3 * size["jpeg"] and size["png"] > 3 * size["webp"], size


def test_a_texture_format_that_is_not_one_is_refused(tmp_path):
    with pytest.raises(StageInputError, match="texture format 'gif'"):
        export_glb(seamed_sphere(), photo_like_texture(16), tmp_path / "m.glb", texture_format="gif")


# ----------------------------------------------------------------------------- OBJ


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp"])
def test_a_textured_obj_zip_round_trips_through_trimesh(tmp_path, fmt):
    from PIL import Image

    mesh, tex = seamed_sphere(), photo_like_texture()
    out = M.export_obj_zip(mesh, tex, tmp_path / "horse.obj.zip", fmt)
    suffix = {"png": ".png", "jpeg": ".jpg", "webp": ".webp"}[fmt]
    with zipfile.ZipFile(tmp_path / "horse.obj.zip") as z:
        assert sorted(z.namelist()) == sorted(["horse.obj", "horse.mtl", "horse" + suffix])
        assert sniff(z.read("horse" + suffix)) == fmt
        assert f"map_Kd horse{suffix}" in z.read("horse.mtl").decode()
        z.extractall(tmp_path / "x")
    back = load_one(tmp_path / "x" / "horse.obj", process=False)
    assert (len(back.vertices), len(back.faces)) == (mesh.num_vertices, mesh.num_faces)
    assert (out.vertices, out.faces) == (mesh.num_vertices, mesh.num_faces)
    assert out.bytes == (tmp_path / "horse.obj.zip").stat().st_size and out.texture_format == fmt
    assert np.allclose(back.vertices, mesh.vertices, atol=1e-5)
    # OBJ's v = 0 is the image's bottom, as Kiln's: the UVs go through unchanged
    assert np.allclose(back.visual.uv, mesh.uvs, atol=1e-5)
    assert back.visual.material.image.size == (256, 256)
    assert np.abs(np.asarray(back.visual.material.image.convert("RGB")).astype(int)
                  - np.asarray(Image.fromarray(tex.image))).mean() < 4


def test_an_untextured_obj_zip_carries_vertex_colours(tmp_path):
    mesh = seamed_sphere()
    cols = np.random.default_rng(1).uniform(0, 1, (mesh.num_vertices, 3)).astype(np.float32)
    mesh = Mesh(mesh.vertices, mesh.faces, vertex_colors=cols)
    M.export_obj_zip(mesh, None, tmp_path / "v.obj.zip")
    with zipfile.ZipFile(tmp_path / "v.obj.zip") as z:
        assert z.namelist() == ["v.obj"]   # no material: readers would prefer it to the colours
        z.extractall(tmp_path / "x")
    back = load_one(tmp_path / "x" / "v.obj", process=False)
    assert (len(back.vertices), len(back.faces)) == (mesh.num_vertices, mesh.num_faces)
    assert np.abs(back.visual.vertex_colors[:, :3] / 255.0 - cols).max() < 1 / 255 + 1e-3


def test_an_obj_zip_copied_for_a_person_is_named_after_the_copy(tmp_path):
    M.export_obj_zip(seamed_sphere(), photo_like_texture(32), tmp_path / "model.obj.zip", "jpeg")
    F.copy_output("obj", tmp_path / "model.obj.zip", tmp_path / "horse-1.obj.zip")
    with zipfile.ZipFile(tmp_path / "horse-1.obj.zip") as z:
        assert sorted(z.namelist()) == ["horse-1.jpg", "horse-1.mtl", "horse-1.obj"]
        assert "mtllib horse-1.mtl\n" in z.read("horse-1.obj").decode()
        assert "map_Kd horse-1.jpg" in z.read("horse-1.mtl").decode()
        z.extractall(tmp_path / "x")
    back = load_one(tmp_path / "x" / "horse-1.obj", process=False)
    assert back.visual.material.image.size == (32, 32)


# ----------------------------------------------------------------------------- STL


@pytest.mark.parametrize("units,scale", [("m", 1.0), ("mm", 1000.0)])
def test_an_stl_round_trips_z_up_in_its_units(tmp_path, units, scale):
    mesh = seamed_sphere()
    out = M.export_stl(mesh, tmp_path / "m.stl", units)
    assert (out.units, out.scale, out.up) == (units, scale, "z")
    back = load_one(tmp_path / "m.stl")   # trimesh joins an STL's corners by position
    # the seam's split vertices are one vertex each in the STL: the counts a reader finds
    assert (len(back.vertices), len(back.faces)) == (out.vertices, out.faces) == \
        (unique_positions(mesh), mesh.num_faces)
    assert out.bytes == (tmp_path / "m.stl").stat().st_size == 84 + 50 * mesh.num_faces
    lo, hi = mesh.vertices.min(0), mesh.vertices.max(0)
    # (x, y, z) -> (x, -z, y), times the scale
    assert np.allclose(back.bounds, scale * np.array([[lo[0], -hi[2], lo[1]], [hi[0], -lo[2], hi[1]]]), atol=1e-3 * scale)
    assert back.is_watertight and back.volume > 0   # still closed, normals still outward


def test_an_stl_in_km_is_refused(tmp_path):
    with pytest.raises(StageInputError, match="units 'km'"):
        M.export_stl(seamed_sphere(), tmp_path / "m.stl", "km")


# ----------------------------------------------------------------------------- PLY


def test_a_ply_mesh_takes_its_colours_from_the_texture_at_each_vertex(tmp_path):
    mesh = seamed_sphere()
    # red on the texture's top half (v > 0.5: the sphere's top), blue below, wide margins
    img = np.zeros((64, 64, 3), np.uint8)
    img[:32] = (220, 30, 30)
    img[32:] = (30, 30, 220)
    out = M.export_mesh_ply(mesh, Texture(img, np.ones((64, 64), bool)), tmp_path / "m.mesh.ply")
    back = load_one(tmp_path / "m.mesh.ply", process=False)
    assert (len(back.vertices), len(back.faces)) == (out.vertices, out.faces) == \
        (unique_positions(mesh), mesh.num_faces)
    assert out.bytes == (tmp_path / "m.mesh.ply").stat().st_size
    cols = back.visual.vertex_colors[:, :3].astype(int)
    top, bottom = back.vertices[:, 1] > 0.2, back.vertices[:, 1] < -0.2
    assert top.any() and bottom.any()
    assert (cols[top] == (220, 30, 30)).all() and (cols[bottom] == (30, 30, 220)).all()
    # loaded with trimesh's own processing too: nothing left to merge
    again = load_one(tmp_path / "m.mesh.ply")
    assert (len(again.vertices), len(again.faces)) == (out.vertices, out.faces)


def test_a_ply_mesh_without_texture_keeps_its_vertex_colours(tmp_path):
    import trimesh

    sphere = trimesh.creation.icosphere(subdivisions=2, radius=0.5)
    cols = np.random.default_rng(2).uniform(0, 1, (len(sphere.vertices), 3)).astype(np.float32)
    mesh = Mesh(sphere.vertices.astype(np.float32), sphere.faces.astype(np.int32), vertex_colors=cols)
    M.export_mesh_ply(mesh, None, tmp_path / "c.mesh.ply")
    back = load_one(tmp_path / "c.mesh.ply", process=False)
    assert (len(back.vertices), len(back.faces)) == (mesh.num_vertices, mesh.num_faces)
    order = np.lexsort(mesh.vertices.T[::-1])          # the weld sorts vertices by position
    assert np.abs(back.visual.vertex_colors[:, :3] - np.rint(cols[order] * 255)).max() <= 1


def test_texture_samples_land_on_texel_centres():
    img = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3) * 5
    # texel (row 1, col 2) has its centre at u = 2.5 / 4, v = 1 - 1.5 / 4
    got = M.sample_texture(img, np.array([[2.5 / 4, 1 - 1.5 / 4]], np.float32))
    assert np.allclose(got[0] * 255, img[1, 2], atol=1e-3)


# ----------------------------------------------------------------------------- every file of a job


def test_write_outputs_writes_every_format_asked_beside_the_glb_and_reports_each(tmp_path):
    export = S.load(None, {"export.formats": "ply,stl,obj", "export.texture_format": "webp",
                           "export.units": "mm"}).export
    mesh = seamed_sphere()
    files = write_outputs(mesh, photo_like_texture(), tmp_path, "model", export)
    assert [f.key for f in files] == ["glb", "obj", "stl", "mesh_ply"]
    assert [f.name for f in files] == ["model.glb", "model.obj.zip", "model.stl", "model.mesh.ply"]
    for f in files:
        assert f.bytes == (tmp_path / f.name).stat().st_size > 0
        assert OutputFile.from_dict(f.to_dict()) == f
    assert files[0].texture_format == files[1].texture_format == "webp"
    assert (files[2].units, files[2].scale) == ("mm", 1000.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.name for f in files)   # no temporaries
    # only the GLB, unless more are asked for
    only = write_outputs(mesh, None, tmp_path / "plain", "model", S.Settings().export)
    assert [f.name for f in only] == ["model.glb"] and only[0].texture_format is None
