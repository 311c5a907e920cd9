"""What the UI's buttons do, as plain functions over plain data (no Gradio here).

``app/ui.py`` wires these to components; tests call them directly. A session's
state is a ``SessionState``, kept on disk by ``app.sessions.SessionStore`` under
the session name the server derives from the browser cookie and the tab (never
by Gradio, whose per-tab state is keyed by a value the client chooses). Errors
meant for the person at the browser are raised as ``UIError`` with a sentence
to show.

Images: ``WorkImage.work`` is a copy of the upload with its longest side <=
``segment.SEG_MAX_SIDE`` that is shown, clicked and segmented (clicks and
``SessionState.mask`` live in its pixel grid). The full-size image is decoded
again from the uploaded file, and the mask scaled to it, only when a job is
submitted.
"""

from __future__ import annotations

import hashlib
import html
import logging
import re
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from kiln.settings import Settings, SettingsError

from .segment import SEG_MAX_SIDE, Box, Click, has_prompt, image_key

log = logging.getLogger(__name__)

MIN_MASK_PIXELS = 64
# a mask under this share of the image is most likely a mis-click: warned about on the page
TINY_MASK_SHARE = 0.005
# ... and under this share (or MIN_MASK_PIXELS of the working copy) refused before a job starts
SPECK_MASK_SHARE = 0.0005
# pieces (8-connected) of at least 0.1 % of the image past which the selection is called scattered
MANY_PIECES = 4
WAITING_FOR_POOL = "Waiting for the worker pool to start…"
NO_HISTORY = "No results yet in this session."


class UIError(Exception):
    """A problem the person at the browser caused or can fix; the message says how."""


# An absolute path (two or more segments) in a message: where the server keeps its files is
# nobody's business at the browser. Stops at characters that end a path in prose and quotes.
_ABS_PATH_RE = re.compile(r"(?<![\w.~:/-])/(?:[^\s/'\"`:;,()<>|]+/)+([^\s/'\"`:;,()<>|]*)")


def public_text(text: str) -> str:
    """``text`` with every absolute path cut to its last part (``/srv/kiln/var/x/log`` ->
    ``log``): for any message a browser is shown."""
    return _ABS_PATH_RE.sub(lambda m: m.group(1) or "…", text or "")


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
class SessionState:
    """Per-tab state. clicks are (x, y, label) and box (x0, y0, x1, y1) in ``image.work``
    pixels; mask (h, w) bool. ``mask_file``: an uploaded mask file the mask was read from
    (read again at full size for a job), ``mask_note`` how it was read. ``show_mask``:
    off shows the photo alone."""

    image: Optional[WorkImage] = None
    clicks: tuple[Click, ...] = ()
    mask: Optional[np.ndarray] = None
    use_alpha: bool = False
    box: Optional[Box] = None
    mask_file: Optional[str] = None
    mask_note: str = ""
    show_mask: bool = True


# the small SessionState fields a session store keeps beside image, clicks, mask and use_alpha
STATE_EXTRA_FIELDS = ("box", "mask_file", "mask_note", "show_mask")


# -- sessions -----------------------------------------------------------------
# A browser tab's Gradio session hash is chosen by the client and travels in request
# bodies, so on its own it proves nothing. Each browser also gets a random HttpOnly
# cookie (set by app.server's middleware); a session name is built from both, so a
# client that learns or guesses another tab's session hash still lands in a session
# of its own, and a result file is served only to the browser whose session made it.

BROWSER_COOKIE = "kiln_browser"
_COOKIE_RE = re.compile(r"[A-Za-z0-9_-]{32,64}")
_SESSION_NAME_RE = re.compile(r"web-([0-9a-f]{16}|anon)-[0-9a-f]{16}")


def new_browser_token() -> str:
    return secrets.token_urlsafe(32)


def browser_id(token: Optional[str]) -> Optional[str]:
    """16 hex digits naming the browser that holds cookie ``token``; None for no/bad cookie."""
    if not token or not _COOKIE_RE.fullmatch(token):
        return None
    return hashlib.sha256(b"kiln-browser:" + token.encode()).hexdigest()[:16]


def session_name(browser_token: Optional[str], tab: Optional[str]) -> str:
    """'web-<browser>-<tab>': the job store folder and history key of one browser tab.
    Clients without the cookie (API scripts) get 'web-anon-<tab>' and can never
    download a result (see ``session_owned_by``)."""
    tab_id = hashlib.sha256(b"kiln-tab:" + (tab or "").encode()).hexdigest()[:16]
    return f"web-{browser_id(browser_token) or 'anon'}-{tab_id}"


