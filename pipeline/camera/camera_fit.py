"""Find the photo's camera for a model that has none, from its silhouette against the mask.

Two cases:

* ``posed``: the mesh already sits in the camera's frame (SAM 3D's meshes, OpenGL axes)
  but its intrinsics were not saved: start from the camera at the origin, a focal length
  that matches the mask's size, and refine.
* canonical: the mesh has no pose (TRELLIS, SAM 3D splats' frame, any GLB): a global search
  over yaw and pitch (10 degree steps) and a few fields of view, each silhouette mapped onto
  the mask by its bounding box, then the best few refined.

Refinement moves all 7 degrees of freedom (3 rotations about the mesh's centre, field of
view, 2D shift, scale) by a batched adaptive random search: each generation rasterizes a
population of low-resolution silhouettes in one call.

The objective is coverage-weighted: ``|S & M| / (|M| + OUTSIDE_WEIGHT * |S - M|)``. A mask
shows only what is visible (the bench's mask leaves out the bag and skateboard in front of
it) while the mesh is whole, so a silhouette reaching outside the mask is forgiven in part
(it may be hidden there); plain IoU (weight 1) pulls the fit off to shrink the model into
the visible part. The report still gives IoU, coverage and inside share.

Silhouettes cannot tell front from back (mirror images) on near-symmetric objects: the
two candidates are told apart photometrically (``tie_break``), by the mesh's own colours or
a render of the splat against the photo inside the mask.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

from pipeline.types import Cameras, Mesh, SourceCamera
from pipeline.validate import StageInputError

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext

OUTSIDE_WEIGHT = 0.3      # share of a silhouette pixel outside the mask that counts against the fit
FIT_SIDE = 128            # the mask's longest side during the search
POLISH = ((256, 0.25, 20), (512, 0.08, 8))   # (mask side, step scale, generations) of the last steps
REPORT_SIDE = 512         # ... when the final fit is measured
FIT_FACES = 8000          # meshes are decimated to about this many faces for the fit only
FOVS_DEG = (30.0, 50.0)
YAW_STEP, PITCHES = 10.0, (-40.0, -20.0, 0.0, 20.0, 40.0)
GENERATIONS, POPULATION, KEEP = 30, 24, 2

# a colour renderer for the tie-break: camera -> (rgb (H, W, 3) in [0, 1], covered (H, W))
RenderFn = Callable[[SourceCamera], "tuple[np.ndarray, np.ndarray]"]


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


@dataclass(frozen=True)
class _Pose:
    """7 numbers: rotation about the mesh centre (axis-angle, 3), log focal / image diagonal,
    centre's image position (u, v) as shares of the image, log depth of the centre."""

    x: np.ndarray

    @staticmethod
    def of(rotvec, fov_deg: float, u: float, v: float, depth: float) -> "_Pose":
        lf = math.log(0.5 / math.tan(math.radians(fov_deg) / 2.0))
        return _Pose(np.array([*rotvec, lf, u, v, math.log(depth)], np.float64))


