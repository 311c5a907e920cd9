"""UV stage: unwrap a mesh into a texture atlas with xatlas.

Charts are packed on the texel grid of a ``texture_size`` square texture with
``gutter`` empty texels around each, so bilinear sampling at a chart's edge
never reads another chart and the baker can dilate colours into the gutter.
"""

from __future__ import annotations

import numpy as np

from .types import Mesh
from .validate import StageInputError

PACK_ATTEMPTS = 12
SHRINK = 0.9          # texel density factor per attempt when the charts did not fit


def unwrap(mesh: Mesh, texture_size: int, gutter: int, max_faces: int) -> Mesh:
    """Cut ``mesh`` into charts and pack them into one texture_size x texture_size atlas.

    mesh: vertices (V, 3) float32, faces (F, 3) int32, optional vertex_colors.
    Returns a new Mesh whose vertices are split along chart seams:
    vertices (V', 3) float32, faces (F, 3) int32 (same face order),
    vertex_colors (V', 3) float32 carried over (or None), uvs (V', 2) float32 in
    [0, 1] with v = 0 the bottom of the texture; texel (row, col) of the S x S
    texture covers u in [col, col+1) / S and v in (1 - (row+1) / S, 1 - row / S].
    xatlas pads every chart by ``gutter`` texels, so rasterized at texel centres
    two charts are at least 2 * gutter + 1 texels apart and each can be dilated
    by ``gutter`` texels without touching another (tests/test_uv.py checks this).
    """
    import xatlas

    mesh.validate("mesh", max_faces=max_faces)
    if not (isinstance(texture_size, (int, np.integer)) and 16 <= texture_size <= 16384):
        raise StageInputError(f"texture_size must be an integer in 16..16384, got {texture_size!r}")
    if not (isinstance(gutter, (int, np.integer)) and 0 <= gutter <= texture_size // 8):
        raise StageInputError(f"gutter must be an integer in 0..{texture_size // 8} texels for a "
                              f"{texture_size} texture, got {gutter!r}")

    verts = np.ascontiguousarray(mesh.vertices, dtype=np.float32)
    faces = np.ascontiguousarray(mesh.faces, dtype=np.uint32)

    # Pass 1 cuts the charts. With only a resolution given, xatlas guesses a texel
    # density and often produces an atlas somewhat larger than asked for.
    atlas = xatlas.Atlas()
    atlas.add_mesh(verts, faces)
    atlas.generate(xatlas.ChartOptions(), _pack_options(texture_size, gutter, 0.0))
    vmap1, faces1, uv1 = atlas.get_mesh(0)
    if len(faces1) != len(faces):
        raise StageInputError(f"xatlas returned {len(faces1)} faces for {len(faces)}; "
                              "the mesh may be non-manifold or degenerate, clean it first")
    density = float(atlas.texels_per_unit)
    if not density > 0:
        raise StageInputError("xatlas could not estimate a texel density; the mesh has no area")
    if atlas.atlas_count == 1 and atlas.width <= texture_size and atlas.height <= texture_size:
        vmap, faces_out, texels = vmap1, faces1, uv1 * [atlas.width, atlas.height]
    else:
        # Pass 2 re-packs the same charts (taken from pass 1's UVs, cheap: no
        # re-charting) at a fixed resolution, lowering the density until they fit.
        chart_uv = (uv1 * [atlas.width, atlas.height] / density).astype(np.float32)
        scale = density * texture_size / max(atlas.width, atlas.height)
        packed = None
        for _ in range(PACK_ATTEMPTS):
            packed = _repack(verts[vmap1], faces1, chart_uv, texture_size, gutter, scale)
            if packed is not None:
                break
            scale *= SHRINK
        if packed is None:
            raise StageInputError(f"UV charts do not fit into one {texture_size}x{texture_size} "
                                  f"texture with a {gutter}-texel gutter; lower bake.gutter or "
                                  "raise bake.texture_size")
        vmap2, faces_out, texels = packed
        vmap = vmap1[vmap2]

    uvs = np.empty((len(vmap), 2), np.float32)
    uvs[:, 0] = texels[:, 0] / texture_size
    # xatlas rows grow downwards like image rows; Kiln's v grows upwards.
    uvs[:, 1] = 1.0 - texels[:, 1] / texture_size
    uvs = np.clip(uvs, 0.0, 1.0)
    vmap = vmap.astype(np.int64)
    return Mesh(
        vertices=np.ascontiguousarray(mesh.vertices[vmap]),
        faces=np.ascontiguousarray(faces_out, dtype=np.int32),
        vertex_colors=None if mesh.vertex_colors is None else np.ascontiguousarray(mesh.vertex_colors[vmap]),
        uvs=uvs,
    ).validate("unwrapped mesh")


def _pack_options(texture_size: int, gutter: int, texels_per_unit: float):
    import xatlas

    po = xatlas.PackOptions()
    po.resolution = int(texture_size)
    po.padding = int(gutter)
    po.bilinear = True
    po.texels_per_unit = float(texels_per_unit)
    return po


def _repack(verts, faces, chart_uv, texture_size, gutter, density):
    """Pack charts given as UVs (world units) at ``density`` texels per unit.

    Returns (vmapping, faces, texel coordinates) or None when one atlas is not enough.
    """
    import xatlas

    atlas = xatlas.Atlas()
    atlas.add_mesh(np.ascontiguousarray(verts), np.ascontiguousarray(faces), uvs=chart_uv)
    charts = xatlas.ChartOptions()
    charts.use_input_mesh_uvs = True
    atlas.generate(charts, _pack_options(texture_size, gutter, density))
    if atlas.atlas_count != 1:
        return None
    vmap, faces_out, uv = atlas.get_mesh(0)
    return vmap, faces_out, uv * [atlas.width, atlas.height]
