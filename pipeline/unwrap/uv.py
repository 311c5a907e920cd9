"""UV stage: unwrap a mesh into a texture atlas.

Two unwrappers share one output contract (see ``unwrap``):

* ``kiln`` (default): charts segmented by normal direction over the face graph
  (``pipeline.unwrap.charts``), each flattened by LSCM in one sparse solve
  (``pipeline.unwrap.lscm``), bounding boxes skyline-packed once (``pipeline.unwrap.pack``).
  Every step is a whole-mesh array operation, so the cost grows about linearly
  with the face count; charts that fold (a UV triangle with area <= 0) or overlap
  themselves in the packed atlas are cut in two and flattened again.
* ``xatlas``: the xatlas library, kept for comparison (bench/uv.py); it grows about
  quadratically (~4 s at 11k faces, minutes at 80k on a 2-core machine).

Charts are packed on the texel grid of a ``texture_size`` square texture with
``gutter`` empty texels around each, so bilinear sampling at a chart's edge
never reads another chart and the baker can dilate colours into the gutter.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kiln.limits import MAX_RASTER_SIDE, MIN_TEXTURE_SIZE

from pipeline.types import Mesh, SourceCamera
from pipeline.validate import StageInputError, check_int

PACK_ATTEMPTS = 12
SHRINK = 0.9          # texel density factor per attempt when the charts did not fit
METHODS = ("kiln", "xatlas")
SPLIT_ROUNDS = 8      # halvings of a folding chart before its faces are laid out one by one
OVERLAP_ROUNDS = 4    # re-packs after splitting charts that overlap themselves
DETACH_ROUNDS = 3     # then re-packs after giving still-overlapping faces charts of their own
STRETCH_LIMIT = 1.5     # charts whose area distortion is worse are halved too
MAX_CHART_FACES = 8000  # larger charts are halved before flattening (see _unwrap_kiln)
LONG_CHART = 0.5        # charts longer than this * sqrt(surface area) and ...
THIN_CHART = 8.0        # ... with length^2 > this * their area are halved before flattening


def unwrap(mesh: Mesh, texture_size: int, gutter: int, max_faces: int,
           method: str = "kiln", source_camera: SourceCamera | None = None,
           more_cameras: Sequence[SourceCamera] = ()) -> Mesh:
    """Cut ``mesh`` into charts and pack them into one texture_size x texture_size atlas.

    mesh: vertices (V, 3) float32, faces (F, 3) int32, optional vertex_colors.
    method: "kiln" (linear-time charts + LSCM + skyline packing) or "xatlas".
    Returns a new Mesh whose vertices are split along chart seams:
    vertices (V', 3) float32, faces (F, 3) int32 (same face order),
    vertex_colors (V', 3) float32 carried over (or None), uvs (V', 2) float32 in
    [0, 1] with v = 0 the bottom of the texture; texel (row, col) of the S x S
    texture covers u in [col, col+1) / S and v in (1 - (row+1) / S, 1 - row / S].
    Charts are padded by ``gutter`` texels, so rasterized at texel centres
    two charts are at least 2 * gutter + 1 texels apart and each can be dilated
    by ``gutter`` texels without touching another (tests/test_uv.py checks this).
    source_camera: the photo's camera in the mesh's frame (``Reconstruction.source_camera``);
    with ``kiln``, the faces it sees unoccluded (cos >= ``photo_chart.PHOTO_CHART_COS``) are
    laid out as one block on the photo's pixel grid, 2^-k texels per photo pixel (k = 0
    where the atlas has room) at a whole-texel offset (``pipeline.unwrap.photo_chart``). The block
    keeps ``gutter`` + 1 texels from every other chart; islands inside it keep the photo's
    own spacing (the texels between them hold what the photo shows there). ``xatlas``
    ignores the camera.
    more_cameras: the cameras of a bake's further photos: each face goes to the photo that
    sees it best, and each photo gets a block on its own pixel grid (``photo_chart``).
    """
    if method not in METHODS:
        raise StageInputError(f"unknown unwrap method {method!r}; use one of {', '.join(METHODS)}")
    mesh.validate("mesh", max_faces=max_faces)
    # capability limits (kiln.limits), not the setting's range: kiln.settings checks that
    check_int("texture_size", texture_size, MIN_TEXTURE_SIZE, MAX_RASTER_SIDE)
    if not (isinstance(gutter, (int, np.integer)) and 0 <= gutter <= texture_size // 8):
        raise StageInputError(f"gutter must be an integer in 0..{texture_size // 8} texels for a "
                              f"{texture_size} texture, got {gutter!r}")
    if source_camera is not None:
        source_camera.validate()
    for cam in more_cameras:
        cam.validate()
    if method == "kiln":
        vmap, faces_out, uvs = _unwrap_kiln(mesh, int(texture_size), int(gutter), source_camera,
                                            tuple(more_cameras) if source_camera is not None else ())
    else:
        vmap, faces_out, uvs = _unwrap_xatlas(mesh, int(texture_size), int(gutter))
    uvs = np.clip(uvs, 0.0, 1.0).astype(np.float32)
    vmap = vmap.astype(np.int64)
    return Mesh(
        vertices=np.ascontiguousarray(mesh.vertices[vmap]),
        faces=np.ascontiguousarray(faces_out, dtype=np.int32),
        vertex_colors=None if mesh.vertex_colors is None else np.ascontiguousarray(mesh.vertex_colors[vmap]),
        uvs=np.ascontiguousarray(uvs),
    ).validate("unwrapped mesh")


def _unwrap_kiln(mesh: Mesh, texture_size: int, gutter: int, camera: SourceCamera | None = None,
                 more_cameras: tuple[SourceCamera, ...] = ()):
    """(vertex map (V',), faces (F, 3), uvs (V', 2) float64) from Kiln's own unwrap."""
    from pipeline.unwrap.charts import face_graph
    from pipeline.unwrap.lscm import chart_vertices
    from pipeline.unwrap.photo_chart import photo_chart

    v = mesh.vertices.astype(np.float64)
    f_all = mesh.faces.astype(np.int64)
    whole = face_graph(v, f_all)
    if not whole.areas.sum() > 0:
        raise StageInputError("the mesh has no surface area; nothing to unwrap")
    block = None if camera is None else photo_chart(v, f_all, whole.normals, whole.areas, camera,
                                                     texture_size, gutter, more_cameras)
    if block is None:
        return _unwrap_charts(v, f_all, whole, texture_size, gutter, None)
    rest = np.setdiff1d(np.arange(len(f_all)), block.faces)
    f = f_all[rest]
    vmap_r, corner_r, uvs_r, offset = _unwrap_charts(v, f, face_graph(v, f), texture_size, gutter,
                                                     block.size)
    corner_b, vmap_b, _ = chart_vertices(f_all[block.faces], block.charts(), len(v))
    texels_b = np.zeros((vmap_b.size, 2))
    texels_b[corner_b.ravel()] = block.corner.reshape(-1, 2)
    faces_out = np.empty((len(f_all), 3), np.int64)
    faces_out[rest] = corner_r
    faces_out[block.faces] = corner_b + len(vmap_r)
    uvs = np.concatenate([uvs_r, (texels_b + offset) / texture_size])
    return np.concatenate([vmap_r, vmap_b]), faces_out, uvs


