"""Chart segmentation for Kiln's own unwrap: cut a mesh into nearly flat, connected pieces.

Every step is a whole-mesh numpy/scipy operation (sorting edges, sparse matrix
products, connected components), so the cost grows about linearly with the face
count, unlike xatlas's chart growing which is what makes it quadratic.

How charts are made:
1. face normals are smoothed over the face graph (a noisy scan would otherwise
   shatter into single-triangle charts);
2. each face picks the closest of the six axis directions, then a few rounds of
   "vote with your neighbours" straighten the borders between directions;
3. connected faces with the same direction form a chart; charts too small to be
   worth their gutter are merged into the neighbour they share the longest border
   with (when that neighbour faces roughly the same way).
Charts whose flattening folds are cut in two by ``split_charts`` and flattened again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Six axis directions: a chart's normals then stay within ~55 degrees of its
# direction, which LSCM flattens with little distortion and (almost) never folds.
DIRECTIONS = np.array([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]], np.float64)
NORMAL_SMOOTHING_ROUNDS = 2
VOTE_ROUNDS = 3
VOTE_WEIGHT = 0.25          # one agreeing neighbour is worth this much of a normal dot product
MIN_DOT = 0.2               # a face never joins a direction more than ~78 degrees off its normal
MERGE_ROUNDS = 4
MIN_CHART_FRACTION = 1.0 / 3000   # charts with less of the surface area than this get merged


@dataclass
class FaceGraph:
    """Faces of a mesh and which pairs of them share an edge.

    normals: (F, 3) float64 unit face normals (0 for degenerate faces)
    areas:   (F,) float64
    pair_a, pair_b: (E,) int64 faces sharing a manifold edge (each pair once)
    pair_len: (E,) float64 length of that edge
    """

    normals: np.ndarray
    areas: np.ndarray
    pair_a: np.ndarray
    pair_b: np.ndarray
    pair_len: np.ndarray

    @property
    def num_faces(self) -> int:
        return int(self.areas.shape[0])

    def adjacency(self, keep: np.ndarray | None = None):
        """Symmetric (F, F) sparse matrix with 1 for adjacent faces (only pairs where ``keep``)."""
        import scipy.sparse as sp

        a, b = self.pair_a, self.pair_b
        if keep is not None:
            a, b = a[keep], b[keep]
        n = self.num_faces
        ones = np.ones(2 * a.size, np.float64)
        return sp.csr_matrix((ones, (np.concatenate([a, b]), np.concatenate([b, a]))), shape=(n, n))


def face_graph(vertices: np.ndarray, faces: np.ndarray) -> FaceGraph:
    """Face normals, areas and edge adjacency. Edges used by anything other than
    exactly two faces (borders, non-manifold fans) do not connect faces: charts
    are cut there."""
    v = vertices.astype(np.float64)
    f = faces.astype(np.int64)
    cross = np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]])
    norm = np.linalg.norm(cross, axis=1)
    areas = 0.5 * norm
    normals = np.divide(cross, norm[:, None], out=np.zeros_like(cross), where=norm[:, None] > 0)

    nf = len(f)
    e0 = np.concatenate([f[:, 0], f[:, 1], f[:, 2]])
    e1 = np.concatenate([f[:, 1], f[:, 2], f[:, 0]])
    lo, hi = np.minimum(e0, e1), np.maximum(e0, e1)
    key = lo * (int(v.shape[0]) + 1) + hi
    order = np.argsort(key, kind="stable")
    ks = key[order]
    starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
    counts = np.diff(np.r_[starts, ks.size])
    two = starts[counts == 2]
    fid = np.tile(np.arange(nf, dtype=np.int64), 3)
    a, b = fid[order[two]], fid[order[two + 1]]
    ok = a != b
    a, b, two = a[ok], b[ok], two[ok]
    ev = order[two]
    length = np.linalg.norm(v[hi[ev]] - v[lo[ev]], axis=1)
    return FaceGraph(normals=normals, areas=areas, pair_a=a, pair_b=b, pair_len=length)


def segment(graph: FaceGraph) -> np.ndarray:
    """(F,) int64 chart id per face, ids 0..C-1, every chart edge-connected."""
    from scipy.sparse.csgraph import connected_components

    adj = graph.adjacency()
    smooth = graph.normals * graph.areas[:, None]
    for _ in range(NORMAL_SMOOTHING_ROUNDS):
        smooth = smooth + adj @ smooth
    length = np.linalg.norm(smooth, axis=1, keepdims=True)
    smooth = np.divide(smooth, length, out=graph.normals.copy(), where=length > 0)

    dots = smooth @ DIRECTIONS.T                             # (F, 6)
    allowed = dots > MIN_DOT
    label = np.argmax(dots, axis=1)
    for _ in range(VOTE_ROUNDS):
        onehot = np.zeros_like(dots)
        onehot[np.arange(label.size), label] = 1.0
        votes = adj @ onehot
        score = np.where(allowed, dots + VOTE_WEIGHT * votes, -np.inf)
        best = np.argmax(score, axis=1)
        label = np.where(np.isfinite(score[np.arange(label.size), best]), best, label)

    same = label[graph.pair_a] == label[graph.pair_b]
    _, charts = connected_components(graph.adjacency(same), directed=False)
    charts = merge_small(graph, charts.astype(np.int64))
    return charts


def _compact(labels: np.ndarray) -> np.ndarray:
    return np.unique(labels, return_inverse=True)[1].astype(np.int64)


def chart_normals(graph: FaceGraph, charts: np.ndarray, n: int) -> np.ndarray:
    """(C, 3) area-weighted mean normal per chart (unit length, 0 when it cancels out)."""
    s = np.zeros((n, 3))
    np.add.at(s, charts, graph.normals * graph.areas[:, None])
    length = np.linalg.norm(s, axis=1, keepdims=True)
    return np.divide(s, length, out=np.zeros_like(s), where=length > 0)


def merge_small(graph: FaceGraph, charts: np.ndarray) -> np.ndarray:
    """Merge charts smaller than MIN_CHART_FRACTION of the area into the neighbour
    they share the longest border with, if it faces within 90 degrees of them."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    total = graph.areas.sum()
    for _ in range(MERGE_ROUNDS):
        n = int(charts.max()) + 1
        area = np.bincount(charts, graph.areas, minlength=n)
        small = area < MIN_CHART_FRACTION * total
        if not small.any():
            break
        ca, cb = charts[graph.pair_a], charts[graph.pair_b]
        cross = ca != cb
        a = np.concatenate([ca[cross], cb[cross]])
        b = np.concatenate([cb[cross], ca[cross]])
        w = np.concatenate([graph.pair_len[cross]] * 2)
        keep = small[a]
        if not keep.any():
            break
        a, b, w = a[keep], b[keep], w[keep]
        # border length per (small chart, neighbour)
        border = sp.coo_matrix((w, (a, b)), shape=(n, n)).tocsr()
        border.sum_duplicates()
        nrm = chart_normals(graph, charts, n)
        coo = border.tocoo()
        facing = np.einsum("ij,ij->i", nrm[coo.row], nrm[coo.col]) > 0.0
        weight = np.where(facing, coo.data, 0.0)
        # per row, the neighbour with the longest (facing) border
        order = np.lexsort((-weight, coo.row))
        rows = coo.row[order]
        first = order[np.r_[True, rows[1:] != rows[:-1]]]
        src, dst = coo.row[first], coo.col[first]
        good = weight[first] > 0
        src, dst = src[good], dst[good]
        if src.size == 0:
            break
        link = sp.coo_matrix((np.ones(src.size), (src, dst)), shape=(n, n))
        _, group = connected_components(link, directed=False)
        charts = _compact(group[charts])
    return charts


