"""kiln.maskfile: which channel of a mask file marks the object, and where the line is drawn."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from kiln.maskfile import grey_level, load_mask, read_alpha, read_mask_channels


def _png(arr: np.ndarray, mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr, mode).save(buf, format="PNG")
    return buf.getvalue()


def _object(h=120, w=160) -> np.ndarray:
    """An ellipse covering about 11 % of the frame."""
    y, x = np.mgrid[0:h, 0:w]
    return ((x - 70) / 30.0) ** 2 + ((y - 60) / 22.0) ** 2 <= 1.0


def test_rgba_mask_with_other_data_in_colour_is_read_by_alpha():
    # SAM 3D Objects' example masks: alpha marks the object, the colour channels hold
    # something else (bright almost everywhere, so by grey level it covers the frame)
    obj = _object()
    rng = np.random.default_rng(0)
    colour = rng.integers(140, 256, obj.shape + (3,), dtype=np.uint8)
    rgba = np.dstack([colour, np.where(obj, 255, 0).astype(np.uint8)])
    r = load_mask(_png(rgba, "RGBA"), max_pixels=10**6)
    assert r.channel == "alpha" and not r.thresholded
    assert np.array_equal(r.mask, obj)
    assert r.coverage == pytest.approx(obj.mean()) and 0.10 < r.coverage < 0.13
    assert grey_level(colour).min() > 127   # the old grey reading: the whole frame
    assert "alpha" in r.describe("mask m.png") and f"{100 * obj.mean():.1f} %" in r.describe("m")


def test_constant_alpha_falls_back_to_grey():
    obj = _object()
    grey = np.where(obj, 255, 0).astype(np.uint8)
    for a in (255, 0, 128):   # opaque (PIL reports no alpha), fully transparent, half
        rgba = np.dstack([grey, grey, grey, np.full(obj.shape, a, np.uint8)])
        r = load_mask(_png(rgba, "RGBA"), max_pixels=10**6)
        assert r.channel == "grey" and np.array_equal(r.mask, obj), a


def test_two_levels_higher_is_the_object():
    obj = _object()
    r = read_mask_channels(np.repeat(obj.astype(np.uint8)[..., None], 3, 2), None)   # 0/1 from numpy
    assert np.array_equal(r.mask, obj) and r.levels == 2 and not r.thresholded
    red = np.zeros(obj.shape + (3,), np.uint8)
    red[obj, 0] = 255                                                             # a coloured label
    assert np.array_equal(read_mask_channels(red, None).mask, obj)


def test_more_than_two_levels_is_thresholded_halfway_and_says_so():
    obj = _object()
    soft = np.where(obj, 230, 10).astype(np.uint8)
    soft[::7, ::5] = 120                        # antialiased / JPEG-like in-between values
    soft[0, 0] = 130
    r = read_mask_channels(np.repeat(soft[..., None], 3, 2), None)
    assert r.thresholded and r.levels == 4 and r.threshold == 120
    assert np.array_equal(r.mask, soft >= 120)
    text = r.describe("mask soft.png")
    assert "thresholded at 120" in text and "4 levels" in text


def test_constant_grey_is_all_or_nothing():
    assert not read_mask_channels(np.zeros((20, 20, 3), np.uint8), None).mask.any()
    assert read_mask_channels(np.full((20, 20, 3), 255, np.uint8), None).mask.all()


def test_image_alpha_soft_edges():
    obj = _object()
    alpha = np.where(obj, 255, 0).astype(np.uint8)
    alpha[obj & np.roll(~obj, 1, axis=1)] = 100   # a soft edge
    r = read_alpha(alpha)
    assert r.channel == "alpha" and r.thresholded and r.threshold == 128
    assert np.array_equal(r.mask, alpha >= 128)
    assert "read by its alpha (opaque = object)" in r.describe("the transparency of a.png")