def _unwrap_charts(v, f, graph, texture_size: int, gutter: int, fixed):
    """Charts, LSCM and packing for faces ``f``; with ``fixed`` = (w, h), a block of that
    many texels is packed too and its offset returned as a fourth value."""
    from pipeline.unwrap.charts import connected, segment
    from pipeline.unwrap.lscm import chart_vertices, triangle_local
    from pipeline.unwrap.pack import PackError, pack
    from pipeline.unwrap.uv_metrics import coverage

    if len(f) == 0:
        try:
            placed = pack(np.zeros((0, 2)), np.zeros(0, np.int64), np.zeros(0), texture_size, gutter,
                          fixed=fixed)
        except PackError as e:
            raise StageInputError(f"the photo chart does not fit one {texture_size}x{texture_size} "
                                  f"texture ({e})") from None
        return np.zeros(0, np.int64), np.zeros((0, 3), np.int64), np.zeros((0, 2)), placed.fixed_offset
    charts = segment(graph)
    centroids = v[f].mean(1)
    charts = _bound_charts(v, f, graph, charts, centroids)
    corner_uv = np.zeros((len(f), 3, 2))
    charts = _flatten_charts(v, f, graph, charts, centroids, corner_uv, np.ones(len(f), bool))
    for round_ in range(OVERLAP_ROUNDS + DETACH_ROUNDS + 1):
        corner, cv_vertex, cv_chart = chart_vertices(f, charts, len(v))
        uv = np.zeros((cv_vertex.size, 2))
        uv[corner.ravel()] = corner_uv.reshape(-1, 2)
        area = np.bincount(charts, graph.areas, minlength=int(charts.max()) + 1)
        try:
            placed = pack(uv, cv_chart, area, texture_size, gutter, fixed=fixed)
        except PackError as e:
            raise StageInputError(f"UV charts do not fit into one {texture_size}x{texture_size} "
                                  f"texture with a {gutter}-texel gutter ({e}); lower bake.gutter "
                                  "or raise bake.texture_size") from None
        uvs = placed.texels / texture_size
        if round_ == OVERLAP_ROUNDS + DETACH_ROUNDS:
            break
        # Charts cannot overlap each other (their padded boxes are disjoint), but a
        # chart can overlap itself: where its border curls round, or around a spiky
        # vertex whose triangles wrap more than a full turn without any of them folding.
        over = coverage(uvs, corner, texture_size).overlapping_faces()
        if over.size == 0:
            break
        if round_ < OVERLAP_ROUNDS:
            charts = _flatten_charts(v, f, graph, charts, centroids, corner_uv,
                                     np.isin(charts, np.unique(charts[over])), split_first=True)
        else:
            # what still overlaps is local: lay those faces out one by one
            charts = charts.copy()
            charts[over] = charts.max() + 1 + np.arange(over.size)
            corner_uv[over] = triangle_local(v, f[over])
            charts = connected(graph, charts)
    if fixed is not None:
        return cv_vertex, corner, uvs, placed.fixed_offset
    return cv_vertex, corner, uvs


