"""Photo projection in the bake: the photo's own pixels on the texels its camera sees.

Each test can fail: the photo must come back when the model is rendered from the
photo's camera; texels the camera cannot see (back faces, surfaces hidden behind
others) must keep the multi-view colour; the photo/multi-view transition must be
a ramp, not a seam; the opt bake must not fill underdetermined texels with speckle.
"""

from __future__ import annotations

import numpy as np
import pytest

from kiln.settings import BakeSettings, load
from pipeline.texture import bake
from pipeline.meshing import mesh_ops
from pipeline.raster import rasterize as rz
from pipeline.unwrap import uv
from pipeline.camera.cameras import look_at, sphere_cameras
from pipeline.recon.builtin import builtin_source_camera
from pipeline.recon.reconstruct import reconstruct
from pipeline.types import Cameras, ImageInput, Mesh, SourceCamera, Texture, Views

from pipeline.raster.rasterize import available_backends
from raster_helpers import gl_context
from synthetic import make_object_image

# one moderngl context for the module (None without EGL: the GL tests skip)
RASTER = gl_context() if "moderngl" in available_backends() else None
RED = np.array([0.9, 0.1, 0.1], np.float32)
BLUE = np.array([0.1, 0.2, 0.9], np.float32)


def flat_views(mesh: Mesh, color, count: int = 12, res: int = 128) -> Views:
    """Views of ``mesh`` painted one colour: what a multi-view bake of a uniform object sees."""
    cams = sphere_cameras(count, 2.4, 40.0, res)
    covered = rz.rasterize_views(RASTER, mesh, cams).tri_id >= 0
    rgb = np.where(covered[..., None], np.asarray(color, np.float32), 0.0).astype(np.float32)
    return Views(rgb=rgb, alpha=covered.astype(np.float32), cameras=cams)


def settings(**kw) -> BakeSettings:
    base = dict(mode="fast", texture_size=256, gutter=2, photo_projection=True)
    base.update(kw)
    return BakeSettings(**base)


@pytest.fixture(scope="module")
def blob():
    """A built-in reconstruction of a textured photo, simplified and unwrapped."""
    s = load(overrides={"reconstruct.resolution": 96, "reconstruct.num_gaussians": 2000})
    rgb, mask = make_object_image(256, "blob")
    recon = reconstruct(ImageInput(rgb, mask), s.reconstruct, seed=0)
    mesh = mesh_ops.simplify_mesh(mesh_ops.clean_mesh(recon.mesh, 0.01, False), 0.9)
    return rgb, mask, recon, uv.unwrap(mesh, 512, 2, 200000)


def render_from(camera: SourceCamera, mesh: Mesh, texture: Texture):
    rgb, covered = bake.render_textured(mesh, texture, camera.as_cameras(), RASTER)
    return rgb[0], covered[0]


# --------------------------------------------------------------------------- the source camera

def test_builtin_source_camera_projects_the_mesh_onto_the_mask():
    s = load(overrides={"reconstruct.resolution": 96, "reconstruct.num_gaussians": 1000,
                        "reconstruct.max_image_side": 256})
    rgb, mask = make_object_image(384, "blob")         # downscaled to 256 for reconstruction
    recon = reconstruct(ImageInput(rgb, mask), s.reconstruct, seed=0)
    cam = recon.source_camera
    assert (cam.width, cam.height, cam.projection) == (384, 384, "orthographic")
    covered = rz.rasterize_views(RASTER, recon.mesh, cam.as_cameras()).tri_id[0] >= 0
    iou = (covered & mask).sum() / (covered | mask).sum()
    assert iou > 0.97, iou
    # shifting the camera by two pixels must show up, so the check above can fail
    shifted = SourceCamera(viewmat=cam.viewmat, K=cam.K + np.float32([[0, 0, 2], [0, 0, 0], [0, 0, 0]]),
                           width=cam.width, height=cam.height, projection=cam.projection)
    moved = rz.rasterize_views(RASTER, recon.mesh, shifted.as_cameras()).tri_id[0] >= 0
    assert (moved & mask).sum() / (moved | mask).sum() < iou - 0.01


