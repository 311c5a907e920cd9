"""The photo chart: the faces the photo sees well, laid out on the photo's own pixel grid.

Photo projection (``photo_projection.py``) colours texels from the photo, but an atlas
laid out by LSCM puts texel centres at arbitrary places relative to the photo's
pixels and at ~1.3-1.6 texels per pixel. The front of the GLB then reaches the
screen through two resamplings (photo -> texture, texture -> screen, the second
with the viewer's trilinear mipmaps reading a level-1 blend at that density), and
1-3 px strokes lose their edges in each: line art came back at 25 dB.

Here the faces the photo's camera sees squarely and unoccluded get UV = their
projection into the photo, scaled by 2^-k (k = 0 whenever the atlas has room), as
one block of the atlas placed at a whole-texel offset. A texel centre then *is* a
photo pixel centre: the bake copies the photo without resampling it, and a viewer
at the photo's camera maps each screen pixel onto one texel centre with a screen
derivative of exactly one texel (level 0, no mipmap blend), so it shows the photo's
own pixels. Seen from anywhere else the block is an ordinary chart whose texel
density follows the photo's (a face at 60 degrees gets half the texels along its
slope, as the photo did).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pipeline.texture.photo_projection import COS_ZERO
from pipeline.types import SourceCamera

# every face the photo colours at all: with 0.5, the faces between cos 0.15 and 0.5 got
# LSCM charts and the front's outer rim its two resamplings back (bricks: -2.4 dB)
PHOTO_CHART_COS = COS_ZERO
BLOCK_SHARE = 0.45          # the block may fill at most this share of the atlas before it is halved
# ... with several photos' blocks: they are most of the surface then (4 photos around: 88 % of
# the texels), and the rows they are laid in leave some of their box empty
MULTI_BLOCK_SHARE = 0.65
MAX_VISIBILITY_SAMPLES = 4_000_000   # depth samples for the occlusion test (the grid coarsens beyond)
MIN_ISLAND_SHARE = 0.02     # islands of the block with less of its area get ordinary charts
DEPTH_TOLERANCE = 1e-4      # relative: a face this much behind another at one sample is hidden


@dataclass
class PhotoChart:
    """faces: (K,) int64 face ids in the block; corner: (K, 3, 2) float64 texel coordinates
    of their corners inside the block (x right, y up, block from (0, 0) to ``size``);
    size: (width, height) whole texels; scale: texels per photo pixel (1, 1/2, ...).
    A photo pixel centre (c + 0.5, r + 0.5) lands on a texel centre of the block."""

    faces: np.ndarray
    corner: np.ndarray
    size: tuple[int, int]
    scale: float
    photo: np.ndarray | None = None     # (K,) int64: whose block each face is in (None: all one photo's)

    def charts(self) -> np.ndarray:
        """(K,) int64 chart ids: one per photo's block (a vertex two blocks share is split)."""
        return np.zeros(len(self.faces), np.int64) if self.photo is None else self.photo


