"""A tab's state and what an upload does to it: the image (a working copy of <= SEG_MAX_SIDE
that is shown, clicked and segmented; the full size is decoded again only for a job), its
transparency as the mask, a mask file, the show-selection toggle.

A tab's ``SessionState`` is kept on disk by ``app.web.state.sessions.SessionStore`` under the session
name ``app.web.server.browser`` derives from the browser cookie and the tab (never by Gradio, whose
per-tab state is keyed by a value the client chooses).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np

from kiln.limits import image_size_problem

from app.web.server.usertext import UIError
from app.segment.prompts import Box, Click, has_prompt
from app.segment.segment import SEG_MAX_SIDE, image_key


@dataclass(frozen=True)
class WorkImage:
    """An uploaded image. ``work`` (h, w, 3) uint8 and ``work_alpha`` (h, w) uint8 | None:
    the copy downscaled to <= SEG_MAX_SIDE that is shown, clicked and segmented. The
    full-size pixels are not kept: ``source`` (the uploaded file, a path or bytes) is
    decoded again by ``full()`` when a job is submitted, so a session holds a few MB
    whatever the upload decodes to. ``size``: (H, W) at full size."""

    name: str
    work: np.ndarray
    work_alpha: Optional[np.ndarray]
    key: str
    size: tuple[int, int]
    source: Any   # str | Path | bytes
    has_alpha: bool = False

    def full(self) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """(rgb (H, W, 3) uint8, alpha (H, W) uint8 | None) at full size."""
        from kiln.imageio import ImageError, load_image

        try:
            # the limits were checked when it was uploaded
            rgb, alpha = load_image(self.source, max_pixels=max(1, self.size[0] * self.size[1]))
        except (ImageError, OSError) as e:
            raise UIError(f"the uploaded image can no longer be read ({type(e).__name__}); "
                          "upload it again") from None
        return rgb, alpha


@dataclass(frozen=True)
class KeptObject:
    """A selection kept as one object of the photo while the next is selected ("Add another
    object"): the ``SessionState`` selection fields as they were (mask (h, w) bool on the working
    copy; a mask file is read again at full size for the job, as the current selection's is)."""

    mask: np.ndarray
    clicks: tuple[Click, ...] = ()
    box: Optional[Box] = None
    use_alpha: bool = False
    mask_file: Optional[str] = None
    mask_note: str = ""


@dataclass(frozen=True)
class SessionState:
    """Per-tab state. clicks are (x, y, label) and box (x0, y0, x1, y1) in ``image.work``
    pixels; mask (h, w) bool. ``mask_file``: an uploaded mask file the mask was read from
    (read again at full size for a job), ``mask_note`` how it was read. ``show_mask``:
    off shows the photo alone. ``kept``: the objects selected before this one on the same image
    ("Add another object"), in order; a new image starts without any."""

    image: Optional[WorkImage] = None
    clicks: tuple[Click, ...] = ()
    mask: Optional[np.ndarray] = None
    use_alpha: bool = False
    box: Optional[Box] = None
    mask_file: Optional[str] = None
    mask_note: str = ""
    show_mask: bool = True
    kept: tuple[KeptObject, ...] = ()


# the SessionState fields a session store keeps in memory beside image, clicks, mask and
# use_alpha ("kept" holds a few working-copy masks: at most app.web.photo.objects.MAX_OBJECTS - 1
# of <= 1 MB each)
STATE_EXTRA_FIELDS = ("box", "mask_file", "mask_note", "show_mask", "kept")


def downscale(arr: np.ndarray, max_side: int) -> np.ndarray:
    import cv2

    h, w = arr.shape[:2]
    s = max_side / max(h, w)
    if s >= 1:
        return arr
    size = (max(1, round(w * s)), max(1, round(h * s)))
    return cv2.resize(arr, size, interpolation=cv2.INTER_AREA)


def load_upload(source: str | Path | bytes | None, app_settings, name: str = "") -> SessionState:
    """A new session state for an uploaded file (path or bytes).

    Raises ``UIError`` with the loader's reason for corrupt, huge or unsupported
    files. An image with transparency starts with its alpha as the mask.
    """
    from kiln.imageio import ImageError, load_image, upload_limit_bytes

    if source is None:
        raise UIError("no file was uploaded")
    try:
        rgb, alpha = load_image(source, max_pixels=app_settings.max_pixels,
                                max_bytes=upload_limit_bytes(app_settings.max_pixels,
                                                             app_settings.max_upload_mb))
    except ImageError as e:
        raise UIError(str(e)) from None
    small = image_size_problem(rgb.shape[1], rgb.shape[0])
    if small:
        raise UIError(small)
    work = np.ascontiguousarray(downscale(rgb, SEG_MAX_SIDE))
    work_alpha = None if alpha is None else np.ascontiguousarray(downscale(alpha, SEG_MAX_SIDE))
    name = name or (Path(source).name if isinstance(source, (str, Path)) else "upload")
    img = WorkImage(name=name, work=work, work_alpha=work_alpha, key=image_key(work),
                    size=(int(rgb.shape[0]), int(rgb.shape[1])), source=source,
                    has_alpha=alpha is not None)
    del rgb, alpha   # the full-size pixels go now; full() decodes them again for a job
    state = SessionState(image=img)
    if img.has_alpha:
        state = set_use_alpha(state, True)
    return state


def set_use_alpha(state: SessionState, on: bool) -> SessionState:
    """Use the image's transparency as the mask (on), or go back to clicks (off)."""
    img = state.image
    if img is None or not img.has_alpha or img.work_alpha is None:
        return replace(state, use_alpha=False)
    if on:
        return replace(state, use_alpha=True, mask=img.work_alpha >= 128, mask_file=None, mask_note="")
    prompted = has_prompt(state.clicks, state.box) and state.mask_file is None
    return replace(state, use_alpha=False, mask=state.mask if prompted else None,
                   mask_file=None, mask_note="")


def set_mask_file(state: SessionState, path: str | Path, app_settings, name: str = "") -> SessionState:
    """Use an uploaded mask file as the mask (``kiln.maskfile``'s rule: a non-constant alpha,
    else the grey level). It must have the image's full size. UIError naming the problem."""
    import cv2

    from kiln.imageio import ImageError, upload_limit_bytes
    from kiln.maskfile import load_mask

    img = require_image(state)
    name = name or Path(path).name
    try:
        reading = load_mask(path, app_settings.max_pixels,
                            max_bytes=upload_limit_bytes(app_settings.max_pixels, app_settings.max_upload_mb))
    except (ImageError, OSError) as e:
        raise UIError(f"mask file {name}: {e}") from None
    H, W = img.size
    mh, mw = reading.mask.shape
    if (mh, mw) != (H, W):
        raise UIError(f"mask file {name} is {mw}x{mh} pixels but the image is {W}x{H}; "
                      "a mask must have the image's size")
    if not reading.mask.any():
        raise UIError(f"mask file {name} marks nothing as the object ({reading.describe(name)})")
    if reading.mask.all():
        raise UIError(f"mask file {name} marks the whole image as the object ({reading.describe(name)})")
    h, w = img.work.shape[:2]
    work = reading.mask if (h, w) == (H, W) else cv2.resize(
        reading.mask.astype(np.uint8) * 255, (w, h), interpolation=cv2.INTER_AREA) >= 128
    return replace(state, mask=np.ascontiguousarray(work), mask_file=str(path),
                   mask_note=reading.describe(name), use_alpha=False, clicks=(), box=None)


def set_show_mask(state: SessionState, on: bool) -> SessionState:
    return replace(state, show_mask=bool(on))


def require_image(state: SessionState) -> WorkImage:
    if state.image is None:
        raise UIError("upload an image first")
    return state.image
