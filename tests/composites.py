"""Photos with a known silhouette: Kiln's drawn cut-outs (kiln.examples, tests/synthetic.py)
with anti-aliased alpha, composited onto studio-like backgrounds and saved as JPEG. Shared by
tests/test_automask.py, tests/test_api.py and bench/automask.py."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from kiln.examples import draw_object
from synthetic import make_object_image


def cutout(kind: str, size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(colour (size, size, 3) float32, alpha (size, size) float32 in 0..1): ``kind`` drawn
    at 4x and area-averaged (colours un-premultiplied)."""
    import cv2

    big = size * 4
    rgb, mask = draw_object(big, kind, seed) if kind in ("toy", "pebble") else make_object_image(big, kind, seed)
    alpha = cv2.resize(mask.astype(np.float32), (size, size), interpolation=cv2.INTER_AREA)
    pre = cv2.resize(rgb.astype(np.float32) * mask[..., None], (size, size), interpolation=cv2.INTER_AREA)
    return pre / np.maximum(alpha[..., None], 1e-6), alpha


def backdrop(kind: str, h: int, w: int, seed: int = 0) -> np.ndarray:
    """(h, w, 3) float32: a studio-like background with a little sensor noise."""
    v, u = np.mgrid[0:h, 0:w].astype(np.float32)
    u, v = u / w, v / h
    if kind == "grey":
        bg = np.full((h, w, 3), 128, np.float32)
    elif kind == "white":
        bg = np.full((h, w, 3), 250, np.float32)
    elif kind == "gradient":   # a sweep from a pale top to a darker blue-grey floor
        t = (0.8 * v + 0.2 * u)[..., None]
        bg = np.array([215, 222, 235], np.float32) * (1 - t) + np.array([110, 118, 140], np.float32) * t
    elif kind == "vignette":   # a warm backdrop lit in the middle
        r2 = ((u - 0.5) ** 2 + (v - 0.45) ** 2)[..., None]
        bg = np.array([235, 230, 220], np.float32) * (1 - 0.9 * r2)
    else:
        raise ValueError(kind)
    return bg + np.random.default_rng(seed).normal(0, 1.5, bg.shape).astype(np.float32)


def as_jpeg(rgb: np.ndarray, quality: int = 85) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=quality)
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))


def composite(kind: str, bg: str, size: int = 300, canvas: tuple[int, int] = (360, 480),
              at: tuple[float, float] = (0.5, 0.5), seed: int = 0, quality: int = 85) -> tuple[np.ndarray, np.ndarray]:
    """(JPEG-decoded photo (H, W, 3) uint8, true silhouette (H, W) bool): the cut-out's
    centre at ``at`` (fractions of the canvas), cut by the frame where it runs off; saved at
    JPEG ``quality``."""
    colour, alpha = cutout(kind, size, seed)
    H, W = canvas
    y0, x0 = int(at[1] * H - size / 2), int(at[0] * W - size / 2)
    A = np.zeros((H, W), np.float32)
    C = np.zeros((H, W, 3), np.float32)
    ys, xs = slice(max(y0, 0), min(y0 + size, H)), slice(max(x0, 0), min(x0 + size, W))
    A[ys, xs] = alpha[ys.start - y0:ys.stop - y0, xs.start - x0:xs.stop - x0]
    C[ys, xs] = colour[ys.start - y0:ys.stop - y0, xs.start - x0:xs.stop - x0]
    photo = C * A[..., None] + backdrop(bg, H, W, seed) * (1 - A[..., None])
    return as_jpeg(np.clip(photo + 0.5, 0, 255).astype(np.uint8), quality), A >= 0.5
