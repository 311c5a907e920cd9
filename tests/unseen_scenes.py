"""Textured models with known truth for the unseen side: a mirror-symmetric duck-like shape
with a mirror-symmetric picture, a lopsided one, and a card (symmetric shape) with different
pictures on its two faces; cameras around them and one photo of each.

Each model is UV-unwrapped and its texture painted from a colour function of the surface
point (each texel the mean over its area), so the truth is exact at every texel and from every
view."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.camera.cameras import intrinsics, look_at
from pipeline.types import ImageInput, Mesh, SourceCamera, Texture

PHOTO = 256   # side of the photo and of the views, pixels


@dataclass(frozen=True)
class Scene:
    mesh: Mesh            # UV-mapped, in the world frame
    texture: Texture      # the truth
    name: str


def _blob(center, radii, sub: int = 3):
    import trimesh

    s = trimesh.creation.icosphere(subdivisions=sub, radius=1.0)
    return s.vertices * np.asarray(radii) + np.asarray(center), np.asarray(s.faces)


def _join(parts):
    vs, fs, off = [], [], 0
    for v, f in parts:
        vs.append(v)
        fs.append(f + off)
        off += len(v)
    return np.concatenate(vs), np.concatenate(fs)


# mirror plane z = 0 in the model frame; posed by this rotation so no axis gives it away
_POSE = np.array([[0.9363, -0.2896, 0.1987], [0.3130, 0.9447, -0.0978], [-0.1594, 0.1538, 0.9752]])


def _posed(v: np.ndarray) -> np.ndarray:
    q, _ = np.linalg.qr(_POSE)
    return v @ q.T


def _unposed(p: np.ndarray) -> np.ndarray:
    q, _ = np.linalg.qr(_POSE)
    return p @ q


def _duck_colour(p: np.ndarray, lopsided: bool) -> np.ndarray:
    """Colour at model-frame points (N, 3): a body with soft bands, an orange beak, black
    eyes, a dark wing patch on each side; symmetric in z unless ``lopsided``."""
    x, y, z = p[:, 0], p[:, 1], p[:, 2]
    az = z if lopsided else np.abs(z)
    c = np.stack([0.85 + 0.1 * np.sin(6 * x), 0.75 + 0.12 * np.sin(5 * y + 3 * x), 0.3 + 0.15 * np.cos(4 * x)], 1)
    wing = (((x + 0.05) / 0.3) ** 2 + ((y - 0.02) / 0.14) ** 2 < 1) & (az > 0.25)
    c[wing] = [0.45, 0.3, 0.15]
    beak = x > 0.6
    c[beak] = [0.95, 0.45, 0.05]
    eye = (x - 0.58) ** 2 + (y - 0.42) ** 2 + (az - 0.1) ** 2 < 0.004
    c[eye] = [0.05, 0.05, 0.05]
    return np.clip(c, 0, 1)


def _card_colour(p: np.ndarray) -> np.ndarray:
    """A card (thin along z): letters-like dark strokes on the front (z > 0), a plain blue back
    with one big circle; white rim."""
    x, y, z = p[:, 0], p[:, 1], p[:, 2]
    c = np.ones((len(p), 3)) * 0.95
    front = z > 0.01
    strokes = ((np.floor((x + 0.5) * 9) % 2 == 0) & (np.abs(y - 0.15) < 0.08) & (x < 0.2)) | \
              ((np.abs(x + 0.35) < 0.04) & (y < 0.1)) | ((np.abs(y + 0.2) < 0.03) & (x > -0.3))
    c[front & strokes] = [0.1, 0.1, 0.12]
    c[front & ~strokes] = [0.95, 0.9, 0.8]
    back = z < -0.01
    c[back] = [0.2, 0.35, 0.8]
    c[back & ((x - 0.15) ** 2 + y ** 2 < 0.04)] = [0.9, 0.8, 0.1]
    return c


def _painted(v: np.ndarray, f: np.ndarray, colour, size: int, name: str, supersample: int = 4) -> Scene:
    """The mesh unwrapped, its texture painted from ``colour`` of the surface point: each texel
    the mean of ``supersample``² samples over it, as a photo's pixel or a painter's brush would
    give it. Point-sampled at texel centres instead, a stroke's edge snaps to each chart's own
    texel grid, so a mirror-symmetric picture is not symmetric texel for texel (the duck's two
    sides then differ by up to half a texel at every edge: a 5 dB gap between a perfect mirror's
    far side and the photo's near side, at texture 512)."""
    from pipeline.raster import rasterize as rz
    from pipeline.unwrap.uv import unwrap
    from raster_helpers import gl_context
    from scipy import ndimage

    mesh = unwrap(Mesh(_posed(v).astype(np.float32), f.astype(np.int32)), size, 2, 200000)
    k = supersample
    uv = rz.rasterize_uv(gl_context(), mesh, size * k)
    chart = np.asarray(uv.tri_id[0]) >= 0
    pos = np.asarray(rz.interpolate(uv, mesh, mesh.vertices))[0]
    fine = np.zeros((size * k, size * k, 3))
    fine[chart] = colour(_unposed(pos[chart].astype(np.float64)))
    total = fine.reshape(size, k, size, k, 3).sum(axis=(1, 3))
    count = chart.reshape(size, k, size, k).sum(axis=(1, 3))
    inside = count > 0
    img = np.zeros((size, size, 3))
    img[inside] = total[inside] / count[inside][:, None]
    # gutter texels copy their nearest chart texel, so bilinear lookups at chart edges stay true
    idx = ndimage.distance_transform_edt(~inside, return_distances=False, return_indices=True)
    img = img[idx[0], idx[1]]
    tex = Texture(image=(img * 255).round().astype(np.uint8), seen=np.ones((size, size), bool))
    return Scene(mesh=mesh, texture=tex, name=name)


def duck(size: int = 512, lopsided: bool = False) -> Scene:
    body = _blob((0, 0, 0), (0.6, 0.35, 0.4), 4)
    if lopsided:
        parts = [body, _blob((0.45, 0.35, 0.18), (0.2, 0.2, 0.2)), _blob((0.68, 0.33, 0.15), (0.1, 0.04, 0.06), 2),
                 _blob((-0.2, 0.15, 0.3), (0.15, 0.2, 0.15), 2)]
    else:
        parts = [body, _blob((0.45, 0.35, 0), (0.2, 0.2, 0.2)), _blob((0.68, 0.33, 0), (0.1, 0.04, 0.06), 2)]
    v, f = _join(parts)
    return _painted(v, f, lambda p: _duck_colour(p, lopsided), size, "lopsided" if lopsided else "duck")


def card(size: int = 512) -> Scene:
    import trimesh

    box = trimesh.creation.box(extents=(1.0, 0.7, 0.04))
    box = box.subdivide().subdivide().subdivide()
    return _painted(np.asarray(box.vertices), np.asarray(box.faces), _card_colour, size, "card")


def camera(azimuth_deg: float, elevation_deg: float = 20.0, distance: float = 3.0) -> SourceCamera:
    """A camera on a circle around the model frame's y axis (mapped by the pose), looking at the
    origin; azimuth 0 looks at the +z side (the duck's left, the card's front)."""
    a, e = math.radians(azimuth_deg), math.radians(elevation_deg)
    eye = _posed(np.array([[distance * math.cos(e) * math.sin(a), distance * math.sin(e),
                            distance * math.cos(e) * math.cos(a)]]))[0]
    up = _posed(np.array([[0.0, 1.0, 0.0]]))[0]
    return SourceCamera(viewmat=look_at(eye, (0, 0, 0), up=up), K=intrinsics(30.0, PHOTO, PHOTO),
                        width=PHOTO, height=PHOTO)


AROUND = (0.0, 60.0, 120.0, 180.0, 240.0, 300.0)


def photo(scene: Scene, cam: SourceCamera) -> ImageInput:
    from pipeline.texture.bake import render_textured
    from raster_helpers import gl_context

    rgb, covered = render_textured(scene.mesh, scene.texture, cam.as_cameras(), gl_context())
    return ImageInput(rgb=(rgb[0] * 255).round().astype(np.uint8), mask=covered[0])


def view_psnr(scene: Scene, texture: Texture, cam: SourceCamera) -> float:
    """PSNR of the model with ``texture`` against the truth, seen from ``cam``, over the
    pixels the model covers."""
    from pipeline.texture.bake import masked_psnr, render_textured
    from raster_helpers import gl_context

    got, covered = render_textured(scene.mesh, texture, cam.as_cameras(), gl_context())
    want, _ = render_textured(scene.mesh, scene.texture, cam.as_cameras(), gl_context())
    return masked_psnr(got[0], want[0], covered[0])
