"""Every kind of GLB Kiln writes passes the Khronos glTF validator with no errors: an image
job's (texture as PNG, JPEG or WebP, and vertex colours without a bake), and a bake job's (the
model's own UVs kept, and new ones)."""

from __future__ import annotations

import numpy as np
import pytest

import gltf_validator
from kiln.settings import load
from pipeline.raster.rasterize import available_backends

needs_gl = pytest.mark.skipif("moderngl" not in available_backends(), reason="no EGL OpenGL context here")
SMALL = {"views.count": 4, "views.resolution": 128, "bake.texture_size": 256, "bake.mode": "fast",
         "reconstruct.resolution": 64, "reconstruct.num_gaussians": 2000}


@pytest.fixture(scope="module")
def node():
    try:
        return gltf_validator.ensure()
    except gltf_validator.Unavailable as e:
        pytest.skip(f"the Khronos glTF validator cannot run here: {e}")


def _assert_valid(path):
    report = gltf_validator.validate(path)
    assert report["issues"]["numErrors"] == 0, gltf_validator.errors(report)
    return report


@needs_gl
@pytest.mark.parametrize("bake,texture_format", [(True, "png"), (True, "jpeg"), (True, "webp"), (False, "png")],
                         ids=["textured-png", "textured-jpeg", "textured-webp", "vertex-colours"])
def test_an_image_job_s_glb_is_valid(node, tmp_path, bake, texture_format):
    from pipeline.run import run_pipeline
    from pipeline.types import ImageInput

    rgb, mask = _object()
    s = load(None, {**SMALL, "bake.enabled": bake, "export.texture_format": texture_format,
                    "export.formats": "glb,obj,stl,ply"})
    res = run_pipeline(ImageInput(rgb, mask), s, tmp_path)
    report = _assert_valid(res.glb_path)
    assert report["info"]["drawCallCount"] == 1
    if bake:
        # the validator decoded the image it was told of: the format asked for
        (image,) = [r for r in report["info"]["resources"] if r["pointer"] == "/images/0"]
        assert image["mimeType"] == f"image/{texture_format}" and image["image"]["width"] == 256
        assert ("EXT_texture_webp" in (report["info"].get("extensionsRequired") or [])) == (texture_format == "webp")
    assert set(res.extra) == {"obj", "stl", "mesh_ply"}   # the other files beside it, from the same job


def _object():
    from kiln.examples import draw_object

    return draw_object(128)


@pytest.mark.parametrize("texture_format", ["png", "jpeg", "webp"])
def test_a_glb_is_valid_with_each_texture_format(node, tmp_path, texture_format):
    from test_formats import photo_like_texture, seamed_sphere

    from pipeline.io.export import export_glb

    path = export_glb(seamed_sphere(), photo_like_texture(), tmp_path / "m.glb", texture_format=texture_format)
    report = _assert_valid(path)
    assert report["issues"]["numWarnings"] == 0


def test_webp_without_its_extension_is_an_error_to_the_validator(node, tmp_path):
    """Why a WebP GLB declares EXT_texture_webp: glTF 2.0 itself allows only PNG and JPEG."""
    from test_formats import photo_like_texture, seamed_sphere

    from pipeline.io.export import export_glb
    from pipeline.io.glb_texture import join_glb, split_glb

    doc, binary = split_glb(export_glb(seamed_sphere(), photo_like_texture(), tmp_path / "w.glb",
                                       texture_format="webp").read_bytes())
    del doc["extensionsUsed"], doc["extensionsRequired"]
    doc["textures"][0] = {"source": 0}
    (tmp_path / "bare.glb").write_bytes(join_glb(doc, binary))
    report = gltf_validator.validate(tmp_path / "bare.glb")
    assert report["issues"]["numErrors"] > 0, report["issues"]
    # "'image/webp' MIME type requires an extension"
    assert any(m.startswith("IMAGE_NON_ENABLED_MIME_TYPE") for m in gltf_validator.errors(report)), \
        gltf_validator.errors(report)


@needs_gl
@pytest.mark.parametrize("keep_uvs", [True, False], ids=["own-uvs", "new-uvs"])
def test_a_bake_job_s_glb_is_valid(node, tmp_path, keep_uvs):
    import trimesh

    from pipeline.backends import resolve_backends
    from pipeline.io.mesh_file import read_mesh
    from pipeline.texture.model_bake import ModelInputs, bake_model
    from raster_helpers import gl_context

    colours = trimesh.creation.icosphere(subdivisions=3, radius=0.5)
    colours.visual.vertex_colors = np.random.default_rng(0).integers(0, 255, (len(colours.vertices), 4)).astype(np.uint8)
    colours.export(tmp_path / "coloured.ply")
    model = read_mesh(tmp_path / "coloured.ply")
    if keep_uvs:   # UVs of its own: a projection onto the xz plane (overlapping, but in [0, 1])
        from pipeline.io.mesh_file import MeshFile
        from pipeline.types import Mesh

        m = model.mesh
        uv = (m.vertices[:, [0, 2]] + 0.5).clip(0, 1)
        model = MeshFile(mesh=Mesh(m.vertices, m.faces, vertex_colors=m.vertex_colors,
                                   uvs=uv.astype(np.float32)), texture=None, format="ply")
    s = load(None, SMALL)
    out = bake_model(ModelInputs(model=model, keep_uvs=keep_uvs), s, resolve_backends(s), tmp_path / "out",
                     gl_context())
    _assert_valid(out.glb_path)
