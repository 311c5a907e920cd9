"""Front or back, or the mirror twin: what silhouettes cannot tell, told by colour.

Seen from the opposite side, any object's outline is the mirror image of the one from the
front (exactly without perspective); an object with a mirror plane (a chair, a car) shows the
very same outline from two cameras, the second one reflected through that plane and turned
round. The fit refines every distinct candidate the search kept plus the opposite side of the
best; those whose silhouettes score within ``TIE_MARGIN`` of the best are compared by colour:
a render of the model from each candidate camera against the photo inside the mask (mean
absolute difference, 0..1, lower is better). Without colours the silhouette decides.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

from pipeline.camera.fit_pose import Pose
from pipeline.types import Mesh, SourceCamera

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext

TIE_MARGIN = 0.02

# a colour renderer for the tie-break: camera -> (rgb (H, W, 3) in [0, 1], covered (H, W))
RenderFn = Callable[[SourceCamera], "tuple[np.ndarray, np.ndarray]"]


def opposite_side(pose: Pose) -> Pose:
    """The camera turned half round about its own up axis through the mesh's centre: it sees
    the back, whose outline is the front's mirror image."""
    return Pose(np.diag([-1.0, 1.0, -1.0]) @ pose.R, pose.lf, pose.u, pose.v, pose.ls)


def model_render(ctx: "RasterContext", mesh: Mesh, texture: Optional[np.ndarray] = None,
                 side: int = 256) -> Optional[RenderFn]:
    """The mesh's own colours from a camera: its texture through its UVs when it has both,
    else its vertex colours; None when it has neither. Drawn with at most ``side`` pixels on
    the longest side (colours compared over a mask need no more), then scaled up to the
    photo's size."""
    if texture is not None and mesh.uvs is not None:
        tex = np.asarray(texture, np.float32) / 255.0
        attr = np.asarray(mesh.uvs, np.float32)
    elif mesh.vertex_colors is not None:
        tex, attr = None, np.asarray(mesh.vertex_colors, np.float32)
    else:
        return None

    def render(cam: SourceCamera):
        import cv2

        from pipeline.raster.rasterize import interpolate, rasterize_views
        from pipeline.types import Cameras

        s = min(1.0, side / max(cam.width, cam.height))
        w, h = max(1, round(cam.width * s)), max(1, round(cam.height * s))
        K = np.diag([w / cam.width, h / cam.height, 1.0]) @ cam.K
        raster = rasterize_views(ctx, mesh, Cameras(cam.viewmat[None], K[None].astype(np.float32), w, h))
        values = interpolate(raster, mesh, attr)[0]
        if tex is not None:
            # v = 0 is the texture's bottom row
            th, tw = tex.shape[:2]
            x = np.clip(values[..., 0] * tw - 0.5, 0, tw - 1).astype(np.float32)
            y = np.clip((1.0 - values[..., 1]) * th - 0.5, 0, th - 1).astype(np.float32)
            values = cv2.remap(tex, x, y, cv2.INTER_LINEAR)
        covered = (raster.tri_id[0] >= 0).astype(np.uint8)
        size = (int(cam.width), int(cam.height))
        return (cv2.resize(values, size, interpolation=cv2.INTER_LINEAR),
                cv2.resize(covered, size, interpolation=cv2.INTER_NEAREST) > 0)

    return render


def photo_error(render: RenderFn, cam: SourceCamera, photo: np.ndarray, mask: np.ndarray) -> float:
    """Mean absolute colour difference (0..1) between the render and the photo where the
    render covers the mask; 1 (the worst) where it covers none of it."""
    rgb, covered = render(cam)
    both = covered & mask
    if not both.any():
        return 1.0
    return float(np.abs(rgb[both] - photo[both].astype(np.float32) / 255.0).mean())


def decide(candidates: list[tuple[Pose, float]], cameras: list[SourceCamera], render: Optional[RenderFn],
           photo: Optional[np.ndarray], mask: np.ndarray) -> tuple[int, dict]:
    """Which candidate wins (its index) and the report: silhouette scores of the winner and
    the runner-up (the best of the rest by silhouette, or among the tied by colour) and how
    far round its camera is, and when silhouettes tie, the photo errors of the winner and the
    runner-up and the margin between them."""
    order = sorted(range(len(candidates)), key=lambda i: -candidates[i][1])
    best = order[0]
    tied = [i for i in order if candidates[best][1] - candidates[i][1] <= TIE_MARGIN]
    report: dict = {"candidates": len(candidates), "tied": len(tied)}
    errors: dict[int, float] = {}
    if len(tied) < 2 or render is None or photo is None:
        report["decided_by"] = "silhouette" if len(tied) < 2 else "silhouette (no colours to compare)"
        chosen = best
    else:
        errors = {i: photo_error(render, cameras[i], photo, mask) for i in tied}
        chosen = min(tied, key=lambda i: errors[i])
        others = sorted(errors[i] for i in tied if i != chosen)
        report.update(decided_by="photo", photo_error={"chosen": round(errors[chosen], 4),
                                                       "runner_up": round(others[0], 4)},
                      photo_margin=round(others[0] - errors[chosen], 4))
    rest = [i for i in order if i != chosen]
    if errors:
        rest.sort(key=lambda i: errors.get(i, 2.0))
    report["silhouette"] = {"chosen": round(candidates[chosen][1], 4),
                            "runner_up": round(candidates[rest[0]][1], 4) if rest else None}
    if rest:
        # how far round the runner-up's camera is from the winner's (about 180: the other side)
        R = candidates[chosen][0].R.T @ candidates[rest[0]][0].R
        report["runner_up_turn_deg"] = round(math.degrees(math.acos(np.clip((np.trace(R) - 1.0) / 2.0, -1, 1))), 1)
    return chosen, report
