"""Selecting the object: clicks and a box re-segment the working copy; the overlay shows the
selection without recolouring the object; what a person should know about a mask."""

from __future__ import annotations

import html
from dataclasses import dataclass, replace
from typing import Any, Optional

import numpy as np

from kiln.limits import MIN_MASK_PIXELS

from app.web.server.usertext import UIError, md_text, public_text
from app.segment.prompts import Box, Click, has_prompt
from app.web.state.uploads import SessionState, require_image

# a mask under this share of the image is most likely a mis-click: warned about on the page
TINY_MASK_SHARE = 0.005
# ... and under this share (or MIN_MASK_PIXELS of the working copy) refused before a job starts
SPECK_MASK_SHARE = 0.0005
# pieces (8-connected) of at least 0.1 % of the image past which the selection is called scattered
MANY_PIECES = 4
# a click that changes fewer pixels than this share of the image (and than UNCHANGED_PIXELS)
# changed nothing a person can see: the page says why instead
UNCHANGED_SHARE, UNCHANGED_PIXELS = 0.001, 50


def _resegment(state: SessionState, clicks: tuple[Click, ...], segmenter,
               box: Optional[Box] = None) -> SessionState:
    img = require_image(state)
    fresh: dict[str, Any] = dict(clicks=clicks, box=box, use_alpha=False, mask_file=None, mask_note="")
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
    img = require_image(state)
    h, w = img.work.shape[:2]
    if not (0 <= x < w + 1 and 0 <= y < h + 1):
        raise UIError(f"click at ({x:.0f}, {y:.0f}) is outside the {w}x{h} image")
    x = float(min(max(x, 0), w - 1))
    y = float(min(max(y, 0), h - 1))
    click = (x, y, 0 if background else 1)
    prompting = _prompting(state)
    prior = state.clicks if prompting else ()
    before = state.mask if prompting else None
    after = _resegment(state, prior + (click,), segmenter, state.box if prompting else None)
    return replace(after, mask_note=unchanged_note(before, after.mask, click))


def unchanged_note(before: Optional[np.ndarray], after: Optional[np.ndarray], click: Click) -> str:
    """Why a click left the selection as it was ("" when it changed it visibly, or when
    there was none before): every click either changes the mask or says why not."""
    if before is None or after is None or before.shape != after.shape:
        return ""
    changed = int(np.count_nonzero(before != after))
    if changed >= max(UNCHANGED_PIXELS, UNCHANGED_SHARE * before.size):
        return ""
    h, w = before.shape
    inside = bool(before[min(int(click[1]), h - 1), min(int(click[0]), w - 1)])
    if click[2] == 1 and inside:
        return ("that click is on what is selected already, so nothing changed: click on a part "
                "that is missing, or turn on background clicks to take a part out")
    if click[2] == 0 and not inside:
        return ("that background click is outside the selection already, so nothing changed: "
                "click on the part of the selection that should go")
    if click[2] == 1:
        return ("that click changed nothing: its colour does not stand apart from the background "
                "there; drag a box around the object, or load a mask file")
    return ("that background click changed nothing: its colour is the object's there; drag a box "
            "around the object, or load a mask file")


def set_box(state: SessionState, x0: float, y0: float, x1: float, y1: float, segmenter) -> SessionState:
    """Use the rectangle dragged from (x0, y0) to (x1, y1) (work-image pixels, any corner
    order) as the box around the object and re-segment; the clicks stay."""
    img = require_image(state)
    h, w = img.work.shape[:2]
    xs = sorted(min(max(float(v), 0.0), w - 1.0) for v in (x0, x1))
    ys = sorted(min(max(float(v), 0.0), h - 1.0) for v in (y0, y1))
    if xs[1] - xs[0] < 4 or ys[1] - ys[0] < 4:
        raise UIError("the box is too small; drag a rectangle around the whole object")
    prior = state.clicks if _prompting(state) else ()
    return _resegment(state, prior, segmenter, (xs[0], ys[0], xs[1], ys[1]))


