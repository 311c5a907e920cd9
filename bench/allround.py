"""All-round benchmark (issue 34): is a baked model right on the sides its photos do not show?

Ground truths are textured models whose every side is known:

* real ones from the public mikedh/trimesh repository (``models/fuze.obj`` with its MTL and
  ``fuze uv.jpg``; ``models/capsule.obj`` with ``capsule0.jpg``), read from ``--models DIR``
  (default ~/.cache/kiln-bench/trimesh-models; never committed: see ``MODELS_HOWTO``), and
* procedural ones made here, deterministically: ``sym`` (a mirror-symmetric body with a
  mirror-symmetric picture), ``lopsided`` (neither shape nor picture symmetric: the negative
  control for a mirror fill), ``card`` (a shape symmetric about its middle plane with
  different pictures on its two faces: a mirror fill must not copy one onto the other) and
  ``smooth`` (a lopsided body whose colours change slowly: issue 34's "model with a smooth
  texture", on which two photos from opposite sides must give every view back at 30 dB).

For each model:

1. the ground truth GLB is rendered from 6 cameras around it (``RING``) by a renderer that
   is not Kiln's (three.js in headless Chromium, ``bench/glb_render.py``);
2. its geometry alone (a PLY of positions and faces: no UVs, no colours) goes to ``kiln bake``
   as a person runs it, with 1, 2 or 4 of those renders as photos (``PHOTO_SETS``: the front;
   front and back; the 4 sides), each an RGBA PNG whose alpha is the object's coverage;
   first with each photo's exact camera (a ``--camera`` JSON), then with none (fitted);
3. the baked GLB is rendered from the same 6 cameras by the same renderer, and each view is
   compared with the ground truth's inside the silhouette (both renders cover the pixel):
   PSNR and SSIM.

Several photos need a ``kiln bake`` that takes ``--image`` more than once (issue 34, item 1);
the bench asks the CLI's own parser whether repeated ``--image`` values all survive, and
reports the 2- and 4-photo rows as "not supported by this kiln bake" when they do not.

Prints a table (the photo views' PSNR, the unseen views' mean and worst PSNR, SSIM, where the
texels came from), writes ``results.json`` and one side-by-side PNG per row (ground truth over
bake over |difference| x4) under ``--out`` (default var/allround). With ``--baseline FILE``
(a results.json of an earlier run, e.g. ``bench/allround-baseline.json``, today's code) it
also prints each row's gain against it and issue 34's one-photo targets.

    .venv/bin/python bench/allround.py                       # all models, 1 photo (+2, 4 when supported)
    .venv/bin/python bench/allround.py --models-only sym card --photos 1 --cameras exact
    .venv/bin/python bench/allround.py --baseline bench/allround-baseline.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# ROOT first: bench/ holds a pipeline.py that must not shadow the pipeline package, so bench/
# itself never goes on sys.path: its renderer is loaded by its path
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _bench_module(name: str):
    import importlib.util

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


glb_render = _bench_module("glb_render")

OUT_DIR = ROOT / "var" / "allround"
MODELS_DIR = Path.home() / ".cache" / "kiln-bench" / "trimesh-models"
MODELS_HOWTO = (
    "get them from the public mikedh/trimesh repository (not committed here), e.g.\n"
    "  git clone --depth 1 https://github.com/mikedh/trimesh /tmp/trimesh\n"
    "  mkdir -p {dir} && cp /tmp/trimesh/models/{{fuze.obj,fuze.obj.mtl,'fuze uv.jpg',"
    "capsule.obj,capsule.mtl,capsule0.jpg}} {dir}/")
BACKGROUND = (255, 0, 255)
SIZE = 512                # photo and evaluation renders, pixels a side
FOV_DEG = 40.0
# the 6 cameras: (name, azimuth deg about +y from the front (+z) towards +x, elevation deg).
# Four sides a little from above, then one from high up and one from below, between them,
# so every photo set leaves views that see parts no photo saw.
RING = (("front", 0.0, 15.0), ("right", 90.0, 15.0), ("back", 180.0, 15.0), ("left", 270.0, 15.0),
        ("top", 45.0, 60.0), ("below", 225.0, -35.0))
# photo sets: which ring views are handed to kiln bake as photos
PHOTO_SETS = {1: ("front",), 2: ("front", "back"), 4: ("front", "right", "back", "left")}
# issue 34's targets for one photo, against today's code (the baseline)
TARGET_UNSEEN_MEAN_GAIN_DB, TARGET_UNSEEN_WORST_GAIN_DB, TARGET_PHOTO_DRIFT_DB = 4.0, 5.0, 0.5


# --------------------------------------------------------------------------- models

@dataclass
class Model:
    """A ground truth: a y-up textured mesh (UV seams split its vertices), its texture.

    vertices (V, 3) float, faces (F, 3) int, uvs (V, 2) in [0, 1] with v = 0 at the
    texture's bottom row (glTF's flip is trimesh's job), texture (H, W, 3) uint8."""

    name: str
    vertices: np.ndarray
    faces: np.ndarray
    uvs: np.ndarray
    texture: np.ndarray
    note: str = ""

    def write_truth_glb(self, path: Path) -> Path:
        """The textured model as an unlit-friendly GLB (PBR, metallic 0), written by trimesh:
        not by Kiln's exporter, so a mistake there cannot hide in the ground truth."""
        import trimesh
        from PIL import Image

        mat = trimesh.visual.material.PBRMaterial(
            baseColorTexture=Image.fromarray(self.texture), baseColorFactor=[255, 255, 255, 255],
            metallicFactor=0.0, roughnessFactor=1.0, doubleSided=False)
        tm = trimesh.Trimesh(self.vertices, self.faces, process=False,
                             visual=trimesh.visual.TextureVisuals(uv=self.uvs, material=mat))
        path.write_bytes(tm.export(file_type="glb"))
        return path

    def write_geometry_ply(self, path: Path) -> Path:
        """Positions and faces only (vertices welded across the UV seams): what kiln bake gets."""
        import trimesh

        tm = trimesh.Trimesh(np.asarray(self.vertices, np.float64), self.faces, process=True)
        tm.merge_vertices(merge_tex=True, merge_norm=True)
        path.write_bytes(trimesh.exchange.ply.export_ply(tm, encoding="binary", include_attributes=False))
        return path