class _Problem:
    """The mesh (decimated), its base rotation, the mask at fit resolution, and cameras from poses."""

    def __init__(self, mesh: Mesh, mask: np.ndarray, base: np.ndarray, side: int):
        self.mesh = mesh
        self.base = base                       # world -> canonical camera rotation before the fit's own
        self.centre = (mesh.vertices.min(0) + mesh.vertices.max(0)).astype(np.float64) / 2.0
        self.radius = float(np.linalg.norm(mesh.vertices - self.centre, axis=1).max())
        self.full = mask.shape
        self.mask = _downscale_mask(mask, side)
        self.h, self.w = self.mask.shape
        self.mask_px = float(self.mask.sum())

    def cameras(self, poses: list[_Pose], w: int, h: int) -> Cameras:
        from scipy.spatial.transform import Rotation

        diag = math.hypot(w, h)
        vms, Ks = [], []
        for p in poses:
            rv, lf, u, v, ld = p.x[:3], p.x[3], p.x[4], p.x[5], p.x[6]
            R = Rotation.from_rotvec(rv).as_matrix() @ self.base
            f, d = math.exp(lf) * diag, math.exp(ld)
            t = np.array([(u - 0.5) * w * d / f, (v - 0.5) * h * d / f, d]) - R @ self.centre
            vm = np.eye(4)
            vm[:3, :3], vm[:3, 3] = R, t
            vms.append(vm)
            Ks.append([[f, 0, w / 2.0], [0, f, h / 2.0], [0, 0, 1]])
        return Cameras(viewmats=np.asarray(vms, np.float32), Ks=np.asarray(Ks, np.float32), width=w, height=h)

    def silhouettes(self, ctx, poses: list[_Pose], w: int, h: int) -> np.ndarray:
        from pipeline.raster.rasterize import rasterize_silhouettes

        return rasterize_silhouettes(ctx, self.mesh, self.cameras(poses, w, h))

    def score(self, ctx, poses: list[_Pose]) -> np.ndarray:
        sil = self.silhouettes(ctx, poses, self.w, self.h)
        both = (sil & self.mask).sum((1, 2))
        outside = (sil & ~self.mask).sum((1, 2))
        return both / (self.mask_px + OUTSIDE_WEIGHT * outside)


def _downscale_mask(mask: np.ndarray, side: int) -> np.ndarray:
    import cv2

    h, w = mask.shape
    s = min(1.0, side / max(h, w))
    if s == 1.0:
        return mask.copy()
    size = (max(1, round(w * s)), max(1, round(h * s)))
    return cv2.resize(mask.astype(np.float32), size, interpolation=cv2.INTER_AREA) >= 0.5


def _decimated(mesh: Mesh) -> Mesh:
    from pipeline.meshing.mesh_ops import simplify_mesh

    if mesh.num_faces <= FIT_FACES:
        return mesh
    return simplify_mesh(mesh, ratio=1.0 - FIT_FACES / mesh.num_faces)


def _mask_box(mask: np.ndarray) -> tuple[float, float, float, float]:
    ys, xs = np.nonzero(mask)
    return xs.min(), ys.min(), xs.max() + 1.0, ys.max() + 1.0


def _refine(ctx, prob: _Problem, start: _Pose, rng, generations: int = GENERATIONS,
            scale: float = 1.0) -> tuple[_Pose, float]:
    """(1, lambda) adaptive random search with the step shrinking when nothing improves."""
    step = scale * np.array([0.08, 0.08, 0.08, 0.08, 0.03, 0.03, 0.06])
    best, best_score = start, float(prob.score(ctx, [start])[0])
    for _ in range(generations):
        trial = [_Pose(best.x + step * rng.standard_normal(7)) for _ in range(POPULATION)]
        scores = prob.score(ctx, trial)
        i = int(np.argmax(scores))
        if scores[i] > best_score:
            best, best_score = trial[i], float(scores[i])
            step *= 1.15
        else:
            step *= 0.7
        if step.max() < 1e-4:
            break
    return best, best_score


