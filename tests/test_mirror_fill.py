"""The unseen side (pipeline.texture.symmetry, mirror_fill, surface_fill): a symmetric model's
far side from its mirror image, and each rule's negative control: a lopsided shape, a card with
other pictures on its two sides, mirror_fill off; a fill that stays on its surface (not across
charts, not from an occluder's edge colours: the real SAM 3D bench behind its bag)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kiln.settings import load
from pipeline.backends import resolve_backends
from pipeline.io.mesh_file import MeshFile, read_mesh
from pipeline.raster.rasterize import available_backends
from pipeline.texture.mirror_fill import mirror_fill
from pipeline.texture.model_bake import ModelInputs, bake_model
from pipeline.texture.surface_fill import SurfaceFill
from pipeline.texture.symmetry import SymmetrySearch
from pipeline.types import Mesh, Texture
from raster_helpers import gl_context
import unseen_scenes as scenes

needs_gl = pytest.mark.skipif("moderngl" not in available_backends(), reason="no EGL OpenGL context on this machine")
HUMAN = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "sam3d-human-object"


@pytest.fixture(scope="module")
def duck():
    return scenes.duck(256)


@pytest.fixture(scope="module")
def lopsided():
    return scenes.duck(256, lopsided=True)


def _bake(scene, azimuth: float, tmp_path, **changes):
    cam = scenes.camera(azimuth)
    model = MeshFile(mesh=Mesh(scene.mesh.vertices, scene.mesh.faces, uvs=scene.mesh.uvs), texture=None, format="glb")
    s = load(None, {"bake.texture_size": 256, **changes})
    out = bake_model(ModelInputs(model=model, photo=scenes.photo(scene, cam), camera=cam, keep_uvs=True), s,
                     resolve_backends(s), tmp_path, gl_context())
    baked = read_mesh(out.glb_path)
    return Texture(baked.texture, np.ones(baked.texture.shape[:2], bool)), out.stats.bake


# ----------------------------------------------------------------------------- the plane


@needs_gl
def test_the_plane_of_a_symmetric_shape_is_found_and_a_lopsided_one_scores_low(duck, lopsided):
    """Measured: the posed duck 0.997 (its plane within a degree), the lopsided one 0.75."""
    plane = SymmetrySearch().find(duck.mesh.vertices, duck.mesh.faces)
    truth = scenes._posed(np.array([[0.0, 0.0, 1.0]]))[0]
    assert plane is not None and plane.score > 0.95, plane
    assert abs(float(np.dot(plane.normal, truth))) > 0.999 and abs(plane.offset) < 0.01, plane
    other = SymmetrySearch().find(lopsided.mesh.vertices, lopsided.mesh.faces)
    assert other is not None and other.score < 0.85, other


def test_the_picture_must_agree_where_a_photo_sees_both_sides():
    """Unit rules on points: agreeing pairs mirror; disagreeing ones, too few pairs, a low
    score do not."""
    from pipeline.texture.symmetry import MirrorPlane

    rng = np.random.default_rng(0)
    pts = rng.uniform(-1, 1, (6000, 3)).astype(np.float32)
    pts[:, 2] = np.where(pts[:, 2] > 0, 0.5, -0.5)                 # two sheets, mirror images in z
    nrm = np.zeros_like(pts)
    nrm[:, 2] = np.sign(pts[:, 2])
    plane = MirrorPlane(normal=(0.0, 0.0, 1.0), offset=0.0, score=0.99, distance=0.0)
    colours = np.stack([0.5 + 0.3 * np.sin(3 * pts[:, 0]), 0.5 + 0.0 * pts[:, 1], 0.4 + 0 * pts[:, 0]], 1)
    conf = np.ones(len(pts), np.float32)
    conf[(pts[:, 2] < 0) & (pts[:, 0] > 0)] = 0.0                   # a quarter unseen
    got = mirror_fill(pts, nrm, colours.astype(np.float32), conf, plane)
    assert got.used and got.agreement > 0.95 and got.texels_fraction > 0.1
    hole = conf == 0
    assert np.abs(got.colors[hole & (got.weight > 0.9)] - colours[hole & (got.weight > 0.9)]).max() < 0.05
    # the other side carries another picture: refused, saying so
    other = colours.copy()
    other[pts[:, 2] < 0] = [0.1, 0.2, 0.9]
    refused = mirror_fill(pts, nrm, other.astype(np.float32), conf, plane)
    assert not refused.used and "pictures differ" in refused.why and not refused.weight.any()
    # only one side seen: nothing confirms the picture
    one = np.where(pts[:, 2] > 0, 1.0, 0.0).astype(np.float32)
    assert "no photo sees both sides" in mirror_fill(pts, nrm, colours.astype(np.float32), one, plane).why
    weak = MirrorPlane(normal=(0.0, 0.0, 1.0), offset=0.0, score=0.6, distance=0.0)
    assert "not mirror-symmetric enough" in mirror_fill(pts, nrm, colours.astype(np.float32), conf, weak).why


# ----------------------------------------------------------------------------- the bake


@needs_gl
def test_the_far_side_of_a_symmetric_model_comes_from_its_mirror(duck, tmp_path):
    """One photo from the left-front: the right side (unseen) comes within 3 dB of the left's
    own view (issue 34's target; 0.5 dB apart at texture 256 when the mirror reads the photo at
    each mirror image, 5.1 dB when it copied the nearest seen texel's colour); with mirror_fill
    off it does not (the negative control)."""
    tex, stats = _bake(duck, 45.0, tmp_path)
    assert stats.texels_from["mirror"] > 0.15, stats.texels_from
    near = scenes.view_psnr(duck, tex, scenes.camera(45.0))
    far = scenes.view_psnr(duck, tex, scenes.camera(135.0))     # the mirror image of the photo's view
    assert far >= near - 3.0, (near, far)
    off, off_stats = _bake(duck, 45.0, tmp_path / "off", **{"bake.mirror_fill": "off"})
    assert off_stats.texels_from["mirror"] == 0
    assert scenes.view_psnr(duck, off, scenes.camera(135.0)) < far - 3.0


@needs_gl
def test_a_lopsided_model_gets_no_mirror(lopsided, tmp_path):
    _, stats = _bake(lopsided, 45.0, tmp_path)
    assert stats.texels_from["mirror"] == 0, stats.texels_from


@needs_gl
def test_a_card_seen_from_the_front_gets_no_mirrored_text_on_its_back(tmp_path):
    card = scenes.card(256)
    tex, stats = _bake(card, 30.0, tmp_path)
    assert stats.texels_from["mirror"] == 0, stats.texels_from
    # the back, seen square on, is a smooth fill: none of the front's dark strokes
    back = scenes.camera(180.0)
    from pipeline.texture.bake import render_textured

    rgb, covered = render_textured(card.mesh, tex, back.as_cameras(), gl_context())
    lum = rgb[0][covered[0]].mean(axis=1)
    assert lum.min() > 0.3, lum.min()


@needs_gl
def test_the_fill_stays_on_its_surface_and_is_smooth(duck, tmp_path):
    """No photo at all on the far side of the lopsided-free duck with the mirror off: its
    unseen texels are smooth (no speckle, no streaks: small texel-to-texel steps inside
    charts) and take the body's colours, not the beak's orange dragged across charts."""
    tex, stats = _bake(duck, 45.0, tmp_path, **{"bake.mirror_fill": "off"})
    assert stats.texels_from["fill"] > 0.4
    far = scenes.view_psnr(duck, tex, scenes.camera(-90.0))
    assert far > 20.0, far          # 12-13 dB with the texture-space fill
    from pipeline.raster import rasterize as rz

    chart = np.asarray(rz.rasterize_uv(gl_context(), duck.mesh, 256).tri_id[0]) >= 0
    img = tex.image.astype(np.float64) / 255.0
    both = chart[:, 1:] & chart[:, :-1]
    step = np.abs(img[:, 1:] - img[:, :-1]).max(axis=2)[both]
    assert np.percentile(step, 99) < 0.2


def test_the_surface_fill_does_not_cross_a_thin_part():
    """A thin plate's two faces share voxels but face away from each other: the top's colour
    does not reach the bottom through the plate; it goes round the rim, smoothly."""
    rng = np.random.default_rng(1)
    top = np.c_[rng.uniform(-1, 1, (4000, 2)), np.full(4000, 0.01)]
    bottom = np.c_[rng.uniform(-1, 1, (4000, 2)), np.full(4000, -0.01)]
    pos = np.concatenate([top, bottom]).astype(np.float32)
    nrm = np.zeros_like(pos)
    nrm[:4000, 2], nrm[4000:, 2] = 1.0, -1.0
    colours = np.zeros((8000, 3), np.float32)
    colours[:4000] = np.where((top[:, 0] > 0)[:, None], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0])
    trust = np.r_[np.ones(4000), np.zeros(4000)].astype(np.float32)
    holes = trust == 0
    out = SurfaceFill(cells=64).fill(pos, nrm, colours, trust, holes)
    # with no rim joining them, the bottom is a part no colour reaches: the mean of all
    assert np.allclose(out, out.mean(axis=0), atol=1e-3)
    assert np.allclose(out.mean(axis=0), colours[:4000].mean(axis=0), atol=0.05)


# ----------------------------------------------------------------------------- the real bench


@needs_gl
@pytest.mark.skipif(not HUMAN.is_dir(), reason=f"real SAM 3D fixtures missing: {HUMAN}")
def test_the_benchs_slats_behind_the_bag_do_not_take_the_bags_colour(tmp_path):
    """SAM 3D's bench with its photo, mask and a camera fitted to the mask (4 s): the bag and the
    skateboard in front are left out of the mask. The texels the camera sees where the mask
    is not (behind them) take the bench's colours, not the bag's hue."""
    from PIL import Image

    from kiln.maskfile import load_mask
    from pipeline.camera.camera_fit import fit_camera
    from pipeline.types import ImageInput

    rgb = np.asarray(Image.open(HUMAN / "image.png").convert("RGB"))
    mask = load_mask(HUMAN / "bench_mask.png", max_pixels=10 ** 8).mask
    model = read_mesh(HUMAN / "bench_sam3d.glb")
    fit = fit_camera(gl_context(), model.mesh, mask, posed=True)
    cam = fit.camera
    s = load(None, {"bake.texture_size": 512, "mesh.simplify_ratio": 0.97, "bake.mirror_fill": "off"})
    out = bake_model(ModelInputs(model=model, photo=ImageInput(rgb, mask), camera=cam, camera_fit=fit,
                                 camera_how="fitted before"), s, resolve_backends(s), tmp_path, gl_context())
    baked = read_mesh(out.glb_path)
    tex = Texture(baked.texture, np.ones(baked.texture.shape[:2], bool))
    from pipeline.texture.bake import render_textured

    got, covered = render_textured(baked.mesh, tex, cam.as_cameras(), gl_context())
    hidden = covered[0] & ~mask
    assert hidden.sum() > 2000, hidden.sum()
    bag_hue = _mean_hue(rgb[hidden] / 255.0)
    bench_hue = _mean_hue(rgb[mask] / 255.0)
    baked_hue = _mean_hue(got[0][hidden])
    # the hidden texels are far from the bag's hue and near the bench's (hues measured ~)
    assert _hue_gap(baked_hue, bag_hue) > 2 * _hue_gap(baked_hue, bench_hue), (baked_hue, bag_hue, bench_hue)


def _mean_hue(rgb: np.ndarray) -> float:
    """Circular mean hue (0-1) of saturated-enough colours (N, 3)."""
    import colorsys

    hsv = np.array([colorsys.rgb_to_hsv(*c) for c in rgb[:: max(1, len(rgb) // 4000)]])
    w = hsv[:, 1] * hsv[:, 2]
    a = 2 * np.pi * hsv[:, 0]
    return float((np.arctan2((w * np.sin(a)).sum(), (w * np.cos(a)).sum()) / (2 * np.pi)) % 1.0)


def _hue_gap(a: float, b: float) -> float:
    d = abs(a - b) % 1.0
    return min(d, 1.0 - d)


def test_kiln_bake_takes_mirror_fill_and_the_report_carries_the_mirror():
    from app.cli.cli import build_parser
    from app.cli.cliargs import settings_from_args
    from kiln.records import BakeStats

    args = build_parser().parse_args(["bake", "--mesh", "m.glb", "-o", "o.glb", "--mirror-fill", "off"])
    assert settings_from_args(args).bake.mirror_fill == "off"
    stats = BakeStats(mode="fast", texels_seen_fraction=1.0, texels_chart_fraction=0.5,
                      mirror={"used": True, "plane": {"normal": [0, 0, 1], "offset": 0.0, "score": 0.99}})
    assert BakeStats.from_dict(stats.to_dict()) == stats