def _bound_charts(v, f, graph, charts, centroids):
    """Halve charts with more than MAX_CHART_FACES faces, and long thin ones, until none is left.

    Factorisation fill-in grows faster than linearly with a chart's size; bounded
    charts keep the LSCM solve linear in the face count. Long thin charts (a handle, a
    leg) would set the texel density of the whole atlas: a chart longer than the atlas
    side at the density the area allows. Those are halved only where they are made of
    much shorter triangles: halving a strip of slivers that run its whole length would
    not shorten it.
    """
    from pipeline.unwrap.charts import chart_length, split_charts

    long_limit = LONG_CHART * np.sqrt(graph.areas.sum())
    tri = v[f]
    edge = np.linalg.norm(tri - np.roll(tri, 1, axis=1), axis=2).max(axis=1)
    for _ in range(32):
        count = np.bincount(charts)
        length = chart_length(graph, charts, centroids)
        area = np.bincount(charts, graph.areas)
        longest_edge = np.zeros(count.size)
        np.maximum.at(longest_edge, charts, edge)
        thin = ((length > long_limit) & (length ** 2 > THIN_CHART * area)
                & (longest_edge < 0.25 * length))
        big = np.flatnonzero((count > MAX_CHART_FACES) | thin)
        if big.size == 0:
            break
        charts = split_charts(graph, charts, big, centroids)
    return charts


