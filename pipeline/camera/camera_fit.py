"""Find the photo's camera for a model that has none, from its silhouette against the mask.

Two cases:

* ``posed``: the mesh already sits in the camera's frame (SAM 3D's meshes, OpenGL axes)
  but its intrinsics were not saved: start from the camera at the origin with a few fields
  of view, each scaled and shifted so the mesh's box lands on the mask's, and refine.
* canonical: the mesh has no pose (TRELLIS, SAM 3D splats' frame, any GLB): a global search
  over yaw and pitch (``fit_search``), then the best few from distinct basins refined, and
  the opposite side of the best.

Refinement moves all 7 degrees of freedom (3 rotations about the mesh's centre, field of
view, 2D shift, image scale: ``fit_pose``) by Levenberg-Marquardt on the mesh's outline
against the mask's signed distance field (``fit_contour``), first at 128 pixels, then at
512; the winner again from other fields of view and small turns (``_Fit.refine_restarts``),
and last at up to 1024. Candidates are compared, and the fit is
reported, by the area objective ``|S & M| / (|M| + 0.3 |S - M|)`` on rendered silhouettes.
A mask shows only what is visible (the bench's mask leaves out the bag and skateboard in
front of it) while the mesh is whole, so a silhouette reaching outside the mask is forgiven
in part (it may be hidden there); plain IoU (weight 1) pulls the fit off to shrink the model
into the visible part. The outline refinement forgives the same way (beyond 2 pixels outside
the mask a pixel costs 0.3). The report still gives IoU, coverage and inside share.

Front against back, and mirror twins, are told apart photometrically (``fit_tiebreak``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Optional

import numpy as np

from pipeline.camera.fit_contour import MeshEdges, refine_outline
from pipeline.camera.fit_pose import FitView, Pose, downscale_mask, focal_share
from pipeline.camera.fit_search import distinct_best, global_search, hull_points, posed_starts
from pipeline.camera.fit_tiebreak import RenderFn, decide, opposite_side
from pipeline.types import Cameras, Mesh, SourceCamera
from pipeline.validate import StageInputError

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext

SEARCH_SIDE = 96          # the mask's longest side during the global search
COARSE_SIDE = 128         # ... during the first refinement of every candidate
FINE_SIDE = 512           # ... during the second
COMPARE_SIDE = 256        # ... when the refined candidates are compared
POLISH_SIDE = 1024        # ... during the winner's last refinement
OUTLINE_SIDE = 256        # the refinement draws silhouettes at most this large to find the outline
REPORT_SIDE = 512         # ... when the final fit is measured (on the whole mesh)
FIT_FACES = 8000          # meshes are decimated to about this many faces for the fit only
GRID_FACES = 1000         # ... and to this many for the global search
RESTART_FOVS_DEG = (15.0, 30.0, 55.0, 90.0)   # diagonal fields of view the winner is refined from too
NUDGE_DEG = 6.0           # ... and turned by this much about the camera's x and y axes
KEEP = 3                  # candidates from distinct basins that go on to the refinement
SAME_DEG = 15.0           # refined candidates closer than this are the same camera (twins lie far apart)


@dataclass(frozen=True)
class CameraFit:
    """A fitted camera (at the photo's size, in the mesh's frame) and how well it fits."""

    camera: SourceCamera
    iou: float
    coverage: float
    inside: float
    objective: float
    seconds: float
    case: str                      # "posed" | "canonical"
    tie_break: Optional[dict] = None

    def report(self) -> dict:
        out = {"source_camera": self.camera.to_dict(), "silhouette_iou": round(self.iou, 4),
               "silhouette_coverage": round(self.coverage, 4), "silhouette_inside": round(self.inside, 4),
               "fit_objective": round(self.objective, 4), "fit_seconds": round(self.seconds, 2),
               "fit_case": self.case}
        if self.tie_break:
            out["tie_break"] = self.tie_break
        return out

    @classmethod
    def from_report(cls, report: "Mapping[str, Any]", camera: SourceCamera) -> "CameraFit":
        """A fit made earlier (its ``report()``, e.g. a fit job's ``camera.json``) with its
        camera as read for this photo; KeyError / TypeError / ValueError for a report that
        lacks the fit's figures."""
        tie = report.get("tie_break")
        return cls(camera=camera, iou=float(report["silhouette_iou"]),
                   coverage=float(report["silhouette_coverage"]), inside=float(report["silhouette_inside"]),
                   objective=float(report.get("fit_objective", 0.0)), seconds=float(report.get("fit_seconds", 0.0)),
                   case=str(report.get("fit_case", "")), tie_break=dict(tie) if tie else None)


def _decimated(mesh: Mesh, faces: int) -> Mesh:
    from pipeline.meshing.mesh_ops import simplify_mesh

    if mesh.num_faces <= faces:
        return mesh
    return simplify_mesh(mesh, ratio=1.0 - faces / mesh.num_faces)


class _Fit:
    """The mesh at the fit's sizes and the mask at the fit's resolutions."""

    def __init__(self, ctx: "RasterContext", mesh: Mesh, mask: np.ndarray, held: tuple[int, ...] = ()):
        self.ctx = ctx
        self.held = held   # pose numbers the refinement keeps (``refine_outline``)
        self.mesh = mesh
        self.small = _decimated(mesh, FIT_FACES)
        self.edges = MeshEdges.of(self.small)
        self.hull = hull_points(self.small)
        v = mesh.vertices.astype(np.float64)
        self.centre = (v.min(0) + v.max(0)) / 2.0
        self.radius = float(np.linalg.norm(v - self.centre, axis=1).max())
        self.mask = mask
        self.views = {side: FitView(mask, side, self.centre)
                      for side in {SEARCH_SIDE, COARSE_SIDE, FINE_SIDE, COMPARE_SIDE, OUTLINE_SIDE, POLISH_SIDE}}

    def refine(self, pose: Pose, sides=(COARSE_SIDE, FINE_SIDE), rounds: int = 5) -> Pose:
        for side in sides:
            pose = self._refined(pose, side, rounds)
        return pose

    def refine_restarts(self, pose: Pose) -> Pose:
        """``pose`` (refined) against itself refined again from each of RESTART_FOVS_DEG and
        turned by NUDGE_DEG about the camera's x and y axes; the best by the area objective
        at FINE_SIDE (perspective is a few pixels). A silhouette tells the field of view only
        through perspective, and a refinement that started far from it can settle where a
        turn of a few degrees makes up for the wrong one; straight outlines (a box seen from
        the side) leave shallow pits a few degrees from the answer."""
        # three rounds each: a restart that is not near the best by then will not win
        tried = ([pose] + [self.refine(p, rounds=3) for p in self.fov_restarts(pose)]
                 + [self.refine(p, sides=(FINE_SIDE,), rounds=3) for p in self.nudged(pose)])
        return max(self.scored(tried, FINE_SIDE), key=lambda t: t[1])[0]

    def nudged(self, pose: Pose) -> list[Pose]:
        turns = [np.array(v) * math.radians(NUDGE_DEG) for v in ((1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0))]
        return self.views[COARSE_SIDE].box_fitted(self.hull, [pose.moved([*t, 0, 0, 0, 0]) for t in turns])

    def _refined(self, pose: Pose, side: int, rounds: int = 5) -> Pose:
        return refine_outline(self.ctx, self.small, self.edges, self.views[side], pose,
                              drawn=self.views[min(side, OUTLINE_SIDE)], rounds=rounds, held=self.held)

    def fov_restarts(self, pose: Pose) -> list[Pose]:
        """``pose`` at each of RESTART_FOVS_DEG (the size in the image kept), box-fitted; fields
        of view within a third of its own are left out."""
        view = self.views[COARSE_SIDE]
        out = [Pose(pose.R, focal_share(fov), pose.u, pose.v, pose.ls - pose.lf + focal_share(fov))
               for fov in RESTART_FOVS_DEG if abs(math.log(fov / pose.fov_deg)) > math.log(1.33)]
        return view.box_fitted(self.hull, out)

    def scored(self, poses: list[Pose], side: int = COMPARE_SIDE) -> list[tuple[Pose, float]]:
        scores = self.views[side].score(self.ctx, self.small, poses)
        return list(zip(poses, (float(s) for s in scores)))


def fit_camera(ctx: "RasterContext", mesh: Mesh, mask: np.ndarray, posed: bool,
               render: Optional[RenderFn] = None, photo: Optional[np.ndarray] = None) -> CameraFit:
    """Fit the camera that shows ``mesh`` as ``mask`` (H, W) bool shows the object.

    posed:  the mesh sits in the camera's frame (OpenGL axes); else a canonical search.
    render, photo: for the front/back tie-break on a canonical mesh, a colour render of the
            model from a camera and the photo (H, W, 3) uint8; without them the silhouette decides.
    """
    t0 = time.perf_counter()
    if not isinstance(mask, np.ndarray) or mask.ndim != 2 or not mask.any():
        raise StageInputError("the mask to fit the camera to is empty (or not a 2D array)")
    if photo is not None and photo.shape[:2] != mask.shape:
        raise StageInputError(f"the photo ({photo.shape[1]}x{photo.shape[0]}) and its mask "
                              f"({mask.shape[1]}x{mask.shape[0]}) differ in size")
    mesh.validate("mesh to fit the camera for")
    mask = mask.astype(bool, copy=False)
    fit = _Fit(ctx, mesh, mask)
    tie = None
    if posed:
        depth = max(float(np.linalg.norm(fit.centre)), 1e-6)
        starts = posed_starts(fit.views[COARSE_SIDE], fit.small.vertices.astype(np.float64), depth)
        best = fit.refine_restarts(max(fit.scored([fit.refine(p) for p in starts]), key=lambda t: t[1])[0])
        case = "posed"
    else:
        coarse = _decimated(fit.small, GRID_FACES)
        found = global_search(ctx, coarse, fit.views[SEARCH_SIDE], fit.radius, KEEP)
        refined = [fit.refine(p) for p, _ in found]
        top = max(fit.scored(refined), key=lambda t: t[1])[0]
        view = fit.views[COARSE_SIDE]
        flipped = view.box_fitted(fit.small.vertices.astype(np.float64), [opposite_side(top)])[0]
        candidates = fit.scored(refined + [fit.refine(flipped)])
        # candidates that converged to the same camera are one candidate
        candidates = distinct_best([p for p, _ in candidates], np.array([s for _, s in candidates]),
                                   len(candidates), apart_deg=SAME_DEG)
        cams = [fit.views[FINE_SIDE].camera(p) for p, _ in candidates]
        chosen, tie = decide(candidates, cams, render, photo, mask)
        best = fit.refine_restarts(candidates[chosen][0])
        case = "canonical"
    best = fit.refine(best, sides=(POLISH_SIDE,))
    return _measure(fit, best, case, tie, t0)


def _measure(fit: _Fit, pose: Pose, case: str, tie: Optional[dict], t0: float) -> CameraFit:
    """The fit's figures on the whole mesh at REPORT_SIDE (not the decimated one it was fitted
    with), the objective at the same resolution."""
    from pipeline.camera.fit_pose import OUTSIDE_WEIGHT
    from pipeline.raster.rasterize import rasterize_silhouettes

    cam = fit.views[FINE_SIDE].camera(pose)
    big = downscale_mask(fit.mask, REPORT_SIDE)
    sx, sy = big.shape[1] / fit.mask.shape[1], big.shape[0] / fit.mask.shape[0]
    K = (np.diag([sx, sy, 1.0]) @ cam.K)[None].astype(np.float32)
    sil = rasterize_silhouettes(fit.ctx, fit.mesh, Cameras(viewmats=cam.viewmat[None], Ks=K,
                                                           width=big.shape[1], height=big.shape[0]))[0]
    both, s_px, m_px = float((sil & big).sum()), float(sil.sum()), float(big.sum())
    return CameraFit(camera=cam, iou=both / max(s_px + m_px - both, 1.0), coverage=both / max(m_px, 1.0),
                     inside=both / max(s_px, 1.0), objective=both / max(m_px + OUTSIDE_WEIGHT * (s_px - both), 1.0),
                     seconds=time.perf_counter() - t0, case=case, tie_break=tie)
