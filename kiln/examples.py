"""Example inputs drawn by Kiln itself (no third-party images are shipped).

``python -m kiln.examples DIR`` writes:
  toy.png        RGBA, the object on a transparent background (alpha is the mask)
  toy_rgb.png    the same object on an opaque studio backdrop (a product shot: "Find the
                 object" or clicks select it)
  toy_mask.png   the mask for toy_rgb.png
  pebble.png     a second RGBA object, a flatter shape with a different pattern
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def draw_object(size: int = 512, kind: str = "toy", seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A colourful object on a plain canvas.

    Returns (rgb (size, size, 3) uint8, mask (size, size) bool). ``kind`` is
    "toy" (a round body with a head, striped and shaded) or "pebble" (a flat
    ellipse with a checker pattern).
    """
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    if kind == "toy":
        body = ((xx - 0.5) / 0.32) ** 2 + ((yy - 0.62) / 0.28) ** 2 <= 1.0
        head = ((xx - 0.5) / 0.17) ** 2 + ((yy - 0.27) / 0.16) ** 2 <= 1.0
        mask = body | head
        hue = np.stack([0.55 + 0.4 * xx, 0.25 + 0.5 * yy, 0.85 - 0.6 * xx], -1)
        stripes = (np.sin(yy * 60.0) > 0.3)[..., None]
        rgb = np.where(stripes, hue * 0.55, hue)
        eyes = (((xx - 0.44) ** 2 + (yy - 0.25) ** 2) < 0.0007) | (((xx - 0.56) ** 2 + (yy - 0.25) ** 2) < 0.0007)
        rgb[eyes] = 0.05
    elif kind == "pebble":
        mask = ((xx - 0.5) / 0.4) ** 2 + ((yy - 0.5) / 0.26) ** 2 <= 1.0
        checker = ((np.floor(xx * 12) + np.floor(yy * 12)) % 2)[..., None]
        rgb = np.where(checker > 0, [0.9, 0.75, 0.3], [0.2, 0.45, 0.7]) * np.ones_like(xx)[..., None]
    else:
        raise ValueError(f"unknown example kind {kind!r}; use 'toy' or 'pebble'")
    # soft shading so the object reads as round
    shade = 0.75 + 0.25 * np.clip(1.0 - 2.0 * np.hypot(xx - 0.42, yy - 0.4), 0, 1)
    rgb = np.clip(rgb * shade[..., None], 0, 1)
    rgb = (rgb * 255).astype(np.uint8)
    rgb[~mask] = 255
    return rgb, mask


def cluttered_background(size: int, seed: int = 0) -> np.ndarray:
    """(size, size, 3) uint8 smooth noisy background, unlike the object's colours."""
    rng = np.random.default_rng(seed)
    small = rng.uniform(0.35, 0.65, (8, 8, 3)).astype(np.float32)
    from PIL import Image

    img = Image.fromarray((small * 255).astype(np.uint8)).resize((size, size), Image.Resampling.BICUBIC)
    return np.asarray(img)


def studio_backdrop(size: int, seed: int = 0) -> np.ndarray:
    """(size, size, 3) uint8: a photo studio's paper backdrop, light above and warmer below,
    with a vignette and a little sensor noise. The opaque example is drawn on it: an opaque
    photo people bring is mostly a product shot, and the weight-free "Find the object" (the
    border model) serves exactly that; it refused the cluttered background the example had."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / max(1, size - 1)
    top, bottom = np.array([0.80, 0.84, 0.90]), np.array([0.62, 0.60, 0.58])
    rgb = top * (1 - yy[..., None]) + bottom * yy[..., None]
    rgb = rgb * (1.0 - 0.35 * ((xx - 0.5) ** 2 + (yy - 0.45) ** 2))[..., None]
    rgb = rgb + rng.normal(0, 0.006, rgb.shape)
    return (np.clip(rgb, 0, 1) * 255).astype(np.uint8)


def write_examples(folder: str | Path, size: int = 512) -> list[Path]:
    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for kind in ("toy", "pebble"):
        rgb, mask = draw_object(size, kind)
        rgba = np.dstack([rgb, (mask * 255).astype(np.uint8)])
        p = folder / f"{kind}.png"
        Image.fromarray(rgba, "RGBA").save(p)
        out.append(p)
    rgb, mask = draw_object(size, "toy")
    bg = studio_backdrop(size)
    composed = np.where(mask[..., None], rgb, bg)
    Image.fromarray(composed).save(folder / "toy_rgb.png")
    Image.fromarray((mask * 255).astype(np.uint8)).save(folder / "toy_mask.png")
    out += [folder / "toy_rgb.png", folder / "toy_mask.png"]
    return out


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "var/examples"
    for p in write_examples(target):
        print(p)
