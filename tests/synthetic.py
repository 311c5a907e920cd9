"""Synthetic test photos: a colourful, textured object on a plain background.

Shared by several test modules. The object's colour varies smoothly (a
gradient, so sampling positions can be checked) and sharply (a checker, so
blurring or misplaced texels show up), and the background is a dull, noisy
grey, so leaks of background into the object are noticeable.
"""

from __future__ import annotations

import numpy as np

BACKGROUND = (60, 60, 60)


def object_colors(size: int) -> np.ndarray:
    """(size, size, 3) uint8: the object's texture over the whole frame.

    Red grows to the right, green grows downwards, blue follows diagonal
    stripes, and a checker with cells of size/8 pixels darkens every other cell.
    """
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    u = (xx + 0.5) / size
    v = (yy + 0.5) / size
    r = 0.15 + 0.8 * u
    g = 0.15 + 0.8 * v
    b = 0.5 + 0.4 * np.sin(2.0 * np.pi * 3.0 * (u + v))
    cell = max(1, size // 8)
    checker = ((xx // cell + yy // cell) % 2).astype(np.float64)
    shade = 0.7 + 0.3 * checker
    rgb = np.stack([r, g, b], axis=-1) * shade[..., None]
    return np.clip(np.round(rgb * 255.0), 0, 255).astype(np.uint8)


def object_mask(size: int, shape: str = "ellipse", seed: int = 0) -> np.ndarray:
    """(size, size) bool mask of the object, well inside the frame.

    ``ellipse``: axis-aligned ellipse, semi-axes 0.36 and 0.26 of the frame.
    ``blob``: a smooth star-shaped outline whose radius has a few random
    harmonics (seeded), mean radius 0.3 of the frame.
    """
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    cx = cy = size / 2.0
    dx = (xx + 0.5 - cx) / size
    dy = (yy + 0.5 - cy) / size
    if shape == "ellipse":
        return (dx / 0.36) ** 2 + (dy / 0.26) ** 2 <= 1.0
    if shape == "blob":
        rng = np.random.default_rng(seed)
        theta = np.arctan2(dy, dx)
        radius = np.full_like(theta, 0.3)
        for k in range(2, 6):
            amp = rng.uniform(0.01, 0.045)
            phase = rng.uniform(0, 2 * np.pi)
            radius += amp * np.cos(k * theta + phase)
        return np.hypot(dx, dy) <= radius
    raise ValueError(f"unknown shape {shape!r}; use 'ellipse' or 'blob'")


def make_object_image(size: int = 256, shape: str = "ellipse", seed: int = 0):
    """A photo of a textured object and its mask.

    Returns (rgb, mask): rgb (size, size, 3) uint8, mask (size, size) bool.
    Background pixels are BACKGROUND plus a little seeded noise.
    """
    mask = object_mask(size, shape, seed)
    rng = np.random.default_rng(seed + 1)
    bg = np.array(BACKGROUND, np.int16) + rng.integers(-6, 7, size=(size, size, 3), dtype=np.int16)
    rgb = np.where(mask[..., None], object_colors(size).astype(np.int16), bg)
    return rgb.astype(np.uint8), mask
