"""Several photos of one object onto one texture: each texel takes its colour from the photo
that sees it best, the photos levelled so that no edge shows where one hands over to the next.

Each photo is projected as a single photo is (``pipeline.texture.photo_projection``): a colour
and a trust weight per texel, the weight already 0 where the photo's camera does not see the
surface (depth-tested), falling to 0 towards grazing angles, occlusion edges and the mask's
edge. The photos then compete per texel by a quality (the data term of view selection, as in
Waechter et al., "Let There Be Color!", 2014, who use the projected area of a face):

    quality = weight * (photo pixels per unit of surface length) * cos(view angle)

* pixels per unit length, ``f / depth`` (``1 / footprint`` for an orthographic camera): more
  photo pixels per texel is more detail. The texel's own size in the texture is the same for
  every photo, so it drops out of the comparison;
* ``cos``: a square-on view, beyond what it adds in pixels (``f / depth`` alone does not fall
  at grazing angles): an error in the mesh's depth shifts a grazing photo's colour along the
  surface by that error times tan(angle), a square-on photo's hardly at all;
* ``weight``: seen, away from the silhouette's and the occlusions' edges.

The choice is soft: photo i's share of a texel is ``(quality_i / best)^SELECT_SHARPNESS``,
normalised. Every factor is continuous over the surface (the weights are built from 3D
distances and photo positions, not texel neighbourhoods, so across UV seams too), so the
choice is smooth by construction: large patches per photo, no speckle where two photos are
nearly as good, and a narrow hand-over (a few degrees of view angle) where they swap. That
smoothness is what the Potts term of a per-face labelling buys; here it costs no graph cut.

Before blending, the photos' colours are levelled (``pipeline.texture.seam_levelling``): a
gain and an offset per photo and channel, solved globally over the texels two photos share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from pipeline.texture.photo_projection import COS_BAND, COS_ZERO, PhotoProjection
from pipeline.texture.seam_levelling import Levelling, identity, level_photos
from pipeline.types import ImageInput, SourceCamera
from pipeline.validate import StageInputError

SELECT_SHARPNESS = 12.0      # quality ratio exponent: 0.9 of the best keeps 28 % of its share, 0.8 keeps 7 %
CHOSEN_SHARE = 0.5           # a photo "colours" a texel (stats, adjacency) when its share is over this

# texels turned further from a camera than this cannot take its colour, nor anchor its
# view-angle ramp (``photo_projection``: weight 0 beyond COS_ZERO, anchors down to COS_ZERO -
# COS_BAND): they are not projected at all, which halves the work per photo on a closed object
CULL_COS = COS_ZERO - COS_BAND - 0.05

# one photo's projection onto the texels of the given indices (M,) of the bake's N texels
Project = Callable[[ImageInput, SourceCamera, np.ndarray], PhotoProjection]


@dataclass(frozen=True)
class PhotoBlend:
    """How the photos were combined over the N texels: share (P, N) float32 of each photo per
    texel (``selection_shares``) and each photo's ``Levelling``; kept so that other points of
    the surface (a texel's mirror image) can be read from the photos the same way."""

    share: np.ndarray
    levelling: Levelling

    def combine(self, texels: np.ndarray, colors: Sequence[np.ndarray], weights: Sequence[np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray]:
        """Blend the photos' colours (P of (M, 3)) read at M other points, each with the shares
        of the texel given for it in ``texels`` (M,), over the photos whose weight there is
        above 0. Returns colours (M, 3) float32 and (M,) bool: some photo gave a colour."""
        s = self.share[:, texels] * (np.stack(weights) > 0)
        total = s.sum(axis=0)
        ok = total > 0
        out = np.zeros((len(texels), 3), np.float32)
        for i, c in enumerate(colors):
            out += np.where(ok, s[i] / np.maximum(total, 1e-12), 0.0)[:, None] * self.levelling.apply(i, c)
        return out, ok


def project_photos(photos: Sequence[tuple[ImageInput, SourceCamera]], positions: np.ndarray,
                   normals: np.ndarray, project: Project, level: bool = True
                   ) -> tuple[PhotoProjection, list[dict], PhotoBlend]:
    """Project every photo and combine them into one ``PhotoProjection`` of the N texels.

    photos:    (photo, its camera) pairs, P >= 1, each checked by ``project``
    positions: (N, 3) float32 texel surface points; normals: (N, 3) float32 unit normals
    project:   one photo's projection onto some of the N texels, by index
               (``photo_projection.project_photo`` bound to the bake's texels)
    level:     level the photos' colours first (off: the negative control)
    Returns the combined projection (the colour is the photos' levelled colours blended by
    their shares; the weight the largest photo weight, so the hand-over to the splat or the
    fill is each photo's own) and per photo {"texels": share of the N texels where it has the
    largest share, "levelling": its gain and offset}, and the ``PhotoBlend`` that made it.
    """
    if not photos:
        raise StageInputError("no photo to project")
    projs = [_project_facing(project, photo, camera, positions, normals) for photo, camera in photos]
    quality = np.stack([_quality(positions, normals, camera, proj.weight)
                        for (_, camera), proj in zip(photos, projs)])                    # (P, N)
    share = selection_shares(quality)
    chosen = np.where(share.max(axis=0) > CHOSEN_SHARE, share.argmax(axis=0), -1)
    levelling: Levelling = identity(len(projs))
    if level and len(projs) > 1:
        levelling = level_photos([p.colors for p in projs], [p.weight for p in projs], chosen, positions)
    colors = np.zeros_like(projs[0].colors)
    density = np.zeros_like(projs[0].density)
    for i, proj in enumerate(projs):
        colors += share[i][:, None] * levelling.apply(i, proj.colors)
    best = share.argmax(axis=0)
    for i, proj in enumerate(projs):
        density[best == i] = proj.density[best == i]
    weight = np.max(np.stack([p.weight for p in projs]), axis=0).astype(np.float32)
    colors[weight <= 0] = 0.0
    glance, glance_colors = _glances(projs, levelling, positions, normals, [camera for _, camera in photos], weight)
    seen = weight > 0
    n = max(len(weight), 1)
    figures = []
    for i in range(len(projs)):
        mine = seen & (best == i)
        lev = levelling.report(i)
        if len(projs) > 1:   # the median step over the pairs' texels, 0-255, before and after
            lev.update(seam_step_before=levelling.before, seam_step_after=levelling.after)
        figures.append({"texels": round(float(mine.sum()) / n, 4), "levelling": lev})
    return (PhotoProjection(colors.astype(np.float32), weight, density, glance, glance_colors), figures,
            PhotoBlend(share, levelling))


def _glances(projs: Sequence[PhotoProjection], levelling: Levelling, positions: np.ndarray, normals: np.ndarray,
             cameras: Sequence[SourceCamera], weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(glance (N,), colours (N, 3)) where no photo has weight: the least grazing photo's
    glance (``PhotoProjection.glance``), levelled like its weighted colours."""
    n = len(positions)
    glance, out = np.zeros(n, np.float32), np.zeros((n, 3), np.float32)
    seen = [(p.glance, p.glance_colors) for p in projs if p.glance is not None and p.glance_colors is not None]
    if len(seen) < len(projs):
        return glance, out
    score = np.stack([np.where(g > 0, np.clip(_cos(positions, normals, cam), 1e-6, 1.0), 0.0)
                      for (g, _), cam in zip(seen, cameras)])
    score[:, weight > 0] = 0.0
    best = score.argmax(axis=0)
    for i, (g, c) in enumerate(seen):
        mine = (best == i) & (score[i] > 0)
        glance[mine] = g[mine]
        out[mine] = levelling.apply(i, c[mine])
    return glance, out


def _project_facing(project: Project, photo: ImageInput, camera: SourceCamera, positions: np.ndarray,
                    normals: np.ndarray) -> PhotoProjection:
    """``project`` on the texels turned towards the camera (cos > CULL_COS), scattered back to
    all N texels: the same weights and colours as projecting them all, for about half the work."""
    cos = _cos(positions, normals, camera)
    idx = np.flatnonzero(cos > CULL_COS)
    n = len(positions)
    full = PhotoProjection(np.zeros((n, 3), np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32),
                           np.zeros(n, np.float32), np.zeros((n, 3), np.float32))
    if len(idx) == 0:
        return full
    got = project(photo, camera, idx)
    full.colors[idx], full.weight[idx], full.density[idx] = got.colors, got.weight, got.density
    if got.glance is not None and got.glance_colors is not None:
        full.glance[idx], full.glance_colors[idx] = got.glance, got.glance_colors   # type: ignore[index]
    return full


def _cos(positions: np.ndarray, normals: np.ndarray, camera: SourceCamera) -> np.ndarray:
    """(N,) cos of the angle between each texel's normal and the direction to the camera."""
    viewmat = camera.viewmat.astype(np.float64)
    R, t = viewmat[:3, :3], viewmat[:3, 3]
    p = positions.astype(np.float64)
    if camera.projection == "orthographic":
        to_cam = np.broadcast_to(-R[2], p.shape)
    else:
        to_cam = (-R.T @ t) - p
        to_cam = to_cam / np.maximum(np.linalg.norm(to_cam, axis=1, keepdims=True), 1e-12)
    return (normals.astype(np.float64) * to_cam).sum(axis=1)


def selection_shares(quality: np.ndarray) -> np.ndarray:
    """(P, N) float32 shares summing to 1 over the photos that see a texel (0 where none
    does): ``(quality / best)^SELECT_SHARPNESS``, normalised. quality: (P, N) >= 0."""
    best = quality.max(axis=0)
    seen = best > 0
    ratio = np.zeros_like(quality, dtype=np.float64)
    ratio[:, seen] = quality[:, seen] / best[seen]
    s = ratio ** SELECT_SHARPNESS
    total = s.sum(axis=0)
    out = np.zeros_like(s)
    out[:, seen] = s[:, seen] / total[seen]
    return out.astype(np.float32)


def _quality(positions: np.ndarray, normals: np.ndarray, camera: SourceCamera, weight: np.ndarray) -> np.ndarray:
    """(N,) float64 quality of one photo at each texel: weight * pixels per unit length * cos."""
    viewmat = camera.viewmat.astype(np.float64)
    f = float(min(camera.K[0, 0], camera.K[1, 1]))
    if camera.projection == "orthographic":
        density = np.full(len(positions), f)
    else:
        z = positions.astype(np.float64) @ viewmat[2, :3] + viewmat[2, 3]   # OpenCV frame: depth along +z
        density = f / np.maximum(z, 1e-9)
    cos = np.clip(_cos(positions, normals, camera), 0.0, 1.0)
    return np.where(weight > 0, weight * density * cos, 0.0)
