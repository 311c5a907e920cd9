"""Load user images safely and write PNGs atomically.

Every image a person hands Kiln (web upload or CLI path) goes through
``load_image``: size limits are checked on the file and on the header *before*
any pixel is decoded (a 100 kB PNG can claim 50 000 x 50 000 pixels), EXIF
orientation is applied so the image looks the way it did on the phone, and the
many PIL modes (grey, 16-bit, CMYK, palette, alpha variants) all come out as
8-bit RGB plus an optional alpha channel. Anything else is refused with
``ImageError`` and a sentence a person can act on.

Pure PIL + numpy: the app process imports this and must stay light.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np

from kiln.atomic import atomic_write
from kiln.limits import MIN_IMAGE_SIDE


class ImageError(ValueError):
    """The input is not a usable image (corrupt, unsupported, too big). The message says why."""


# The decoders PIL may use. PIL would otherwise try every plugin it has, some of which
# hand the bytes to external programs (EPS -> Ghostscript) or are rarely-fuzzed parsers.
# (Phones' multi-picture JPEGs open through the JPEG plugin.)
FORMATS = ("PNG", "JPEG", "WEBP", "TIFF", "BMP", "GIF")

# Modes whose pixels we can bring to 8-bit RGB(A) with PIL's own converters.
_DIRECT_RGB = {"RGB", "CMYK", "YCbCr", "LAB", "HSV", "1", "L"}
_DIRECT_RGBA = {"RGBA", "RGBa", "LA", "La", "PA"}
_SIXTEEN_BIT = {"I;16", "I;16L", "I;16B", "I;16N"}



# Room for a file's non-pixel chunks: ICC profile, EXIF, XMP, text.
METADATA_ALLOWANCE = 2 * 1024 * 1024

# Deflate's growth on incompressible data: zlib stores such blocks (+0.03 %); measured on
# noise, PIL writes +0.14 % and OpenCV +0.18 %. 2 % also covers a JPEG of pure noise at
# quality 100 without chroma subsampling (4.11 bytes per pixel).
DEFLATE_GROWTH = 0.02


def worst_case_image_bytes(pixels: int, channels: int = 4) -> int:
    """An upper bound on the file size of an 8-bit image of ``pixels`` pixels whose content
    does not compress at all (noise), as PNG, and so as TIFF, BMP or lossless WebP too.

    A PNG's image data is one filter byte per row plus ``channels`` bytes per pixel,
    deflated; with every side at least ``MIN_IMAGE_SIDE`` there are at most pixels / MIN_IMAGE_SIDE
    rows. Then the deflate growth, 12 bytes per IDAT chunk of at least 4 KiB (libpng
    writes 8 KiB, PIL 64 KiB), the fixed chunks and the metadata allowance.
    """
    raw = pixels * channels + -(-pixels // MIN_IMAGE_SIDE)
    deflated = int(raw * (1 + DEFLATE_GROWTH)) + 64
    chunks = 12 * -(-deflated // 4096)
    return deflated + chunks + 8 + 25 + 12 + METADATA_ALLOWANCE


def upload_limit_bytes(max_pixels: int, max_upload_mb: float = 0.0) -> int:
    """The byte limit that goes with the pixel limit: any 8-bit RGBA image of
    ``max_pixels`` pixels fits, whatever its content. ``max_upload_mb`` > 0 (MiB) is an
    explicit cap instead (which may then refuse some images the pixel limit allows)."""
    if max_upload_mb and max_upload_mb > 0:
        return int(max_upload_mb * 1024 * 1024)
    return worst_case_image_bytes(max_pixels, channels=4)


def describe_limits(max_pixels: int, max_bytes: int) -> str:
    """'up to 40 MP and 160 MB' (MP = million pixels; MB = MiB, as in the errors)."""
    return f"up to {max_pixels / 1e6:.3g} MP and {max_bytes / (1024 * 1024):.0f} MB"


def _fmt_mb(n: float) -> str:
    return f"{n / (1024 * 1024):.1f} MB"


def _read_source(source: str | Path | bytes, max_bytes: int | None) -> tuple[bytes, str]:
    """Return the raw bytes and a name for messages, checking the byte limit first."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if max_bytes is not None and len(data) > max_bytes:
            raise ImageError(f"upload is {_fmt_mb(len(data))}; the limit is {_fmt_mb(max_bytes)}")
        return data, "upload"
    path = Path(source)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ImageError(f"image file not found: {path}") from None
    except OSError as e:
        raise ImageError(f"cannot read image file {path}: {e.strerror}") from None
    if path.is_dir():
        raise ImageError(f"{path} is a folder, not an image file")
    if max_bytes is not None and size > max_bytes:
        raise ImageError(f"{path.name} is {_fmt_mb(size)}; the limit is {_fmt_mb(max_bytes)}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ImageError(f"cannot read image file {path}: {e.strerror}") from None
    return data, path.name


def _bomb_message(name: str, err: Exception, max_pixels: int) -> str:
    """PIL refuses absurd headers itself (beyond 2x its own limit) before we see the size."""
    import re

    from PIL import Image

    m = re.search(r"\((\d+) pixels\)", str(err))
    if m and int(m.group(1)) <= max_pixels:
        return (f"{name} is {int(m.group(1)):,} pixels, above the image decoder's own safety limit of "
                f"{2 * (Image.MAX_IMAGE_PIXELS or 0):,}. Downscale it and try again")
    claimed = f" is {int(m.group(1)):,} pixels;" if m else " has too many pixels;"
    return f"{name}{claimed} the limit is {max_pixels:,}. Downscale it and try again"


def _sixteen_to_8(arr: np.ndarray) -> np.ndarray:
    """(H, W) uint16/int32 in 0..65535 -> (H, W) uint8, full range kept (65535 -> 255)."""
    a = np.clip(arr.astype(np.float64), 0, 65535)
    return np.round(a / 257.0).astype(np.uint8)


def _to_rgb_alpha(img) -> tuple[np.ndarray, np.ndarray | None]:
    """Decoded PIL image of any mode -> ((H, W, 3) uint8, (H, W) uint8 alpha or None)."""
    mode = img.mode
    if mode in _SIXTEEN_BIT:
        grey = _sixteen_to_8(np.asarray(img))
        return np.repeat(grey[:, :, None], 3, axis=2), None
    if mode == "I":
        # 32-bit integer images almost always carry 16-bit samples (old PNG/TIFF readers).
        arr = np.asarray(img)
        grey = _sixteen_to_8(arr) if arr.max(initial=0) > 255 else np.clip(arr, 0, 255).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2), None
    if mode == "F":
        arr = np.asarray(img, dtype=np.float64)
        if not np.isfinite(arr).all():
            raise ImageError("floating-point image contains NaN or infinite values")
        # Floats in [0, 1] are normalised intensities; anything larger is taken as 0..255.
        scale = 255.0 if arr.max(initial=0) <= 1.0 else 1.0
        grey = np.clip(np.round(arr * scale), 0, 255).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2), None
    if mode == "P":
        has_alpha = "transparency" in img.info or img.palette.mode == "RGBA"
        img = img.convert("RGBA" if has_alpha else "RGB")
        mode = img.mode
    elif mode in ("L", "1") and "transparency" in img.info:
        img = img.convert("RGBA")
        mode = "RGBA"
    if mode in _DIRECT_RGBA:
        rgba = np.asarray(img.convert("RGBA"))
        rgb = np.ascontiguousarray(rgba[:, :, :3])
        alpha = np.ascontiguousarray(rgba[:, :, 3])
        return rgb, (None if alpha.min() == 255 else alpha)
    if mode in _DIRECT_RGB:
        return np.asarray(img.convert("RGB")).copy(), None
    raise ImageError(f"unsupported image mode '{mode}'; save it as an 8-bit RGB or RGBA PNG or JPEG")