def test_source_camera_survives_the_cache(tmp_path):
    from pipeline import cache

    s = load(overrides={"reconstruct.resolution": 64, "reconstruct.num_gaussians": 1000})
    rgb, mask = make_object_image(128, "ellipse")
    image = ImageInput(rgb, mask)
    recon = reconstruct(image, s.reconstruct, seed=0)
    key = cache.reconstruction_key(image, s)
    cache.save_reconstruction(tmp_path, key, recon)
    back = cache.load_reconstruction(tmp_path, key)
    assert back.source_camera.to_dict() == recon.source_camera.to_dict()


def test_gaussian_renderer_refuses_orthographic_cameras():
    from pipeline.views.render_views import render_gaussians
    from pipeline.validate import StageInputError

    s = load(overrides={"reconstruct.resolution": 64, "reconstruct.num_gaussians": 1000})
    rgb, mask = make_object_image(128, "ellipse")
    recon = reconstruct(ImageInput(rgb, mask), s.reconstruct, seed=0)
    with pytest.raises(StageInputError, match="perspective"):
        render_gaussians(recon.gaussians, recon.source_camera.as_cameras(), backend="cpu")


# --------------------------------------------------------------------------- photo comes back

def test_photo_rendered_back_from_its_camera_reproduces_the_photo(blob):
    from scipy import ndimage

    rgb, mask, recon, mesh = blob
    views = flat_views(mesh, [0.5, 0.5, 0.5])       # the multi-view bake knows nothing of the photo
    photo = ImageInput(rgb, mask)
    results = {}
    for on in (True, False):
        tex, stats = bake.bake_texture(mesh, views, settings(texture_size=512, photo_projection=on),
                                       RASTER, "cpu", 0, photo=photo, source_camera=recon.source_camera)
        out, covered = render_from(recon.source_camera, mesh, tex)
        inner = ndimage.binary_erosion(mask, iterations=3) & covered
        results[on] = bake.masked_psnr(out, rgb.astype(np.float32) / 255.0, inner)
        assert stats.photo_projection is on
    assert results[True] >= 30.0, results
    assert results[False] < 20.0, results           # grey views: without the photo nothing matches


