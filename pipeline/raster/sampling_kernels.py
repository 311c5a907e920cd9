"""The compiled loops of ``pipeline.raster.image_sampling`` (see there for the conventions).

Imports numba at the top: ``image_sampling`` imports this module only when it samples.
``cache=True``: compiled once into ``__pycache__`` (``./run.sh setup`` does it).
"""

from __future__ import annotations

import math

import numba
import numpy as np

# torch's bicubic: Keys' cubic convolution with A = -0.75
_A = -0.75


@numba.njit(cache=True, nogil=True)
def _cubic_weights(t):
    """The four taps' weights at offsets -1, 0, 1, 2 for a fraction ``t`` in [0, 1)."""
    x1 = t + 1.0
    w0 = ((_A * x1 - 5.0 * _A) * x1 + 8.0 * _A) * x1 - 4.0 * _A
    w1 = ((_A + 2.0) * t - (_A + 3.0)) * t * t + 1.0
    x2 = 1.0 - t
    w2 = ((_A + 2.0) * x2 - (_A + 3.0)) * x2 * x2 + 1.0
    x3 = 2.0 - t
    w3 = ((_A * x3 - 5.0 * _A) * x3 + 8.0 * _A) * x3 - 4.0 * _A
    return w0, w1, w2, w3


@numba.njit(cache=True, nogil=True, parallel=True)
def bicubic_zeros(image, x, y, out):
    """out[n, c] = image (H, W, C) at (x[n], y[n]) in pixel-index coordinates (pixel i's
    centre at i), bicubic, zero outside the image."""
    h, w, n_ch = image.shape
    for n in numba.prange(x.shape[0]):
        # beyond two pixels out every tap is outside: clipping there changes nothing and
        # keeps the floor of an absurd coordinate a small integer
        fx = min(max(x[n], -4.0), w + 4.0)
        fy = min(max(y[n], -4.0), h + 4.0)
        x0 = int(math.floor(fx))
        y0 = int(math.floor(fy))
        wx = _cubic_weights(fx - x0)
        wy = _cubic_weights(fy - y0)
        for c in range(n_ch):
            acc = 0.0
            for j in range(4):
                row = y0 - 1 + j
                if row < 0 or row >= h:
                    continue
                line = 0.0
                for i in range(4):
                    col = x0 - 1 + i
                    if col >= 0 and col < w:
                        line += wx[i] * image[row, col, c]
                acc += wy[j] * line
            out[n, c] = acc


@numba.njit(cache=True, nogil=True, parallel=True)
def bilinear_border(image, x, y, out):
    """out[n, c] = image (H, W, C) at (x[n], y[n]) in pixel-index coordinates, bilinear, the
    coordinates clamped to the image first (torch's ``padding_mode="border"``)."""
    h, w, n_ch = image.shape
    for n in numba.prange(x.shape[0]):
        fx = min(max(x[n], 0.0), w - 1.0)
        fy = min(max(y[n], 0.0), h - 1.0)
        x0 = int(math.floor(fx))
        y0 = int(math.floor(fy))
        tx = fx - x0
        ty = fy - y0
        x1 = min(x0 + 1, w - 1)
        y1 = min(y0 + 1, h - 1)
        for c in range(n_ch):
            top = image[y0, x0, c] * (1.0 - tx) + image[y0, x1, c] * tx
            bottom = image[y1, x0, c] * (1.0 - tx) + image[y1, x1, c] * tx
            out[n, c] = top * (1.0 - ty) + bottom * ty
