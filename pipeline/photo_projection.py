"""Photo projection: colour the texels the photo's camera sees from the photo itself.

A Gaussian render is a band-limited, gappy copy of the photo; the photo is the
sharpest source Kiln will ever have for the side it shows. ``project_photo``
gives every chart texel a colour read from the photo and a weight in [0, 1]
saying how much to trust it; the bake blends ``weight * photo + (1 - weight) *
multi-view``. The weight is the product of

* visibility: the texel's surface point is the first surface along its pixel's
  ray, tested against the *mesh* rasterized from the source camera (not the
  Gaussians, which are fuzzy and offset from the mesh);
* view angle: full weight when the surface faces the camera within
  ``COS_FULL``, falling smoothly to 0 at ``COS_ZERO`` (grazing texels get
  few photo pixels spread thin, so the multi-view bake takes over);
* distance from occlusion edges in the photo: where one part of the surface
  passes in front of another, the hidden side's texels next to the edge fade
  in over ``FEATHER_FRACTION`` of the object's size, so the photo/multi-view
  transition is a ramp and not a seam. Because the weight is computed from
  3D positions and photo pixels, never from texel neighbourhoods, it is
  continuous across UV chart seams too;
* the mask: texels that land outside the object's mask (background pixels)
  get no photo colour.

Colours are read (bicubic) from a pyramid of the mask-premultiplied photo
(so the background never bleeds in at the rim), at the level that matches the
texel's footprint in photo pixels: where the photo is denser than the texture,
each texel gets the area average of the photo pixels it covers, not an
aliased point sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kiln.settings import allowed_range

from .types import ImageInput, Mesh, Raster, SourceCamera
from .validate import StageInputError, check_array, check_finite

COS_FULL = 0.5               # cos 60 deg: full photo weight up to here
COS_ZERO = 0.15              # cos 81 deg: no photo weight beyond here
FEATHER_FRACTION = 0.02      # occlusion-edge feather, as a fraction of the object's size in photo pixels
MIN_FEATHER_PIXELS = 3.0
ANGLE_RAMP_WIDTH = 0.04      # the view-angle ramp spans at least this fraction of the object on its surface
MASK_FEATHER_PIXELS = 1.5    # the mask's own edge: a ramp at least this wide ...
MASK_FEATHER_SHARE = 1.0     # ... and this share of the occlusion feather: where the mesh's silhouette
                             # overshoots the mask, the hand-over must not be a cliff
OCCLUSION_SLOPE = 8.0        # depth steps larger than this many pixel footprints are occlusion edges
DEPTH_REL_TOL = 0.004        # visibility tolerance, as in the multi-view bake ...
DEPTH_SLOPE_PIXELS = 1.5     # ... plus this many pixel footprints stretched by the surface slope
MAX_SLOPE = 10.0
CROP_MARGIN = 4              # photo pixels kept around the mask's bounding box
MAX_SIDE_PER_TEXEL = 2.0     # the photo crop is downscaled to at most this x texture size per side
CHUNK = 1 << 20              # texels per vectorised block


@dataclass
class PhotoProjection:
    """What the photo contributes to N chart texels (row-major order of the chart mask).

    colors:  (N, 3) float32 in [0, 1], the photo's colour at each texel (0 where weight is 0)
    weight:  (N,)   float32 in [0, 1], trust in that colour (0 = not seen by the photo)
    density: (N,)   float32, photo pixels (of the full-resolution photo) per texel, by area;
             > 1 means the photo holds more detail than the texture can
    """

    colors: np.ndarray
    weight: np.ndarray
    density: np.ndarray


def project_photo(mesh: Mesh, face_ids: np.ndarray, bary: np.ndarray, positions: np.ndarray,
                  normals: np.ndarray, photo: ImageInput, camera: SourceCamera, texture_size: int,
                  raster_backend: str, device: str = "cpu") -> PhotoProjection:
    """Colours and weights from the photo for N texels on ``mesh``'s surface.

    mesh:      the UV-mapped mesh (vertices (V, 3) float32, faces (F, 3) int32, uvs (V, 2))
    face_ids:  (N,) int32, the face each texel lies on
    bary:      (N, 3) float32, the texel's barycentric weights in that face
    positions: (N, 3) float32, the texels' surface points (world)
    normals:   (N, 3) float32, unit surface normals there (welded across UV seams)
    photo:     the original photo, rgb (H, W, 3) uint8, mask (H, W) bool
    camera:    the photo's camera in the mesh's world frame, at the photo's size
    """
    import torch

    from . import rasterize as rz

    n = _check_inputs(mesh, face_ids, positions, normals, photo, camera)
    check_array("texel barycentrics", bary, dtype=np.float32, shape=(n, 3))
    dev = torch.device(device)
    crop, cam = _crop_and_scale(photo, camera, texture_size)
    out_colors = np.zeros((n, 3), np.float32)
    out_weight = np.zeros(n, np.float32)
    density = _texel_density(mesh, camera, texture_size)[face_ids]
    if crop is None:
        return PhotoProjection(out_colors, out_weight, density)

    where = {"device": str(dev)} if dev.type == "cuda" else {}
    raster = rz.rasterize_views(mesh, cam.as_cameras(), raster_backend, **where)
    depth = np.asarray(raster.depth[0], np.float32)
    covered = np.asarray(raster.tri_id[0]) >= 0
    mask = crop.mask
    footprint = _pixel_footprint(cam)
    edges = _occlusion_weight(depth, covered, mask, cam, footprint)
    pyramid = _premultiplied_pyramid(crop.rgb, mask)
    # the crop may be a downscaled photo: its pixels are coarser by this factor (by area)
    crop_scale = (cam.width * cam.height) / float(camera.width * camera.height)
    levels = 0.5 * np.log2(np.maximum(density * crop_scale, 1.0))
    vertex_angle = _surface_angle_weight(mesh, camera)
    angle = np.einsum("nk,nk->n", bary, vertex_angle[mesh.faces[face_ids]]).astype(np.float32)

    R = torch.as_tensor(cam.viewmat[:3, :3], dtype=torch.float32, device=dev)
    t = torch.as_tensor(cam.viewmat[:3, 3], dtype=torch.float32, device=dev)
    K = torch.as_tensor(cam.K, dtype=torch.float32, device=dev)
    center = -(R.T @ t)
    depth_t = torch.as_tensor(depth, device=dev)
    edges_t = torch.as_tensor(edges, device=dev)
    pyr = [torch.as_tensor(level, device=dev).permute(2, 0, 1)[None].contiguous() for level in pyramid]
    ortho = cam.projection == "orthographic"
    for start in range(0, n, CHUNK):
        sl = slice(start, start + CHUNK)
        p = torch.as_tensor(positions[sl], device=dev)
        nrm = torch.nn.functional.normalize(torch.as_tensor(normals[sl], device=dev), dim=1)
        c, w = _project_chunk(p, nrm, R, t, K, center, ortho, footprint, depth_t, edges_t, pyr,
                              torch.as_tensor(levels[sl], device=dev),
                              torch.as_tensor(angle[sl], device=dev), cam.width, cam.height)
        out_colors[sl] = c.cpu().numpy()
        out_weight[sl] = w.cpu().numpy()
    return PhotoProjection(out_colors, out_weight, density)


def _project_chunk(p, nrm, R, t, K, center, ortho: bool, footprint: float, depth, edges, pyr,
                   levels, angle, width: int, height: int):
    """(colors (N, 3), weight (N,)) for one block of texels."""
    import torch

    cam = p @ R.T + t
    z = cam[:, 2]
    if ortho:
        xy = cam[:, :2]
        to_cam = -R[2].expand_as(p)                      # every ray is parallel to the view axis
        pixel = torch.full_like(z, footprint)
        in_front = torch.ones_like(z, dtype=torch.bool)
    else:
        zs = torch.where(z > 1e-6, z, torch.ones_like(z))
        xy = cam[:, :2] / zs[:, None]
        to_cam = torch.nn.functional.normalize(center - p, dim=1)
        pixel = z * footprint
        in_front = z > 1e-6
    px = xy[:, 0] * K[0, 0] + xy[:, 1] * K[0, 1] + K[0, 2]
    py = xy[:, 1] * K[1, 1] + K[1, 2]
    cos = (nrm * to_cam).sum(1)
    col, row = px.floor().long(), py.floor().long()
    inside = in_front & (col >= 0) & (col < width) & (row >= 0) & (row < height) & (cos > 0)
    rc, cc = row.clamp(0, height - 1), col.clamp(0, width - 1)
    d = depth[rc, cc]
    tan = (1.0 - cos.clamp(0, 1) ** 2).sqrt() / cos.clamp(min=1.0 / MAX_SLOPE)
    tol = DEPTH_REL_TOL * z.abs() + DEPTH_SLOPE_PIXELS * pixel * tan
    visible = inside & (d > 0) & ((z - d).abs() <= tol)

    grid = torch.stack([2.0 * px / width - 1.0, 2.0 * py / height - 1.0], 1)[None, None]
    edge_w = torch.nn.functional.grid_sample(edges[None, None], grid, mode="bilinear",
                                             padding_mode="border", align_corners=False)[0, 0, 0]
    rgbm = _sample_pyramid(pyr, grid, levels)                                  # (N, 4)
    m = rgbm[:, 3].clamp(0.0, 1.0)        # bicubic overshoots a little at the mask's edge
    colors = (rgbm[:, :3] / m.clamp(min=1e-6)[:, None]).clamp(0.0, 1.0)
    mask_w = _smoothstep(0.5, 0.95, m)
    weight = torch.where(visible, angle * edge_w * mask_w, torch.zeros_like(angle))
    colors = torch.where((weight > 0)[:, None], colors, torch.zeros_like(colors))
    return colors, weight


def _sample_pyramid(pyr, grid, levels):
    """Lookup between the two pyramid levels around ``levels`` (N,), bicubic in each, blended.

    pyr: list of (1, 4, h_l, w_l) tensors, level 0 the crop itself; grid (1, 1, N, 2) in
    grid_sample's normalised coordinates, which name the same photo point at every level.
    """
    import torch

    top = len(pyr) - 1
    levels = levels.clamp(0.0, float(top))
    lo = levels.floor().long()
    frac = (levels - lo.float())[:, None]
    out = torch.zeros(grid.shape[2], 4, device=grid.device)
    for level in torch.unique(lo).tolist():
        sel = lo == level
        g = grid[:, :, sel]
        a = _bicubic(pyr[level], g)
        b = _bicubic(pyr[min(level + 1, top)], g)
        out[sel] = a * (1.0 - frac[sel]) + b * frac[sel]
    return out


def _bicubic(image, grid):
    """Bicubic lookup, (N, 4). Sharper than bilinear: the photo is resampled twice on its
    way to the screen (into the texture, then by the viewer), and two bilinear passes
    blur one-pixel strokes into grey ramps (measured: +2 dB on fine line work)."""
    import torch

    return torch.nn.functional.grid_sample(image, grid, mode="bicubic", padding_mode="zeros",
                                           align_corners=False)[0, :, 0].T


def _smoothstep(lo: float, hi: float, x):
    s = ((x - lo) / (hi - lo)).clamp(0.0, 1.0)
    return s * s * (3.0 - 2.0 * s)


def _surface_angle_weight(mesh: Mesh, camera: SourceCamera) -> np.ndarray:
    """(V,) float32 view-angle weight per vertex, smoothed over the surface.

    Vertices whose (welded) normal is more grazing than COS_ZERO get 0; the weight then
    rises with the geodesic distance from them (Dijkstra over mesh edges) to 1 at
    ANGLE_RAMP_WIDTH of the object's size, so the photo/multi-view hand-over spans that
    much surface whatever the shape. With a ramp in cos alone, an object whose
    silhouette rim turns sharply (the built-in backend's) changed over within a couple
    of texels, which showed as a seam. A second, steeper ramp in cos keeps the weight
    low where the surface itself is still grazing.
    """
    import scipy.sparse as sp
    from scipy.sparse import csgraph

    from .geometry import vertex_normals

    v = mesh.vertices.astype(np.float64)
    _, weld = np.unique(v, axis=0, return_inverse=True)
    weld = weld.reshape(-1)
    nw = int(weld.max()) + 1
    first = np.zeros(nw, np.int64)
    first[weld] = np.arange(len(weld))
    pos = v[first]
    nrm = vertex_normals(v, mesh.faces)[first]
    if camera.projection == "orthographic":
        to_cam = np.broadcast_to(-camera.viewmat[2, :3].astype(np.float64), pos.shape)
    else:
        R, t = camera.viewmat[:3, :3].astype(np.float64), camera.viewmat[:3, 3].astype(np.float64)
        to_cam = -(R.T @ t) - pos
        to_cam = to_cam / np.maximum(np.linalg.norm(to_cam, axis=1, keepdims=True), 1e-12)
    cos = (nrm * to_cam).sum(1)
    f = weld[mesh.faces]
    rows = np.concatenate([f[:, 0], f[:, 1], f[:, 2]])
    cols = np.concatenate([f[:, 1], f[:, 2], f[:, 0]])
    length = np.linalg.norm(pos[rows] - pos[cols], axis=1) + 1e-12
    graph = sp.csr_matrix((length, (rows, cols)), shape=(nw, nw))
    grazing = np.flatnonzero(cos < COS_ZERO)
    extent = float(np.ptp(pos, axis=0).max()) or 1.0
    ramp = ANGLE_RAMP_WIDTH * extent
    if len(grazing) == 0:
        dist = np.full(nw, np.inf)
    else:
        dist = csgraph.dijkstra(graph, directed=False, indices=grazing, min_only=True,
                                limit=ramp * 1.01)
    w = np.minimum(_smooth_np(np.where(np.isfinite(dist), dist, ramp) / ramp),
                   _smooth_np((cos - COS_ZERO) / (COS_FULL - COS_ZERO) * 4.0))
    return w[weld].astype(np.float32)


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


def _premultiplied_pyramid(rgb: np.ndarray, mask: np.ndarray) -> list[np.ndarray]:
    """Levels of (r*m, g*m, b*m, m) float32, each half the size of the one before
    (Gaussian-filtered, ``cv2.pyrDown``), down to a few pixels."""
    import cv2

    m = mask.astype(np.float32)[..., None]
    level = np.concatenate([rgb.astype(np.float32) / 255.0 * m, m], -1)
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
    if mask.any() and not mask.all():
        # inside the mask: distance to the nearest background pixel
        dist = ndimage.distance_transform_edt(mask)
        w = np.minimum(w, _smooth_np((dist - 0.5) / max(MASK_FEATHER_PIXELS, MASK_FEATHER_SHARE * feather)))
    return w.astype(np.float32)


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
