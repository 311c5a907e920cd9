"""Every kind of GLB Kiln writes passes the Khronos glTF validator with no errors: an image
job's (texture, and vertex colours without a bake), and a bake job's (the model's own UVs
kept, and new ones)."""

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
@pytest.mark.parametrize("bake", [True, False], ids=["textured", "vertex-colours"])
def test_an_image_job_s_glb_is_valid(node, tmp_path, bake):
    from kiln.examples import draw_object
    from pipeline.run import run_pipeline
    from pipeline.types import ImageInput

    rgb, mask = draw_object(128)
    res = run_pipeline(ImageInput(rgb, mask), load(None, {**SMALL, "bake.enabled": bake}), tmp_path)
    report = _assert_valid(res.glb_path)
    assert report["info"]["drawCallCount"] == 1


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
