"""Photo projection: colour the texels the photo's camera sees from the photo itself.

A Gaussian render is a band-limited, gappy copy of the photo; the photo is the
sharpest source Kiln will ever have for the side it shows. ``project_photo``
gives every chart texel a colour read from the photo and a weight in [0, 1]
saying how much to trust it; the bake blends ``weight * photo + (1 - weight) *
multi-view``. The weight is the product of

* visibility: the texel's surface point is the first surface along its pixel's
  ray, tested against the *mesh* rasterized from the source camera (not the
  Gaussians, which are fuzzy and offset from the mesh);
* view angle: 0 where the surface is more grazing than ``COS_ZERO`` (grazing
  texels get few photo pixels spread thin, so the multi-view bake takes over),
  rising to 1 over ``ANGLE_RAMP_WIDTH`` of the object's size of surface;
* distance from occlusion edges in the photo: where one part of the surface
  passes in front of another, the hidden side's texels next to the edge fade
  in over ``FEATHER_FRACTION`` of the object's size, so the photo/multi-view
  transition is a ramp and not a seam. Because the weight is computed from
  3D positions and photo pixels, never from texel neighbourhoods, it is
  continuous across UV chart seams too;
* the mask: texels inside it get full weight; where the mesh runs on past the
  mask's edge, its texels keep the edge's colours with a weight that falls to 0
  over the same width of surface. The ramps are measured in 3D between texels,
  so they are as wide on the surface wherever it turns away from the camera,
  and start exactly where the texels' own normals and photo positions cross.

Colours are read (bicubic) from a pyramid of the photo whose background pixels
take the nearest mask pixel's colour (so the background never bleeds in at the
rim), at the level that matches the
texel's footprint in photo pixels: where the photo is denser than the texture,
each texel gets the area average of the photo pixels it covers, not an
aliased point sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kiln.settings import allowed_range

from pipeline.types import ImageInput, Mesh, SourceCamera
from pipeline.validate import StageInputError, check_array, check_finite
from pipeline.texture.visibility import depth_tolerance

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext

COS_ZERO = 0.15              # cos 81 deg: no photo weight beyond here
COS_BAND = 0.3               # grazing texels within this much of COS_ZERO anchor the angle ramp
FEATHER_FRACTION = 0.02      # occlusion-edge feather, as a fraction of the object's size in photo pixels
MIN_FEATHER_PIXELS = 3.0
ANGLE_RAMP_WIDTH = 0.04      # the view-angle and mask-edge ramps span this fraction of the object on its surface
OCCLUSION_SLOPE = 8.0        # depth steps larger than this many pixel footprints are occlusion edges
DEPTH_SLOPE_PIXELS = 1.5     # visibility: pixel footprints a slope may stretch (pipeline.texture.visibility)
CROP_MARGIN = 4              # photo pixels kept around the mask's bounding box
MAX_SIDE_PER_TEXEL = 2.0     # the photo crop is downscaled to at most this x texture size per side
CHUNK = 1 << 20              # texels per vectorised block
GLANCE_OUTSIDE_PIXELS = 1.0  # a grazing texel may fall this far outside the mask (crop pixels) and still glance


@dataclass
class PhotoProjection:
    """What the photo contributes to N chart texels (row-major order of the chart mask).

    colors:  (N, 3) float32 in [0, 1], the photo's colour at each texel (0 where weight is 0)
    weight:  (N,)   float32 in [0, 1], trust in that colour (0 = not seen by the photo)
    density: (N,)   float32, photo pixels (of the full-resolution photo) per texel, by area;
             > 1 means the photo holds more detail than the texture can
    glance:  (N,)   float32 in [0, 1] or None: where ``weight`` is 0 because the surface is
             too grazing (beyond ``COS_ZERO``) but the camera still sees it (depth-tested,
             inside the mask), how much: ``glance_colors`` (N, 3) are the photo's colours
             there. No source in its own right (a grazing view spreads one photo pixel over
             many texels, and a depth error shifts it along the surface), but a better guess
             than a fill from the surface around, for what nothing else sees
    """

    colors: np.ndarray
    weight: np.ndarray
    density: np.ndarray
    glance: "np.ndarray | None" = None
    glance_colors: "np.ndarray | None" = None


def project_photo(mesh: Mesh, face_ids: np.ndarray, bary: np.ndarray, positions: np.ndarray,
                  normals: np.ndarray, photo: ImageInput, camera: SourceCamera, texture_size: int,
                  raster_ctx: "RasterContext", beyond_mask: bool = True) -> PhotoProjection:
    """Colours and weights from the photo for N texels on ``mesh``'s surface, on the host
    whatever the bake's device (numpy and ``pipeline.raster.image_sampling``'s compiled
    lookups: a few hundred thousand texels take milliseconds, and need no torch).

    mesh:      the UV-mapped mesh (vertices (V, 3) float32, faces (F, 3) int32, uvs (V, 2))
    face_ids:  (N,) int32, the face each texel lies on
    bary:      (N, 3) float32, the texel's barycentric weights in that face
    positions: (N, 3) float32, the texels' surface points (world)
    normals:   (N, 3) float32, unit surface normals there (welded across UV seams)
    photo:     the original photo, rgb (H, W, 3) uint8, mask (H, W) bool
    camera:    the photo's camera in the mesh's world frame, at the photo's size
    raster_ctx: the caller's rasterizer context (``pipeline.raster.rasterize.raster_context``)
    beyond_mask: True: surface that runs past the mask's edge ramps off over a few percent of
               the object (the mask of Kiln's own reconstruction is its silhouette); False: a
               texel whose projection falls outside the mask gets no weight (a mask that leaves
               out what stands in front of the object: the photo there shows something else)
    """
    from pipeline.raster import rasterize as rz

    n = _check_inputs(mesh, face_ids, positions, normals, photo, camera)
    check_array("texel barycentrics", bary, dtype=np.float32, shape=(n, 3))
    crop, cam = _crop_and_scale(photo, camera, texture_size)
    out_colors = np.zeros((n, 3), np.float32)
    out_weight = np.zeros(n, np.float32)
    density = _texel_density(mesh, camera, texture_size)[face_ids]
    if crop is None:
        return PhotoProjection(out_colors, out_weight, density)

    raster = rz.rasterize_views(raster_ctx, mesh, cam.as_cameras())
    depth = np.asarray(raster.depth[0], np.float32)
    covered = np.asarray(raster.tri_id[0]) >= 0
    mask = crop.mask
    footprint = _pixel_footprint(cam)
    edges = _occlusion_weight(depth, covered, mask, cam, footprint)
    pyramid = _filled_pyramid(crop.rgb, mask)
    # the crop may be a downscaled photo: its pixels are coarser by this factor (by area)
    crop_scale = (cam.width * cam.height) / float(camera.width * camera.height)
    levels = 0.5 * np.log2(np.maximum(density * crop_scale, 1.0))
    signed = _signed_mask_distance(mask)
    # the hand-overs span this much surface whatever the shape
    ramp = ANGLE_RAMP_WIDTH * (float(np.ptp(mesh.vertices, axis=0).max()) or 1.0)

    R = np.asarray(cam.viewmat[:3, :3], np.float32)
    t = np.asarray(cam.viewmat[:3, 3], np.float32)
    K = np.asarray(cam.K, np.float32)
    center = -(R.T @ t)
    signed_at = np.zeros(n, np.float32)
    cos_at = np.zeros(n, np.float32)
    # depth-tested visibility alone: at a smooth silhouette the depth slopes steeply enough
    # to count as an occlusion edge, so the edge feather is 0 over just the grazing texels
    sighted = np.zeros(n, np.float32)
    ortho = cam.projection == "orthographic"
    for start in range(0, n, CHUNK):
        sl = slice(start, start + CHUNK)
        nrm = normals[sl] / np.maximum(np.linalg.norm(normals[sl], axis=1, keepdims=True), 1e-12)
        c, w, sd, cos, vis = _project_chunk(positions[sl], nrm, R, t, K, center, ortho, footprint, depth,
                                            edges, pyramid, levels[sl], signed, cam.width, cam.height)
        out_colors[sl] = c
        out_weight[sl] = w
        signed_at[sl] = sd
        cos_at[sl] = cos
        sighted[sl] = vis
    out_weight *= _angle_weight(positions, out_weight > 0, cos_at, ramp)
    # a texel spans about 2**level crop pixels
    if beyond_mask:
        out_weight *= _beyond_mask_weight(positions, out_weight > 0, signed_at,
                                          2.0 + 2.0 * 2.0 ** levels, ramp)
    else:
        out_weight[signed_at <= 0] = 0.0
    # grazing texels the camera sees: at a silhouette their centres fall up to about a pixel
    # outside the mask (the pyramid there holds the edge's own colours)
    glance = np.where((out_weight <= 0) & (cos_at < COS_ZERO) & (signed_at > -GLANCE_OUTSIDE_PIXELS),
                      sighted, 0.0).astype(np.float32)
    glance_colors = np.where((glance > 0)[:, None], out_colors, 0.0).astype(np.float32)
    out_colors[out_weight <= 0] = 0.0
    return PhotoProjection(out_colors, out_weight, density, glance, glance_colors)


def _project_chunk(p, nrm, R, t, K, center, ortho: bool, footprint: float, depth, edges, pyramid,
                   levels, signed, width: int, height: int):
    """(colors (N, 3), weight (N,) before the view angle's and the mask's, signed distance
    (N,) in photo pixels from the mask's edge (> 0 inside), cos of the view angle (N,),
    visibility (N,) 0 or 1) for one block of texels: numpy float32 arrays."""
    from pipeline.raster.image_sampling import bilinear

    cam = p @ R.T + t
    z = cam[:, 2]
    if ortho:
        xy = cam[:, :2]
        to_cam = np.broadcast_to(-R[2], p.shape)          # every ray is parallel to the view axis
        pixel = np.full_like(z, footprint)
        in_front = np.ones(len(z), bool)
    else:
        zs = np.where(z > 1e-6, z, np.float32(1.0))
        xy = cam[:, :2] / zs[:, None]
        to_cam = center - p
        to_cam = to_cam / np.maximum(np.linalg.norm(to_cam, axis=1, keepdims=True), 1e-12)
        pixel = z * np.float32(footprint)
        in_front = z > 1e-6
    px = xy[:, 0] * K[0, 0] + xy[:, 1] * K[0, 1] + K[0, 2]
    py = xy[:, 1] * K[1, 1] + K[1, 2]
    cos = (nrm * to_cam).sum(1)
    col, row = np.floor(px), np.floor(py)
    inside = in_front & (col >= 0) & (col < width) & (row >= 0) & (row < height) & (cos > 0)
    tol = depth_tolerance(z, cos, pixel, DEPTH_SLOPE_PIXELS)
    # the depth of any of the four pixel centres around the texel will do: one pixel's
    # depth alone (a flat face, maybe a steeper neighbour's) misses grazing texels here and
    # there, and each miss is a hole in the photo's weight. Texels that close to a real
    # occlusion edge get no weight from the edge feather anyway.
    visible = np.zeros(len(z), bool)
    # clipped before the cast: a texel far off the photo (or behind an orthographic camera)
    # has an absurd coordinate, and only the four clamped neighbours are read
    c0 = np.clip(np.floor(px - 0.5), -1, width).astype(np.int64)
    r0 = np.clip(np.floor(py - 0.5), -1, height).astype(np.int64)
    for dr in (0, 1):
        for dc in (0, 1):
            d = depth[np.clip(r0 + dr, 0, height - 1), np.clip(c0 + dc, 0, width - 1)]
            visible |= (d > 0) & (np.abs(z - d) <= tol)
    visible &= inside

    edge_w = bilinear(edges, px, py)
    colors = np.clip(_sample_pyramid(pyramid, px / width, py / height, levels), 0.0, 1.0)   # (N, 3)
    sd = bilinear(signed, px, py)
    weight = np.where(visible, edge_w, np.float32(0.0))
    return colors, weight, sd, cos, visible.astype(np.float32)


def _sample_pyramid(pyramid, u, v, levels):
    """Lookup between the two pyramid levels around ``levels`` (N,), bicubic in each, blended; (N, C).

    pyramid: list of (h_l, w_l, C) float32 images, level 0 the crop itself; u, v (N,): the
    points as fractions of the image's width and height, the same photo point at every level.
    Bicubic, because it is sharper than bilinear: the photo is resampled twice on its way to
    the screen (into the texture, then by the viewer), and two bilinear passes blur
    one-pixel strokes into grey ramps (measured: +2 dB on fine line work).
    """
    from pipeline.raster.image_sampling import bicubic

    top = len(pyramid) - 1
    levels = np.clip(levels, 0.0, float(top))
    lo = np.floor(levels).astype(np.int64)
    frac = (levels - lo)[:, None].astype(np.float32)
    out = np.zeros((len(u), pyramid[0].shape[2]), np.float32)
    for level in np.unique(lo).tolist():
        sel = lo == level
        a, b = (bicubic(img, u[sel] * img.shape[1], v[sel] * img.shape[0])
                for img in (pyramid[level], pyramid[min(level + 1, top)]))
        out[sel] = a * (1.0 - frac[sel]) + b * frac[sel]
    return out


def _angle_weight(positions: np.ndarray, seen: np.ndarray, cos: np.ndarray, ramp: float) -> np.ndarray:
    """(N,) float32 view-angle weight: 0 where the surface is more grazing than COS_ZERO,
    rising with the distance on the surface from there to 1 at ``ramp`` (world units).

    A ramp in cos alone is steep on the surface where it turns sharply (the built-in
    backend's silhouette rim goes from facing the camera to edge-on within a few texels),
    which showed as a seam. The distance is measured between texels in 3D, as for the mask
    (``_beyond_mask_weight``): per texel, so it starts where the texels' own normals turn
    grazing (the visibility test cuts at theirs), and continuous across UV seams.
    """
    from scipy.spatial import cKDTree

    w = np.zeros(len(positions), np.float32)
    facing = seen & (cos >= COS_ZERO)
    # any path on the surface from a facing texel to a grazing one crosses cos = COS_ZERO,
    # so the grazing texels near it are the only ones that can be nearest
    grazing = (cos < COS_ZERO) & (cos > COS_ZERO - COS_BAND)
    if not facing.any():
        return w
    if not grazing.any():
        w[facing] = 1.0
        return w
    dist, _ = cKDTree(positions[grazing]).query(positions[facing], distance_upper_bound=ramp,
                                                      workers=-1)
    w[facing] = _smooth_np(np.minimum(dist, ramp) / ramp)
    return w


# --------------------------------------------------------------------------- photo side

def _crop_and_scale(photo: ImageInput, camera: SourceCamera, texture_size: int):
    """The photo cut to the mask's bounding box (plus a margin) and, when it is larger than
    the texture could ever hold, area-downscaled; with the camera for that crop.
    Returns (ImageInput, SourceCamera), or (None, None) for an empty mask."""
    import cv2

    mask = photo.mask
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    if len(rows) == 0:
        return None, None
    h, w = mask.shape
    y0, y1 = max(0, rows[0] - CROP_MARGIN), min(h, rows[-1] + 1 + CROP_MARGIN)
    x0, x1 = max(0, cols[0] - CROP_MARGIN), min(w, cols[-1] + 1 + CROP_MARGIN)
    rgb = photo.rgb[y0:y1, x0:x1]
    m = mask[y0:y1, x0:x1]
    K = camera.K.astype(np.float64).copy()
    K[0, 2] -= x0
    K[1, 2] -= y0
    cw, ch = x1 - x0, y1 - y0
    limit = MAX_SIDE_PER_TEXEL * texture_size
    if max(cw, ch) > limit:
        f = limit / max(cw, ch)
        nw, nh = max(1, round(cw * f)), max(1, round(ch * f))
        rgb = cv2.resize(rgb, (nw, nh), interpolation=cv2.INTER_AREA)
        m = cv2.resize(m.astype(np.float32), (nw, nh), interpolation=cv2.INTER_AREA) >= 0.5
        K[0] *= nw / cw
        K[1] *= nh / ch
        K[2] = (0.0, 0.0, 1.0)
        cw, ch = nw, nh
    cam = SourceCamera(viewmat=camera.viewmat, K=K.astype(np.float32), width=int(cw),
                       height=int(ch), projection=camera.projection)
    return ImageInput(rgb=np.ascontiguousarray(rgb), mask=np.ascontiguousarray(m)), cam


def _filled_pyramid(rgb: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """Levels of (r, g, b) float32, each half the size of the one before (Gaussian-filtered,
    ``cv2.pyrDown``), down to a few pixels. Background pixels take the colour of the nearest
    mask pixel first, so the background never bleeds in at the rim and the surface beyond the
    mask's edge reads the edge's colours."""
    import cv2
    from scipy import ndimage

    rgb = rgb.astype(np.float32) / 255.0
    if mask.any() and not mask.all():
        idx = ndimage.distance_transform_edt(~mask, return_distances=False, return_indices=True)
        rgb = rgb[idx[0], idx[1]]
    level = np.ascontiguousarray(rgb)
    out = [level]
    while min(level.shape[:2]) >= 8:
        level = cv2.pyrDown(level)
        out.append(level)
    return out


def _pixel_footprint(cam: SourceCamera) -> float:
    """World size of one pixel: absolute for orthographic cameras, per unit depth for perspective."""
    return 1.0 / float(min(cam.K[0, 0], cam.K[1, 1]))


def _occlusion_weight(depth: np.ndarray, covered: np.ndarray, mask: np.ndarray,
                      cam: SourceCamera, footprint: float) -> np.ndarray:
    """(h, w) float32 in [0, 1]: 0 on occlusion edges of the mesh seen from the photo's
    camera, rising smoothly to 1 a feather width away; also a short ramp at the mask's edge."""
    from scipy import ndimage

    # a depth step between neighbouring pixels much larger than a pixel's footprint is a
    # place where one surface passes in front of another
    pix = footprint * (depth if cam.projection == "perspective" else np.ones_like(depth))
    step = np.zeros(depth.shape, bool)
    for axis in (0, 1):
        a = np.take(depth, range(depth.shape[axis] - 1), axis=axis)
        b = np.take(depth, range(1, depth.shape[axis]), axis=axis)
        ca = np.take(covered, range(depth.shape[axis] - 1), axis=axis)
        cb = np.take(covered, range(1, depth.shape[axis]), axis=axis)
        pa = np.take(pix, range(depth.shape[axis] - 1), axis=axis)
        jump = ca & cb & (np.abs(a - b) > OCCLUSION_SLOPE * np.maximum(pa, 1e-12))
        lo = [slice(None)] * 2
        hi = [slice(None)] * 2
        lo[axis] = slice(0, -1)
        hi[axis] = slice(1, None)
        step[tuple(lo)] |= jump
        step[tuple(hi)] |= jump
    size = float(max(mask.shape)) if not mask.any() else float(
        max(np.ptp(np.flatnonzero(mask.any(axis=0))), np.ptp(np.flatnonzero(mask.any(axis=1)))) + 1)
    feather = max(MIN_FEATHER_PIXELS, FEATHER_FRACTION * size)
    w = np.ones(depth.shape, np.float32)
    if step.any():
        dist = ndimage.distance_transform_edt(~step)
        w = np.minimum(w, _smooth_np(dist / feather))
    return w.astype(np.float32)


def _signed_mask_distance(mask: np.ndarray) -> np.ndarray:
    """(h, w) float32 distance in pixels from the mask's edge (between pixels), > 0 inside."""
    from scipy import ndimage

    if mask.all() or not mask.any():
        return np.where(mask, 1e6, -1e6).astype(np.float32)
    inner = ndimage.distance_transform_edt(mask)
    outer = ndimage.distance_transform_edt(~mask)
    return np.where(mask, inner - 0.5, 0.5 - outer).astype(np.float32)


def _beyond_mask_weight(positions: np.ndarray, seen: np.ndarray, signed: np.ndarray,
                        band: np.ndarray, ramp: float) -> np.ndarray:
    """(N,) float32 in [0, 1]: 1 for texels inside the mask (``signed`` > 0, its distance from
    the mask's edge in photo pixels), falling with the distance on the
    surface from the nearest seen texel inside it to 0 at ``ramp`` (world units).

    Where the mesh's silhouette overshoots the mask, the photo's information ends at the
    mask's edge but the surface goes on: the hand-over ramp belongs on that surface, a fixed
    width of it, and not inside the mask, where it would replace the photo's own pixels with
    the blurrier multi-view colour. It is measured between texels in 3D (straight lines are
    as good as geodesics over a few percent of the object, and 3D does not stop at UV seams);
    photo pixels cannot measure it: at a silhouette one of them can span more than the ramp.
    """
    from scipy.spatial import cKDTree

    w = np.ones(len(positions), np.float32)
    beyond = seen & (signed <= 0)
    # only texels within about a texel (``band``, photo pixels) of the mask's edge can be the
    # nearest inside one to a texel beyond it
    anchors = seen & (signed > 0) & (signed <= band)
    if not beyond.any():
        return w
    if not anchors.any():
        w[beyond] = 0.0
        return w
    tree = cKDTree(positions[anchors])
    dist, _ = tree.query(positions[beyond], distance_upper_bound=ramp, workers=-1)
    w[beyond] = 1.0 - _smooth_np(np.minimum(dist, ramp) / ramp)
    return w


def _smooth_np(x: np.ndarray) -> np.ndarray:
    s = np.clip(x, 0.0, 1.0)
    return s * s * (3.0 - 2.0 * s)


def _photo_face_area(mesh: Mesh, camera: SourceCamera) -> np.ndarray:
    """(F,) float64 area of each face in photo pixels; 0 for faces turned away."""
    f = mesh.faces
    px, _ = camera.project(mesh.vertices.astype(np.float64))
    a = px[f[:, 1]] - px[f[:, 0]]
    b = px[f[:, 2]] - px[f[:, 0]]
    # image y points down: a face turned towards the camera has negative signed area here
    return np.maximum(-(a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]) * 0.5, 0.0)


def _texel_density(mesh: Mesh, camera: SourceCamera, texture_size: int) -> np.ndarray:
    """(F,) float32 full-resolution photo pixels per texel, by area, for each face (0 for
    faces turned away from the camera). Faces with no UV area count as 0."""
    f = mesh.faces
    photo_area = _photo_face_area(mesh, camera)
    assert mesh.uvs is not None   # asked for after the unwrap
    uv = mesh.uvs.astype(np.float64) * texture_size
    ua = uv[f[:, 1]] - uv[f[:, 0]]
    ub = uv[f[:, 2]] - uv[f[:, 0]]
    texel_area = np.abs(ua[:, 0] * ub[:, 1] - ua[:, 1] * ub[:, 0]) * 0.5
    return np.where(texel_area > 1e-12, photo_area / np.maximum(texel_area, 1e-12), 0.0).astype(np.float32)


def _check_inputs(mesh, face_ids, positions, normals, photo, camera) -> int:
    if not isinstance(photo, ImageInput):
        raise StageInputError(f"photo must be an ImageInput, got {type(photo).__name__}")
    photo.validate()
    if not isinstance(camera, SourceCamera):
        raise StageInputError(f"source camera must be a SourceCamera, got {type(camera).__name__}")
    camera.validate()
    h, w = photo.mask.shape
    if (camera.height, camera.width) != (h, w):
        raise StageInputError(f"the source camera is for a {camera.width}x{camera.height} photo, "
                              f"but the photo is {w}x{h}")
    if mesh.uvs is None:
        raise StageInputError("photo projection needs a UV-mapped mesh")
    n = int(positions.shape[0]) if isinstance(positions, np.ndarray) else -1
    check_array("texel positions", positions, dtype=np.float32, shape=(None, 3))
    check_array("texel normals", normals, dtype=np.float32, shape=(n, 3))
    check_array("texel face ids", face_ids, dtype=np.int32, shape=(n,))
    check_finite("texel positions", positions)
    check_finite("texel normals", normals)
    return n


def suggested_texture_size(density: np.ndarray, weight: np.ndarray, size: int) -> int | None:
    """The texture size that would give the photo-covered texels about one texel per photo
    pixel, when the current ``size`` gives clearly fewer; else None.
    density, weight: (N,) per texel, as in PhotoProjection."""
    seen = weight > 0.5
    if not seen.any():
        return None
    need = float(np.median(density[seen]))
    if need <= 2.0:          # within a factor of sqrt(2) per side: not worth a warning
        return None
    return int(2 ** math.ceil(math.log2(size * math.sqrt(need))))


AUTO_SIZES = (512, allowed_range("bake.texture_size")[1])   # what ``bake.texture_size: auto`` picks from
AUTO_UTILISATION = 0.6       # share of the atlas the charts fill (measured: 0.6-0.75)


def texture_size_for_photo(mesh: Mesh, camera: SourceCamera, default: int = 1024) -> int:
    """The power-of-two texture size that gives the surface the photo sees about one texel
    per photo pixel, in AUTO_SIZES; ``default`` when the camera sees no face.

    Texels per unit of surface must match the photo's densest well-seen part (the 90th
    percentile, by area, of photo pixels per unit area over faces turned to the camera),
    spread over the whole surface at AUTO_UTILISATION. A size within a factor 1.25 per
    side of the need is taken as enough, so a slight shortfall does not double the size.
    """
    v = mesh.vertices.astype(np.float64)
    f = mesh.faces
    photo_area = _photo_face_area(mesh, camera)
    world_area = 0.5 * np.linalg.norm(np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]]), axis=1)
    front = (photo_area > 0) & (world_area > 0)
    if not front.any():
        return default
    density = photo_area[front] / world_area[front]
    order = np.argsort(density)
    cdf = np.cumsum(world_area[front][order])
    p90 = density[order][min(np.searchsorted(cdf, 0.9 * cdf[-1]), len(order) - 1)]
    need = math.sqrt(p90 * float(world_area.sum()) / AUTO_UTILISATION)
    size = 2 ** math.ceil(math.log2(max(need / 1.25, 1.0)))
    return int(min(max(size, AUTO_SIZES[0]), AUTO_SIZES[1]))