def connected(graph: FaceGraph, charts: np.ndarray) -> np.ndarray:
    """Chart ids made compact, with every chart split into its edge-connected pieces."""
    from scipy.sparse.csgraph import connected_components

    same = charts[graph.pair_a] == charts[graph.pair_b]
    return connected_components(graph.adjacency(same), directed=False)[1].astype(np.int64)


def chart_length(graph: FaceGraph, charts: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """(C,) length of every chart along its main axis, from the area-weighted spread of
    its face centres (a uniform strip of length L has variance L^2 / 12 along it)."""
    n = int(charts.max()) + 1
    w = graph.areas + 1e-30
    wsum = np.bincount(charts, w, minlength=n)
    mean = np.stack([np.bincount(charts, w * centroids[:, k], minlength=n) for k in range(3)], 1)
    mean /= np.maximum(wsum, 1e-300)[:, None]  # type: ignore[misc]  # weighted bincount is float64; the stub says intp
    d = centroids - mean[charts]
    cov = np.zeros((n, 3, 3))
    np.add.at(cov, charts, w[:, None, None] * d[:, :, None] * d[:, None, :])
    cov /= np.maximum(wsum, 1e-300)[:, None, None]
    return np.sqrt(12.0 * np.maximum(np.linalg.eigvalsh(cov)[:, -1], 0.0))


def split_charts(graph: FaceGraph, charts: np.ndarray, bad: np.ndarray,
                 centroids: np.ndarray) -> np.ndarray:
    """Cut each chart listed in ``bad`` in two across its longest extent (a plane
    through its area-weighted centre, normal to the main axis of its face centres);
    the pieces are re-split into edge-connected charts. Other charts keep their faces.

    centroids: (F, 3) face centres. Returns new compact chart ids.
    """
    n = int(charts.max()) + 1
    is_bad = np.zeros(n, bool)
    is_bad[bad] = True
    sel = np.flatnonzero(is_bad[charts])
    c = charts[sel]
    w = graph.areas[sel] + 1e-30
    wsum = np.bincount(c, w, minlength=n)
    mean = np.stack([np.bincount(c, w * centroids[sel, k], minlength=n) for k in range(3)], 1)
    mean /= np.maximum(wsum, 1e-300)[:, None]  # type: ignore[misc]  # weighted bincount is float64; the stub says intp
    d = centroids[sel] - mean[c]
    # per-chart 3x3 covariance, its main eigenvector
    cov = np.zeros((n, 3, 3))
    np.add.at(cov, c, w[:, None, None] * d[:, :, None] * d[:, None, :])
    _, vecs = np.linalg.eigh(cov[bad])
    axis = np.zeros((n, 3))
    axis[bad] = vecs[:, :, -1]
    side = (np.einsum("ij,ij->i", d, axis[c]) > 0).astype(np.int64)
    sub = charts * 2
    sub[sel] += side
    return connected(graph, sub)
