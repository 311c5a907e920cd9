"""Inputs for bench/fidelity.py, made by code (nothing third-party is committed).

Each input is an RGB photo (H, W, 3) uint8 and a mask (H, W) bool:

* ``toy``, ``pebble``: Kiln's generated examples (``kiln/examples.py``);
* ``astronaut``, ``coffee``, ``chelsea``: real photos that ship with scikit-image
  (``skimage.data``), masks by OpenCV GrabCut seeded with a rectangle chosen here
  (plus sure-foreground / sure-background strokes where GrabCut alone strays),
  then cleaned (largest part, holes filled, a light opening);
* ``lineart``: black pen strokes (2-3 px) on a white rounded card;
* ``sign``: a sign board with several lines of text (Pillow's built-in font);
* ``bricks``: fine texture, a brick wall with 2 px mortar and a 4 px checker band
  on a shield shape;
* ``globe``: an object whose appearance from *every* side is known: the surface the
  built-in backend reconstructs from the ``toy`` silhouette, painted with a colour that
  is a function of 3D position (``globe_colour``: a latitude/longitude checker, with a
  gradient from front to back), written as a GLB with a 4096 texture (``truth_glb``)
  and rendered by three.js from the photo's camera to make the photo. Its side and
  back views have a reference that neither bake was fitted to: the same GLB rendered
  from those cameras.

``python bench/fidelity_inputs.py [DIR]`` writes ``NAME.png`` and ``NAME_mask.png``
and a ``contact.png`` sheet (photo with the mask's outline) to check the masks by eye.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "var" / "fidelity" / "inputs"


@dataclass
class FidelityInput:
    name: str
    rgb: np.ndarray     # (H, W, 3) uint8
    mask: np.ndarray    # (H, W) bool
    note: str = ""
    truth_glb: Path | None = None   # the object itself, when its every side is known (``globe``)


# --------------------------------------------------------------------------- masks

def _clean(mask: np.ndarray, open_px: int = 2) -> np.ndarray:
    """Largest connected part, holes filled, thin spurs removed."""
    import cv2
    from scipy import ndimage

    m = mask.astype(np.uint8)
    if open_px > 0:
        k = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * open_px + 1, 2 * open_px + 1))
        m = cv2.morphologyEx(m, cv2.MORPH_OPEN, k)
    labels, n = ndimage.label(m)
    if n > 1:
        sizes = np.bincount(labels.ravel())[1:]
        m = labels == (int(np.argmax(sizes)) + 1)
    return ndimage.binary_fill_holes(m > 0)


def grabcut(rgb: np.ndarray, rect: tuple[int, int, int, int],
            fg: list[tuple[int, int, int, int]] = (), bg: list[tuple[int, int, int, int]] = (),
            iters: int = 8) -> np.ndarray:
    """GrabCut in ``rect`` = (x, y, w, h); ``fg``/``bg`` rectangles are forced to
    foreground/background. Deterministic: OpenCV seeds its GMM k-means with a fixed RNG."""
    import cv2

    cv2.setRNGSeed(0)
    mask = np.full(rgb.shape[:2], cv2.GC_BGD, np.uint8)
    x, y, w, h = rect
    mask[y:y + h, x:x + w] = cv2.GC_PR_FGD
    for (x0, y0, x1, y1) in fg:
        mask[y0:y1, x0:x1] = cv2.GC_FGD
    for (x0, y0, x1, y1) in bg:
        mask[y0:y1, x0:x1] = cv2.GC_BGD
    bgd = np.zeros((1, 65), np.float64)
    fgd = np.zeros((1, 65), np.float64)
    bgr = np.ascontiguousarray(rgb[..., ::-1])
    cv2.grabCut(bgr, mask, None, bgd, fgd, iters, cv2.GC_INIT_WITH_MASK)
    return (mask == cv2.GC_FGD) | (mask == cv2.GC_PR_FGD)


# --------------------------------------------------------------------------- inputs

def generated(kind: str) -> FidelityInput:
    from kiln.examples import draw_object

    rgb, mask = draw_object(512, kind)
    return FidelityInput(kind, rgb, mask, "kiln/examples.py")


def astronaut() -> FidelityInput:
    from skimage import data

    rgb = data.astronaut()
    # the astronaut with her helmet; the flag (left) and the shuttle model (right) stay out
    m = grabcut(rgb, (15, 10, 490, 502),
                fg=[(185, 60, 275, 140), (130, 175, 300, 235), (50, 290, 270, 500), (310, 390, 470, 500)],
                bg=[(0, 0, 90, 240), (350, 0, 512, 265), (305, 60, 345, 215), (100, 30, 145, 140),
                    (385, 265, 512, 330)])
    return FidelityInput("astronaut", rgb, _clean(m, 3), "skimage.data.astronaut, GrabCut")


def coffee() -> FidelityInput:
    from skimage import data

    rgb = data.coffee()
    # cup and saucer; the table edge and the spoon's far end stay out
    m = grabcut(rgb, (40, 20, 540, 360), fg=[(200, 100, 400, 200)])
    return FidelityInput("coffee", rgb, _clean(m, 3), "skimage.data.coffee, GrabCut")


def chelsea() -> FidelityInput:
    from skimage import data

    rgb = data.chelsea()
    # the cat's head fills the frame; the blurred room at the right and top stays out
    m = grabcut(rgb, (0, 0, 451, 300), fg=[(60, 50, 370, 280)],
                bg=[(430, 40, 451, 300), (415, 0, 451, 70), (0, 0, 25, 45)])
    return FidelityInput("chelsea", rgb, _clean(m, 3), "skimage.data.chelsea, GrabCut")


def _card_mask(size: int, inset: int, radius: int) -> np.ndarray:
    from PIL import Image, ImageDraw

    img = Image.new("L", (size, size), 0)
    ImageDraw.Draw(img).rounded_rectangle((inset, inset, size - inset, size - inset),
                                          radius=radius, fill=255)
    return np.asarray(img) > 127


def lineart(size: int = 512) -> FidelityInput:
    """A pen drawing (house, sun, spiral, hatching) in 2-3 px black strokes on a white card."""
    from PIL import Image, ImageDraw

    mask = _card_mask(size, 40, 40)
    img = Image.new("RGB", (size, size), (128, 128, 128))
    d = ImageDraw.Draw(img)
    d.rounded_rectangle((40, 40, size - 40, size - 40), radius=40, fill=(255, 255, 255))
    k = (0, 0, 0)
    d.polygon([(120, 250), (220, 160), (320, 250)], outline=k, width=3)          # roof
    d.rectangle((135, 250, 305, 400), outline=k, width=3)                        # walls
    d.rectangle((200, 320, 240, 400), outline=k, width=2)                        # door
    d.rectangle((150, 270, 190, 305), outline=k, width=2)                        # window
    d.line([(170, 270), (170, 305)], fill=k, width=2)
    d.line([(150, 287), (190, 287)], fill=k, width=2)
    d.ellipse((360, 90, 430, 160), outline=k, width=3)                           # sun
    for a in np.linspace(0, 2 * np.pi, 12, endpoint=False):
        c, s = np.cos(a), np.sin(a)
        d.line([(395 + 45 * c, 125 + 45 * s), (395 + 62 * c, 125 + 62 * s)], fill=k, width=2)
    t = np.linspace(0, 6 * np.pi, 400)                                          # spiral
    pts = [(395 + 3.5 * ti * np.cos(ti), 330 + 3.5 * ti * np.sin(ti)) for ti in t]
    d.line(pts, fill=k, width=2)
    for i in range(10):                                                          # hatching
        d.line([(80 + 12 * i, 430), (110 + 12 * i, 460)], fill=k, width=2)
    d.line([(70, 420), (440, 420)], fill=k, width=3)                              # ground
    rgb = np.asarray(img).copy()
    return FidelityInput("lineart", rgb, mask, "black strokes 2-3 px on a white card")


def sign(size: int = 512) -> FidelityInput:
    """A cream sign with a dark border and five lines of text at three sizes."""
    from PIL import Image, ImageDraw, ImageFont

    h = int(size * 0.7)
    img = Image.new("RGB", (size, h), (90, 110, 90))
    d = ImageDraw.Draw(img)
    d.rounded_rectangle((24, 24, size - 24, h - 24), radius=18, fill=(245, 235, 205),
                        outline=(60, 40, 30), width=8)
    lines = [("KILN WORKSHOP", 44, (150, 30, 20)), ("open daily 9:00 - 17:30", 26, (20, 20, 20)),
             ("photos in, models out", 26, (20, 20, 60)), ("no GPU? no problem.", 20, (20, 20, 20)),
             ("ask inside -> 42 Glaze Street", 16, (20, 60, 20))]
    y = 52
    for text, px, colour in lines:
        font = ImageFont.load_default(size=px)
        w = d.textlength(text, font=font)
        d.text(((size - w) / 2, y), text, font=font, fill=colour)
        y += int(px * 1.55)
    mask = np.zeros((h, size), bool)
    mask_img = Image.new("L", (size, h), 0)
    ImageDraw.Draw(mask_img).rounded_rectangle((24, 24, size - 24, h - 24), radius=18, fill=255)
    mask = np.asarray(mask_img) > 127
    return FidelityInput("sign", np.asarray(img).copy(), mask, "text, Pillow's built-in font")


def bricks(size: int = 512) -> FidelityInput:
    """A shield covered in bricks (2 px mortar), with a 4 px checker band across it."""
    from PIL import Image, ImageDraw

    yy, xx = np.mgrid[0:size, 0:size]
    bh, bw = 16, 36
    row = yy // bh
    offset = (row % 2) * (bw // 2)
    brick_id = (xx + offset) // bw + 97 * row
    mortar = (yy % bh < 2) | ((xx + offset) % bw < 2)
    rng = np.random.default_rng(7)
    tint = rng.uniform(0.75, 1.0, (brick_id.max() + 1, 1))
    base = np.array([178.0, 74.0, 52.0])
    rgb = (tint[brick_id] * base).astype(np.uint8)
    rgb[mortar] = (215, 210, 200)
    band = (yy >= 300) & (yy < 340)
    checker = ((xx // 4 + yy // 4) % 2).astype(bool)
    rgb[band & checker] = (30, 30, 40)
    rgb[band & ~checker] = (235, 225, 120)
    m = Image.new("L", (size, size), 0)
    ImageDraw.Draw(m).polygon([(80, 50), (432, 50), (432, 280), (256, 470), (80, 280)], fill=255)
    mask = np.asarray(m) > 127
    rgb[~mask] = (100, 120, 140)
    return FidelityInput("bricks", rgb, mask, "fine texture: 2 px mortar, 4 px checker")


GLOBE_TEXTURE = 4096
GLOBE_BACKGROUND = (120, 120, 120)


def globe_colour(p: np.ndarray) -> np.ndarray:
    """(N, 3) float colour in [0, 1] of the ``globe`` at world points p (N, 3) (y up, front +z).

    A checker of 12 longitude sectors by latitude bands 0.08 wide, orange and blue,
    the orange turning green and the blue purple from front to back, with thin dark
    lines along every fourth band: structure at several scales on every side."""
    lon = np.arctan2(p[:, 0], p[:, 2])                   # 0 at the front, +-pi at the back
    band = np.floor((p[:, 1] + 0.5) / 0.08).astype(np.int64)
    sector = np.floor((lon + np.pi) / (np.pi / 6)).astype(np.int64)
    back = 0.5 - 0.5 * np.cos(lon)                        # 0 front .. 1 back
    a = np.stack([0.92 - 0.6 * back, 0.55 + 0.2 * back, 0.18 + 0.1 * back], 1)
    b = np.stack([0.15 + 0.45 * back, 0.3 - 0.1 * back, 0.78 - 0.1 * back], 1)
    c = np.where(((band + sector) % 2 == 0)[:, None], a, b)
    line = np.abs(((p[:, 1] + 0.5) / 0.32) % 1.0 - 0.5) > 0.485     # ~0.01 wide every 0.32
    c[line] = (0.08, 0.08, 0.1)
    return c


def globe(folder: Path, settings=None, renderer=None) -> FidelityInput:
    """The ``globe`` input: photo, mask and ``truth_glb`` (written into ``folder``).

    The surface is what ``reconstruct`` makes of the toy's silhouette with ``settings``
    (default settings when None), so the pipeline run on this photo and mask rebuilds
    the very same surface; only its colours are unknown to it."""
    from kiln.examples import draw_object
    from kiln.settings import load
    from pipeline.raster import rasterize as rz
    from pipeline.texture.bake import fill_texture
    from pipeline.io.export import export_glb
    from pipeline.recon.reconstruct import reconstruct
    from pipeline.types import ImageInput, Texture
    from pipeline.unwrap.uv import unwrap

    import glb_render

    settings = settings or load(None, {})
    _, mask = draw_object(512, "toy")
    grey = np.full(mask.shape + (3,), 128, np.uint8)
    recon = reconstruct(ImageInput(rgb=grey, mask=mask), settings.reconstruct, seed=settings.seed)
    mesh = unwrap(recon.mesh, GLOBE_TEXTURE, gutter=4, max_faces=10 ** 7)
    with rz.raster_context("moderngl") as rc:
        raster = rz.rasterize_uv(rc, mesh, GLOBE_TEXTURE)
    chart = np.asarray(raster.tri_id[0]) >= 0
    pos = np.asarray(rz.interpolate(raster, mesh, mesh.vertices), np.float32)[0]
    image = np.zeros((GLOBE_TEXTURE, GLOBE_TEXTURE, 3), np.float32)
    image[chart] = globe_colour(pos[chart].astype(np.float64))
    folder.mkdir(parents=True, exist_ok=True)
    truth = folder / "globe_truth.glb"
    export_glb(mesh, Texture(image=fill_texture(image, chart, chart), seen=chart), truth)

    cam = recon.source_camera
    near, far = glb_render.near_far(recon.mesh.vertices.astype(np.float64), cam.viewmat.astype(np.float64))
    spec = glb_render.CameraSpec(viewmat=cam.viewmat.astype(np.float64), K=cam.K.astype(np.float64),
                                 width=cam.width, height=cam.height, projection=cam.projection,
                                 near=near, far=far)
    own = renderer is None
    r = glb_render.GLBRenderer().__enter__() if own else renderer
    try:
        [(rgb, covered)] = r.render(truth, [spec], background=GLOBE_BACKGROUND)
    finally:
        if own:
            r.close()
    # mask pixels the surface just misses (its silhouette is the mask's to ~1 px) take
    # their nearest rendered colour, as a camera would show the object's edge
    from scipy import ndimage

    _, (rows, cols) = ndimage.distance_transform_edt(~covered, return_indices=True)
    rgb = rgb.copy()
    fill = mask & ~covered
    rgb[fill] = rgb[rows[fill], cols[fill]]
    rgb[~mask] = GLOBE_BACKGROUND
    return FidelityInput("globe", rgb, mask, "known all-round colour on the toy's reconstructed "
                         "surface, photo rendered by three.js", truth_glb=truth)


BUILDERS: dict[str, Callable[[], FidelityInput]] = {
    "toy": lambda: generated("toy"),
    "pebble": lambda: generated("pebble"),
    "astronaut": astronaut,
    "coffee": coffee,
    "chelsea": chelsea,
    "lineart": lineart,
    "sign": sign,
    "bricks": bricks,
}
NAMES = tuple(BUILDERS) + ("globe",)


def make(name: str, folder: Path = DEFAULT_DIR, settings=None, renderer=None) -> FidelityInput:
    if name not in NAMES:
        raise ValueError(f"unknown fidelity input {name!r}; choose from {', '.join(NAMES)}")
    inp = globe(folder, settings, renderer) if name == "globe" else BUILDERS[name]()
    assert inp.rgb.dtype == np.uint8 and inp.rgb.ndim == 3 and inp.mask.shape == inp.rgb.shape[:2]
    return inp


def outline(rgb: np.ndarray, mask: np.ndarray, colour=(0, 255, 0)) -> np.ndarray:
    """The photo with the mask's edge drawn on it, and the outside dimmed."""
    from scipy import ndimage

    out = rgb.astype(np.float32)
    out[~mask] *= 0.45
    edge = mask ^ ndimage.binary_erosion(mask, iterations=2)
    out[edge] = colour
    return out.astype(np.uint8)


def write(folder: Path, names=NAMES, settings=None, renderer=None) -> list[FidelityInput]:
    """Make the inputs ``names`` and write them to ``folder``; ``settings`` and ``renderer``
    (a started glb_render.GLBRenderer, else one is started) serve ``globe`` only."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    items = [make(n, folder, settings, renderer) for n in names]
    tiles = []
    for it in items:
        Image.fromarray(it.rgb).save(folder / f"{it.name}.png")
        Image.fromarray((it.mask * 255).astype(np.uint8)).save(folder / f"{it.name}_mask.png")
        tiles.append(outline(it.rgb, it.mask))
    th = 256
    row = [np.asarray(Image.fromarray(t).resize((round(t.shape[1] * th / t.shape[0]), th))) for t in tiles]
    Image.fromarray(np.concatenate(row, axis=1)).save(folder / "contact.png")
    return items


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR
    for it in write(out):
        print(f"{it.name:10s} {it.rgb.shape[1]}x{it.rgb.shape[0]}  mask {it.mask.mean():.1%}  {it.note}")
    print(f"wrote {out}/contact.png")