class ModelMissing(RuntimeError):
    """A real model's files are not in the models folder; the message says how to get them."""


def _z_up_to_y_up(v: np.ndarray) -> np.ndarray:
    # (x, y, z) z-up -> (x, z, -y) y-up: a proper rotation, so faces keep their winding
    return np.stack([v[:, 0], v[:, 2], -v[:, 1]], axis=1)


def load_trimesh_model(models_dir: Path, name: str) -> Model:
    """``fuze`` or ``capsule`` from a folder holding the mikedh/trimesh repository's files."""
    import trimesh
    from PIL import Image

    files = {"fuze": ("fuze.obj", "fuze.obj.mtl", "fuze uv.jpg"),
             "capsule": ("capsule.obj", "capsule.mtl", "capsule0.jpg")}[name]
    missing = [f for f in files if not (models_dir / f).is_file()]
    if missing:
        raise ModelMissing(f"{', '.join(missing)} not in {models_dir}; "
                           + MODELS_HOWTO.format(dir=models_dir))
    tm = trimesh.load(models_dir / files[0], force="mesh", process=False)
    uv = getattr(tm.visual, "uv", None)
    if uv is None:
        raise ModelMissing(f"{files[0]} in {models_dir} loaded without UVs")
    # the texture read here, not through trimesh's material, so its MTL's "Tr" cannot touch it
    tex = np.asarray(Image.open(models_dir / files[2]).convert("RGB"))
    v = _z_up_to_y_up(np.asarray(tm.vertices, np.float64))   # both files are z-up
    return Model(name, v, np.asarray(tm.faces, np.int64), np.clip(np.asarray(uv, np.float64), 0, 1), tex,
                 note=f"mikedh/trimesh models/{files[0]}, {len(tm.faces)} faces")


def surface_grid(position: Callable[[np.ndarray, np.ndarray], np.ndarray], nu: int = 96,
                 nv: int = 48) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A closed surface over a longitude/latitude grid: (vertices, faces, uvs).

    position(theta, phi) -> (..., 3): theta the polar angle from +y (0 top, pi bottom), phi
    the azimuth from the front (+z) towards +x, in [-pi, pi]. u = (phi + pi) / 2 pi, so the
    mirror x -> -x (phi -> -phi) is u -> 1 - u, and the seam is at the back; v = 1 at the top.
    Triangles that the poles collapse are dropped."""
    u = np.linspace(0.0, 1.0, nu + 1)
    v = np.linspace(0.0, 1.0, nv + 1)
    uu, vv = np.meshgrid(u, v)                                   # (nv+1, nu+1), row = v
    theta, phi = np.pi * (1.0 - vv), 2.0 * np.pi * uu - np.pi
    grid = np.asarray(position(theta, phi), np.float64)          # (nv+1, nu+1, 3)
    # the seam's two columns and each pole's row are one point each: make them so exactly
    # (sin(pi) is 1e-16, not 0, and a power < 1 of it is 1e-8), or the welded geometry leaks
    grid[:, -1] = grid[:, 0]
    grid[0, :] = grid[0].mean(0)
    grid[-1, :] = grid[-1].mean(0)
    verts = grid.reshape(-1, 3)
    uvs = np.stack([uu.ravel(), vv.ravel()], axis=1)
    idx = np.arange((nv + 1) * (nu + 1)).reshape(nv + 1, nu + 1)
    a, b, c, d = idx[:-1, :-1], idx[:-1, 1:], idx[1:, 1:], idx[1:, :-1]
    # counter-clockwise seen from outside (v grows upwards, u towards +x seen from the front)
    faces = np.concatenate([np.stack([a, b, c], -1).reshape(-1, 3), np.stack([a, c, d], -1).reshape(-1, 3)])
    p = verts[faces]
    area = np.linalg.norm(np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]), axis=1)
    return verts, faces[area > 1e-12 * max(1.0, float(area.max()))], uvs


def _sphere_dir(theta, phi):
    s = np.sin(theta)
    return np.stack([s * np.sin(phi), np.cos(theta), s * np.cos(phi)], axis=-1)


def _bump(theta, phi, t0, p0, width):
    # a smooth bump centred at (t0, p0) on the sphere, angular width in radians
    d = _sphere_dir(theta, phi) @ _sphere_dir(np.float64(t0), np.float64(p0))
    return np.exp((d - 1.0) / (width * width))


def _canvas(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Texel centres (u, v) of an h x w texture, v = 1 at row 0."""
    return np.meshgrid((np.arange(w) + 0.5) / w, 1.0 - (np.arange(h) + 0.5) / h)