def _bbox_fit(prob: _Problem, ctx, poses: list[_Pose]) -> list[_Pose]:
    """Each pose moved and scaled so its silhouette's bounding box (that of the projected
    vertices: no render needed) lands on the mask's."""
    cams = prob.cameras(poses, prob.w, prob.h)
    v = prob.mesh.vertices.astype(np.float64)
    cam_pts = np.einsum("cij,nj->cni", cams.viewmats[:, :3, :3].astype(np.float64), v) \
        + cams.viewmats[:, None, :3, 3]
    z = np.maximum(cam_pts[..., 2], 1e-6)
    px = cam_pts[..., 0] / z * cams.Ks[:, None, 0, 0] + cams.Ks[:, None, 0, 2]
    py = cam_pts[..., 1] / z * cams.Ks[:, None, 1, 1] + cams.Ks[:, None, 1, 2]
    mx0, my0, mx1, my1 = _mask_box(prob.mask)
    out = []
    for i, p in enumerate(poses):
        if not (cam_pts[i, :, 2] > 1e-6).all():
            out.append(p)
            continue
        x0, y0, x1, y1 = px[i].min(), py[i].min(), px[i].max(), py[i].max()
        scale = math.sqrt(((mx1 - mx0) * (my1 - my0)) / max((x1 - x0) * (y1 - y0), 1.0))
        x = p.x.copy()
        x[4] += ((mx0 + mx1) - (x0 + x1)) / 2.0 / prob.w
        x[5] += ((my0 + my1) - (y0 + y1)) / 2.0 / prob.h
        x[6] -= math.log(max(scale, 1e-6))
        out.append(_Pose(x))
    return out


def _start_depth(prob: _Problem, fov_deg: float) -> float:
    """The depth at which the mesh's bounding sphere spans the mask's size."""
    mx0, my0, mx1, my1 = _mask_box(prob.mask)
    share = max((mx1 - mx0) / prob.w, (my1 - my0) / prob.h, 1e-3)
    return prob.radius / math.tan(math.radians(fov_deg) / 2.0) / share


def fit_camera(ctx: "RasterContext", mesh: Mesh, mask: np.ndarray, posed: bool,
               render: Optional[RenderFn] = None, photo: Optional[np.ndarray] = None,
               seed: int = 0) -> CameraFit:
    """Fit the camera that shows ``mesh`` as ``mask`` (H, W) bool shows the object.

    posed:  the mesh sits in the camera's frame (OpenGL axes); else a canonical search.
    render, photo: for the front/back tie-break on a canonical mesh, a colour render of the
            model from a camera and the photo (H, W, 3) uint8; without them the silhouette decides.
    """
    t0 = time.perf_counter()
    if mask.ndim != 2 or not mask.any():
        raise StageInputError("the mask to fit the camera to is empty")
    rng = np.random.default_rng(seed)
    small = _decimated(mesh)
    if posed:
        prob = _Problem(small, mask, np.diag([1.0, -1.0, -1.0]), FIT_SIDE)   # OpenGL -> OpenCV axes
        depth = float(np.linalg.norm(prob.centre))
        mx0, my0, mx1, my1 = _mask_box(prob.mask)
        u, v = (mx0 + mx1) / 2.0 / prob.w, (my0 + my1) / 2.0 / prob.h
        starts = [_bbox_fit(prob, ctx, [_Pose.of((0, 0, 0), fov, u, v, depth)])[0] for fov in FOVS_DEG]
        starts = [p for _, p in sorted(zip(prob.score(ctx, starts), starts), key=lambda t: -t[0])][:KEEP]
        case = "posed"
    else:
        prob = _Problem(small, mask, np.eye(3), FIT_SIDE)
        starts = _global_search(ctx, prob)
        case = "canonical"
    refined = [_refine(ctx, prob, s, rng) for s in starts]
    best, best_score = max(refined, key=lambda t: t[1])
    tie = None
    if not posed:
        best, best_score, tie = _tie_break(ctx, prob, best, best_score, refined, render, photo, rng)
    # the last steps at finer masks: a pixel of the search's mask is several of the photo's
    fine = prob
    for side, scale, generations in POLISH:
        fine = _Problem(small, mask, prob.base, side)
        best, best_score = _refine(ctx, fine, best, rng, generations, scale=scale)
    return _measure(ctx, mesh, mask, fine, best, best_score, case, tie, time.perf_counter() - t0)