def session_owned_by(session: Optional[str], browser_token: Optional[str]) -> bool:
    """True when ``session`` was made by the browser holding cookie ``browser_token``."""
    bid = browser_id(browser_token)
    m = _SESSION_NAME_RE.fullmatch(session or "")
    return bool(bid and m and m.group(1) == bid)


# -- images -----------------------------------------------------------------

def _downscale(arr: np.ndarray, max_side: int) -> np.ndarray:
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
    if min(rgb.shape[:2]) < 16:
        raise UIError(f"image is only {rgb.shape[1]}x{rgb.shape[0]} pixels; use one at least 16 pixels "
                      "on each side")
    work = np.ascontiguousarray(_downscale(rgb, SEG_MAX_SIDE))
    work_alpha = None if alpha is None else np.ascontiguousarray(_downscale(alpha, SEG_MAX_SIDE))
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
    if img is None or not img.has_alpha:
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

    img = _require_image(state)
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


# -- clicks -----------------------------------------------------------------

def _require_image(state: SessionState) -> WorkImage:
    if state.image is None:
        raise UIError("upload an image first")
    return state.image


def _resegment(state: SessionState, clicks: tuple[Click, ...], segmenter,
               box: Optional[Box] = None) -> SessionState:
    img = _require_image(state)
    fresh = dict(clicks=clicks, box=box, use_alpha=False, mask_file=None, mask_note="")
    if not has_prompt(clicks, box):
        return replace(state, mask=None, **fresh)
    mask = segmenter.segment(img.work, list(clicks), box) if box is not None else \
        segmenter.segment(img.work, list(clicks))
    return replace(state, mask=np.asarray(mask, bool), **fresh)


def _prompting(state: SessionState) -> bool:
    """True when clicks and the box decide the mask (not the alpha, not a mask file)."""
    return not state.use_alpha and state.mask_file is None


def add_click(state: SessionState, x: float, y: float, background: bool, segmenter) -> SessionState:
    """Add an object (or background) click at work-image pixel (x, y) and re-segment.

    Clicking leaves alpha mode: the clicks decide the mask from then on.
    """
    img = _require_image(state)
    h, w = img.work.shape[:2]
    if not (0 <= x < w + 1 and 0 <= y < h + 1):
        raise UIError(f"click at ({x:.0f}, {y:.0f}) is outside the {w}x{h} image")
    x = float(min(max(x, 0), w - 1))
    y = float(min(max(y, 0), h - 1))
    click = (x, y, 0 if background else 1)
    prompting = _prompting(state)
    prior = state.clicks if prompting else ()
    return _resegment(state, prior + (click,), segmenter, state.box if prompting else None)


def set_box(state: SessionState, x0: float, y0: float, x1: float, y1: float, segmenter) -> SessionState:
    """Use the rectangle dragged from (x0, y0) to (x1, y1) (work-image pixels, any corner
    order) as the box around the object and re-segment; the clicks stay."""
    img = _require_image(state)
    h, w = img.work.shape[:2]
    xs = sorted(min(max(float(v), 0.0), w - 1.0) for v in (x0, x1))
    ys = sorted(min(max(float(v), 0.0), h - 1.0) for v in (y0, y1))
    if xs[1] - xs[0] < 4 or ys[1] - ys[0] < 4:
        raise UIError("the box is too small; drag a rectangle around the whole object")
    prior = state.clicks if _prompting(state) else ()
    return _resegment(state, prior, segmenter, (xs[0], ys[0], xs[1], ys[1]))


def undo_click(state: SessionState, segmenter) -> SessionState:
    """Take back the last click, or the box when no click is left."""
    if not _prompting(state):
        return state
    if state.clicks:
        return _resegment(state, state.clicks[:-1], segmenter, state.box)
    if state.box is not None:
        return _resegment(state, (), segmenter, None)
    return state


def clear_clicks(state: SessionState) -> SessionState:
    return replace(state, clicks=(), box=None, mask=None, use_alpha=False, mask_file=None, mask_note="")


def prepare_segmenter(state: SessionState, segmenter) -> None:
    """Let the segmenter precompute (SAM2: the image embedding) right after an upload."""
    if state.image is not None:
        segmenter.prepare(state.image.work)


# -- display ----------------------------------------------------------------

BACKGROUND_DIM = 0.4   # what remains of the background's brightness around a selection


