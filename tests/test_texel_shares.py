"""The bake report's shares of texels by source (``texels_from``) are shares of the
surface's texels: the texels inside the UV charts, the empty atlas and the gutters left
out. A layout that fills half the atlas, seen whole by the photo, is all photo; seen half,
half photo and half fill; never the quarter that counting the atlas would give."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.settings import load
from pipeline.camera.cameras import intrinsics, look_at
from pipeline.raster.rasterize import rasterize_silhouettes
from pipeline.texture.bake import bake_texture
from pipeline.types import ImageInput, Mesh, SourceCamera
from raster_helpers import gl_context

N = 8   # the quad's grid: N x N cells


def _half_atlas_quad() -> Mesh:
    """A unit quad at z = 0 facing +z, its UVs on the left half of the atlas (u < 0.5)."""
    g = np.linspace(-0.5, 0.5, N + 1)
    x, y = np.meshgrid(g, g)
    verts = np.stack([x.ravel(), y.ravel(), np.zeros(x.size)], 1).astype(np.float32)
    idx = np.arange((N + 1) ** 2).reshape(N + 1, N + 1)
    a, b, c, d = idx[:-1, :-1], idx[:-1, 1:], idx[1:, 1:], idx[1:, :-1]
    faces = np.concatenate([np.stack([a, b, c], -1).reshape(-1, 3),
                            np.stack([a, c, d], -1).reshape(-1, 3)]).astype(np.int32)
    uvs = np.stack([(verts[:, 0] + 0.5) * 0.5, verts[:, 1] + 0.5], 1).astype(np.float32)
    return Mesh(vertices=verts, faces=faces, uvs=uvs)


@pytest.mark.parametrize("seen_share", [1.0, 0.5])
def test_texel_shares_are_of_the_charts_not_the_atlas(seen_share):
    mesh = _half_atlas_quad()
    ctx = gl_context()
    cam = SourceCamera(viewmat=look_at((0.0, 0.0, 2.0)), K=intrinsics(40.0, 160, 160), width=160, height=160)
    covered = rasterize_silhouettes(ctx, mesh, cam.as_cameras())[0]
    mask = covered.copy()
    if seen_share < 1:
        cols = np.flatnonzero(covered.any(0))
        mask[:, (cols[0] + cols[-1] + 1) // 2:] = False      # the photo shows the quad's left half
    rgb = np.full((160, 160, 3), (200, 120, 40), np.uint8)
    # the mirror off: a flat quad of one colour is mirror-symmetric in shape and picture, and
    # the mirror (tests/test_mirror_fill.py) would rightly fill the unseen half from the seen one
    settings = load(None, {"bake.texture_size": 256, "bake.mirror_fill": "off"}).bake
    _, stats = bake_texture(mesh, None, settings, ctx, "cpu", 0, photo=ImageInput(rgb=rgb, mask=mask),
                            source_camera=cam, photo_beyond_mask=False)
    shares = stats.texels_from
    assert stats.texels_chart_fraction == pytest.approx(0.5, abs=0.02)     # half the atlas is empty
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3)
    # the photo's weight ramps down over a few texels at the mask's edge: a few percent
    assert shares["photo"] == pytest.approx(seen_share, abs=0.06), shares
    assert shares["fill"] == pytest.approx(1.0 - seen_share, abs=0.06), shares