def _flatten_charts(v, f, graph, charts, centroids, corner_uv, todo, split_first=False):
    """Flatten the charts of the faces in ``todo`` into ``corner_uv`` (F, 3, 2), splitting
    any that fold; returns the chart ids (changed where charts were split)."""
    from pipeline.unwrap.charts import connected, split_charts
    from pipeline.unwrap.lscm import flatten, triangle_local

    tiny = 1e-12 * graph.areas.sum()
    if split_first:
        charts = split_charts(graph, charts, np.unique(charts[todo]), centroids)
    for round_ in range(SPLIT_ROUNDS + 1):
        sel = np.flatnonzero(todo)
        if sel.size == 0:
            break
        fl = flatten(v, f[sel], charts[sel], graph.normals[sel], graph.areas[sel])
        cuv = fl.uv[fl.corner]
        corner_uv[sel] = cuv
        d1, d2 = cuv[:, 1] - cuv[:, 0], cuv[:, 2] - cuv[:, 0]
        signed = d1[:, 0] * d2[:, 1] - d1[:, 1] * d2[:, 0]
        folded = ~np.isfinite(cuv).all(axis=(1, 2)) | ((signed <= 0) & (graph.areas[sel] > tiny))
        folded |= _wound(cuv, fl.corner, fl.cv_vertex.size)
        bad = np.unique(charts[sel][folded])
        if round_ < SPLIT_ROUNDS:
            bad = np.union1d(bad, _stretched(np.abs(signed), graph.areas[sel], charts[sel]))
        if bad.size == 0:
            break
        todo = np.isin(charts, bad)
        if round_ == SPLIT_ROUNDS and folded.any():
            # last resort: the folded faces become charts of their own, the rest of
            # their charts keep their (unfolded) layout, split into connected pieces
            lone = sel[folded]
            charts = charts.copy()
            charts[lone] = charts.max() + 1 + np.arange(lone.size)
            corner_uv[lone] = triangle_local(v, f[lone])
            charts = connected(graph, charts)
            break
        charts = split_charts(graph, charts, bad, centroids)
    return charts


def _stretched(uv_area: np.ndarray, area: np.ndarray, charts: np.ndarray) -> np.ndarray:
    """Charts whose LSCM map distorts area badly (area-weighted mean of max(r, 1/r) above
    STRETCH_LIMIT, r = a face's share of its chart's UV area / of its surface area):
    LSCM keeps angles, not areas, and a bumpy chart gets texels very unevenly."""
    ids, c = np.unique(charts, return_inverse=True)
    uv_tot = np.bincount(c, uv_area)
    tot = np.bincount(c, area)
    ok = area > 0
    r = np.ones_like(area)
    r[ok] = (uv_area[ok] / np.maximum(uv_tot[c[ok]], 1e-300)) / (area[ok] / tot[c[ok]])
    r = np.clip(r, 1e-6, 1e6)
    score = np.bincount(c, area * np.maximum(r, 1.0 / r)) / np.maximum(tot, 1e-300)
    return ids[score > STRETCH_LIMIT]


def _wound(cuv: np.ndarray, corner: np.ndarray, n: int) -> np.ndarray:
    """(F,) faces around a vertex whose UV corner angles add up to more than a full
    turn: their fan overlaps itself although no triangle is flipped (spiky vertices
    of noisy scans do this)."""
    ang = np.zeros(corner.shape)
    for k in range(3):
        a = cuv[:, (k + 1) % 3] - cuv[:, k]
        b = cuv[:, (k + 2) % 3] - cuv[:, k]
        ang[:, k] = np.abs(np.arctan2(a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0], (a * b).sum(1)))
    total = np.bincount(corner.ravel(), ang.ravel(), minlength=n)
    over = total > 2 * np.pi + 1e-6
    return over[corner].any(axis=1)


def _unwrap_xatlas(mesh: Mesh, texture_size: int, gutter: int):
    """(vertex map, faces, uvs) from xatlas: its charts, re-packed smaller until one atlas holds them."""
    import xatlas

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

    uvs = np.empty((len(vmap), 2), np.float64)
    uvs[:, 0] = texels[:, 0] / texture_size
    # xatlas rows grow downwards like image rows; Kiln's v grows upwards.
    uvs[:, 1] = 1.0 - texels[:, 1] / texture_size
    return vmap, faces_out, uvs


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