def test_photo_chart_gives_the_photo_back_pixel_for_pixel(blob):
    """With the photo chart (UV = the photo's pixel grid) the bake copies the photo's pixels
    and a bilinear render from the photo's camera reads them back unchanged: no resampling
    is left to blur 1-2 px detail. Without it (an LSCM layout at a similar density) the two
    resamplings cost several dB."""
    from scipy import ndimage

    rgb, mask, recon, lscm_mesh = blob
    mesh = uv.unwrap(mesh_ops.simplify_mesh(mesh_ops.clean_mesh(recon.mesh, 0.01, False), 0.9),
                     512, 2, 200000, source_camera=recon.source_camera)
    yy, xx = np.mgrid[0:rgb.shape[0], 0:rgb.shape[1]]
    fine = rgb.copy()
    fine[(xx // 2 + yy // 2) % 2 == 0] //= 3          # a 2 px checker over the photo
    photo = ImageInput(fine, mask)
    inner = ndimage.binary_erosion(mask, iterations=12)
    psnr = {}
    for name, m in (("photo chart", mesh), ("lscm", lscm_mesh)):
        views = flat_views(m, [0.5, 0.5, 0.5])
        tex, _ = bake.bake_texture(m, views, settings(texture_size=512), RASTER, "cpu", 0,
                                   photo=photo, source_camera=recon.source_camera)
        out, covered = render_from(recon.source_camera, m, tex)
        psnr[name] = bake.masked_psnr(out, fine.astype(np.float32) / 255.0, inner & covered)
    assert psnr["photo chart"] >= 45.0, psnr
    assert psnr["lscm"] < psnr["photo chart"] - 10.0, psnr


def test_texel_density_is_reported(blob):
    rgb, mask, recon, mesh = blob
    views = flat_views(mesh, [0.5, 0.5, 0.5], count=4, res=64)
    big = recon.source_camera.scaled(8.0)            # the same camera on an 8x larger photo
    photo = ImageInput(np.kron(rgb, np.ones((8, 8, 1), np.uint8)), np.kron(mask, np.ones((8, 8), bool)))
    _, stats = bake.bake_texture(mesh, views, settings(texture_size=64), RASTER, "cpu", 0,
                                 photo=photo, source_camera=big)
    assert stats.photo_pixels_per_texel > 2.0
    assert stats.texture_size_suggested > 64
    assert "texture size" in stats.warnings[0]
    _, stats = bake.bake_texture(mesh, views, settings(texture_size=512), RASTER, "cpu", 0,
                                 photo=ImageInput(rgb, mask), source_camera=recon.source_camera)
    assert stats.warnings == () and stats.texture_size_suggested is None


# --------------------------------------------------------------------------- what it must not colour

def two_boxes() -> Mesh:
    """A thin box in front of a wider one, both facing +z, each side its own UV chart."""
    def box(lo, hi, k0):
        (x0, y0, z0), (x1, y1, z1) = lo, hi
        corners = np.array([[x, y, z] for z in (z0, z1) for y in (y0, y1) for x in (x0, x1)], np.float32)
        quads = [(4, 5, 7, 6), (1, 0, 2, 3), (5, 1, 3, 7), (0, 4, 6, 2), (6, 7, 3, 2), (0, 1, 5, 4)]
        verts, faces, uvs = [], [], []
        for q, quad in enumerate(quads):
            k = k0 + q
            cell = np.array([(k % 4) / 4.0 + 0.02, (k // 4) / 3.0 + 0.02])
            base = len(verts)
            for c, (a, b) in zip(quad, [(0, 0), (1, 0), (1, 1), (0, 1)]):
                verts.append(corners[c])
                uvs.append(cell + 0.2 * np.array([a, b]))
            faces += [(base, base + 1, base + 2), (base, base + 2, base + 3)]
        return np.array(verts), np.array(faces), np.array(uvs)

    v1, f1, u1 = box((-0.1, -0.4, 0.2), (0.1, 0.4, 0.25), 0)      # thin slab in front
    v2, f2, u2 = box((-0.4, -0.3, -0.3), (0.4, 0.3, -0.05), 6)    # wide body behind
    verts = np.concatenate([v1, v2]).astype(np.float32)
    faces = np.concatenate([f1, f2 + len(v1)]).astype(np.int32)
    return Mesh(vertices=verts, faces=faces, uvs=np.concatenate([u1, u2]).astype(np.float32))


def test_hidden_and_back_texels_keep_the_multiview_colour():
    mesh = two_boxes()
    cam = builtin_source_camera(np.array([128.0, -128.0, 0.0]), 256.0, (256, 256))
    covered = rz.rasterize_views(RASTER, mesh, cam.as_cameras()).tri_id[0] >= 0
    photo = ImageInput(np.tile((RED * 255).astype(np.uint8), (256, 256, 1)), covered)
    views = flat_views(mesh, BLUE, count=16)
    tex, _ = bake.bake_texture(mesh, views, settings(), RASTER, "cpu", 0, photo=photo, source_camera=cam)
    size = 256
    # texel centres of every face, classified by where they are
    u = rz.rasterize_uv(RASTER, mesh, size)
    pos = rz.interpolate(u, mesh, mesh.vertices)[0]
    chart = u.tri_id[0] >= 0
    img = tex.image.astype(np.float32) / 255.0
    is_red = np.abs(img - RED).max(-1) < 0.1
    is_blue = np.abs(img - BLUE).max(-1) < 0.1
    front_of_body = chart & (np.abs(pos[..., 2] + 0.05) < 1e-4)          # faces +z, behind the slab
    hidden = front_of_body & (np.abs(pos[..., 0]) < 0.08)                # straight behind the slab
    open_ = front_of_body & (np.abs(np.abs(pos[..., 0]) - 0.3) < 0.05) \
        & (np.abs(pos[..., 1]) < 0.25)                                   # in plain sight, off the edges
    back = chart & (np.abs(pos[..., 2] + 0.3) < 1e-4)                    # the body's back face
    slab_back = chart & (np.abs(pos[..., 2] - 0.2) < 1e-4)               # the slab's back face
    assert hidden.sum() > 50 and open_.sum() > 50 and back.sum() > 50 and slab_back.sum() > 20
    assert is_red[open_].mean() > 0.95           # the photo is used where it sees
    assert is_blue[hidden].mean() > 0.99         # the slab's shadow is not printed on the body
    assert is_blue[back].mean() > 0.99           # the front is not printed on the back
    assert is_blue[slab_back].mean() > 0.99      # a thin object's front is not printed on its back


def test_no_seam_where_the_photo_hands_over_to_the_views(blob):
    """Photo all red, views all blue: on the surface the texture must ramp between them.

    Measured in texture space, between neighbouring texels of one chart, as the change of
    the blue->red fraction per unit of surface distance: a seam is a jump of 1 within a
    texel (~0.003 here, a gradient of ~300); the ramp must be much gentler.
    """
    from scipy import ndimage

    rgb, mask, recon, mesh = blob
    photo = ImageInput(np.tile((RED * 255).astype(np.uint8), mask.shape + (1,)), mask)
    views = flat_views(mesh, BLUE)
    size = 512
    tex, stats = bake.bake_texture(mesh, views, settings(texture_size=size), RASTER, "cpu", 0,
                                   photo=photo, source_camera=recon.source_camera)
    u = rz.rasterize_uv(RASTER, mesh, size)
    chart = ndimage.binary_erosion(u.tri_id[0] >= 0, iterations=1)
    pos = rz.interpolate(u, mesh, mesh.vertices)[0]
    img = tex.image.astype(np.float32) / 255.0
    t = ((img - BLUE) @ (RED - BLUE)) / float((RED - BLUE) @ (RED - BLUE))
    assert (t[chart] > 0.95).mean() > 0.2 and (t[chart] < 0.05).mean() > 0.2, \
        "both the photo and the views must own part of the surface"
    worst = 0.0
    for axis in (0, 1):
        dt = np.abs(np.diff(t, axis=axis))
        dp = np.linalg.norm(np.diff(pos, axis=axis), axis=-1)
        both = np.take(chart, range(size - 1), axis=axis) & np.take(chart, range(1, size), axis=axis)
        worst = max(worst, float((dt / np.maximum(dp, 1e-6))[both].max()))
    assert worst < SEAM_TOLERANCE, worst


SEAM_TOLERANCE = 100.0   # blue->red fraction per unit of surface (object size 1): ramps >= 1 % of it


# --------------------------------------------------------------------------- speckle

def fine_views(mesh: Mesh, count: int = 6, res: int = 96) -> Views:
    """Views of ``mesh`` textured with a pattern finer than the views resolve."""
    size = 256
    yy, xx = np.mgrid[0:size, 0:size]
    pattern = (0.5 + 0.35 * np.sin(xx * 1.3) * np.cos(yy * 1.7))[..., None] * np.array([1.0, 0.8, 0.6])
    texture = Texture(image=np.clip(pattern * 255, 0, 255).astype(np.uint8), seen=np.ones((size, size), bool))
    cams = sphere_cameras(count, 2.4, 40.0, res)
    rgb, covered = bake.render_textured(mesh, texture, cams, RASTER)
    return Views(rgb=rgb.astype(np.float32), alpha=covered.astype(np.float32), cameras=cams)


def speckle(tex: Texture, mesh: Mesh) -> float:
    """Mean |texel - median of its 3x3 neighbourhood| inside the charts, in 8-bit levels."""
    from scipy import ndimage

    chart = rz.rasterize_uv(RASTER, mesh, tex.image.shape[0]).tri_id[0] >= 0
    inner = ndimage.binary_erosion(chart, iterations=3)
    img = tex.image.astype(np.float32)
    return float(np.abs(img - ndimage.median_filter(img, size=(3, 3, 1))).mean(-1)[inner].mean())


def test_opt_bake_leaves_no_speckle_in_texels_the_views_do_not_determine(blob, monkeypatch):
    _, _, _, mesh = blob
    views = fine_views(mesh)
    opt = settings(mode="opt", steps=60, lr=0.03, tv_weight=0.02, texture_size=256,
                   photo_projection=False)
    fast_tex, _ = bake.bake_texture(mesh, views, settings(photo_projection=False), RASTER, "cpu", 0)
    opt_tex, stats = bake.bake_texture(mesh, views, opt, RASTER, "cpu", 0)
    assert stats.opt_texture_size < 256
    base = speckle(fast_tex, mesh)
    assert speckle(opt_tex, mesh) < base + 1.5, (speckle(opt_tex, mesh), base)
    # what the opt bake did before: every texel free, Adam random-walks the undetermined ones
    monkeypatch.setattr(bake, "OPT_PIXELS_PER_TEXEL", 0.0)
    old_tex, _ = bake.bake_texture(mesh, views, opt, RASTER, "cpu", 0)
    assert speckle(old_tex, mesh) > base + 3.0, (speckle(old_tex, mesh), base)


# --------------------------------------------------------------------------- texture size: auto

def test_auto_texture_size_follows_the_photo(blob):
    from pipeline.texture.photo_projection import texture_size_for_photo

    _, _, recon, mesh = blob
    small = texture_size_for_photo(mesh, recon.source_camera)
    assert small == 512                                      # a 256 px photo needs little
    larger = texture_size_for_photo(mesh, recon.source_camera.scaled(4.0))
    assert larger >= 4 * small // 2 and larger <= 4096
    assert texture_size_for_photo(mesh, recon.source_camera.scaled(40.0)) == 4096   # capped


def test_texture_size_setting_takes_auto():
    from kiln.settings import SettingsError

    assert load(overrides={"bake.texture_size": "auto"}).bake.texture_size == "auto"
    assert load(overrides={"bake.texture_size": "2048"}).bake.texture_size == 2048
    with pytest.raises(SettingsError, match="texture_size"):
        load(overrides={"bake.texture_size": "big"})
    with pytest.raises(SettingsError, match="power of two"):
        load(overrides={"bake.texture_size": 1000})


def test_grazing_texels_the_camera_sees_glance_and_hidden_ones_do_not():
    """``PhotoProjection.glance``: a texel more grazing than COS_ZERO has no photo weight, but
    where the camera still sees it (depth-tested) it keeps the photo's colour for the bake to
    use before the fill. Negative controls: the same rim hidden behind a box in front of it,
    and the side turned away, get none."""
    import trimesh

    from pipeline.camera.cameras import intrinsics
    from pipeline.texture.photo_projection import COS_ZERO, project_photo

    ball = trimesh.creation.icosphere(subdivisions=4, radius=0.5)
    box = trimesh.creation.box(extents=(0.2, 1.2, 0.1))
    box.apply_translation((0.35, 0.0, 0.9))                 # on the rays to the ball's right rim
    both = trimesh.util.concatenate([ball, box])
    mesh = Mesh(both.vertices.astype(np.float32), both.faces.astype(np.int32),
                uvs=np.zeros((len(both.vertices), 2), np.float32))
    cam = SourceCamera(look_at(np.array([0.0, 0.0, 3.0])), intrinsics(30.0, 256, 256), 256, 256)
    covered = rz.rasterize_views(RASTER, mesh, cam.as_cameras()).tri_id[0] >= 0
    photo = ImageInput(np.tile((RED * 255).astype(np.uint8), (256, 256, 1)), covered)
    on_ball = np.arange(len(ball.faces))
    pos = ball.triangles_center.astype(np.float32)
    nrm = (pos / np.linalg.norm(pos, axis=1, keepdims=True)).astype(np.float32)
    got = project_photo(mesh, on_ball.astype(np.int32), np.full((len(pos), 3), 1 / 3, np.float32), pos, nrm,
                        photo, cam, 256, RASTER, beyond_mask=False)
    to_cam = np.array([0.0, 0.0, 3.0]) - pos
    cos = (nrm * to_cam).sum(1) / np.linalg.norm(to_cam, axis=1)
    grazing = (cos > 0.03) & (cos < COS_ZERO - 0.02) & (np.abs(pos[:, 1]) < 0.3)
    left, right = grazing & (pos[:, 0] < -0.3), grazing & (pos[:, 0] > 0.3)
    away = cos < -0.05
    assert left.sum() > 20 and right.sum() > 20
    assert got.glance is not None and got.glance_colors is not None
    assert (got.weight[left | right] == 0).all()                       # too grazing for the photo's weight
    assert (got.glance[left] > 0.5).mean() > 0.9, got.glance[left]     # ... but seen: a glance, red
    assert np.abs(got.glance_colors[left][got.glance[left] > 0.5] - RED).max() < 0.05
    assert (got.glance[right] == 0).all()                              # hidden behind the box
    assert (got.glance[away] == 0).all()                               # turned away