def photo_chart(vertices: np.ndarray, faces: np.ndarray, normals: np.ndarray, areas: np.ndarray,
                camera: SourceCamera, texture_size: int, gutter: int,
                more_cameras: Sequence[SourceCamera] = ()) -> PhotoChart | None:
    """The photo chart of a mesh, or None when no camera sees a face squarely.

    vertices (V, 3), faces (F, 3), normals (F, 3) unit face normals, areas (F,) in the
    cameras' world frame. With ``more_cameras`` (the other photos of a bake), each face goes
    to the photo that sees it best (``cos * pixels per unit length``, as the bake's choice
    of photo: ``pipeline.texture.multi_photo``) and every photo gets a block of its own on
    its own pixel grid, all at one scale; the blocks are laid side by side, ``gutter + 1``
    texels apart and at whole-texel offsets, into the one block returned. A photo's own
    faces are then its own pixels in its own view however many photos there are (one block
    for the first photo alone put the others' colours on the first photo's grid, resampled
    twice: 36.8 -> 32.7 dB in the first photo's own view with 4 photos, bench/allround.py)."""
    v = np.asarray(vertices, np.float64)
    f = np.asarray(faces, np.int64)
    cams = [camera, *more_cameras]
    seen = [_seen_faces(v, f, normals, areas, cam) for cam in cams]
    quality = np.stack([q for _, q in seen])                      # (P, F), 0 where not eligible
    if not (quality > 0).any():
        return None
    owner = np.where(quality.max(0) > 0, quality.argmax(0), -1)
    mine = []
    for i, (px, _) in enumerate(seen):
        chosen = owner == i
        if chosen.any():
            chosen &= _large_islands(f, chosen, areas)
        if chosen.any():
            mine.append((np.flatnonzero(chosen), px))
    if not mine:
        return None
    room = texture_size - 2 * gutter - 2
    scale = 1.0
    while scale > 1.0 / 64:
        made = [_block(px[f[ids]], ids, scale) for ids, px in mine]
        blocks = [b for b in made if b is not None]
        if not blocks:
            return None
        got = _side_by_side(blocks, gutter, room)
        if got is not None:
            w, h = got.size
            share = BLOCK_SHARE if len(blocks) == 1 else MULTI_BLOCK_SHARE
            if w <= room and h <= room and w * h <= share * texture_size ** 2:
                return got
        scale /= 2
    return None


def _seen_faces(v: np.ndarray, f: np.ndarray, normals: np.ndarray, areas: np.ndarray, camera: SourceCamera):
    """((V, 2) pixel coordinates of the vertices, (F,) quality of the camera's view of each
    face: cos * pixels per unit length, 0 where it does not see the face squarely enough
    (cos < PHOTO_CHART_COS) or unoccluded)."""
    px, z = camera.project(v)
    if camera.projection == "orthographic":
        to_cam = np.broadcast_to(-camera.viewmat[2, :3].astype(np.float64), (len(f), 3))
    else:
        R, t = camera.viewmat[:3, :3].astype(np.float64), camera.viewmat[:3, 3].astype(np.float64)
        to_cam = -(R.T @ t) - v[f].mean(1)
        to_cam = to_cam / np.maximum(np.linalg.norm(to_cam, axis=1, keepdims=True), 1e-12)
    cos = np.einsum("ij,ij->i", normals, to_cam)
    in_front = (z[f] > 1e-9).all(1) if camera.projection == "perspective" else np.ones(len(f), bool)
    facing = (cos > 0) & in_front & (areas > 0)
    chosen = facing & (cos >= PHOTO_CHART_COS)
    if chosen.any():
        chosen &= ~_hidden(px, z, f, facing, camera.projection == "perspective")
    fpx = float(min(camera.K[0, 0], camera.K[1, 1]))
    density = np.full(len(f), fpx) if camera.projection == "orthographic" else \
        fpx / np.maximum(z[f].mean(1), 1e-9)
    return px, np.where(chosen, cos * density, 0.0)


def _block(tri: np.ndarray, ids: np.ndarray, scale: float) -> PhotoChart | None:
    """One photo's faces ``ids`` with their corners ``tri`` (K, 3, 2) in its pixels (y down),
    as a block at ``scale`` texels per pixel, or None when all its faces overlap."""
    lo, hi = tri.reshape(-1, 2).min(0), tri.reshape(-1, 2).max(0)
    x0 = np.floor(lo[0] * scale)
    y1 = np.ceil(hi[1] * scale)
    corner = np.empty_like(tri)
    corner[..., 0] = tri[..., 0] * scale - x0
    corner[..., 1] = y1 - tri[..., 1] * scale          # image rows grow down, texel y up
    size = (int(np.ceil(corner[..., 0].max())), int(np.ceil(corner[..., 1].max())))
    # a face hidden between two depth samples can still overlap its occluder at a texel
    # centre of a coarser block: those leave the block for ordinary charts
    keep = ~_overlapping(corner, size)
    if not keep.any():
        return None
    return PhotoChart(faces=ids[keep], corner=corner[keep], size=size, scale=scale)