def _paint(img: np.ndarray, where: np.ndarray, rgb) -> None:
    img[where] = np.asarray(rgb, np.float64)


def _disc(u, v, cu, cv, r, aspect=2.0):
    # a round dot on the surface: u spans twice the angle v does
    return ((u - cu) * aspect) ** 2 + (v - cv) ** 2 < r * r


def sym_model(h: int = 512) -> Model:
    """Mirror-symmetric about x = 0 in shape and picture: a body with a snout and two ears,
    striped and spotted (a picture with edges, so a wrong side shows)."""
    def pos(theta, phi):
        r = 1.0 + 0.35 * _bump(theta, phi, 1.7, 0.0, 0.35) + 0.3 * (
            _bump(theta, phi, 0.55, 0.7, 0.3) + _bump(theta, phi, 0.55, -0.7, 0.3))
        return _sphere_dir(theta, phi) * r[..., None] * np.array([0.8, 0.9, 1.0])
    verts, faces, uvs = surface_grid(pos)
    u, v = _canvas(h, 2 * h)
    m = np.minimum(u, 1.0 - u)            # distance from the back seam in u: symmetric by making
    img = np.zeros((h, 2 * h, 3))         # every feature a function of |u - 0.5| = 0.5 - m
    a = np.abs(u - 0.5)
    img[:] = np.stack([0.95 - 0.5 * v, 0.75 - 0.2 * v, 0.3 + 0.4 * v], -1) * 255
    _paint(img, (np.sin(40 * a) > 0.6) & (v < 0.45), (40, 90, 170))          # stripes on the flanks
    for cu, cv, r, col in ((0.08, 0.62, 0.05, (20, 20, 20)), (0.2, 0.3, 0.06, (200, 40, 40)),
                           (0.32, 0.7, 0.04, (30, 150, 60)), (0.42, 0.45, 0.05, (240, 240, 240))):
        _paint(img, _disc(a, v, cu, cv, r), col)
    _paint(img, (m < 0.04) & (v > 0.2), (120, 60, 20))                        # a dark stripe down the back
    return Model("sym", verts, faces, uvs, img.astype(np.uint8), note="procedural, mirror-symmetric (x = 0)")


def lopsided_model(h: int = 512) -> Model:
    """Neither the shape nor the picture has a mirror plane: bumps and patches on one side."""
    def pos(theta, phi):
        r = 1.0 + 0.45 * _bump(theta, phi, 1.1, 1.2, 0.4) + 0.25 * _bump(theta, phi, 2.2, -2.3, 0.3) \
            + 0.08 * np.sin(3 * phi + 0.7) * np.sin(theta)
        return _sphere_dir(theta, phi) * r[..., None] * np.array([1.0, 0.85, 0.8])
    verts, faces, uvs = surface_grid(pos)
    u, v = _canvas(h, 2 * h)
    img = np.stack([0.3 + 0.6 * u, 0.8 - 0.5 * v, 0.5 + 0.3 * np.sin(6 * u)], -1) * 255
    _paint(img, np.sin(30 * (u + 0.5 * v)) > 0.7, (250, 230, 60))            # diagonal stripes
    _paint(img, _disc(u, v, 0.72, 0.6, 0.09), (180, 20, 60))
    _paint(img, _disc(u, v, 0.3, 0.35, 0.05), (20, 40, 60))
    _paint(img, (u > 0.55) & (u < 0.62) & (v > 0.15) & (v < 0.8), (10, 110, 40))
    return Model("lopsided", verts, faces, uvs, np.clip(img, 0, 255).astype(np.uint8),
                 note="procedural, asymmetric (negative control)")


