"""A fill that stays on its own surface: colour for the texels no source coloured.

Texture space is the wrong place to fill: a chart's neighbour in the atlas may be any other
part of the object, so a nearest-texel or inpainting fill drags a beak's orange across the
body and stops at every UV seam. Here the fill works on the surface itself:

1. the texels are grouped into cells: a voxel of ``cells`` across the object, split by which
   of the six axis directions the normal faces most, so the two faces of a thin card (or a
   slat's top and underside) are different cells even where they share a voxel;
2. cells in neighbouring voxels whose normals do not point against each other are joined:
   a graph on the surface, across UV seams, that steps around a thin part's edge instead of
   through it;
3. cells holding colour (seen texels, weighted by how far they may be trusted) keep it; the
   others solve Laplace's equation on the graph (a harmonic fill: the smoothest colours that
   meet the known ones, no speckle, no streaks); a part of the surface no colour reaches at
   all takes the mean of every known colour;
4. each texel to fill reads its cell and the cells joined to it, weighted by a Gaussian of
   the distance, so the cells do not show as blocks.

Colours at the photo mask's edge where something in front hid the object are not trusted
(``hidden_edge_trust``): the mask's edge pixels there mix in the occluder (a bag's colour on
a bench's slats), and a fill from them would spread it over everything hidden behind it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import numpy as np

from pipeline.types import Mesh, SourceCamera

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext

# the six directions a cell's normal is binned by
_DIRECTIONS = np.array([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]], np.float64)


@dataclass(frozen=True)
class SurfaceFill:
    """cells:      voxels across the object's largest side (the fill's resolution; the solve
                has about cells^2 unknowns on a closed surface)
    min_texel_cells: a voxel is at least this many texels wide, so each cell holds several
    join_cos:   cells are joined when their normals' cosine is above this (a thin card's two
                faces, at -1, are not; a cube's edge, at 0, is)
    known_weight: a cell holds colour when its texels' trust sums to at least this
    sigma:      the Gaussian that blends cells at a texel, in voxel widths
    edge_texels: within this many texels of a known texel on the surface, a hole takes the
                known texels' own colours (inverse-distance weighted), ramping to the cells'
                fill beyond: the cells are coarser than the texels, and a hole's rim would
                otherwise lose the detail next to it (what inpainting kept inside a chart)
    """

    cells: int = 128
    min_texel_cells: float = 1.5
    join_cos: float = -0.3
    known_weight: float = 1.0
    sigma: float = 0.6
    edge_texels: float = 3.0

    def fill(self, positions: np.ndarray, normals: np.ndarray, colors: np.ndarray, trust: np.ndarray,
             holes: np.ndarray, texel_size: Optional[float] = None) -> np.ndarray:
        """Colours (H, 3) float32 for the texels ``holes`` (N,) bool selects.

        positions, normals: (N, 3) every chart texel's surface point and unit normal
        colors:   (N, 3) float32, their colours where ``trust`` > 0
        trust:    (N,) float32 in [0, 1], how much each texel's colour may be spread (0 for
                  the holes and for colours not to be taken)
        texel_size: a texel's width on the surface (world units), if known
        """
        import scipy.sparse as sp
        from scipy.sparse.csgraph import connected_components
        from scipy.sparse.linalg import spsolve

        h_idx = np.flatnonzero(holes)
        if len(h_idx) == 0:
            return np.zeros((0, 3), np.float32)
        pos = np.asarray(positions, np.float64)
        lo = pos.min(axis=0)
        size = float(np.ptp(pos, axis=0).max()) or 1.0
        voxel = size / self.cells
        if texel_size is not None:
            voxel = max(voxel, self.min_texel_cells * texel_size)
        cell_of, cells = _cells(pos, np.asarray(normals, np.float64), lo, voxel)
        count = len(cells.keys)
        w = np.asarray(trust, np.float64)
        wsum = np.bincount(cell_of, weights=w, minlength=count)
        csum = np.stack([np.bincount(cell_of, weights=w * colors[:, c], minlength=count) for c in range(3)], 1)
        known = wsum >= self.known_weight
        if not known.any():       # too thin a spread to trust any cell: the best there is
            known = wsum > 0
        value = np.zeros((count, 3))
        value[known] = csum[known] / wsum[known][:, None]

        adj = _adjacency(cells, voxel, self.join_cos)
        unknown = ~known
        if unknown.any():
            # parts no known colour reaches: the mean of all known colour, held as known
            ncomp, comp = connected_components(adj, directed=False)
            reached = np.zeros(ncomp, bool)
            reached[comp[known]] = True
            cut = unknown & ~reached[comp]
            if cut.any():
                mean = (csum[known].sum(0) / max(wsum[known].sum(), 1e-12)) if known.any() else np.full(3, 0.5)
                value[cut] = mean
                unknown &= ~cut
                known = ~unknown
        if unknown.any():
            u = np.flatnonzero(unknown)
            k = np.flatnonzero(known)
            deg = np.asarray(adj.sum(axis=1)).ravel()
            lap = sp.diags(deg) - adj
            a = lap[u][:, u].tocsc()
            b = adj[u][:, k] @ value[k]       # L_uu x_u = A_uk x_k: each unknown the mean of its neighbours
            value[u] = np.asarray(spsolve(a, b)).reshape(len(u), 3)
        value = np.clip(value, 0.0, 1.0)
        nrm = np.asarray(normals, np.float64)
        out = _blend_at(pos[h_idx], nrm[h_idx], cell_of[h_idx], cells, adj, value, voxel * self.sigma)
        if texel_size is not None:
            _keep_edges(out, pos, nrm, np.asarray(colors, np.float64), w, h_idx, self.edge_texels * texel_size)
        return out.astype(np.float32)


@dataclass(frozen=True)
class _Cells:
    keys: np.ndarray      # (C,) int64 sorted: voxel key * 6 + direction
    centroid: np.ndarray  # (C, 3)
    normal: np.ndarray    # (C, 3) unit mean normal
    voxel: np.ndarray     # (C, 3) int64 voxel coordinates
    dims: np.ndarray      # (3,) voxel grid size (for the keys)


def _cells(pos: np.ndarray, nrm: np.ndarray, lo: np.ndarray, voxel: float) -> tuple[np.ndarray, _Cells]:
    ijk = np.floor((pos - lo) / voxel).astype(np.int64) + 1           # a margin for the neighbours
    dims = ijk.max(axis=0) + 2
    direction = np.argmax(nrm @ _DIRECTIONS.T, axis=1)
    key = ((ijk[:, 0] * dims[1] + ijk[:, 1]) * dims[2] + ijk[:, 2]) * 6 + direction
    keys, cell_of = np.unique(key, return_inverse=True)
    cell_of = cell_of.reshape(-1)
    c = len(keys)
    cnt = np.bincount(cell_of, minlength=c).astype(np.float64)
    centroid = np.stack([np.bincount(cell_of, weights=pos[:, d], minlength=c) for d in range(3)], 1) / cnt[:, None]
    normal = np.stack([np.bincount(cell_of, weights=nrm[:, d], minlength=c) for d in range(3)], 1).astype(np.float64)
    normal = normal / np.maximum(np.linalg.norm(normal, axis=1, keepdims=True), 1e-12)
    vox = keys // 6
    voxel_ijk = np.stack([vox // (dims[1] * dims[2]), (vox // dims[2]) % dims[1], vox % dims[2]], 1)
    return cell_of, _Cells(keys, centroid, normal, voxel_ijk, dims)


def _adjacency(cells: _Cells, voxel: float, join_cos: float):
    """(C, C) symmetric sparse weights: cells in the same or neighbouring voxels (26) whose
    normals' cosine is above ``join_cos``, weighted by the inverse distance of their centroids."""
    import scipy.sparse as sp

    c = len(cells.keys)
    rows, cols = [], []
    dims = cells.dims
    offsets = [(a, b, d) for a in (-1, 0, 1) for b in (-1, 0, 1) for d in (-1, 0, 1)]
    for a, b, d in offsets:
        nb = cells.voxel + np.array([a, b, d])
        vkey = (nb[:, 0] * dims[1] + nb[:, 1]) * dims[2] + nb[:, 2]
        for direction in range(6):
            key = vkey * 6 + direction
            at = np.searchsorted(cells.keys, key)
            at_c = np.minimum(at, c - 1)
            hit = (cells.keys[at_c] == key) & (at_c != np.arange(c))
            rows.append(np.flatnonzero(hit))
            cols.append(at_c[hit])
    r = np.concatenate(rows)
    q = np.concatenate(cols)
    ok = (cells.normal[r] * cells.normal[q]).sum(axis=1) > join_cos
    r, q = r[ok], q[ok]
    dist = np.linalg.norm(cells.centroid[r] - cells.centroid[q], axis=1)
    w = 1.0 / np.maximum(dist, 0.25 * voxel)
    adj = sp.csr_matrix((w, (r, q)), shape=(c, c))
    return ((adj + adj.T) * 0.5).tocsr()