def _side_by_side(blocks: list[PhotoChart], gutter: int, room: int) -> PhotoChart | None:
    """The blocks in rows (tallest first), ``2 * gutter + 2`` texels apart, each at a
    whole-texel offset, as one block: of the row widths tried (up to ``room``), the one
    whose box fits ``room`` and has the least area (None: none fits)."""
    if len(blocks) == 1:
        return blocks[0]
    gap = 2 * gutter + 2
    order = sorted(range(len(blocks)), key=lambda k: -blocks[k].size[1])
    widths = np.sort([b.size[0] + gap for b in blocks])[::-1]
    best = None
    for limit in sorted({room, *np.cumsum(widths).tolist()}):
        placed, ok = _rows(blocks, order, gap, min(limit, room))
        if not ok:
            continue
        w = max(placed[k][0] + blocks[k].size[0] for k in placed)
        h = max(placed[k][1] + blocks[k].size[1] for k in placed)
        if h <= room and (best is None or w * h < best[0]):
            best = (w * h, placed, (int(w), int(h)))
    if best is None:
        return None
    _, placed, size = best
    faces = np.concatenate([blocks[k].faces for k in range(len(blocks))])
    photo = np.concatenate([np.full(len(blocks[k].faces), k, np.int64) for k in range(len(blocks))])
    corner = np.concatenate([blocks[k].corner + np.array(placed[k], np.float64) for k in range(len(blocks))])
    return PhotoChart(faces=faces, corner=corner, size=size, scale=blocks[0].scale, photo=photo)


def _rows(blocks: list[PhotoChart], order: list[int], gap: int, limit: int) -> tuple[dict, bool]:
    """Shelf placement {block: (x, y)} in rows no wider than ``limit``; False when one block is wider."""
    x = y = row_h = 0
    placed: dict[int, tuple[int, int]] = {}
    for k in order:
        w, h = blocks[k].size
        if w > limit:
            return placed, False
        if x > 0 and x + w > limit:
            x, y, row_h = 0, y + row_h + gap, 0
        placed[k] = (x, y)
        x += w + gap
        row_h = max(row_h, h)
    return placed, True


def _large_islands(f: np.ndarray, chosen: np.ndarray, areas: np.ndarray) -> np.ndarray:
    """(F,) the chosen faces in edge-connected islands with at least MIN_ISLAND_SHARE of
    the chosen area. A face cut off by hidden or grazing neighbours would sit a texel
    from the rest of the block, closer than the gutter keeps charts; it gets an ordinary
    chart instead. Larger islands keep the photo's own spacing: the texels between them
    hold what the photo shows between them."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    ids = np.flatnonzero(chosen)
    sub = f[ids]
    edges = np.sort(np.concatenate([sub[:, [0, 1]], sub[:, [1, 2]], sub[:, [2, 0]]]), axis=1)
    owner = np.tile(np.arange(len(ids)), 3)
    order = np.lexsort((edges[:, 1], edges[:, 0]))
    e, o = edges[order], owner[order]
    same = (e[1:] == e[:-1]).all(1)
    a, b = o[:-1][same], o[1:][same]
    graph = coo_matrix((np.ones(a.size), (a, b)), shape=(len(ids), len(ids)))
    _, label = connected_components(graph, directed=False)
    share = np.bincount(label, areas[ids]) / max(float(areas[ids].sum()), 1e-300)
    keep = np.zeros(len(f), bool)
    keep[ids[share[label] >= MIN_ISLAND_SHARE]] = True
    return keep


def _overlapping(corner: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(K,) faces of a block that share a texel centre with another face of it."""
    from pipeline.unwrap.uv_metrics import coverage

    n = max(size)
    uv = corner.reshape(-1, 2) / n
    cov = coverage(uv, np.arange(uv.shape[0]).reshape(-1, 3), n)
    out = np.zeros(len(corner), bool)
    out[cov.overlapping_faces()] = True
    return out


