"""Baking a model someone else made (pipeline.texture.model_bake): frames found, the photo gated by
the silhouette, ground truth recovered, Kiln's own pair baked back, the real SAM 3D files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kiln.settings import load
from pipeline.backends import resolve_backends
from pipeline.texture.bake import masked_psnr, render_textured
from pipeline.io.camera_file import camera_from_focal
from pipeline.io.frames import SPLAT_TO_MESH, fit_frame, transform_gaussians
from pipeline.io.mesh_file import MeshFile, read_mesh
from pipeline.texture.model_bake import ModelInputs, bake_model, silhouette_fit
from pipeline.raster.rasterize import available_backends
from pipeline.types import ImageInput, Mesh, SourceCamera, Texture
from pipeline.validate import StageInputError
from raster_helpers import gl_context

pytestmark = pytest.mark.skipif("moderngl" not in available_backends(),
                                reason="no EGL OpenGL context on this machine")
HUMAN = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "sam3d-human-object"
needs_human = pytest.mark.skipif(not HUMAN.is_dir(), reason=f"real SAM 3D fixtures missing: {HUMAN}")
FAST = {"bake.mode": "fast", "bake.texture_size": 512, "views.count": 8, "views.resolution": 256}


@pytest.fixture(scope="module")
def kiln_pair(tmp_path_factory):
    """A GLB and its Gaussians' .ply as `kiln run --ply` writes them (the drawn toy)."""
    from kiln.examples import draw_object
    from pipeline.run import run_pipeline

    rgb, mask = draw_object(256)
    s = load(None, {**FAST, "export.gaussians_ply": True, "reconstruct.resolution": 96})
    res = run_pipeline(ImageInput(rgb, mask), s, tmp_path_factory.mktemp("run"))
    return res.glb_path, res.ply_path


def test_the_splat_frame_is_found_for_each_source(kiln_pair):
    from pipeline.io.splat_ply import read_splat

    mesh = read_mesh(kiln_pair[0]).mesh
    g = read_splat(kiln_pair[1]).gaussians
    for source in ("kiln", "sam3d", "trellis"):
        # the splat as that tool would have written it beside this mesh
        written = transform_gaussians(g, SPLAT_TO_MESH[source].rotation.T)
        fit = fit_frame(mesh, written)
        assert fit.source == source and fit.distance < 0.01, fit.note
        moved = transform_gaussians(written, SPLAT_TO_MESH[source].rotation)
        np.testing.assert_allclose(moved.means, g.means, atol=1e-5)
    # a wrong --source is caught by the surface check, naming the distance
    with pytest.raises(StageInputError, match="does not lie on the mesh in sam3d frame"):
        fit_frame(mesh, g, source="sam3d")


def test_kilns_own_pair_bakes_back_to_its_texture(kiln_pair, tmp_path):
    """`kiln run --ply`'s GLB and splat, handed back with --source kiln, keep-uvs: the splat
    alone gives back the original texture (which had the photo too) to >= 28 dB (32.9 dB
    measured at opt/120 steps, ~30 dB in fast mode)."""
    from pipeline.io.splat_ply import read_splat
    from pipeline.raster.rasterize import rasterize_uv

    model = read_mesh(kiln_pair[0])
    g = read_splat(kiln_pair[1]).gaussians
    s = load(None, {**FAST, "bake.photo_projection": False})
    out = bake_model(ModelInputs(model=model, splat=g, frame=fit_frame(model.mesh, g), keep_uvs=True),
                     s, resolve_backends(s), tmp_path, gl_context())
    assert out.stats.bake.texels_from["views"] > 0.95 and out.stats.model.frame == "kiln"
    again = read_mesh(out.glb_path)
    chart = rasterize_uv(gl_context(), model.mesh, 512).tri_id[0] >= 0
    psnr = masked_psnr(again.texture / 255.0, model.texture / 255.0, chart)
    assert psnr >= 28.0, psnr


def _truth_scene():
    """A UV-mapped mesh with a known texture, and the photo of it from a known camera."""
    import trimesh

    from pipeline.unwrap.uv import unwrap

    tm = trimesh.creation.icosphere(subdivisions=3, radius=0.5)
    tm.vertices[:, 1] *= 0.8
    mesh = unwrap(Mesh(tm.vertices.astype(np.float32), tm.faces.astype(np.int32)), 256, 2, 100000)
    u, v = np.meshgrid(np.linspace(0, 1, 256), np.linspace(1, 0, 256))
    truth = np.stack([0.5 + 0.4 * np.sin(9 * u), 0.5 + 0.4 * np.cos(7 * v), 0.3 + 0.5 * u * v], -1)
    texture = Texture(image=(truth * 255).round().astype(np.uint8), seen=np.ones((256, 256), bool))
    cam = camera_from_focal(420.0, 320, 240, frame="opengl")
    posed = Mesh((mesh.vertices + np.float32([0.05, -0.02, -2.2])), mesh.faces, uvs=mesh.uvs)
    rgb, covered = render_textured(posed, texture, cam.as_cameras(), gl_context())
    photo = ImageInput(rgb=(rgb[0] * 255).round().astype(np.uint8), mask=covered[0])
    return posed, texture, cam, photo


def test_the_photo_of_a_known_texture_bakes_back_into_the_models_own_uvs(tmp_path):
    mesh, texture, cam, photo = _truth_scene()
    model = MeshFile(mesh=mesh, texture=texture.image, format="glb")
    s = load(None, {"bake.texture_size": 256})
    out = bake_model(ModelInputs(model=model, photo=photo, camera=cam, keep_uvs=True), s,
                     resolve_backends(s), tmp_path, gl_context())
    assert out.stats.model.silhouette["inside"] > 0.99 and out.stats.bake.texels_from["photo"] > 0.3
    baked = read_mesh(out.glb_path)
    rgb, covered = render_textured(mesh, Texture(baked.texture, np.ones((256, 256), bool)),
                                   cam.as_cameras(), gl_context())
    psnr = masked_psnr(rgb[0], photo.rgb / 255.0, covered[0] & photo.mask)
    assert psnr >= 30.0, psnr


