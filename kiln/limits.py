"""Kiln's input rules and size limits, in one place.

The page, the CLI, the API and the stages read these; each value is checked once where it
enters (an upload, a file on the command line, an API call) and trusted after that. The
stages keep their own checks only where a limit is a capability (what a rasterizer can
hold), and take the value from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:   # numpy is not imported for the constants (settings and --help read them)
    import numpy as np

# --------------------------------------------------------------------------- images

# The shortest side an input image may have: smaller ones hold too little to segment.
MIN_IMAGE_SIDE = 16
# The largest image ``app.max_pixels`` can ever admit (its settings range ends here).
MAX_INPUT_PIXELS = 200_000_000
# The longest side reconstruction may downscale to: no admitted image is larger, and a
# backend given a larger target would allocate for it.
MAX_WORK_SIDE = 16384
# The longest side of any camera image, raster or texture: a float32 RGBA target of
# 8192^2 is 1 GiB.
MAX_RASTER_SIDE = 8192
# The longest side an admitted photo can have (the most pixels ``app.max_pixels`` admits, on
# the narrowest strip): the photo's own camera describes it at that size, and is never drawn
# at it (the photo projection crops and scales to the texture first).
MAX_PHOTO_SIDE = MAX_INPUT_PIXELS // MIN_IMAGE_SIDE
# views x height x width rendered or rasterized at once; the output alone is 16 bytes a
# pixel (~4.3 GB here), the most the bake settings can ask for (64 views of 2048^2).
MAX_TOTAL_PIXELS = 2 ** 28


def image_size_problem(width: int, height: int, name: str = "image") -> Optional[str]:
    """Why an input image of this size cannot be used (a sentence about ``name``), or None."""
    if min(width, height) < MIN_IMAGE_SIDE:
        return (f"{name} is only {width}x{height} pixels; use one at least {MIN_IMAGE_SIDE} pixels "
                "on each side")
    return None

# --------------------------------------------------------------------------- masks

# Fewer object pixels than this is a speck, not an object: refused by the page, the CLI,
# the API and the reconstruction (measured on the image the check sees).
MIN_MASK_PIXELS = 64


def mask_problem(mask: np.ndarray) -> Optional[str]:
    """Why no job can start from ``mask`` ((H, W) bool), as the end of a sentence that
    begins with the mask's name ("the mask", "mask m.png"), or None when it is usable.
    The caller adds what to do next, in its own front end's words."""
    n = int(mask.sum())
    if n == 0:
        return "is empty: no pixel is the object"
    if n == mask.size:
        return "covers the whole image: some background must stay outside the object"
    if n < MIN_MASK_PIXELS:
        return f"has only {n} object pixel(s); at least {MIN_MASK_PIXELS} are needed for a shape"
    return None

# --------------------------------------------------------------------------- meshes and textures

# The most faces any stage takes (cleaning needs ~100 bytes a face; face ids stay exact in
# float32 render targets below 2^24). A bigger mesh is a mistake or needs simplifying elsewhere.
MAX_FACES = 10_000_000
# the fewest faces an exact count (mesh.faces, --faces) may ask for: below this a closed
# surface is a few flat facets and its outline no longer follows the object's (a cube has 12)
MIN_EXACT_FACES = 100
# The smallest texture: below 16 texels a chart cannot hold a gutter.
MIN_TEXTURE_SIZE = 16
# The largest mesh or splat file Kiln reads (a 30 MB TRELLIS splat, a scan of a few hundred MB).
MAX_MODEL_FILE_BYTES = 1 << 30


def model_file_problem(path, kind: str) -> Optional[str]:
    """Why a ``kind`` ("model", "splat") file cannot be read (missing, too big), or None."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        return f"{path} does not exist"
    size = path.stat().st_size
    if size > MAX_MODEL_FILE_BYTES:
        return (f"{path.name} is {size / 2 ** 30:.1f} GiB; Kiln reads {kind} files of at most "
                f"{MAX_MODEL_FILE_BYTES / 2 ** 30:.0f} GiB")
    return None