def _hidden(px: np.ndarray, z: np.ndarray, f: np.ndarray, facing: np.ndarray,
            perspective: bool) -> np.ndarray:
    """(F,) faces some other facing face covers, nearer the camera, at one of their samples.

    Depth-tested at pixel centres (coarser for huge photos), every facing face drawn:
    a closed surface's first hit along a ray is facing. Faces too small to cover a
    sample are tested at their centroid against the sample nearest it."""
    from pipeline.unwrap.uv_metrics import coverage

    sel = np.flatnonzero(facing)
    tri = px[f[sel]]
    lo = tri.reshape(-1, 2).min(0)
    span = float((tri.reshape(-1, 2).max(0) - lo).max()) + 2.0
    step = 1.0
    while (span / step) ** 2 > MAX_VISIBILITY_SAMPLES:
        step *= 2
    n = int(np.ceil(span / step)) + 1
    # coverage() samples texel centres of an n x n grid in uv with v up: place the pixel
    # grid so sample (row, col) sits on pixel centre origin + step * (col + .5, row + .5)
    origin = np.floor(lo) - 1.0
    q = (px - origin) / step
    uv = np.stack([q[:, 0] / n, 1.0 - q[:, 1] / n], 1)
    cov = coverage(uv, f[sel], n)
    hit_f = sel[cov.hit_face]
    row, col = np.divmod(cov.hit_texel, n)
    depth = _depth_at(q, z, f, hit_f, col + 0.5, row + 0.5, perspective)
    nearest = np.full(n * n, np.inf)
    np.minimum.at(nearest, cov.hit_texel, depth)
    hidden = np.zeros(len(f), bool)
    tol = DEPTH_TOLERANCE * max(float(np.abs(z).max()), 1e-12)
    behind = depth > nearest[cov.hit_texel] + tol
    hidden[hit_f[behind]] = True
    # faces without a sample of their own
    sampled = np.zeros(len(f), bool)
    sampled[hit_f] = True
    lone = sel[~sampled[sel]]
    if lone.size:
        c = q[f[lone]].mean(1)
        col_c = np.clip(np.floor(c[:, 0]), 0, n - 1).astype(np.int64)
        row_c = np.clip(np.floor(c[:, 1]), 0, n - 1).astype(np.int64)
        zc = z[f[lone]].mean(1)
        hidden[lone] = zc > nearest[row_c * n + col_c] + tol
    return hidden


def _depth_at(q, z, f, face, x, y, perspective: bool) -> np.ndarray:
    """Camera depth of ``face`` at grid points (x, y): barycentric in the projected
    triangle (1/z interpolates linearly under perspective, z under orthographic)."""
    a, b, c = q[f[face, 0]], q[f[face, 1]], q[f[face, 2]]
    det = (b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (c[:, 0] - a[:, 0]) * (b[:, 1] - a[:, 1])
    det = np.where(np.abs(det) < 1e-300, 1e-300, det)
    w1 = ((x - a[:, 0]) * (c[:, 1] - a[:, 1]) - (c[:, 0] - a[:, 0]) * (y - a[:, 1])) / det
    w2 = ((b[:, 0] - a[:, 0]) * (y - a[:, 1]) - (x - a[:, 0]) * (b[:, 1] - a[:, 1])) / det
    w0 = 1.0 - w1 - w2
    zf = z[f[face]]
    if perspective:
        inv = w0 / zf[:, 0] + w1 / zf[:, 1] + w2 / zf[:, 2]
        return 1.0 / np.maximum(inv, 1e-300)
    return w0 * zf[:, 0] + w1 * zf[:, 1] + w2 * zf[:, 2]
