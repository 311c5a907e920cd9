"""A slow software stand-in for ``nvdiffrast.torch.rasterize``, written from nvdiffrast's
documentation, so Kiln's wrapper (tiling, clip matrices, output conventions) and the
raster comparison can be checked on a machine without CUDA.

Like nvdiffrast's CUDA rasterizer it decides coverage on vertex positions snapped to 1/16
pixel and computes barycentrics and depth from the unsnapped positions; so against GL
(1/256 pixel) it differs on silhouette slivers exactly as the real library does."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

SUBPIXEL = 16   # nvdiffrast's cudaraster: CR_SUBPIXEL_LOG2 = 4


def _cross2(a, b):
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def rasterize(ctx, pos, tri, resolution, ranges=None, grad_db=True):
    """nvdiffrast's interface: pos (B, V, 4) float32 clip space, tri (F, 3) int32,
    resolution [H, W] both divisible by 8; returns (B, H, W, 4) = (u, v, z/w, triangle_id + 1),
    u the weight of v0 and v of v1 (perspective-correct), row 0 at clip y = -1, pixel
    centres at +0.5, nearest z/w wins."""
    import torch

    assert pos.dtype == torch.float32 and pos.is_contiguous() and pos.ndim == 3 and pos.shape[2] == 4
    assert tri.dtype == torch.int32 and tri.is_contiguous()
    h, w = resolution
    assert h % 8 == 0 and w % 8 == 0, "RasterizeCudaContext wants sizes divisible by 8"
    P = pos.numpy().astype(np.float64)
    T = tri.numpy()
    out = np.zeros((P.shape[0], h, w, 4), np.float32)
    for b in range(P.shape[0]):
        zbuf = np.full((h, w), np.inf)
        clip = P[b][T]                                  # (F, 3, 4)
        ok = (clip[:, :, 3] > 0).all(1)
        px = np.zeros(clip.shape[:2] + (2,))
        px[ok] = (clip[ok, :, :2] / clip[ok, :, 3:4] + 1) * 0.5 * np.array([w, h])
        snapped = np.round(px * SUBPIXEL) / SUBPIXEL
        lo, hi = snapped.min(1), snapped.max(1)
        ok &= (hi[:, 0] > -0.5) & (hi[:, 1] > -0.5) & (lo[:, 0] < w + 0.5) & (lo[:, 1] < h + 0.5)
        for f in np.nonzero(ok)[0]:
            s = snapped[f]
            area = _cross2(s[1] - s[0], s[2] - s[0])
            if area == 0:
                continue
            x0, y0 = np.floor(s.min(0) - 0.5).astype(int)
            x1, y1 = np.ceil(s.max(0) + 0.5).astype(int)
            x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
            if x0 >= x1 or y0 >= y1:
                continue
            ys, xs = np.mgrid[y0:y1, x0:x1]
            p = np.stack([xs + 0.5, ys + 0.5], -1)
            # coverage on the snapped triangle
            e0 = _cross2(s[2] - s[1], p - s[1]) / area
            e1 = _cross2(s[0] - s[2], p - s[2]) / area
            inside = (e0 >= 0) & (e1 >= 0) & (1 - e0 - e1 >= 0)
            if not inside.any():
                continue
            # barycentrics and depth from the exact positions
            q = px[f]
            qa = _cross2(q[1] - q[0], q[2] - q[0])
            if qa == 0:
                continue
            l0 = _cross2(q[2] - q[1], p - q[1]) / qa
            l1 = _cross2(q[0] - q[2], p - q[2]) / qa
            l2 = 1 - l0 - l1
            c = clip[f]
            zw = l0 * c[0, 2] / c[0, 3] + l1 * c[1, 2] / c[1, 3] + l2 * c[2, 2] / c[2, 3]
            zb = zbuf[y0:y1, x0:x1]
            hit = inside & (np.abs(zw) <= 1) & (zw < zb)
            bw = np.stack([l0 / c[0, 3], l1 / c[1, 3], l2 / c[2, 3]], -1)
            bw /= bw.sum(-1, keepdims=True)
            zb[hit] = zw[hit]
            block = out[b, y0:y1, x0:x1]
            block[hit] = np.stack([bw[..., 0], bw[..., 1], zw, np.full_like(zw, f + 1)], -1)[hit]
    return torch.from_numpy(out), torch.zeros((P.shape[0], h, w, 0))


@pytest.fixture
def reference_nvdiffrast(monkeypatch):
    """Kiln's nvdiffrast backend, running on the stand-in above (on CPU)."""
    pytest.importorskip("torch")

    from pipeline.raster import rasterize as R

    pkg = types.ModuleType("nvdiffrast")
    mod = types.ModuleType("nvdiffrast.torch")
    mod.rasterize = rasterize
    pkg.torch = mod
    monkeypatch.setitem(sys.modules, "nvdiffrast", pkg)
    monkeypatch.setitem(sys.modules, "nvdiffrast.torch", mod)
    monkeypatch.setattr(R, "_nvdiffrast_problem", lambda: None)
    monkeypatch.setattr(R, "_new_nv_context", lambda device: (object(), "cpu"))
    monkeypatch.setattr(R, "_NV_TILE", 32)   # forces tiling, padding and cropping at test sizes