def card_model(h: int = 512) -> Model:
    """A rounded slab (symmetric about z = 0, and about x = 0) with one picture on its front
    (z > 0) and another on its back: a symmetric shape whose two sides must not be mirrored.
    The pictures are painted by where each texel lies on the slab (x, y), not by (u, v),
    so the squarish surface's uneven parametrisation does not stretch them."""
    def spow(w, e):
        return np.sign(w) * np.abs(w) ** e
    def pos(theta, phi):
        e = 0.45   # squarish superquadric: flat faces with rounded edges
        s = spow(np.sin(theta), e)
        return np.stack([0.9 * s * spow(np.sin(phi), e), 1.2 * spow(np.cos(theta), e),
                         0.22 * s * spow(np.cos(phi), e)], -1)
    verts, faces, uvs = surface_grid(pos, nu=128, nv=64)
    u, v = _canvas(h, 2 * h)
    p = pos(np.pi * (1.0 - v), 2.0 * np.pi * u - np.pi)      # each texel's point on the slab
    x, y, front = p[..., 0] / 0.9, p[..., 1] / 1.2, p[..., 2] > 0
    img = np.where(front[..., None], np.array([235.0, 225, 200]), np.array([40.0, 60, 110]))
    img = np.broadcast_to(img, (h, 2 * h, 3)).copy()
    # front: a red sun top left, three text-like bars, a green corner block (asymmetric in x)
    _paint(img, front & ((x + 0.5) ** 2 + (y - 0.6) ** 2 < 0.05), (210, 40, 30))
    for i, (l0, l1) in enumerate(((-0.1, 0.7), (-0.6, 0.6), (-0.6, 0.1))):
        _paint(img, front & (x > l0) & (x < l1) & (np.abs(y - (0.1 - 0.25 * i)) < 0.06), (30, 30, 30))
    _paint(img, front & (x > 0.35) & (x < 0.7) & (y > 0.35) & (y < 0.75), (20, 150, 60))
    # back: yellow diagonal stripes and a white ring
    back = ~front
    _paint(img, back & (np.sin(6 * (x - y)) > 0.5), (240, 200, 40))
    ring = x ** 2 + y ** 2
    _paint(img, back & (ring > 0.25) & (ring < 0.36), (250, 250, 250))
    return Model("card", verts, faces, uvs, img.astype(np.uint8),
                 note="procedural, symmetric shape, different pictures front and back")


def smooth_model(h: int = 512) -> Model:
    """Issue 34's "model with a smooth texture": a lumpy, lopsided body (no mirror plane, so
    no mirror fill) whose colour is a smooth function of where a texel lies on it, a few
    slow waves of hue and brightness and no edges. Two photos from opposite sides must give
    every view back at 30 dB or more: what neither sees (the underside from 15 degrees up)
    is filled along the surface from colours that change slowly."""
    def pos(theta, phi):
        r = 1.0 + 0.3 * _bump(theta, phi, 1.2, 0.9, 0.5) + 0.2 * _bump(theta, phi, 2.0, -2.0, 0.45) \
            + 0.05 * np.sin(2 * phi + 0.3) * np.sin(theta)
        return _sphere_dir(theta, phi) * r[..., None] * np.array([0.9, 1.0, 0.8])
    verts, faces, uvs = surface_grid(pos)
    u, v = _canvas(h, 2 * h)
    d = _sphere_dir(np.pi * (1.0 - v), 2.0 * np.pi * u - np.pi)     # each texel's direction
    x, y, z = d[..., 0], d[..., 1], d[..., 2]
    img = np.stack([0.55 + 0.25 * np.sin(1.4 * x + 0.8 * y + 0.3),
                    0.5 + 0.2 * np.cos(1.1 * y - 0.9 * z),
                    0.45 + 0.25 * np.sin(1.2 * z + 0.6 * x + 1.1)], -1) * 255
    return Model("smooth", verts, faces, uvs, np.clip(img, 0, 255).astype(np.uint8),
                 note="procedural, asymmetric, smooth colours (issue 34's two-photo target)")


PROCEDURAL = {"sym": sym_model, "lopsided": lopsided_model, "card": card_model, "smooth": smooth_model}
REAL = ("fuze", "capsule")
MODEL_NAMES = REAL + tuple(PROCEDURAL)


def load_model(name: str, models_dir: Path) -> Model:
    return PROCEDURAL[name]() if name in PROCEDURAL else load_trimesh_model(models_dir, name)


# --------------------------------------------------------------------------- cameras

def ring_cameras(vertices: np.ndarray, size: int = SIZE, fov_deg: float = FOV_DEG
                 ) -> dict[str, glb_render.CameraSpec]:
    """The 6 ``RING`` cameras around the bounding sphere of ``vertices`` (it fills the view),
    perspective, in Kiln's convention (OpenCV axes, K with pixel edges on whole numbers)."""
    from pipeline.camera.cameras import intrinsics, look_at

    v = np.asarray(vertices, np.float64)
    lo, hi = v.min(0), v.max(0)
    centre = (lo + hi) / 2
    radius = float(np.linalg.norm(v - centre, axis=1).max())
    dist = 1.05 * radius / math.sin(math.radians(fov_deg) / 2)
    K = intrinsics(fov_deg, size, size).astype(np.float64)
    out = {}
    for name, az, el in RING:
        a, e = math.radians(az), math.radians(el)
        d = np.array([math.sin(a) * math.cos(e), math.sin(e), math.cos(a) * math.cos(e)])
        vm = look_at(centre + d * dist, centre).astype(np.float64)
        near, far = glb_render.near_far(v, vm)
        out[name] = glb_render.CameraSpec(viewmat=vm, K=K, width=size, height=size, near=near, far=far)
    return out


