"""Kiln's CPU splat renderer: gsplat's tiled classic rasterizer, compiled by numba.

The torch renderer in ``render_views`` builds every (pixel, Gaussian) fragment as tensors
and sorts them by pixel: most of its time went into gathers, the sort and the memory they
move (0.28 s a view of 40k Gaussians at 512², 2 cores). Here each 16 px tile walks its own
depth-ordered list of Gaussians pixel by pixel, as gsplat's CUDA kernel does, and the tiles
run on every core: the same image for a fraction of the time.

The math is gsplat 1.5.3's (``rasterize_to_pixels_3dgs_fwd``, classic mode):

* pixel centres at (col + 0.5, row + 0.5); ``sigma = 0.5 (a dx² + c dy²) + b dx dy``;
* ``alpha = min(0.999, opacity exp(-sigma))``; ``sigma < 0`` or ``alpha < 1/255`` skipped;
* a pixel stops *before* a Gaussian that would take its transmittance to 1e-4 or below;
* premultiplied colour ``sum c_i alpha_i T_i``, alpha ``1 - T``.

Only the pixels inside a Gaussian's footprint box (``radii``) are visited: outside it alpha
is below 1/255 anyway (the box is the ellipse's extent at that level), so this skips work,
not colour. Transmittance and colour are summed in float64.

numba compiles the kernels on first use and caches the machine code beside this file (or
in numba's user cache where this folder is read-only), so only a fresh install pays the
compile, once. numba is imported inside the functions: importing this module is free.
"""

from __future__ import annotations

import numpy as np

TILE = 16   # gsplat's tile side in pixels


def render_tiles(means2d: np.ndarray, conics: np.ndarray, radii: np.ndarray, order: np.ndarray,
                 opacities: np.ndarray, colors: np.ndarray, width: int, height: int):
    """Composite projected Gaussians into one view.

    means2d (N, 2) float32 pixel coordinates; conics (N, 3) float32 (a, b, c) of the
    inverse 2D covariance; radii (N, 2) int32 footprint half-extents; order (M,) int64
    indices of the Gaussians to draw, front to back; opacities (N,) and colors (N, 3)
    float32. Returns (premultiplied rgb (H, W, 3) float32, alpha (H, W) float32).
    """
    start, ids = _bin(np.ascontiguousarray(means2d, np.float32), np.ascontiguousarray(radii, np.int32),
                      np.ascontiguousarray(order, np.int64), int(width), int(height))
    premult = np.zeros((height, width, 3), np.float32)
    alpha = np.zeros((height, width), np.float32)
    _composite(np.ascontiguousarray(means2d, np.float32), np.ascontiguousarray(conics, np.float32),
               np.ascontiguousarray(radii, np.int32), np.ascontiguousarray(opacities, np.float32),
               np.ascontiguousarray(colors, np.float32), start, ids, int(width), int(height),
               premult, alpha)
    return premult, alpha


def warm() -> None:
    """Compile the kernels now (or load them from numba's cache): ``./run.sh setup`` calls
    this, so the first job after an install does not spend seconds compiling."""
    one = np.ones((1, 3), np.float32)
    render_tiles(np.full((1, 2), 8.0, np.float32), one, np.full((1, 2), 3, np.int32),
                 np.zeros(1, np.int64), one[0, :1], one, TILE, TILE)


def _bin(means2d, radii, order, width, height):
    from pipeline.views.splat_kernels import bin_tiles

    return bin_tiles(means2d, radii, order, width, height, TILE)


def _composite(means2d, conics, radii, opacities, colors, start, ids, width, height, premult, alpha):
    from pipeline.views.splat_kernels import composite

    composite(means2d, conics, radii, opacities, colors, start, ids, width, height, TILE, premult, alpha)
