"""Reconstruction stage: one masked photo -> a closed, coloured mesh plus Gaussians.

``reconstruct`` validates and downscales the photo, then dispatches on
``settings.backend`` through ``RECONSTRUCTORS``. Every backend lives in its own
module, ``pipeline/<backend>.py``, and registers itself with
``register_backend`` when imported; this module imports it on first use, so a
backend's dependencies load only when someone asks for it. ``builtin``
(``pipeline/recon/builtin.py``, silhouette inflation) is always there; ``sam3d``
(``pipeline/recon/sam3d.py``) when SAM 3D Objects is installed.

Frame of every backend's output (see ``pipeline/types.py``): y up, the photo's
camera looks along -z at the object's front (+z), image column -> +x, image
row -> -y, normalised into [-0.5, 0.5]^3 with the longest extent 1.
"""

from __future__ import annotations

import importlib
from typing import Callable, Optional

import numpy as np

from kiln.limits import MAX_INPUT_PIXELS, MAX_WORK_SIDE, mask_problem
from kiln.settings import ReconstructSettings

from pipeline.types import ImageInput, Reconstruction, SourceCamera
from pipeline.validate import StageInputError, check_int

ProgressFn = Callable[[float, str], None]
# fn(image, settings, seed, progress) -> Reconstruction; image already validated and downscaled
Reconstructor = Callable[[ImageInput, ReconstructSettings, int, Optional[ProgressFn]], Reconstruction]

RECONSTRUCTORS: dict[str, Reconstructor] = {}
# fn(image, settings) -> None, raising StageInputError: the backend's own refusals of an
# input, cheap enough to run before a worker starts (image already validated and downscaled)
InputCheck = Callable[[ImageInput, ReconstructSettings], None]
INPUT_CHECKS: dict[str, InputCheck] = {}

ALWAYS_AVAILABLE = "builtin"


class BackendUnavailable(StageInputError):
    """The requested reconstruction backend is not installed or could not be loaded."""


# --------------------------------------------------------------------------- dispatch

def register_backend(name: str, fn: Reconstructor, check_input: Optional[InputCheck] = None) -> None:
    """Make ``reconstruct.backend: <name>`` call ``fn``; backend modules call this on import.
    ``check_input``: the refusals ``fn`` would start with, for ``check_input()``."""
    RECONSTRUCTORS[name] = fn
    if check_input is not None:
        INPUT_CHECKS[name] = check_input


def check_input(image: ImageInput, settings: ReconstructSettings) -> None:
    """Everything ``reconstruct`` would refuse ``image`` for before doing real work: the
    general checks (validation, empty/full mask, a speck, also after the downscale) and
    the backend's own (builtin: a mask too thin for the grid). For front ends, before a
    worker starts. A backend that cannot be loaded here is left to the worker, whose
    probe says why."""
    prepared, _ = prepare_image(image, settings.max_image_side)
    try:
        lookup(settings.backend)
    except BackendUnavailable:
        return
    check = INPUT_CHECKS.get(settings.backend)
    if check is not None:
        check(prepared, settings)


def reconstruct(image: ImageInput, settings: ReconstructSettings, seed: int,
                progress: Optional[ProgressFn] = None) -> Reconstruction:
    """Reconstruct the masked object with the backend ``settings.backend`` names.

    image.rgb (H, W, 3) uint8, image.mask (H, W) bool. The image is validated and
    downscaled to ``settings.max_image_side`` before the backend sees it.
    """
    fn = lookup(settings.backend)
    prepared, scale = prepare_image(image, settings.max_image_side)
    recon = fn(prepared, settings, seed, progress)
    recon.meta.setdefault("backend", settings.backend)
    recon.meta["image_scale"] = scale   # the backend saw the already downscaled image
    if recon.source_camera is not None:
        recon.source_camera = to_original_pixels(recon.source_camera, prepared.mask.shape,
                                                 image.mask.shape).validate()
    return recon


def to_original_pixels(cam: SourceCamera, seen_shape: tuple, original_shape: tuple) -> SourceCamera:
    """A backend's source camera, stated in pixels of the (downscaled) image it saw, restated
    in pixels of the original photo, so the bake can read the photo at full resolution.
    A camera already at the original size is returned unchanged. Shapes are (H, W)."""
    (h, w), (H, W) = seen_shape, original_shape
    if (cam.height, cam.width) == (H, W) or (cam.height, cam.width) != (h, w):
        return cam
    K = cam.K.astype(np.float64).copy()
    # cv2.resize rounds each side separately, so each axis has its own factor
    K[0] *= W / w
    K[1] *= H / h
    K[2] = (0.0, 0.0, 1.0)
    return SourceCamera(viewmat=cam.viewmat, K=K.astype(np.float32), width=W, height=H,
                        projection=cam.projection)