def camera_json(cam: glb_render.CameraSpec) -> dict:
    """The ``source_camera`` form ``kiln bake --camera`` reads (pipeline/io/camera_file.py)."""
    return {"source_camera": {"projection": cam.projection, "width": int(cam.width),
                              "height": int(cam.height), "viewmat": np.asarray(cam.viewmat).tolist(),
                              "K": np.asarray(cam.K).tolist()}}


def rotation_error_deg(a: np.ndarray, b: np.ndarray) -> float:
    """Angle of the rotation between two world -> camera matrices' rotation parts."""
    R = np.asarray(a, np.float64)[:3, :3] @ np.asarray(b, np.float64)[:3, :3].T
    # |R - I|_F = 2 sqrt(2) sin(angle / 2): unlike arccos of the trace, exact near 0 as well
    return float(np.degrees(2 * np.arcsin(min(1.0, np.linalg.norm(R - np.eye(3)) / (2 * math.sqrt(2))))))


# --------------------------------------------------------------------------- metrics

def masked_psnr(a: np.ndarray, b: np.ndarray, where: np.ndarray) -> float:
    """PSNR in dB of two 8-bit images over the pixels ``where`` (all channels); nan if none."""
    if not where.any():
        return float("nan")
    d = a.astype(np.float64)[where] - b.astype(np.float64)[where]
    mse = float(np.mean(d * d))
    return float("inf") if mse == 0 else 10.0 * math.log10(255.0 ** 2 / mse)


def masked_ssim(a: np.ndarray, b: np.ndarray, where: np.ndarray) -> float:
    """SSIM (Gaussian window, sigma 1.5) averaged over ``where``; outside it both images are
    set to the same grey first, so the background neither helps nor hurts (the pixels at the
    silhouette's edge still see a little of it: it is the same in both)."""
    from skimage.metrics import structural_similarity

    if not where.any():
        return float("nan")
    rows, cols = np.flatnonzero(where.any(1)), np.flatnonzero(where.any(0))
    box = (slice(max(rows[0] - 5, 0), rows[-1] + 6), slice(max(cols[0] - 5, 0), cols[-1] + 6))
    x, y, m = a[box].copy(), b[box].copy(), where[box]
    if min(m.shape) < 7:
        return float("nan")
    x[~m] = 128
    y[~m] = 128
    smap = structural_similarity(x, y, channel_axis=2, data_range=255, gaussian_weights=True,
                                 sigma=1.5, use_sample_covariance=False, full=True)[1]
    return float(smap.mean(axis=2)[m].mean())


# --------------------------------------------------------------------------- kiln bake

