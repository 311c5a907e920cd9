"""kiln.imageio: every PIL mode a person may upload, limits, corruption, EXIF, atomic PNG."""

from __future__ import annotations

import io
import os
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from kiln.imageio import ImageError, load_image, save_png

BIG = 10_000_000


def _encode(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _gradient(h=24, w=32) -> np.ndarray:
    """(h, w, 3) uint8 with distinct columns/rows so orientation errors show."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // (w - 1), y * 255 // (h - 1), np.full_like(x, 77)], -1).astype(np.uint8)


def test_rgb_png_roundtrip_from_bytes_and_path(tmp_path):
    rgb = _gradient()
    data = _encode(Image.fromarray(rgb))
    got, alpha = load_image(data, BIG)
    assert got.dtype == np.uint8 and got.shape == (24, 32, 3)
    assert np.array_equal(got, rgb) and alpha is None
    p = tmp_path / "x.png"
    p.write_bytes(data)
    got2, _ = load_image(p, BIG)
    got3, _ = load_image(str(p), BIG)
    assert np.array_equal(got2, rgb) and np.array_equal(got3, rgb)


def test_rgba_alpha_returned_and_opaque_alpha_is_none():
    rgba = np.zeros((10, 12, 4), np.uint8)
    rgba[..., :3] = 200
    rgba[2:8, 3:9, 3] = 255
    rgb, alpha = load_image(_encode(Image.fromarray(rgba, "RGBA")), BIG)
    assert alpha is not None and alpha.shape == (10, 12) and alpha.dtype == np.uint8
    assert np.array_equal(alpha, rgba[..., 3])
    rgba[..., 3] = 255
    _, alpha = load_image(_encode(Image.fromarray(rgba, "RGBA")), BIG)
    assert alpha is None


def test_grey_and_grey_alpha():
    g = np.arange(0, 240, 2, dtype=np.uint8).reshape(12, 10)
    rgb, alpha = load_image(_encode(Image.fromarray(g, "L")), BIG)
    assert rgb.shape == (12, 10, 3) and alpha is None
    assert np.array_equal(rgb[..., 0], g) and np.array_equal(rgb[..., 2], g)
    la = Image.merge("LA", [Image.fromarray(g), Image.fromarray(255 - g)])
    rgb, alpha = load_image(_encode(la), BIG)
    assert np.array_equal(rgb[..., 1], g) and np.array_equal(alpha, 255 - g)


def test_sixteen_bit_grey_scaled_to_8bit():
    a = np.array([[0, 257, 65535, 32896]], dtype=np.uint16).repeat(4, 0)
    img = Image.fromarray(a)
    assert img.mode == "I;16"
    rgb, alpha = load_image(_encode(img), BIG)
    assert alpha is None
    assert rgb[0, :, 0].tolist() == [0, 1, 255, 128]
    # TIFF keeps 16 bits too
    rgb_t, _ = load_image(_encode(img, "TIFF"), BIG)
    assert rgb_t[0, :, 1].tolist() == [0, 1, 255, 128]


def test_cmyk_jpeg_becomes_rgb():
    img = Image.new("CMYK", (16, 16), (0, 255, 255, 0))   # pure red in CMYK
    rgb, alpha = load_image(_encode(img, "JPEG", quality=95), BIG)
    assert alpha is None and rgb.shape == (16, 16, 3)
    r, g, b = rgb[8, 8].astype(int)
    assert r > 220 and g < 40 and b < 40


def test_palette_with_transparency():
    p = Image.new("P", (8, 6), 0)
    p.putpalette([0, 0, 0, 10, 200, 30] + [0] * (254 * 3))
    px = p.load()
    for x in range(2, 6):
        px[x, 3] = 1
    rgb, alpha = load_image(_encode(p, transparency=0), BIG)
    assert alpha is not None
    assert alpha[3, 2] == 255 and alpha[0, 0] == 0
    assert rgb[3, 3].tolist() == [10, 200, 30]
    # palette without transparency: plain RGB
    rgb2, alpha2 = load_image(_encode(p), BIG)
    assert alpha2 is None and rgb2[3, 4].tolist() == [10, 200, 30]


def test_exif_orientation_applied():
    rgb = _gradient(20, 30)
    img = Image.fromarray(rgb)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW to display
    got, _ = load_image(_encode(img, "JPEG", quality=100, exif=exif.tobytes()), BIG)
    assert got.shape == (30, 20, 3)
    # orientation 6 = the stored image's left column becomes the displayed top row
    expected = np.rot90(rgb, k=-1)
    assert np.abs(got.astype(int) - expected.astype(int)).mean() < 6


def test_too_many_pixels_refused_before_decoding(monkeypatch):
    # A valid PNG header claiming 30000 x 30000 with no real pixel data behind it:
    # refusing it must not need (or try) to decode anything.
    def chunk(tag, payload):
        return struct.pack(">I", len(payload)) + tag + payload + struct.pack(">I", zlib.crc32(tag + payload))
    header = struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 10)) + chunk(b"IEND", b"")

    def no_decode(self):
        raise AssertionError("decoded before checking the pixel limit")
    monkeypatch.setattr(Image.Image, "load", no_decode)
    with pytest.raises(ImageError, match="900,000,000 pixels; the limit is 40,000,000"):
        load_image(data, 40_000_000)


def test_pixel_limit_small():
    data = _encode(Image.fromarray(_gradient(100, 100)))
    with pytest.raises(ImageError, match="10,000 pixels; the limit is 9,999"):
        load_image(data, 9_999)
    assert load_image(data, 10_000)[0].shape == (100, 100, 3)


def test_file_too_big(tmp_path):
    data = _encode(Image.fromarray(_gradient(64, 64)))
    with pytest.raises(ImageError, match="limit is"):
        load_image(data, BIG, max_bytes=len(data) - 1)
    p = tmp_path / "big.png"
    p.write_bytes(data)
    with pytest.raises(ImageError, match="big.png is .* the limit is"):
        load_image(p, BIG, max_bytes=100)
    assert load_image(p, BIG, max_bytes=len(data))[0].shape == (64, 64, 3)


@pytest.mark.parametrize("payload,match", [
    (b"", "empty"),
    (b"this is plainly text, not a picture" * 10, "not an image"),
])
def test_not_an_image(payload, match):
    with pytest.raises(ImageError, match=match):
        load_image(payload, BIG)


def test_truncated_png_refused():
    data = _encode(Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)))
    with pytest.raises(ImageError, match="corrupt or truncated"):
        load_image(data[: len(data) // 2], BIG)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(ImageError, match="not found"):
        load_image(tmp_path / "nope.png", BIG)
    with pytest.raises(ImageError, match="folder"):
        load_image(tmp_path, BIG)


def test_save_png_atomic_roundtrip(tmp_path):
    rgba = np.random.default_rng(1).integers(0, 256, (9, 7, 4), dtype=np.uint8)
    out = save_png(tmp_path / "sub" / "a.png", rgba)
    assert out.exists()
    assert np.array_equal(np.asarray(Image.open(out)), rgba)
    mask = np.zeros((5, 6), bool)
    mask[1:3, 2:5] = True
    save_png(tmp_path / "m.png", mask)
    m = np.asarray(Image.open(tmp_path / "m.png"))
    assert m.dtype == np.uint8 and np.array_equal(m > 0, mask) and m.max() == 255
    # no temp files left behind
    assert sorted(os.listdir(tmp_path / "sub")) == ["a.png"]


def test_save_png_failure_leaves_old_file(tmp_path, monkeypatch):
    target = tmp_path / "keep.png"
    save_png(target, np.full((4, 4, 3), 10, np.uint8))

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(Image.Image, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        save_png(target, np.full((4, 4, 3), 99, np.uint8))
    monkeypatch.undo()
    assert np.asarray(Image.open(target))[0, 0, 0] == 10
    assert sorted(os.listdir(tmp_path)) == ["keep.png"]


def test_save_png_rejects_bad_arrays(tmp_path):
    with pytest.raises(ValueError, match="uint8 or bool"):
        save_png(tmp_path / "f.png", np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError, match="shape"):
        save_png(tmp_path / "f.png", np.zeros((4, 4, 2), np.uint8))


def test_only_the_listed_formats_are_decoded(monkeypatch):
    """PIL knows dozens of formats, some decoded by external programs (EPS by Ghostscript):
    an upload is only ever handed to the decoders of ``FORMATS``."""
    from PIL import EpsImagePlugin

    def no_eps(*a, **k):
        raise AssertionError("the EPS decoder saw an upload")
    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", no_eps)
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    with pytest.raises(ImageError, match="not an image Kiln can read"):
        load_image(eps, BIG)
    ppm = _encode(Image.fromarray(_gradient()), "PPM")      # PIL decodes it, Kiln does not offer it
    with pytest.raises(ImageError, match="not an image Kiln can read"):
        load_image(ppm, BIG)
    # multi-picture JPEGs (what many phones save) still open, through the JPEG decoder
    frames = [Image.fromarray(_gradient()), Image.fromarray(_gradient()[::-1].copy())]
    buf = io.BytesIO()
    frames[0].save(buf, format="MPO", save_all=True, append_images=frames[1:])
    rgb, alpha = load_image(buf.getvalue(), BIG)
    assert rgb.shape == (24, 32, 3) and alpha is None
    assert np.abs(rgb.astype(int) - _gradient()).mean() < 8


def test_sixteen_bit_colour_png_and_tiff_keep_their_high_bits():
    """16-bit RGB(A) as cameras and editors write it: scaled to 8 bits, not truncated."""
    cv2 = pytest.importorskip("cv2")
    bgra = np.zeros((8, 10, 4), np.uint16)
    bgra[..., 0], bgra[..., 1], bgra[..., 2] = 257, 32896, 65535      # B, G, R
    bgra[..., 3] = 65535
    bgra[:2, :, 3] = 0
    for ext, arr in ((".png", bgra), (".png", bgra[..., :3]), (".tiff", bgra[..., :3])):
        ok, buf = cv2.imencode(ext, np.ascontiguousarray(arr))
        assert ok
        rgb, alpha = load_image(buf.tobytes(), BIG)
        assert rgb.dtype == np.uint8 and tuple(rgb[4, 4]) == (255, 128, 1), ext
        if arr.shape[2] == 4:
            assert alpha is not None and alpha[0, 0] == 0 and alpha[4, 4] == 255
        else:
            assert alpha is None


# -- the byte limit follows the pixel limit ----------------------------------------------

@pytest.mark.parametrize("h,w,channels", [(256, 256, 4), (1024, 16, 4), (300, 217, 3), (16, 4096, 4)])
def test_worst_case_bound_holds_for_incompressible_images(h, w, channels):
    import cv2

    from kiln.imageio import METADATA_ALLOWANCE, worst_case_image_bytes

    noise = np.random.default_rng(h * w).integers(0, 256, (h, w, channels), dtype=np.uint8)
    sizes = [len(_encode(Image.fromarray(noise), "PNG", compress_level=lvl)) for lvl in (0, 1, 6, 9)]
    sizes.append(len(cv2.imencode(".png", noise)[1]))
    sizes.append(len(_encode(Image.fromarray(noise), "TIFF")))
    if channels == 3:
        sizes.append(len(_encode(Image.fromarray(noise), "JPEG", quality=100, subsampling=0)))
    bound = worst_case_image_bytes(h * w, channels=4)
    assert max(sizes) <= bound
    # tight: the bound is the raw size plus a few percent and the metadata room
    assert bound - METADATA_ALLOWANCE < 1.05 * h * w * 4 + 1024


def test_upload_limit_admits_the_largest_allowed_image():
    from kiln.imageio import upload_limit_bytes

    max_pixels = 256 * 256
    noise = np.random.default_rng(1).integers(0, 256, (256, 256, 4), dtype=np.uint8)
    data = _encode(Image.fromarray(noise, "RGBA"))
    limit = upload_limit_bytes(max_pixels)
    rgb, alpha = load_image(data, max_pixels, max_bytes=limit)
    assert rgb.shape == (256, 256, 3) and alpha is not None
    # the default pixel limit admits a 6000x4500 photo: its PNG must fit the byte limit too
    assert upload_limit_bytes(40_000_000) >= 6000 * 4500 * 4 * 1.02
    # an explicit cap (MiB) is honoured as it is
    assert upload_limit_bytes(max_pixels, 1) == 1024 * 1024
    with pytest.raises(ImageError, match="limit is 1.0 MB"):
        load_image(data + b"\0" * (1024 * 1024), max_pixels, max_bytes=upload_limit_bytes(max_pixels, 1))


def test_default_settings_limits_agree():
    from kiln.imageio import describe_limits, upload_limit_bytes, worst_case_image_bytes
    from kiln.settings import load

    app = load(None, {}).app
    limit = upload_limit_bytes(app.max_pixels, app.max_upload_mb)
    assert limit >= worst_case_image_bytes(app.max_pixels, channels=4)
    assert describe_limits(app.max_pixels, limit) == f"up to 40 MP and {limit / 2**20:.0f} MB"
