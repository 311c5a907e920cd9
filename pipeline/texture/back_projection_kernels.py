"""The fast bake's back-projection on the CPU, compiled by numba: the twin of
``pipeline.texture.bake._project_view`` summed over the views (see there for the math).

The torch code builds a dozen (N,) temporaries per view and a ``grid_sample`` of the whole
premultiplied view; here each texel walks the views once, in the same order, with its sums in
registers: the same numbers to float32 round-off (0.75 s -> ~0.15 s on the toy, 2 cores).
Where round-off moves a texel across a pixel edge or the depth test's bound, that texel's
visibility in that view can differ from torch's: ``tests/test_bake.py`` bounds how often.

This module imports numba at the top: import it only to bake on the CPU. ``cache=True``
keeps the machine code in ``__pycache__``, so only the first run after an install compiles.
"""

from __future__ import annotations

import math

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _tap(rgb, alpha, c, y, x, height, width, w, r, g, b, a):
    # (r, g, b, a) plus one bilinear tap of view c's premultiplied (rgb * alpha, alpha) at
    # weight w; zeros outside the view (grid_sample's zeros padding)
    if 0 <= x < width and 0 <= y < height:
        al = alpha[c, y, x]
        r += w * (rgb[c, y, x, 0] * al)
        g += w * (rgb[c, y, x, 1] * al)
        b += w * (rgb[c, y, x, 2] * al)
        a += w * al
    return r, g, b, a


@numba.njit(cache=True, nogil=True, parallel=True)
def back_project(positions, normals, viewmats, Ks, centers, depth, rgb, alpha, rel_tol, max_slope,
                 footprints, cos_power, acc):
    """acc (N, 4) float32 += per view, weight * bilinear (premultiplied rgb, alpha) at each
    texel's projection, weight = cos^cos_power where the view's depth map shows the texel,
    else 0. positions, normals (N, 3) float32 (normals unit); viewmats (C, 4, 4), Ks (C, 3, 3),
    centers (C, 3), depth (C, H, W), rgb (C, H, W, 3), alpha (C, H, W), all float32."""
    n_views, height, width = depth.shape
    one = np.float32(1.0)
    for i in numba.prange(positions.shape[0]):
        px_, py_, pz_ = positions[i, 0], positions[i, 1], positions[i, 2]
        nx, ny, nz = normals[i, 0], normals[i, 1], normals[i, 2]
        nn = max(math.sqrt(nx * nx + ny * ny + nz * nz), np.float32(1e-12))
        nx, ny, nz = nx / nn, ny / nn, nz / nn
        for c in range(n_views):
            R = viewmats[c]
            K = Ks[c]
            z = px_ * R[2, 0] + py_ * R[2, 1] + pz_ * R[2, 2] + R[2, 3]
            if not z > 1e-6:
                continue
            cx = px_ * R[0, 0] + py_ * R[0, 1] + pz_ * R[0, 2] + R[0, 3]
            cy = px_ * R[1, 0] + py_ * R[1, 1] + pz_ * R[1, 2] + R[1, 3]
            u = (cx * K[0, 0] + cy * K[0, 1]) / z + K[0, 2]
            v = cy / z * K[1, 1] + K[1, 2]
            tx, ty, tz = centers[c, 0] - px_, centers[c, 1] - py_, centers[c, 2] - pz_
            tn = max(math.sqrt(tx * tx + ty * ty + tz * tz), np.float32(1e-12))
            cos = nx * (tx / tn) + ny * (ty / tn) + nz * (tz / tn)
            if not cos > 0:
                continue
            col = int(math.floor(u))
            row = int(math.floor(v))
            if col < 0 or col >= width or row < 0 or row >= height:
                continue
            d = depth[c, row, col]
            if not d > 0:
                continue
            cc = min(cos, one)
            tan = math.sqrt(one - cc * cc) / max(cos, np.float32(one / max_slope))
            tol = rel_tol * abs(z) + footprints * (z / K[0, 0]) * tan
            if not abs(z - d) <= tol:
                continue
            weight = cos ** cos_power
            # grid_sample, bilinear, align_corners=False: the pixel coordinate of the sample
            gx = np.float32(2.0) * u / width - one
            gy = np.float32(2.0) * v / height - one
            ix = ((gx + one) * width - one) / np.float32(2.0)
            iy = ((gy + one) * height - one) / np.float32(2.0)
            x0 = int(math.floor(ix))
            y0 = int(math.floor(iy))
            fx = ix - x0
            fy = iy - y0
            zero = np.float32(0.0)
            r, g, b, a = _tap(rgb, alpha, c, y0, x0, height, width, (one - fx) * (one - fy), zero, zero, zero, zero)
            r, g, b, a = _tap(rgb, alpha, c, y0, x0 + 1, height, width, fx * (one - fy), r, g, b, a)
            r, g, b, a = _tap(rgb, alpha, c, y0 + 1, x0, height, width, (one - fx) * fy, r, g, b, a)
            r, g, b, a = _tap(rgb, alpha, c, y0 + 1, x0 + 1, height, width, fx * fy, r, g, b, a)
            acc[i, 0] += r * weight
            acc[i, 1] += g * weight
            acc[i, 2] += b * weight
            acc[i, 3] += a * weight


def warm() -> None:
    """Compile ``back_project`` now (or load it from numba's cache): ``./run.sh setup``."""
    f = np.zeros((1, 3), np.float32)
    back_project(f, f, np.eye(4, dtype=np.float32)[None], np.eye(3, dtype=np.float32)[None], f,
                 np.zeros((1, 2, 2), np.float32), np.zeros((1, 2, 2, 3), np.float32),
                 np.zeros((1, 2, 2), np.float32), np.float32(0.004), np.float32(10.0), np.float32(1.0),
                 np.float32(4.0), np.zeros((1, 4), np.float32))