def find_automatically(state: SessionState, finder) -> SessionState:
    """The object found without clicks on the working copy by ``finder`` (an
    ``app.segment.automask.Finder``: SAM 2, rembg or the border model) as the selection,
    with the box around it as the prompt, so clicks afterwards correct it (they re-segment
    within that box). UIError saying why when no single object can be told."""
    img = require_image(state)
    found = finder.find(img.work)
    if not found.found:
        raise UIError(f"no single object found automatically: {found.problem}; click the object "
                      "or drag a box around it")
    ys, xs = np.nonzero(found.mask)
    h, w = found.mask.shape
    pad = 0.03 * max(h, w)
    box = (max(0.0, xs.min() - pad), max(0.0, ys.min() - pad),
           min(w - 1.0, xs.max() + pad), min(h - 1.0, ys.max() + pad))
    # the border model is "the background model" on the page: a person knows backgrounds
    how = "the background model" if found.method == "border-model" else found.method_name
    return replace(state, clicks=(), box=box, mask=found.mask, use_alpha=False, mask_file=None,
                   mask_note=f"found automatically by {how}: clicks correct it")


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
    if state.kept:
        from app.web.photo.objects import kept_outlines

        kept_outlines(out, state.kept, max(1, max(out.shape[:2]) // 400))
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
    spread: str = ""   # ``app.segment.clicks.Spread``'s warning: other things taken along
    colours: str = ""   # ``app.segment.clicks.ColourSpread``'s: far beyond the clicked colours

    @property
    def warnings(self) -> list[str]:
        out = []
        if self.share < TINY_MASK_SHARE:
            # the share itself is said once, in the summary's "Mask: ..." (``percent``)
            out.append("the selection is tiny: drag a box around the whole object or click on more of it")
        if self.pieces > MANY_PIECES:
            out.append(f"the selection is in {self.pieces} pieces: add background clicks on the "
                       "stray ones, or drag a box around the object")
        if self.spread:
            out.append(self.spread)
        elif self.colours:   # one warning about other things taken along is enough
            out.append(self.colours)
        return out


def percent(share: float) -> str:
    """A share (0..1) as the page says it: '28.7%', and two significant digits under 1 %
    ('0.06%'), so a tiny selection never reads as 0.1 % in one place and 0.06 % in another."""
    p = 100 * share
    return f"{p:.1f}%" if p >= 1 or p == 0 else f"{p:.2g}%"


def assess_mask(mask: np.ndarray, clicks: tuple[Click, ...] = (), rgb: Optional[np.ndarray] = None) -> MaskCheck:
    """``MaskCheck`` of an (h, w) bool mask; with the ``clicks`` that selected it, whether it
    spreads over other things than the clicked one (and with the (h, w, 3) uint8 picture
    ``rgb`` they were made on, whether it reaches far beyond the clicked colours)."""
    import cv2

    from app.segment.clicks import ColourSpread, Spread

    n = int(mask.sum())
    share = n / max(1, mask.size)
    pieces = 0
    if n:
        count, _, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
        pieces = int((stats[1:, cv2.CC_STAT_AREA] >= max(1, 0.001 * mask.size)).sum())
    spread = Spread().check(mask, clicks) if n and pieces <= MANY_PIECES else ""
    colours = ""
    if n and not spread and pieces <= MANY_PIECES and rgb is not None and rgb.shape[:2] == mask.shape:
        colours = ColourSpread().check(rgb, mask, clicks)
    return MaskCheck(share=share, pieces=pieces, speck=n < MIN_MASK_PIXELS or share < SPECK_MASK_SHARE,
                     spread=spread, colours=colours)


def nothing_found_hint(clicks: tuple[Click, ...], box: Optional[Box]) -> str:
    """What to try next when the prompt selected nothing. The person has already done
    what the page asked (clicked, or dragged a box), so this names the next step rather
    than repeating the instruction."""
    if box is None and not clicks:
        return "click the object or drag a box around it"
    if not any(c[2] == 1 for c in clicks):
        if box is None:
            return "only background clicks so far: click on the object itself, or drag a box around it"
        return ("nothing in the box stands out from its surroundings: click on the object "
                "inside the box, or load a mask file")
    return ("nothing found at the clicks: click on other parts of the object, add background "
            "clicks next to it, or load a mask file")


def mask_summary(state: SessionState) -> str:
    img = state.image
    if img is None:
        return "Upload an image, or pick an example below."
    h, w = img.size
    head = f"**{html.escape(img.name)}** — {w}x{h}"
    if state.kept:
        from app.web.photo.objects import kept_summary

        return f"{kept_summary(state)}  \n{_selection_summary(state, head)}"
    return _selection_summary(state, head)


def _selection_summary(state: SessionState, head: str) -> str:
    img = require_image(state)
    if state.mask is None or not state.mask.any():
        text = f"{head}. {nothing_found_hint(state.clicks, state.box)}."
        return f"{text}  \n{md_text(public_text(state.mask_note))}" if state.mask_note and state.kept else text
    clicked = not state.use_alpha and not state.mask_file
    mc = assess_mask(state.mask, state.clicks if clicked else (), img.work)
    if state.use_alpha:
        src = "image transparency"
    elif state.mask_file:
        src = "mask file"
    elif not state.clicks and state.mask_note.startswith("found automatically"):
        src = "Find the object"
    else:
        n_obj = sum(c[2] == 1 for c in state.clicks)
        n_bg = sum(c[2] == 0 for c in state.clicks)
        src = f"{n_obj} object / {n_bg} background clicks" + (" and a box" if state.box else "")
    text = f"{head}. Mask: {percent(mc.share)} of the image, from {src}."
    if state.mask_note:
        text += f"  \n{md_text(public_text(state.mask_note))}"
    for warning in mc.warnings:
        text += f"  \n⚠ {md_text(warning[:1].upper() + warning[1:])}."
    return text