def multi_image_supported() -> bool:
    """Does ``kiln bake`` keep every ``--image`` of a command line? Asked of the CLI's own
    parser, in a fresh process: argparse's plain ``store`` would keep only the last one and
    bake one photo silently, so "the flag is accepted" is not enough."""
    code = ("import sys\nfrom app.cli.cli import build_parser\n"
            "ns = build_parser().parse_args(['bake', '--mesh', 'M.ply', '--image', 'AAA.png', "
            "'--image', 'BBB.png', '-o', 'O.glb'])\n"
            "print('both' if 'AAA.png' in repr(vars(ns)) and 'BBB.png' in repr(vars(ns)) else 'last')\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip().endswith("both")


@dataclass
class Bake:
    ok: bool
    seconds: float
    glb: Optional[Path] = None
    report: dict = field(default_factory=dict)
    error: str = ""


def kiln_bake(mesh: Path, photos: list[tuple[Path, Optional[Path]]], out: Path, texture_size: int,
              extra: tuple[str, ...] = (), in_process: bool = False) -> Bake:
    """``kiln bake`` as a person runs it (worker start included): each photo with its camera
    file, or none (then kiln fits one)."""
    out.mkdir(parents=True, exist_ok=True)
    glb, report = out / "baked.glb", out / "report.json"
    cmd = [sys.executable, "-m", "app.cli", "bake", "--mesh", str(mesh)]
    for image, camera in photos:
        cmd += ["--image", str(image)] + (["--camera", str(camera)] if camera is not None else [])
    cmd += ["-o", str(glb), "--report", str(report), "--texture-size", str(texture_size),
            "--set", f"app.jobs_dir={out / 'jobs'}", "--set", f"app.cache_dir={out / 'cache'}", *extra]
    if in_process:
        cmd.append("--in-process")
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    secs = time.perf_counter() - t0
    (out / "kiln-bake.log").write_text(" ".join(cmd) + "\n\n" + r.stdout + r.stderr)
    if r.returncode != 0 or not glb.is_file():
        lines = [ln for ln in (r.stderr or r.stdout).strip().splitlines() if ln.strip()]
        return Bake(False, secs, error=f"exit {r.returncode}: {lines[-1] if lines else ''}"[:200])
    return Bake(True, secs, glb, json.loads(report.read_text()) if report.is_file() else {})


# --------------------------------------------------------------------------- runs

@dataclass
class Row:
    model: str
    photos: int
    cameras: str                 # "exact" | "fitted"
    status: str                  # "ok" or why not
    photo_views: tuple[str, ...] = ()
    psnr: dict = field(default_factory=dict)       # view -> dB
    ssim: dict = field(default_factory=dict)
    texels_from: dict = field(default_factory=dict)
    texels_chart_fraction: Optional[float] = None
    fit: list = field(default_factory=list)          # per photo: IoU, rotation error (fitted)
    seconds: float = 0.0

    def unseen(self) -> list[str]:
        return [n for n, _, _ in RING if n not in self.photo_views]

    def summary(self) -> dict:
        """The figures the table shows (nan when the row did not run)."""
        def agg(d, names, f):
            vals = [d[n] for n in names if n in d and np.isfinite(d[n])]
            return float(f(vals)) if vals else float("nan")
        seen, unseen = list(self.photo_views), self.unseen()
        return {"photo_psnr": agg(self.psnr, seen, np.mean), "unseen_mean_psnr": agg(self.psnr, unseen, np.mean),
                "unseen_worst_psnr": agg(self.psnr, unseen, np.min), "photo_ssim": agg(self.ssim, seen, np.mean),
                "unseen_mean_ssim": agg(self.ssim, unseen, np.mean)}


def _tile(img: np.ndarray, h: int) -> np.ndarray:
    from PIL import Image

    if img.shape[0] == h:
        return img
    return np.asarray(Image.fromarray(img).resize((h, h), Image.BILINEAR))


def side_by_side(truth: list, baked: list, photo_views: tuple[str, ...], h: int = 256) -> np.ndarray:
    """Rows: ground truth, bake, |difference| x 4 over both coverages (red: only one covers).
    Columns: the RING views; a photo view gets a green bar above it."""
    cols = []
    for (name, _, _), (t, tc), (b, bc) in zip(RING, truth, baked):
        both = tc & bc
        d = np.clip(np.abs(t.astype(int) - b.astype(int)) * 4, 0, 255).astype(np.uint8)
        diff = np.zeros_like(t)
        diff[both] = d[both]
        diff[tc ^ bc] = (255, 0, 0)
        bar = np.full((8, h, 3), (40, 200, 60) if name in photo_views else (60, 60, 60), np.uint8)
        col = np.concatenate([bar, _tile(t, h), _tile(b, h), _tile(diff, h)], axis=0)
        cols += [col, np.full((col.shape[0], 4, 3), 30, np.uint8)]
    return np.concatenate(cols[:-1], axis=1)


def run_model(model: Model, renderer, out: Path, photo_counts: list[int], modes: list[str],
              multi: bool, size: int, texture_size: int, in_process: bool,
              extra: tuple[str, ...]) -> list[Row]:
    from PIL import Image

    mdir = out / model.name
    mdir.mkdir(parents=True, exist_ok=True)
    truth_glb = model.write_truth_glb(mdir / "truth.glb")
    geometry = model.write_geometry_ply(mdir / "geometry.ply")
    cams = ring_cameras(model.vertices, size)
    truth = renderer.render(truth_glb, list(cams.values()), background=BACKGROUND)
    photo_files: dict[str, tuple[Path, Path]] = {}
    for (name, _, _), (rgb, cov) in zip(RING, truth):
        img, cam = mdir / f"photo-{name}.png", mdir / f"photo-{name}.camera.json"
        # the photo's alpha is the object's exact coverage: kiln bake reads it as the mask
        Image.fromarray(np.dstack([rgb, np.where(cov, 255, 0).astype(np.uint8)])).save(img)
        cam.write_text(json.dumps(camera_json(cams[name])))
        photo_files[name] = (img, cam)
    rows = []
    for n in photo_counts:
        views = PHOTO_SETS[n]
        for mode in modes:
            row = Row(model.name, n, mode, "ok", views)
            if n > 1 and not multi:
                row.status = "not supported by this kiln bake (one --image only)"
                rows.append(row)
                continue
            photos = [(photo_files[v][0], photo_files[v][1] if mode == "exact" else None) for v in views]
            bake = kiln_bake(geometry, photos, mdir / f"{n}-{mode}", texture_size, extra, in_process)
            row.seconds = bake.seconds
            if not bake.ok:
                row.status = f"bake failed: {bake.error}"
                rows.append(row)
                print(f"{model.name:9s} {n} photo(s) {mode:6s} {row.status}", flush=True)
                continue
            stats = bake.report.get("stats", {})
            row.texels_from = dict(stats.get("texels_from") or {})
            row.texels_chart_fraction = stats.get("texels_chart_fraction")
            if mode == "fitted":
                row.fit = _fit_figures(bake, cams, views)
            baked = renderer.render(bake.glb, list(cams.values()), background=BACKGROUND)
            for (name, _, _), (t, tc), (b, bc) in zip(RING, truth, baked):
                both = tc & bc
                row.psnr[name] = masked_psnr(t, b, both)
                row.ssim[name] = masked_ssim(t, b, both)
            Image.fromarray(side_by_side(truth, baked, views)).save(out / f"{model.name}-{n}-{mode}.png")
            s = row.summary()
            print(f"{model.name:9s} {n} photo(s) {mode:6s} photo {s['photo_psnr']:.2f} dB, unseen mean "
                  f"{s['unseen_mean_psnr']:.2f} worst {s['unseen_worst_psnr']:.2f} dB, "
                  f"{bake.seconds:.0f} s; texels {row.texels_from}", flush=True)
            rows.append(row)
    return rows


def _fit_figures(bake: Bake, cams: dict, views: tuple[str, ...]) -> list[dict]:
    """For a fitted camera: its silhouette IoU (the report's) and how far it turned from the
    true camera (the camera file kiln bake wrote beside the GLB), per photo."""
    figs = []
    model = bake.report.get("stats", {}).get("model") or {}
    fit = model.get("camera_fit") or {}
    cam_file = bake.glb.with_suffix(".camera.json") if bake.glb else None
    rot = None
    if cam_file is not None and cam_file.is_file():
        data = json.loads(cam_file.read_text())
        data = data.get("source_camera", data)
        if "viewmat" in data and len(views) == 1:
            rot = rotation_error_deg(np.asarray(data["viewmat"]), cams[views[0]].viewmat)
    figs.append({"iou": fit.get("silhouette_iou"), "rotation_error_deg": rot})
    return figs


# --------------------------------------------------------------------------- report

def fmt(v, nd: int = 2) -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{nd}f}"


