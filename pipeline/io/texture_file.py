"""A baked texture as an image file's bytes (PNG, JPEG or WebP), and what each is called.

PNG is lossless and what Kiln always wrote; JPEG and WebP are lossy and several times smaller
for a photo-like texture. Chart gutters are dilated by the bake, so the codecs' block
artefacts at a chart's edge fall on gutter texels, not on the surface.
"""

from __future__ import annotations

import io

import numpy as np

from pipeline.validate import StageInputError, check_array

# high enough that a baked photo texture shows no blocking in the viewer, low enough that a
# JPEG/WebP is a fraction of the PNG (docs/benchmarks.md, bench/formats.py)
QUALITY = 90
MIME = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
SUFFIX = {"png": ".png", "jpeg": ".jpg", "webp": ".webp"}


def encode_texture(image: np.ndarray, fmt: str) -> bytes:
    """``image`` ((H, W, 3) uint8, row 0 = top) as the bytes of a ``fmt`` file ("png",
    "jpeg" or "webp")."""
    from PIL import Image

    check_array("texture image", image, dtype=np.uint8, shape=(None, None, 3))
    if fmt not in MIME:
        raise StageInputError(f"texture format {fmt!r} is not one of {', '.join(MIME)}")
    buf = io.BytesIO()
    im = Image.fromarray(np.ascontiguousarray(image), "RGB")
    if fmt == "png":
        im.save(buf, format="PNG")   # PIL's default level, as trimesh wrote Kiln's PNGs before
    elif fmt == "jpeg":
        im.save(buf, format="JPEG", quality=QUALITY)
    else:
        im.save(buf, format="WEBP", quality=QUALITY, method=4)
    return buf.getvalue()


def sniff(data: bytes) -> str | None:
    """The format of image bytes by their magic number: "png", "jpeg", "webp" or None."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None
