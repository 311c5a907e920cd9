"""The camera fit's local refinement: the mesh's outline pulled onto the mask's outline.

Scoring rendered silhouettes by counting pixels is flat between pixel steps, so a search on
it stalls within a pixel or two of the answer, and a pixel is several degrees of rotation at
the search's resolution. This refinement is smooth instead: the mesh's occluding contour (its
edges between a face turned towards the camera and one turned away, plus open edges), kept
where it draws the silhouette's outline, is projected and scored by the mask's signed
distance field at those points (in pixels, bilinear, so sub-pixel). Levenberg-Marquardt over
the 7 pose numbers, with the Jacobian of each point's projection (worked out by hand) and the
field's own gradient. Which edges form the outline depends on the pose: it is found again
(one silhouette render) every few steps.

Each point costs its distance (smoothed near zero), each pixel further than NEAR_PX outside
the mask only OUTSIDE_WEIGHT: the outline's version of the area objective (``camera_fit``),
whose change when the outline moves by a small step is that (covering more of the mask gains
1 a pixel, reaching outside it loses OUTSIDE_WEIGHT a pixel). Near the edge both sides count
the same: there the distances are the mask's own pixel steps, and a discount on one side
would bias the whole outline outwards by a fraction of a pixel. Least squares would let a part that something in
front hides in the photo (far outside the mask) pull the whole fit; a distance pulls with the
same force near or far.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import numpy as np

from pipeline.camera.fit_pose import OUTSIDE_WEIGHT, FitView, Pose
from pipeline.types import Mesh

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext

SPACING_PX = 1.0        # contour edges are sampled about this far apart in the image
NEAR_PX = 2.0           # ... and the same on both sides of the edge within this distance
SMOOTH_PX = 1.0         # the loss is |r| smoothed within about this distance of the edge
STILL_PX = 0.1          # a round that moves no outline point further than this ends the refinement
OUTLINE_PX = 1.5        # a contour point this close to the rendered silhouette's edge draws it
# the largest step one iteration may take in each of the 7 numbers (a trust region: far from
# the answer the outline's correspondences are wrong, and a long step can fly off)
_MAX_STEP = np.array([0.3, 0.3, 0.3, 0.5, 0.2, 0.2, 0.5])


@dataclass(frozen=True)
class MeshEdges:
    """The mesh's edges with the faces on each side (open and non-manifold edges: always
    contour) and its face normals, for finding the occluding contour from any camera."""

    vertices: np.ndarray     # (V, 3) float64
    edges: np.ndarray        # (E, 2) vertex indices of two-faced edges
    sides: np.ndarray        # (E, 2) the faces either side
    open_edges: np.ndarray   # (K, 2) edges with one face, or more than two
    normals: np.ndarray      # (F, 3) unnormalised
    anchors: np.ndarray      # (F, 3) a vertex of each face

    @staticmethod
    def of(mesh: Mesh) -> "MeshEdges":
        v = mesh.vertices.astype(np.float64)
        f = mesh.faces.astype(np.int64)
        e = np.sort(np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]]), axis=1)
        owner = np.tile(np.arange(len(f)), 3)
        uniq, inv, counts = np.unique(e, axis=0, return_inverse=True, return_counts=True)
        inv = inv.reshape(-1)
        order = np.argsort(inv, kind="stable")
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        two = counts == 2
        sides = np.stack([owner[order[first[two]]], owner[order[first[two] + 1]]], axis=1)
        normals = np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]])
        return MeshEdges(v, uniq[two], sides, uniq[~two], normals, v[f[:, 0]])

    def contour_edges(self, eye: np.ndarray) -> np.ndarray:
        """(K, 2) the edges on the occluding contour seen from ``eye`` (world)."""
        facing = np.einsum("fk,fk->f", self.normals, eye - self.anchors) > 0
        turn = facing[self.sides[:, 0]] != facing[self.sides[:, 1]]
        return np.concatenate([self.edges[turn], self.open_edges])


def _sampled(edges: np.ndarray, vertices: np.ndarray, lengths_px: np.ndarray, spacing: float) -> np.ndarray:
    """(N, 3) points along each edge, about ``spacing`` pixels apart in the image, ends included."""
    n = np.maximum(np.ceil(lengths_px / spacing).astype(np.int64), 1)
    k = np.repeat(np.arange(len(edges)), n + 1)
    # the position of each point along its edge: 0, 1/n, ..., 1
    start = np.repeat(np.cumsum(n + 1) - (n + 1), n + 1)
    t = (np.arange(len(k)) - start) / np.repeat(n, n + 1)
    a, b = vertices[edges[k, 0]], vertices[edges[k, 1]]
    return a + (b - a) * t[:, None]


def filled(binary: np.ndarray) -> np.ndarray:
    """(H, W) bool with its holes (background out of reach of the image's border) filled."""
    import cv2

    pad = np.pad(binary.astype(np.uint8), 1)
    flood = np.zeros((pad.shape[0] + 2, pad.shape[1] + 2), np.uint8)
    cv2.floodFill(pad, flood, (0, 0), 2)
    return (pad != 2)[1:-1, 1:-1]


class MaskField:
    """The mask's signed distance (pixels, > 0 outside) and its gradient, sampled bilinearly.
    Holes are filled: the outline refinement matches outer outlines only (see ``_outline``)."""

    def __init__(self, view: FitView):
        import cv2

        m = filled(view.mask).astype(np.uint8)
        inside = cv2.distanceTransform(m, cv2.DIST_L2, cv2.DIST_MASK_PRECISE)
        outside = cv2.distanceTransform(1 - m, cv2.DIST_L2, cv2.DIST_MASK_PRECISE)
        # pixel centres next to the edge are half a pixel from it
        self.sdf = np.where(m > 0, 0.5 - inside, outside - 0.5).astype(np.float32)
        self.gy: np.ndarray = np.gradient(self.sdf, axis=0)
        self.gx: np.ndarray = np.gradient(self.sdf, axis=1)
        self.view = view

    def sample(self, px: np.ndarray, gradient: bool = True) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """(N, 2) pixel positions -> ((N,) signed distances, (N, 2) gradients or None without
        ``gradient``), clamped to the image's edge (points beyond the frame are left out before)."""
        h, w = self.sdf.shape
        x = np.clip(px[:, 0] - 0.5, 0.0, w - 1.0)
        y = np.clip(px[:, 1] - 0.5, 0.0, h - 1.0)
        x0 = np.minimum(x.astype(np.int64), max(w - 2, 0))
        y0 = np.minimum(y.astype(np.int64), max(h - 2, 0))
        x1, y1 = np.minimum(x0 + 1, w - 1), np.minimum(y0 + 1, h - 1)
        fx, fy = x - x0, y - y0

        def bil(a):
            return ((a[y0, x0] * (1 - fx) + a[y0, x1] * fx) * (1 - fy)
                    + (a[y1, x0] * (1 - fx) + a[y1, x1] * fx) * fy)

        return bil(self.sdf), np.stack([bil(self.gx), bil(self.gy)], axis=1) if gradient else None


def _outline(ctx: "RasterContext", mesh: Mesh, edges: MeshEdges, view: FitView, drawn: FitView,
             pose: Pose) -> np.ndarray:
    """The contour points that draw the silhouette's outer outline from ``pose`` (the rest lie
    inside the silhouette, hidden behind nearer parts). Holes do not count: a model's gaps
    (between a bench's slats) are often filled in a mask, and their edges would pull the fit
    towards the mask's nearest edge; the area objective that compares candidates sees them."""
    import cv2

    vm, _ = pose.matrices(view.centre, view.w, view.h)
    eye = -vm[:3, :3].T @ vm[:3, 3]
    edges_on = edges.contour_edges(eye)
    if not len(edges_on):
        return np.zeros((0, 3))
    ends = pose.project(edges.vertices[edges_on.reshape(-1)], view.centre, view.w, view.h).reshape(-1, 2, 2)
    pts = _sampled(edges_on, edges.vertices, np.linalg.norm(ends[:, 1] - ends[:, 0], axis=1), SPACING_PX)
    # beyond the photo's frame the mask says nothing: the object may go on there
    px = pose.project(pts, view.centre, view.w, view.h)
    pts = pts[(px[:, 0] >= 0) & (px[:, 0] < view.w) & (px[:, 1] >= 0) & (px[:, 1] < view.h)]
    # the silhouette drawn at ``drawn``'s resolution (at most the field's): finer costs more
    # than it tells
    sil = filled(drawn.silhouettes(ctx, mesh, [pose])[0]).astype(np.uint8)
    depth_in = cv2.distanceTransform(sil, cv2.DIST_L2, cv2.DIST_MASK_PRECISE)
    px = pose.project(pts, drawn.centre, drawn.w, drawn.h)
    ix = np.clip(px[:, 0].astype(np.int64), 0, drawn.w - 1)
    iy = np.clip(px[:, 1].astype(np.int64), 0, drawn.h - 1)
    return pts[depth_in[iy, ix] <= OUTLINE_PX]


def _loss(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each point's cost and its IRLS weight: a smoothed |r|, and beyond NEAR_PX outside the
    mask only OUTSIDE_WEIGHT for each further pixel."""
    s = np.sqrt(r * r + SMOOTH_PX * SMOOTH_PX)
    s_near = np.sqrt(NEAR_PX * NEAR_PX + SMOOTH_PX * SMOOTH_PX)
    far = r > NEAR_PX
    cost = np.where(far, s_near + OUTSIDE_WEIGHT * (s - s_near), s) - SMOOTH_PX
    return cost, np.where(far, OUTSIDE_WEIGHT, 1.0) / s


def _residuals(field: MaskField, pose: Pose, pts: np.ndarray):
    """Residuals (pixels), their Jacobian (N, 7), IRLS weights and the cost."""
    view = field.view
    px, jp = pose.project_jacobian(pts, view.centre, view.w, view.h)
    r, g = field.sample(px)
    assert g is not None
    cost, w = _loss(r)
    return r, np.einsum("nk,nkj->nj", g, jp), w, float(cost.sum())


def _cost(field: MaskField, pose: Pose, pts: np.ndarray) -> float:
    view = field.view
    r, _ = field.sample(pose.project(pts, view.centre, view.w, view.h), gradient=False)
    return float(_loss(r)[0].sum())


def refine_outline(ctx: "RasterContext", mesh: Mesh, edges: MeshEdges, view: FitView, pose: Pose,
                   drawn: Optional[FitView] = None, rounds: int = 5, steps: int = 8,
                   held: tuple[int, ...] = ()) -> Pose:
    """Levenberg-Marquardt (on reweighted least squares) on the outline's distances to the
    mask's edge at ``view``'s resolution; the outline found again each round, from a
    silhouette drawn at ``drawn``'s (default: ``view``'s). Stops when a round moves the
    outline by less than STILL_PX. ``held``: which of the 7 numbers (``Pose.moved``'s order)
    stay as they are, e.g. (3,) for the focal length of a known camera."""
    field = MaskField(view)
    drawn = drawn or view
    lam = 1e-2
    for _ in range(rounds):
        lam = min(lam, 1.0)
        pts = _outline(ctx, mesh, edges, view, drawn, pose)
        if len(pts) < 8:
            break
        before = pose.project(pts, view.centre, view.w, view.h)
        moved_any = False
        for _ in range(steps):
            r, J, w, cost = _residuals(field, pose, pts)
            A = J.T @ (w[:, None] * J)
            b = J.T @ (w * r)
            for k in held:   # a held number's row and column say "no step"
                A[k, :], A[:, k], A[k, k], b[k] = 0.0, 0.0, 1.0, 0.0
            D = np.diag(np.maximum(np.diag(A), 1e-9))
            improved = False
            while lam < 1e6:
                delta = -np.linalg.solve(A + lam * D, b)
                if not np.isfinite(delta).all() or (np.abs(delta) > _MAX_STEP).any():
                    lam *= 4.0
                    continue
                trial = pose.moved(delta)
                if _cost(field, trial, pts) < cost:
                    pose, lam, improved = trial, max(lam / 3.0, 1e-6), True
                    break
                lam *= 4.0
            if not improved:
                break
            moved_any = True
        if not moved_any:
            break
        if np.abs(pose.project(pts, view.centre, view.w, view.h) - before).max() < STILL_PX:
            break
    return pose