def lookup(backend: str) -> Reconstructor:
    """The registered function for ``backend``, importing ``pipeline/<backend>.py`` first
    when it has not registered yet. BackendUnavailable when there is none or it cannot load."""
    fn = RECONSTRUCTORS.get(backend)
    if fn is not None:
        return fn
    if backend.isidentifier():
        _import_backend(backend)
        fn = RECONSTRUCTORS.get(backend)
    if fn is None:
        if ALWAYS_AVAILABLE not in RECONSTRUCTORS:
            _import_backend(ALWAYS_AVAILABLE)   # so the list below names it
        known = ", ".join(sorted(RECONSTRUCTORS))
        raise BackendUnavailable(f"reconstruct.backend '{backend}' is not available in this "
                                 f"installation (available: {known}); use backend 'builtin'")
    return fn


def _import_backend(backend: str) -> None:
    try:
        importlib.import_module(f"{__package__}.{backend}")
    except ModuleNotFoundError as e:
        if e.name != f"{__package__}.{backend}":
            raise BackendUnavailable(f"reconstruct.backend '{backend}' cannot be loaded: "
                                     f"{e}; install it or use backend 'builtin'") from e
    except ImportError as e:
        raise BackendUnavailable(f"reconstruct.backend '{backend}' cannot be loaded: {e}; "
                                 "use backend 'builtin'") from e


# --------------------------------------------------------------------------- input checks

def require_usable_mask(mask: np.ndarray, name: str = "mask") -> None:
    """Raise StageInputError for a mask no reconstruction can work from (the rule is
    ``kiln.limits.mask_problem``). mask: (H, W) bool."""
    problem = mask_problem(mask)
    if problem is not None:
        raise StageInputError(f"{name} {problem}")


def prepare_image(image: ImageInput, max_side: int) -> tuple[ImageInput, float]:
    """Validate and downscale so the longest side is at most ``max_side``.

    Returns (image, scale) where scale = new size / original size (1.0 when unchanged).
    """
    image.validate()
    # a side of 0 cannot be resized to, one above MAX_WORK_SIDE is a memory hazard;
    # the setting's range (kiln.settings) is checked when settings are built
    check_int("reconstruct.max_image_side", max_side, 1, MAX_WORK_SIDE)
    h, w = image.mask.shape
    if h * w > MAX_INPUT_PIXELS:
        raise StageInputError(f"image is {w}x{h} pixels, more than {MAX_INPUT_PIXELS} in all; "
                              "downscale it before reconstruction")
    require_usable_mask(image.mask)
    if max(h, w) <= max_side:
        return image, 1.0
    import cv2

    scale = max_side / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    rgb = cv2.resize(image.rgb, size, interpolation=cv2.INTER_AREA)
    mask = cv2.resize(image.mask.astype(np.float32), size, interpolation=cv2.INTER_AREA) >= 0.5
    mask |= _thin_parts_downscaled(image.mask, size, scale)
    require_usable_mask(mask, name=f"mask (after downscaling the image to {size[0]}x{size[1]})")
    return ImageInput(rgb=np.ascontiguousarray(rgb), mask=mask), scale


# A part of the photo narrower than this many working pixels is drawn into the working mask
# wherever it covers at least THIN_COVER of a working pixel, not half: downscaled by area,
# a 3 px stem in a 7000 px photo covers at most 0.44 of a pixel (less where it straddles two)
# and vanished before the reconstruction could keep it (``thin_parts``).
THIN_WORK_PX = 2.0
THIN_COVER = 0.2


def _thin_parts_downscaled(mask: np.ndarray, size: tuple[int, int], scale: float) -> np.ndarray:
    """(h, w) bool at ``size`` (w, h): the working pixels a thin part of ``mask`` covers at
    least THIN_COVER of (a photo pixel counts in the working pixel its centre falls in)."""
    from pipeline.recon.thin_parts import narrow_parts

    rows, cols = np.nonzero(mask)
    r0, c0 = rows.min(), cols.min()       # the opening runs on the object's box only
    ys, xs = np.nonzero(narrow_parts(mask[r0:rows.max() + 1, c0:cols.max() + 1], THIN_WORK_PX / scale))
    w, h = size
    out = np.zeros(h * w, np.float64)
    if len(ys):
        i = np.minimum(((ys + r0 + 0.5) * h / mask.shape[0]).astype(np.int64), h - 1)
        j = np.minimum(((xs + c0 + 0.5) * w / mask.shape[1]).astype(np.int64), w - 1)
        out = np.bincount(i * w + j, minlength=h * w).astype(np.float64)
    per_pixel = (mask.shape[0] / h) * (mask.shape[1] / w)
    return (out / per_pixel >= THIN_COVER).reshape(h, w)