def _global_search(ctx, prob: _Problem) -> list[_Pose]:
    from scipy.spatial.transform import Rotation

    poses = []
    for fov in FOVS_DEG:
        depth = _start_depth(prob, fov)
        for pitch in PITCHES:
            for yaw in np.arange(0.0, 360.0, YAW_STEP):
                # the camera looks at the mesh's front (+z) turned by yaw about y, then pitched;
                # a camera at +z looking towards -z, y up, is OpenCV's R = diag(1, -1, -1)
                turn = Rotation.from_euler("xy", [pitch, yaw], degrees=True)
                R = np.diag([1.0, -1.0, -1.0]) @ turn.as_matrix().T
                poses.append(_Pose.of(Rotation.from_matrix(R).as_rotvec(), fov, 0.5, 0.5, depth))
    poses = _bbox_fit(prob, ctx, poses)
    scores = np.concatenate([prob.score(ctx, poses[i:i + 256]) for i in range(0, len(poses), 256)])
    order = np.argsort(-scores)
    return [poses[i] for i in order[:KEEP]]


def _mirror(prob: _Problem, pose: _Pose) -> _Pose:
    """The pose seeing the mesh from the opposite side (a half turn about the view's up axis)."""
    from scipy.spatial.transform import Rotation

    R = Rotation.from_rotvec(pose.x[:3]).as_matrix()
    flipped = Rotation.from_matrix(np.diag([-1.0, 1.0, -1.0]) @ R)   # turn about the camera's y
    x = pose.x.copy()
    x[:3] = flipped.as_rotvec()
    return _Pose(x)


def _tie_break(ctx, prob, best, best_score, refined, render, photo, rng):
    """Refine the opposite side too; when the silhouettes tie (within 0.02), the photometric
    score (mean absolute colour difference inside the mask, lower is better) decides."""
    other, other_score = _refine(ctx, prob, _bbox_fit(prob, ctx, [_mirror(prob, best)])[0], rng)
    tie = {"silhouette": {"chosen": round(best_score, 4), "other_side": round(other_score, 4)}}
    if render is None or photo is None or abs(best_score - other_score) > 0.02:
        tie["decided_by"] = "silhouette"
        if other_score > best_score:
            return other, other_score, tie
        return best, best_score, tie
    cams = [prob_camera(prob, p) for p in (best, other)]
    errors = [_photo_error(render, c, photo, prob.full) for c in cams]
    tie.update(decided_by="photo", photo_error={"chosen": round(min(errors), 4), "other_side": round(max(errors), 4)})
    return (best, best_score, tie) if errors[0] <= errors[1] else (other, other_score, tie)


def prob_camera(prob: _Problem, pose: _Pose) -> SourceCamera:
    h, w = prob.full
    c = prob.cameras([pose], w, h)
    return SourceCamera(viewmat=c.viewmats[0], K=c.Ks[0], width=w, height=h).validate("fitted camera")


def _photo_error(render: RenderFn, cam: SourceCamera, photo: np.ndarray, shape) -> float:
    rgb, covered = render(cam)
    if not covered.any():
        return float("inf")
    return float(np.abs(rgb[covered] - photo[covered] / 255.0).mean())


def _measure(ctx, mesh, mask, prob, pose, score, case, tie, seconds) -> CameraFit:
    from pipeline.raster.rasterize import rasterize_views

    cam = prob_camera(prob, pose)
    big = _downscale_mask(mask, REPORT_SIDE)
    s = big.shape[0] / mask.shape[0]
    small_cam = Cameras(viewmats=cam.viewmat[None], Ks=(np.diag([s, s, 1.0]) @ cam.K)[None].astype(np.float32),
                        width=big.shape[1], height=big.shape[0])
    sil = np.asarray(rasterize_views(ctx, mesh, small_cam).tri_id[0]) >= 0
    both = float((sil & big).sum())
    return CameraFit(camera=cam, iou=both / max(float((sil | big).sum()), 1.0),
                     coverage=both / max(float(big.sum()), 1.0), inside=both / max(float(sil.sum()), 1.0),
                     objective=score, seconds=seconds, case=case, tie_break=tie)