def _blend_at(pos: np.ndarray, nrm: np.ndarray, own: np.ndarray, cells: _Cells, adj, value: np.ndarray,
              sigma: float) -> np.ndarray:
    """(H, 3): per texel, its own cell's and joined cells' values, Gaussian-weighted by the
    distance to their centroids and by how well their normals agree."""
    indptr, indices = adj.indptr, adj.indices
    deg = indptr[own + 1] - indptr[own]
    texel = np.repeat(np.arange(len(own)), deg + 1)
    # each texel's row: its own cell first, then its neighbours
    starts = np.cumsum(np.concatenate([[0], deg[:-1] + 1]))
    cand = np.empty(len(texel), np.int64)
    cand[starts] = own
    rest = np.ones(len(texel), bool)
    rest[starts] = False
    # neighbours of each texel's cell, in CSR order
    nb_pos = np.repeat(indptr[own], deg) + (np.arange(deg.sum()) - np.repeat(np.cumsum(deg) - deg, deg))
    cand[rest] = indices[nb_pos]
    d2 = ((pos[texel] - cells.centroid[cand]) ** 2).sum(axis=1)
    agree = np.clip((nrm[texel] * cells.normal[cand]).sum(axis=1), 0.0, 1.0)
    w = np.exp(-d2 / (2.0 * sigma * sigma)) * (0.05 + agree)
    w[starts] = np.maximum(w[starts], 1e-6)     # never nothing: the own cell stays
    total = np.bincount(texel, weights=w, minlength=len(own))
    out = np.stack([np.bincount(texel, weights=w * value[cand, c], minlength=len(own)) for c in range(3)], 1)
    return out / total[:, None]