def table(rows: list[Row]) -> str:
    head = ("| model | photos | cameras | photo view PSNR dB | unseen mean PSNR dB | unseen worst PSNR dB "
            "| photo SSIM | unseen SSIM | texels from (photo / fill) | fit IoU, turn | bake s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r.status != "ok":
            lines.append(f"| {r.model} | {r.photos} | {r.cameras} | {r.status} |" + " |" * 7)
            continue
        s = r.summary()
        tf = r.texels_from
        fit = "; ".join(f"{fmt(f.get('iou'), 3)}, {fmt(f.get('rotation_error_deg'), 1)}°" for f in r.fit) or "—"
        lines.append(f"| {r.model} | {r.photos} | {r.cameras} | {fmt(s['photo_psnr'])} | "
                     f"{fmt(s['unseen_mean_psnr'])} | {fmt(s['unseen_worst_psnr'])} | {fmt(s['photo_ssim'], 3)} | "
                     f"{fmt(s['unseen_mean_ssim'], 3)} | {fmt(tf.get('photo'), 2)} / {fmt(tf.get('fill'), 2)} | "
                     f"{fit} | {r.seconds:.0f} |")
    return "\n".join(lines)


def per_view_table(rows: list[Row]) -> str:
    names = [n for n, _, _ in RING]
    head = "| model | photos | cameras | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (3 + len(names))]
    for r in rows:
        if r.status == "ok":
            lines.append(f"| {r.model} | {r.photos} | {r.cameras} | " + " | ".join(
                ("**" if n in r.photo_views else "") + fmt(r.psnr.get(n)) + ("**" if n in r.photo_views else "")
                for n in names) + " |")
    return "\n".join(lines)


def compare(rows: list[Row], baseline: dict) -> list[str]:
    """Each row's gain over the same row of a baseline results.json, and issue 34's one-photo
    targets over all models the two runs share."""
    base = {(b["model"], b["photos"], b["cameras"]): b for b in baseline.get("rows", []) if b["status"] == "ok"}
    out, gains = [], {"exact": [], "fitted": []}
    for r in rows:
        b = base.get((r.model, r.photos, r.cameras))
        if r.status != "ok" or b is None:
            continue
        s, bs = r.summary(), b["summary"]
        g = (s["unseen_mean_psnr"] - bs["unseen_mean_psnr"], s["unseen_worst_psnr"] - bs["unseen_worst_psnr"],
             s["photo_psnr"] - bs["photo_psnr"])
        out.append(f"{r.model} {r.photos} photo(s) {r.cameras}: unseen mean {g[0]:+.2f} dB, worst {g[1]:+.2f} dB, "
                   f"photo view {g[2]:+.2f} dB")
        if r.photos == 1:
            gains[r.cameras].append(g)
    for mode, gs in gains.items():
        if not gs:
            continue
        mean, worst = float(np.mean([g[0] for g in gs])), float(np.mean([g[1] for g in gs]))
        # "stays within 0.5 dB of today": a loss counts against it, a gain does not (the grazing
        # rim of the photo's own view took the fill's colours before and the photo's now)
        drift = float(max(max(-g[2], 0.0) for g in gs))
        ok = (mean >= TARGET_UNSEEN_MEAN_GAIN_DB, worst >= TARGET_UNSEEN_WORST_GAIN_DB, drift <= TARGET_PHOTO_DRIFT_DB)
        out.append(f"one photo, {mode} cameras, {len(gs)} models: unseen views gain {mean:+.2f} dB on average "
                   f"({'meets' if ok[0] else 'MISSES'} >= {TARGET_UNSEEN_MEAN_GAIN_DB:g}), worst view {worst:+.2f} dB "
                   f"({'meets' if ok[1] else 'MISSES'} >= {TARGET_UNSEEN_WORST_GAIN_DB:g}), photo view loses at most "
                   f"{drift:.2f} dB ({'meets' if ok[2] else 'MISSES'} <= {TARGET_PHOTO_DRIFT_DB:g})")
    return out


def machine() -> dict:
    return glb_render.machine(ROOT, ("pipeline", "kiln", "app"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Outputs under --out: results.json, MODEL-PHOTOS-CAMERAS.png "
                                        "(ground truth / bake / |diff| x4; green bar = a photo's view), "
                                        "MODEL/ (truth.glb, geometry.ply, photos, camera files, bakes).")
    ap.add_argument("--models-only", nargs="+", default=list(MODEL_NAMES), choices=MODEL_NAMES, metavar="NAME",
                    help="models to run (default all): " + ", ".join(MODEL_NAMES))
    ap.add_argument("--models", type=Path, default=MODELS_DIR,
                    help=f"folder with the mikedh/trimesh model files (default {MODELS_DIR})")
    ap.add_argument("--photos", nargs="+", type=int, default=sorted(PHOTO_SETS), choices=sorted(PHOTO_SETS),
                    help="photo sets: 1 = front, 2 = front and back, 4 = the four sides (default all)")
    ap.add_argument("--cameras", nargs="+", default=["exact", "fitted"], choices=["exact", "fitted"],
                    help="exact: each photo's true camera as --camera; fitted: none given (default both)")
    ap.add_argument("--size", type=int, default=SIZE, help=f"photo and render size in pixels (default {SIZE})")
    ap.add_argument("--texture-size", type=int, default=1024, help="kiln bake --texture-size (default 1024)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to every kiln bake as --set (e.g. bake.mirror_fill=off)")
    ap.add_argument("--in-process", action="store_true", help="kiln bake --in-process (no worker start)")
    ap.add_argument("--baseline", type=Path, help="a results.json to compare with (e.g. bench/allround-baseline.json)")
    ap.add_argument("--out", type=Path, default=OUT_DIR, help=f"output folder (default {OUT_DIR})")
    args = ap.parse_args(argv)

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    multi = multi_image_supported()
    if any(n > 1 for n in args.photos) and not multi:
        print("kiln bake here keeps only the last --image: the 2- and 4-photo rows are reported as not "
              "supported", flush=True)
    extra = tuple(x for kv in args.set for x in ("--set", kv))
    info = machine()
    print(f"machine: {info['cpu']}, {info['cpus']} cores, load {info['loadavg'][0]:.1f}; "
          f"{info['branch']} {info['commit']}{' (modified)' if info['dirty'] else ''}", flush=True)
    try:
        renderer = glb_render.GLBRenderer().__enter__()   # fail before any slow work
    except glb_render.RendererUnavailable as e:
        print(f"allround: {e}", file=sys.stderr)
        return 2
    rows: list[Row] = []
    skipped: dict[str, str] = {}
    try:
        for name in args.models_only:
            try:
                model = load_model(name, args.models)
            except ModelMissing as e:
                skipped[name] = str(e)
                print(f"{name}: skipped: {e}", flush=True)
                continue
            rows += run_model(model, renderer, out, args.photos, args.cameras, multi, args.size,
                              args.texture_size, args.in_process, extra)
    finally:
        renderer.close()
    info["loadavg_end"] = os.getloadavg()
    print()
    print(table(rows))
    print()
    print("PSNR dB per view (bold: a photo's own view):")
    print(per_view_table(rows))
    if args.baseline:
        print()
        for line in compare(rows, json.loads(args.baseline.read_text())):
            print(line)
    (out / "results.json").write_text(json.dumps(
        {"machine": info, "size": args.size, "texture_size": args.texture_size, "set": args.set,
         "multi_image": multi, "ring": RING, "photo_sets": PHOTO_SETS, "skipped": skipped,
         "rows": [dict(r.__dict__, summary=r.summary()) for r in rows]}, indent=1, default=float))
    print(f"\nwrote {out / 'results.json'} and side-by-side PNGs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