def test_a_camera_that_does_not_fit_is_not_projected_and_nothing_else_is_refused(tmp_path):
    mesh, texture, cam, photo = _truth_scene()
    wrong = SourceCamera(viewmat=cam.viewmat, K=cam.K * np.float32([[0.4], [0.4], [1]]),
                         width=cam.width, height=cam.height)
    s = load(None, {"bake.texture_size": 256})
    bare = MeshFile(mesh=Mesh(mesh.vertices, mesh.faces, uvs=mesh.uvs), texture=None, format="obj")
    with pytest.raises(StageInputError, match="nothing to take colour from: the photo was not projected"):
        bake_model(ModelInputs(model=bare, photo=photo, camera=wrong, keep_uvs=True), s,
                   resolve_backends(s), tmp_path, gl_context())
    # with colours of its own the bake goes on without the photo, and says why
    coloured = MeshFile(mesh=bare.mesh, texture=texture.image, format="glb")
    out = bake_model(ModelInputs(model=coloured, photo=photo, camera=wrong, keep_uvs=True), s,
                     resolve_backends(s), tmp_path, gl_context())
    assert out.stats.bake.texels_from["photo"] == 0 and out.stats.bake.texels_from["fallback"] > 0.9
    assert any("not projected" in w for w in out.stats.warnings)


def _human():
    from PIL import Image

    from kiln.maskfile import load_mask

    rgb = np.asarray(Image.open(HUMAN / "image.png").convert("RGB"))
    focal = json.loads((HUMAN / "focal_length.json").read_text())["focal_length"]
    cam = camera_from_focal(focal, rgb.shape[1], rgb.shape[0], frame="opengl")
    return rgb, cam, (lambda name: load_mask(HUMAN / name, max_pixels=10 ** 8).mask)


@needs_human
def test_the_real_sam3d_silhouettes_as_measured():
    rgb, cam, mask = _human()
    body = silhouette_fit(gl_context(), read_mesh(HUMAN / "human_sam3d_body.ply").mesh, cam,
                          mask("human_mask.png"))
    assert body.inside == pytest.approx(0.98, abs=0.015) and body.coverage == pytest.approx(0.75, abs=0.02)
    bench = silhouette_fit(gl_context(), read_mesh(HUMAN / "bench_sam3d.glb").mesh, cam, mask("bench_mask.png"))
    assert bench.inside == pytest.approx(0.57, abs=0.03) and bench.coverage == pytest.approx(0.33, abs=0.03)


@needs_human
@pytest.mark.slow
def test_the_person_bakes_from_her_photo(tmp_path):
    """SAM 3D Body's mesh, her photo and focal length: seen from that camera the model shows
    the photo where it covers her mask (>= 20 dB; 23 dB measured with three.js as well)."""
    rgb, cam, mask = _human()
    m = mask("human_mask.png")
    model = read_mesh(HUMAN / "human_sam3d_body.ply")
    s = load(None, {"bake.texture_size": 1024})
    out = bake_model(ModelInputs(model=model, photo=ImageInput(rgb, m), camera=cam), s,
                     resolve_backends(s), tmp_path, gl_context())
    assert out.stats.bake.texels_from["photo"] > 0.2 and out.stats.model.silhouette["inside"] > 0.97
    baked = read_mesh(out.glb_path)
    got, covered = render_textured(baked.mesh, Texture(baked.texture, np.ones(baked.texture.shape[:2], bool)),
                                   cam.as_cameras(), gl_context())
    psnr = masked_psnr(got[0], rgb / 255.0, covered[0] & m)
    assert psnr >= 20.0, psnr


def test_a_mesh_of_one_flat_colour_is_drawn_by_its_tool_and_the_photo_fills_its_far_side(tmp_path):
    """SAM 3D Body writes every vertex in one light blue: that is how it draws a bare body, not
    the person's colours. With a photo, the far side is filled from the photo's colours (the
    surface fill), never painted that blue; a mesh whose colours vary keeps them."""
    from pipeline.texture.model_bake import flat_colour

    mesh, texture, cam, photo = _truth_scene()
    blue = np.tile(np.float32([166, 189, 219]) / 255.0, (len(mesh.vertices), 1))
    painted = Mesh(mesh.vertices, mesh.faces, uvs=mesh.uvs, vertex_colors=blue)
    model = MeshFile(mesh=painted, texture=None, format="ply")
    assert flat_colour(model) == (166, 189, 219)
    varied = blue.copy()
    varied[::2, 0] = 0.2
    assert flat_colour(MeshFile(mesh=Mesh(mesh.vertices, mesh.faces, vertex_colors=varied),
                                texture=None, format="ply")) is None

    s = load(None, {"bake.texture_size": 256, "bake.mirror_fill": "off"})
    out = bake_model(ModelInputs(model=model, photo=photo, camera=cam, keep_uvs=True), s,
                     resolve_backends(s), tmp_path, gl_context())
    shares = out.stats.bake.texels_from
    assert shares["photo"] > 0.3 and shares["fallback"] == 0 and shares["fill"] > 0.2, shares
    assert any("one flat colour (166, 189, 219)" in w for w in out.stats.warnings)
    baked = read_mesh(out.glb_path).texture.reshape(-1, 3).astype(np.int16)
    near_blue = np.abs(baked - np.int16([166, 189, 219])).max(axis=1) <= 6
    assert near_blue.mean() < 0.01, near_blue.mean()