def load_image(source: str | Path | bytes, max_pixels: int,
               max_bytes: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Load an image file or encoded bytes.

    Returns ``(rgb, alpha)``: rgb (H, W, 3) uint8, alpha (H, W) uint8 or None when
    the image has no transparency (a fully opaque alpha channel is reported as None).
    H, W are after EXIF orientation.

    Raises ``ImageError`` when the data is bigger than ``max_bytes``, claims more than
    ``max_pixels`` pixels (checked from the header, before decoding), is corrupt,
    truncated, not one of ``FORMATS``, or in a mode that cannot be converted.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    data, name = _read_source(source, max_bytes)
    if not data:
        raise ImageError(f"{name} is empty (0 bytes)")
    # open() with explicit formats only looks among the plugins loaded so far
    Image.init()
    try:
        with warnings.catch_warnings():
            # We enforce our own pixel limit below; PIL's warning would only be noise.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img: Image.Image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError as e:
        raise ImageError(_bomb_message(name, e, max_pixels)) from None
    except UnidentifiedImageError:
        raise ImageError(f"{name} is not an image Kiln can read (corrupt, or not PNG/JPEG/WebP/TIFF/BMP/GIF)") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise ImageError(f"{name} could not be opened as an image: {e}") from None

    width, height = img.size
    if width < 1 or height < 1:
        raise ImageError(f"{name} has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise ImageError(f"{name} is {width}x{height} = {width * height:,} pixels; "
                         f"the limit is {max_pixels:,}. Downscale it and try again")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img.load()
    except Image.DecompressionBombError as e:
        raise ImageError(_bomb_message(name, e, max_pixels)) from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise ImageError(f"{name} is corrupt or truncated: {e}") from None

    try:
        img = ImageOps.exif_transpose(img)
    except Exception:  # noqa: BLE001 - a broken EXIF block must not cost the picture; keep it unrotated
        pass
    try:
        return _to_rgb_alpha(img)
    except (ValueError, OSError) as e:
        if isinstance(e, ImageError):
            raise
        raise ImageError(f"{name}: image mode '{img.mode}' cannot be converted to RGB ({e}); "
                         "save it as an 8-bit RGB or RGBA PNG or JPEG") from None


def save_png(path: str | Path, array: np.ndarray) -> Path:
    """Write ``array`` as PNG atomically (temp file in the same folder + ``os.replace``).

    ``array``: (H, W) grey or mask, (H, W, 3) RGB, (H, W, 4) RGBA; uint8, or bool
    (written as 0/255 grey). Returns the path written.
    """
    from PIL import Image

    arr = np.asarray(array)
    if arr.dtype == bool:
        arr = arr.astype(np.uint8) * 255
    if arr.dtype != np.uint8:
        raise ValueError(f"save_png needs uint8 or bool pixels, got {arr.dtype}")
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (3, 4))):
        raise ValueError(f"save_png needs shape (H,W), (H,W,3) or (H,W,4), got {arr.shape}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"save_png got an empty image of shape {arr.shape}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda f: Image.fromarray(np.ascontiguousarray(arr)).save(f, format="PNG"))
