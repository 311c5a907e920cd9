"""pipeline.raster.image_sampling: the host's image lookups against torch's grid_sample, whose
conventions they keep (align_corners=False; bilinear holds the border, bicubic reads zeros
outside), at points inside, on the edges and far outside the image."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.raster.image_sampling import bicubic, bilinear


def _points(rng, w, h, n=4000):
    px = rng.uniform(-6, w + 6, n)
    py = rng.uniform(-6, h + 6, n)
    # pixel centres, the exact edges and absurd coordinates too
    px[:50], py[:50] = rng.integers(0, w, 50) + 0.5, rng.integers(0, h, 50) + 0.5
    px[50:60], py[50:60] = 0.0, h
    px[60:70], py[60:70] = 1e9, -1e12
    return px.astype(np.float32), py.astype(np.float32)


def _grid(px, py, w, h):
    return torch.stack([2 * torch.from_numpy(px).double() / w - 1, 2 * torch.from_numpy(py).double() / h - 1], 1)[None, None]


def test_bicubic_is_grid_samples_with_zeros_outside():
    rng = np.random.default_rng(0)
    img = rng.random((37, 53, 3)).astype(np.float32)
    px, py = _points(rng, 53, 37)
    ref = torch.nn.functional.grid_sample(torch.from_numpy(img).double().permute(2, 0, 1)[None], _grid(px, py, 53, 37),
                                          mode="bicubic", padding_mode="zeros", align_corners=False)[0, :, 0].T.numpy()
    got = bicubic(img, px, py)
    assert got.shape == (len(px), 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, atol=2e-5)
    assert (got[60:70] == 0).all()
    # at a pixel centre the cubic's outer taps weigh nothing: the pixel itself
    cols, rows = (px[:50] - 0.5).astype(int), (py[:50] - 0.5).astype(int)
    np.testing.assert_allclose(got[:50], img[rows, cols], atol=1e-6)


def test_bilinear_is_grid_samples_holding_the_border():
    rng = np.random.default_rng(1)
    img = rng.random((29, 41)).astype(np.float32)
    px, py = _points(rng, 41, 29)
    ref = torch.nn.functional.grid_sample(torch.from_numpy(img).double()[None, None], _grid(px, py, 41, 29),
                                          mode="bilinear", padding_mode="border", align_corners=False)[0, 0, 0].numpy()
    got = bilinear(img, px, py)
    assert got.shape == (len(px),) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, atol=2e-6)
    assert got[60] == img[0, -1]          # far right, far above: the top-right corner


def test_bilinear_reads_every_channel_of_a_colour_image_as_each_plane_alone():
    rng = np.random.default_rng(2)
    img = rng.random((9, 14, 3)).astype(np.float32)
    px, py = _points(rng, 14, 9, 500)
    got = bilinear(img, px, py)
    assert got.shape == (500, 3)
    for c in range(3):
        np.testing.assert_array_equal(got[:, c], bilinear(img[..., c], px, py))
