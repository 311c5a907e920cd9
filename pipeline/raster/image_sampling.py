"""Read images at arbitrary points on the host: bilinear with the border held, bicubic with
zeros outside, as ``torch.nn.functional.grid_sample`` does with ``align_corners=False``.

Coordinates are in pixels with pixel (col, row)'s centre at (col + 0.5, row + 0.5), the
convention of every camera in Kiln. The photo projection reads its photo, masks and depth
maps through these on any machine: a few hundred thousand texels are a few milliseconds for
the compiled loops (``sampling_kernels``), and the bake does not need torch for them.
"""

from __future__ import annotations

import numpy as np


def bilinear(image: np.ndarray, px: np.ndarray, py: np.ndarray) -> np.ndarray:
    """image (H, W) or (H, W, C) float32 at N points (px, py) -> (N,) or (N, C) float32;
    points outside read the nearest border value."""
    from pipeline.raster.sampling_kernels import bilinear_border

    image = np.asarray(image, np.float32)
    flat = image.ndim == 2
    planes = np.ascontiguousarray(image[..., None] if flat else image)
    out = np.empty((len(px), planes.shape[2]), np.float32)
    bilinear_border(planes, _index(px), _index(py), out)
    return out[:, 0] if flat else out


def bicubic(image: np.ndarray, px: np.ndarray, py: np.ndarray) -> np.ndarray:
    """image (H, W, C) float32 at N points (px, py) -> (N, C) float32; zero outside. Can
    overshoot [0, 1] near sharp edges, as any bicubic does: clamp where that matters."""
    from pipeline.raster.sampling_kernels import bicubic_zeros

    image = np.ascontiguousarray(image, np.float32)
    out = np.empty((len(px), image.shape[2]), np.float32)
    bicubic_zeros(image, _index(px), _index(py), out)
    return out


def sample_texture(image: np.ndarray, uv: np.ndarray) -> np.ndarray:
    """A texture's bilinear lookups: image (H, W, C) uint8 (read as /255) or float, row 0 at
    v = 1, at uv (N, 2) with texel (row, col)'s centre at ((col + .5) / W, 1 - (row + .5) / H),
    clamped to the edge texels. Returns (N, C) float32. The one texture lookup of the bake's
    fit measure, its renders and the vertex colours of untextured formats."""
    image = np.asarray(image)
    img = image.astype(np.float32) / np.float32(255.0) if image.dtype == np.uint8 else image.astype(np.float32)
    h, w = image.shape[:2]
    uv = np.asarray(uv, np.float32)
    return bilinear(img, uv[:, 0] * np.float32(w), (np.float32(1.0) - uv[:, 1]) * np.float32(h))


def _index(p: np.ndarray) -> np.ndarray:
    """Pixel-index coordinates (pixel i's centre at i) in float64 for the kernels."""
    return np.asarray(p, np.float64) - 0.5