def _keep_edges(out: np.ndarray, pos: np.ndarray, nrm: np.ndarray, colors: np.ndarray, w: np.ndarray,
                h_idx: np.ndarray, radius: float, k: int = 6) -> None:
    """Blend, in place, the holes' fill ``out`` (H, 3) towards the inverse-distance mean of the
    trusted known texels within ``radius`` on the surface whose normals face the same way."""
    from scipy.spatial import cKDTree

    src = np.flatnonzero(w > 0.5)
    if len(src) == 0 or radius <= 0:
        return
    dist, j = cKDTree(pos[src]).query(pos[h_idx], k=k, distance_upper_bound=radius, workers=-1)
    near = np.isfinite(dist)
    if not near.any():
        return
    jj = src[np.minimum(j, len(src) - 1)]
    near &= (nrm[jj] * nrm[h_idx][:, None, :]).sum(axis=2) > 0.3
    wt = np.where(near, 1.0 / np.maximum(np.where(near, dist, 1.0), 1e-3 * radius), 0.0)
    total = wt.sum(axis=1)
    has = total > 0
    mean = (wt[..., None] * colors[jj]).sum(axis=1) / np.maximum(total, 1e-12)[:, None]
    closest = np.where(near, dist, np.inf).min(axis=1)
    s = np.clip(closest / radius, 0.0, 1.0)
    alpha = np.where(has, 1.0 - s * s * (3.0 - 2.0 * s), 0.0)[:, None]
    out[:] = out * (1.0 - alpha) + mean * alpha


def hidden_edge_trust(mesh: Mesh, positions: np.ndarray, mask: np.ndarray, camera: SourceCamera,
                      raster_ctx: "RasterContext", band_fraction: float = 0.03,
                      max_side: int = 2048) -> np.ndarray:
    """(N,) float32 in [0, 1]: how far the photo's colour at each texel may be spread by a fill.

    Where the mesh, seen from the photo's camera, runs on past the mask, something in front
    hid it (or the mask left it out): the photo's pixels along that stretch of the mask's edge
    mix in the occluder's colours. Texels projecting within ``band_fraction`` of the object's
    size (in photo pixels) of such pixels get 0 rising smoothly to 1 beyond; everywhere else 1.
    """
    from scipy import ndimage

    from pipeline.raster.rasterize import rasterize_views

    factor = min(1.0, max_side / float(max(camera.width, camera.height)))
    cam = camera.scaled(factor) if factor < 1.0 else camera
    m = mask
    if factor < 1.0:
        import cv2

        m = cv2.resize(mask.astype(np.uint8), (cam.width, cam.height), interpolation=cv2.INTER_NEAREST) > 0
    covered = np.asarray(rasterize_views(raster_ctx, mesh, cam.as_cameras()).tri_id[0]) >= 0
    hidden = covered & ~m
    out = np.ones(len(positions), np.float32)
    if not hidden.any() or not m.any():
        return out
    rows, cols = np.flatnonzero(m.any(axis=1)), np.flatnonzero(m.any(axis=0))
    band = max(3.0, band_fraction * float(max(rows[-1] - rows[0], cols[-1] - cols[0]) + 1))
    dist = ndimage.distance_transform_edt(~hidden)
    px, _ = cam.project(np.asarray(positions, np.float64))
    c = np.clip(np.floor(px[:, 0]).astype(np.int64), 0, cam.width - 1)
    r = np.clip(np.floor(px[:, 1]).astype(np.int64), 0, cam.height - 1)
    inside = (px[:, 0] >= 0) & (px[:, 0] < cam.width) & (px[:, 1] >= 0) & (px[:, 1] < cam.height)
    s = np.clip(dist[r, c] / band, 0.0, 1.0)
    out[inside] = (s * s * (3.0 - 2.0 * s))[inside]
    return out