def render_overlay(state: SessionState) -> Optional[np.ndarray]:
    """(h, w, 3) uint8: the work image with the selection shown without recolouring the
    object: its pixels stay as in the photo, the background is dimmed and the edge is drawn
    as a dark line with a light one inside it (visible on dark and light backgrounds alike).
    The box is drawn the same way, object clicks as green dots and background clicks as red
    ones. ``state.show_mask`` off: the photo alone. None without an image."""
    import cv2

    img = state.image
    if img is None:
        return None
    work = img.work
    if not state.show_mask:
        return work.copy()
    if state.mask is not None and state.mask.any():
        m = state.mask
        # OpenCV's saturating uint8 arithmetic: this runs on every click, float math is 10x slower
        out = cv2.convertScaleAbs(work, alpha=BACKGROUND_DIM)
        np.copyto(out, work, where=m[:, :, None])
        contours, _ = cv2.findContours(m.astype(np.uint8), cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
        t = max(1, max(m.shape) // 500)
        # the line lies on the background side of the edge: only pixels outside the mask change
        edge = np.zeros(m.shape, np.uint8)
        cv2.drawContours(edge, contours, -1, 1, 3 * t + 1)
        cv2.drawContours(edge, contours, -1, 2, t + 1)
        outside = ~m
        out[(edge == 1) & outside] = (0, 0, 0)
        out[(edge == 2) & outside] = (255, 255, 255)
    else:
        out = work.copy()
    if state.box is not None:
        x0, y0, x1, y1 = (int(round(v)) for v in state.box)
        t = max(1, max(out.shape[:2]) // 400)
        cv2.rectangle(out, (x0, y0), (x1, y1), (0, 0, 0), 3 * t)
        cv2.rectangle(out, (x0, y0), (x1, y1), (255, 210, 0), t)
    r = max(4, max(out.shape[:2]) // 90)
    for x, y, lab in state.clicks:
        colour = (40, 220, 60) if lab == 1 else (230, 40, 40)
        c = (int(round(x)), int(round(y)))
        cv2.circle(out, c, r + 2, (255, 255, 255), -1, cv2.LINE_AA)
        cv2.circle(out, c, r, colour, -1, cv2.LINE_AA)
    return out


@dataclass(frozen=True)
class MaskCheck:
    """What a person should know about a mask: its share of the image (0..1), its pieces
    (8-connected, at least 0.1 % of the image each), and whether it is a speck."""

    share: float
    pieces: int
    speck: bool

    @property
    def warnings(self) -> list[str]:
        out = []
        if self.share < TINY_MASK_SHARE:
            out.append(f"the selection is tiny ({100 * self.share:.2f} % of the image): "
                       "drag a box around the whole object or click on more of it")
        if self.pieces > MANY_PIECES:
            out.append(f"the selection is in {self.pieces} pieces: add background clicks on the "
                       "stray ones, or drag a box around the object")
        return out


def check_mask(mask: np.ndarray) -> MaskCheck:
    """``MaskCheck`` of an (h, w) bool mask."""
    import cv2

    n = int(mask.sum())
    share = n / max(1, mask.size)
    pieces = 0
    if n:
        count, _, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
        pieces = int((stats[1:, cv2.CC_STAT_AREA] >= max(1, 0.001 * mask.size)).sum())
    return MaskCheck(share=share, pieces=pieces, speck=n < MIN_MASK_PIXELS or share < SPECK_MASK_SHARE)


def mask_summary(state: SessionState) -> str:
    img = state.image
    if img is None:
        return "Upload an image, or pick an example below."
    h, w = img.size
    head = f"**{html.escape(img.name)}** — {w}x{h}"
    if state.mask is None or not state.mask.any():
        hint = ("click the object or drag a box around it" if not state.clicks and state.box is None
                else "no object found there; click on the object itself or drag a box around it")
        return f"{head}. {hint}."
    mc = check_mask(state.mask)
    if state.use_alpha:
        src = "image transparency"
    elif state.mask_file:
        src = "mask file"
    else:
        n_obj = sum(c[2] == 1 for c in state.clicks)
        n_bg = sum(c[2] == 0 for c in state.clicks)
        src = f"{n_obj} object / {n_bg} background clicks" + (" and a box" if state.box else "")
    text = f"{head}. Mask: {100 * mc.share:.1f}% of the image, from {src}."
    if state.mask_note:
        text += f"  \n{_md_text(public_text(state.mask_note))}"
    for warning in mc.warnings:
        text += f"  \n⚠ {_md_text(warning[:1].upper() + warning[1:])}."
    return text


# -- settings and jobs ------------------------------------------------------

def ui_overrides(bake: bool, simplify_ratio: float, texture_size: Any, views: Any, bake_mode: str,
                 seed: Any, gaussians_ply: bool) -> dict:
    """The web form's values as dotted setting keys (checked later by kiln.settings)."""
    return {
        "bake.enabled": bool(bake),
        "mesh.simplify_ratio": simplify_ratio,
        "bake.texture_size": (texture_size if str(texture_size) == "auto" else int(texture_size))
        if texture_size not in (None, "") else None,
        "views.count": views,
        "bake.mode": bake_mode,
        "seed": seed,
        "export.gaussians_ply": bool(gaussians_ply),
    }


# the form's labels for the setting keys it sets, so an error names the box to fix
FIELD_LABELS = {"bake.enabled": "Bake texture", "mesh.simplify_ratio": "Simplify ratio",
                "bake.texture_size": "Texture size", "views.count": "Bake views",
                "bake.mode": "Bake mode", "seed": "Seed", "export.gaussians_ply": "Also export Gaussians"}
_SETTING_RE = re.compile(r"setting '([\w.]+)'(?: = )?")


def field_error(message: str) -> str:
    """A settings error as the form names it: "setting 'seed' = -1 is out of range; …" ->
    "Seed: -1 is out of range; …"."""
    m = _SETTING_RE.match(message)
    if m is None or m.group(1) not in FIELD_LABELS:
        return message
    return f"{FIELD_LABELS[m.group(1)]}: {message[m.end():]}"


def job_settings(base: Settings, overrides: dict) -> Settings:
    """``base`` with the form's overrides; an invalid value becomes a ``UIError`` naming
    its field."""
    try:
        return base.override(overrides)
    except SettingsError as e:
        raise UIError(field_error(str(e))) from None


def full_mask(state: SessionState, alpha: Optional[np.ndarray] = None) -> np.ndarray:
    """(H, W) bool mask at the upload's full size, ready for a job. ``alpha``: the
    full-size alpha when the caller has decoded it already (``WorkImage.full``)."""
    import cv2

    img = _require_image(state)
    if state.use_alpha and img.has_alpha:
        if alpha is None:
            alpha = img.full()[1]
        return alpha >= 128
    if state.mask_file:
        return _full_mask_file(state)
    if state.mask is None:
        raise UIError("select the object first: click on it (or use the image's transparency)")
    H, W = img.size
    if state.mask.shape == (H, W):
        return state.mask.copy()
    up = cv2.resize(state.mask.astype(np.float32), (W, H), interpolation=cv2.INTER_LINEAR)
    return up >= 0.5


def _full_mask_file(state: SessionState) -> np.ndarray:
    from kiln.imageio import ImageError
    from kiln.maskfile import load_mask

    H, W = state.image.size
    try:
        # its limits were checked when it was uploaded
        mask = load_mask(state.mask_file, max_pixels=max(1, H * W)).mask
    except (ImageError, OSError):
        raise UIError("the mask file can no longer be read; upload it again") from None
    if mask.shape != (H, W):
        raise UIError("the mask file no longer matches the image; upload it again")
    return mask


def job_inputs(state: SessionState) -> tuple[np.ndarray, np.ndarray]:
    """(rgb (H, W, 3) uint8, mask (H, W) bool) for ``Supervisor.submit``; UIError if not ready."""
    img = _require_image(state)
    if not state.use_alpha and (state.mask is None or not state.mask.any()):
        full_mask(state)   # says what is missing before the slow decode
    rgb, alpha = img.full()
    mask = full_mask(state, alpha)
    n = int(mask.sum())
    if n < MIN_MASK_PIXELS:
        raise UIError(f"the mask covers only {n} pixels; click on the object to select more of it")
    if n == mask.size:
        raise UIError("the mask covers the whole image; add a background click outside the object")
    return rgb, mask


def check_job_request(state: SessionState, base: Settings, *form) -> Settings:
    """What ``job_request`` refuses, checked on the working copy without decoding the
    full-size image (fast, for the check before a job waits in the queue)."""
    img = _require_image(state)
    if state.use_alpha and img.work_alpha is not None:
        mask = img.work_alpha >= 128
    elif state.mask is None:
        raise UIError("select the object first: click on it (or use the image's transparency)")
    else:
        mask = state.mask
    if not mask.any():
        raise UIError("the mask is empty; click on the object to select it")
    if mask.all():
        raise UIError("the mask covers the whole image; add a background click outside the object")
    mc = check_mask(mask)
    if mc.speck:
        raise UIError(f"the selection is only a speck ({100 * mc.share:.2f} % of the image); "
                      "drag a box around the whole object or click on more of it")
    return job_settings(base, ui_overrides(*form))


def job_request(state: SessionState, base: Settings, *form) -> tuple[np.ndarray, np.ndarray, Settings]:
    """(rgb, mask, settings) of the job a Generate press asks for: ``job_inputs`` of the
    session and ``base`` with the form's values (``ui_overrides``' arguments, in order).
    UIError when either is not usable."""
    rgb, mask = job_inputs(state)
    return rgb, mask, job_settings(base, ui_overrides(*form))


STAGE_LABELS = {"reconstruct": "Reconstructing", "render_views": "Rendering views",
                "mesh": "Simplifying mesh", "uv": "Unwrapping UVs", "bake": "Baking texture",
                "export": "Exporting GLB"}


def stage_label(stage: Optional[str]) -> str:
    """A stage name as the progress bar shows it; 'Starting' before the first stage."""
    if not stage:
        return "Starting"
    return STAGE_LABELS.get(stage, stage.replace("_", " ").capitalize())


def progress_html(st: Any = None, note: str = "", waited_s: float = 0.0) -> str:
    """A progress bar for a job status (``worker.jobstore.JobStatus``) or a note.
    ``waited_s``: how long the press waited in the page's queue before the job was
    submitted; "Done in" counts it (the person waited for it too).

    The outer element carries data-state / data-stage so scripts and tests can read it.
    """
    if st is None:
        body = html.escape(public_text(note)) if note else "No job yet."
        return f'<div id="kiln-progress" data-state="idle"><div class="kiln-note">{body}</div></div>'
    pct = max(0.0, min(1.0, float(st.progress or 0.0))) * 100
    state = st.state
    if state == "queued":
        # "queued (2 ahead)", or why a retry was queued after a crash
        text = note or st.message or "queued"
        text = text[:1].upper() + text[1:]
    elif state == "running":
        text = f"{stage_label(st.stage)} — {pct:.0f}%"
        # the worker prefixes its messages with the stage name, which the label already says
        detail = (st.message or "").removeprefix(f"{st.stage}: ") if st.stage else st.message
        if detail:
            text += f" — {detail}"
    elif state == "done":
        pct = 100.0
        timings = st.timings or {}
        total = timings.get("total_s")
        if isinstance(total, (int, float)):
            queued = float(timings.get("queued_s") or 0.0) + max(0.0, waited_s)
            text = f"Done in {total + max(0.0, waited_s):.1f} s"
            if queued >= 0.5:
                text += f" ({queued:.1f} s of it waiting for a worker)"
        else:
            text = "Done"
        stats = st.stats or {}
        reused = [what for what, key in (("reconstruction", "reconstruction_cached"),
                                         ("views", "views_cached")) if stats.get(key)]
        if reused:
            text += f" ({' and '.join(reused)} reused from cache)"
        if note:
            text += f"; {note}"
    elif state == "cancelled":
        # the supervisor says why: "cancelled by user", "cancelled before it started", …
        why = (st.error or "").strip() or "cancelled"
        text = why[:1].upper() + why[1:] if why.lower().startswith("cancel") else f"Cancelled: {why}"
    else:
        text = "Failed: " + (st.error or st.message or "unknown reason")
    return (f'<div id="kiln-progress" data-state="{html.escape(state)}" '
            f'data-stage="{html.escape(st.stage or "")}" data-job="{html.escape(st.id)}">'
            f'<div class="kiln-bar"><div class="kiln-fill kiln-{html.escape(state)}" '
            f'style="width:{pct:.1f}%"></div></div>'
            f'<div class="kiln-note">{html.escape(public_text(text))}</div></div>')


def watch_job(sup, job_id: str, poll_s: float = 0.25) -> Iterator[Any]:
    """Yield the job's status whenever its sequence number changes, ending with a
    terminal status (done / failed / cancelled)."""
    seen = -1
    while True:
        st = sup.status(job_id)
        if st.seq != seen or st.terminal:
            seen = st.seq
            yield st
        if st.terminal:
            return
        time.sleep(poll_s)


def follow_job(ctx, session: str, rgb: np.ndarray, mask: np.ndarray, settings: Settings,
               poll_s: float = 0.25) -> Iterator[tuple[str, Any]]:
    """Submit a job for ``session`` once the worker pool is up, then follow it.

    ``ctx``: an ``app.context.AppContext``; rgb (H, W, 3) uint8, mask (H, W) bool.
    Yields ``(note, None)`` while the pool starts or when the job cannot be
    submitted (the note says why), then ``("", JobStatus)`` whenever the job
    changes, ending with its terminal status. Closing the generator before that
    (the tab went away, or Cancel stopped the Gradio event) cancels the job, so
    its worker is freed for others.
    """
    while not ctx.sup_ready.is_set():
        # a yield per second lets Gradio drop a closed tab's generator while it waits
        yield WAITING_FOR_POOL, None
        ctx.sup_ready.wait(1.0)
    sup = ctx.sup
    if sup is None:
        yield ctx.sup_error or "the worker pool is not running", None
        return
    try:
        job_id = sup.submit(rgb, mask, settings, session=session)
    except Exception as e:  # noqa: BLE001 - queue full or a refused input: the person reads why
        log.warning("submit failed: %s", e)
        yield f"Could not start the job: {public_text(str(e))}", None
        return
    finally:
        del rgb, mask   # full size, up to app.max_pixels: the job store has them now
    ctx.summaries[job_id] = settings_summary(settings)
    ctx.active.add(session, job_id)
    last = None
    try:
        for last in watch_job(sup, job_id, poll_s):
            yield "", last
    finally:
        ctx.active.discard(session, job_id)
        if last is None or not last.terminal:
            try:
                sup.cancel(job_id)
            except Exception:  # noqa: BLE001 - the person is gone; the log keeps the reason
                log.exception("cancel of %s failed", job_id)


# -- results and history ----------------------------------------------------

# how a published result is named, wherever Gradio copies it (the server's file guard matches it)
RESULT_NAME_RE = re.compile(r"kiln-([A-Za-z0-9_-]+)\.(glb|ply)")


class ResultPublisher:
    """Copies a session's finished outputs into Gradio's own file folder under an
    unguessable name, so the browser downloads them from there and the job store
    itself is never served. Copies are made once per (session, job)."""

    def __init__(self, root: Path, prune_age_s: float = 86400.0):
        self.root = Path(root)
        self._prune(prune_age_s)
        self._lock = threading.Lock()
        self._tokens: dict[str, str] = {}
        self._done: dict[tuple[str, str], dict[str, Path]] = {}
        self._owners: dict[str, str] = {}

    def _prune(self, age_s: float) -> None:
        """Drop session folders older than ``age_s``: sessions do not outlive a server, and
        every published file is only a copy of a job output."""
        if not self.root.is_dir():
            return
        cutoff = time.time() - age_s
        for d in self.root.iterdir():
            try:
                if d.is_dir() and d.stat().st_mtime < cutoff:
                    shutil.rmtree(d, ignore_errors=True)
            except OSError:
                continue

    def _session_dir(self, session: str) -> Path:
        with self._lock:
            tok = self._tokens.setdefault(session, secrets.token_hex(16))
        return self.root / tok

    def publish(self, session: str, st: Any) -> dict[str, Path]:
        """{'glb': path, 'ply': path} copies of a done job's outputs; {} otherwise.

        Refuses jobs of other sessions: a session only ever gets its own files.
        """
        if st is None or st.state != "done" or not st.outputs:
            return {}
        if st.session != session:
            raise UIError("that result belongs to another session")
        key = (session, st.id)
        with self._lock:
            if key in self._done and all(p.exists() for p in self._done[key].values()):
                return dict(self._done[key])
        dest = self._session_dir(session) / st.id
        dest.mkdir(parents=True, exist_ok=True)
        out = {}
        for kind, src in sorted(st.outputs.items()):
            src = Path(src)
            if kind not in ("glb", "ply") or not src.is_file():
                continue
            target = dest / f"kiln-{st.id}.{kind}"
            if not target.exists():
                tmp = target.with_name(target.name + ".tmp")
                shutil.copyfile(src, tmp)
                tmp.replace(target)
            out[kind] = target
        with self._lock:
            self._done[key] = dict(out)
            self._owners[st.id] = session
        return out

    def owner(self, file_name: str) -> Optional[str]:
        """The session a published file (``kiln-<job>.<ext>``, wherever Gradio copied it)
        belongs to; None for a name that is no published result of this server."""
        m = RESULT_NAME_RE.fullmatch(file_name)
        if m is None:
            return None
        with self._lock:
            return self._owners.get(m.group(1))


def settings_summary(settings: Settings) -> str:
    """'texture 1024px opt, 16 views, simplify 0.95, seed 0': what a person chose for a job."""
    b = settings.bake
    tex = f"texture {b.texture_size}px {b.mode}" if b.enabled else "vertex colours"
    ply = ", +ply" if settings.export.gaussians_ply else ""
    return f"{tex}, {settings.views.count} views, simplify {settings.mesh.simplify_ratio:g}, seed {settings.seed}{ply}"


def _md_text(text: str) -> str:
    """Plain text safe inside Markdown: HTML escaped, Markdown's emphasis/code marks backslashed."""
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", html.escape(text))


@dataclass(frozen=True)
class JobInfo:
    """What the page remembers of a job it submitted: the image's name and a thumbnail
    (a data: URI of a small JPEG)."""

    image_name: str
    thumbnail: str = ""


def thumbnail_uri(rgb: np.ndarray, side: int = 72) -> str:
    """A data: URI of a JPEG of (h, w, 3) uint8 ``rgb`` with its longest side ``side``."""
    import base64

    import cv2

    small = _downscale(rgb, side)
    ok, buf = cv2.imencode(".jpg", np.ascontiguousarray(small[:, :, ::-1]), [cv2.IMWRITE_JPEG_QUALITY, 80])
    return "data:image/jpeg;base64," + base64.b64encode(buf.tobytes()).decode() if ok else ""


_STEM_BAD_RE = re.compile(r"[^A-Za-z0-9._-]+")


def result_stems(statuses: Sequence[Any], infos: dict) -> dict[str, str]:
    """job id -> '<image-name>-<n>' for done jobs whose image the page knows: n counts the
    session's done results of that image, oldest first, so names stay put as more come."""
    out, seen = {}, {}
    for st in sorted(statuses, key=lambda s: (s.created, s.id)):
        info = infos.get(st.id)
        if st.state != "done" or info is None:
            continue
        stem = _STEM_BAD_RE.sub("_", Path(info.image_name).stem).strip("._") or "model"
        seen[stem] = seen.get(stem, 0) + 1
        out[st.id] = f"{stem[:60]}-{seen[stem]}"
    return out


def download_name(stem: Optional[str], path: Path) -> str:
    """The name a browser saves a published result as: '<image-name>-<n>.glb', else its own."""
    return f"{stem}{path.suffix}" if stem else path.name


def _why(st: Any) -> str:
    reason = public_text(st.error or st.message or "")
    if st.state == "cancelled":
        return reason or "cancelled"
    return f"failed: {reason or 'unknown reason'}"


def history_html(statuses: Sequence[Any], summaries: Optional[dict] = None,
                 infos: Optional[dict] = None) -> str:
    """The session's jobs, newest first, as HTML: thumbnail, image name, time, job id, state
    (a cancelled or failed job says why), settings, and the name its GLB downloads as.
    ``summaries``: job id -> settings text; ``infos``: job id -> ``JobInfo``."""
    if not statuses:
        return f'<div class="kiln-history-empty">{NO_HISTORY}</div>'
    infos = infos or {}
    stems = result_stems(statuses, infos)
    rows = []
    for st in sorted(statuses, key=lambda s: (s.created, s.id), reverse=True):
        info = infos.get(st.id)
        when = time.strftime("%H:%M:%S", time.localtime(st.created)) if st.created else "--:--:--"
        state = st.state if st.state in ("done", "queued", "running") else _why(st)
        if st.state == "done":
            total = (st.timings or {}).get("total_s")
            state += f" in {total:.1f} s" if isinstance(total, (int, float)) else ""
        thumb = (f'<img class="kiln-thumb" alt="" src="{html.escape(info.thumbnail)}">'
                 if info is not None and info.thumbnail else '<span class="kiln-thumb"></span>')
        name = html.escape(info.image_name) if info is not None else "(image not known)"
        summary = (summaries or {}).get(st.id, "")
        file_note = f" · <code>{html.escape(stems[st.id])}.glb</code>" if st.id in stems else ""
        rows.append(f'<li class="kiln-job kiln-{html.escape(st.state)}" data-job="{html.escape(st.id)}">'
                    f'{thumb}<div><b>{name}</b> · {when} · <code>{html.escape(st.id)}</code><br>'
                    f'{html.escape(state)}{" · " + html.escape(summary) if summary else ""}{file_note}'
                    f'</div></li>')
    return '<ul class="kiln-history-list">' + "".join(rows) + "</ul>"


def history_markdown(statuses: Sequence[Any], summaries: Optional[dict] = None) -> str:
    """A Markdown list of a session's jobs, newest first; ``summaries``: job id -> settings text.
    (A list, not a table: in the narrow column a table wrapped its words mid-way.)"""
    if not statuses:
        return NO_HISTORY
    rows = []
    for st in sorted(statuses, key=lambda s: (s.created, s.id), reverse=True):
        when = time.strftime("%H:%M:%S", time.localtime(st.created)) if st.created else "--:--:--"
        state = st.state if st.state in ("done", "queued", "running") else _why(st)
        summary = (summaries or {}).get(st.id, "")
        rows.append(f"- **{when}** `{st.id}` — {_md_text(state)}" + (f" — {_md_text(summary)}" if summary else ""))
    return "\n".join(rows)


def history_files(session: str, statuses: Sequence[Any], publisher: ResultPublisher,
                  infos: Optional[dict] = None) -> list[tuple[str, str]]:
    """(path, download name) of every downloadable output of the session's done jobs, newest first."""
    stems = result_stems(statuses, infos or {})
    files: list[tuple[str, str]] = []
    for st in sorted(statuses, key=lambda s: (s.created, s.id), reverse=True):
        if st.state == "done" and st.session == session:
            files += [(str(p), download_name(stems.get(st.id), p))
                      for _, p in sorted(publisher.publish(session, st).items())]
    return files


def status_line(caps: Optional[dict], segmenter_text: str, running: int, waiting: int,
                workers_note: str = "") -> str:
    """The status line: one sentence in plain words (what to expect, what to do), with the
    technical detail (device, backends, queue, segmenter and why) in a fold one click away."""
    if not caps:
        dev = workers_note or "workers starting…"
        backends = "…"
        plain = [workers_note[:1].upper() + workers_note[1:] if workers_note else "Workers starting…"]
    else:
        dev = caps.get("device") or "cpu"
        dev = "CPU" if dev == "cpu" else dev
        names = [n for n in ("gsplat", "nvdiffrast", "moderngl") if caps.get(n)]
        backends = ", ".join(names + ["cpu renderer"])
        plain = ["CPU only: a model takes a minute or more" if dev == "CPU"
                 else f"GPU ready ({dev}): a model takes seconds to a minute"]
    if segmenter_text.startswith("SAM2"):
        plain.append("selection by SAM2: a click or a box usually selects the whole object")
    elif "loading" in segmenter_text:
        plain.append("SAM2 is loading, GrabCut selects meanwhile: drag a box around the object")
    elif "SAM2" in segmenter_text:
        plain.append("SAM2 not available, using GrabCut: drag a box around the object, "
                     "then click more points")
    else:
        plain.append("selection by GrabCut: drag a box around the object, then click more points")
    if running or waiting:
        plain.append(f"{running} job{'s' if running != 1 else ''} running, {waiting} waiting")
    detail = (f"**Device:** {html.escape(str(dev))} · **Backends:** {html.escape(backends)} · "
              f"**Jobs:** {running} running, {waiting} waiting · "
              f"**Segmentation:** {html.escape(segmenter_text)}")
    return (f'<span class="kiln-plain">{html.escape("; ".join(plain))}.</span>\n'
            f'<details class="kiln-details"><summary>Details</summary>\n\n{detail}\n\n</details>')


@dataclass
class ActiveJobs:
    """session -> the jobs it is following, so Cancel finds them whatever the page holds;
    plus the sessions whose Generate is still waiting in Gradio's queue for a slot."""

    jobs: dict = field(default_factory=dict)      # session -> set of job ids
    pending: set = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set_pending(self, session: str, on: bool) -> None:
        with self.lock:
            (self.pending.add if on else self.pending.discard)(session)

    def take_pending(self, session: str) -> bool:
        """True (and forget it) when the session had a Generate waiting."""
        with self.lock:
            if session in self.pending:
                self.pending.discard(session)
                return True
            return False

    def add(self, session: str, job_id: str) -> None:
        """The session's Generate got its job: no longer pending."""
        with self.lock:
            self.pending.discard(session)
            self.jobs.setdefault(session, set()).add(job_id)

    def discard(self, session: str, job_id: str) -> None:
        with self.lock:
            ids = self.jobs.get(session, set())
            ids.discard(job_id)
            if not ids:
                self.jobs.pop(session, None)

    def get(self, session: str) -> list[str]:
        """The session's running jobs, oldest id first."""
        with self.lock:
            return sorted(self.jobs.get(session, ()))
