"""Several objects of one photo on the "Photo to 3D" tab: "Add another object" keeps the current
selection as object 1 (2, ...) and starts a new one; Generate then makes every object.

What Generate makes of them depends on the reconstruction (``kiln.stages.scene_problem``): one
that places objects in the photo's camera frame (SAM 3D Objects) gives one scene, a GLB with a
node per object; the built-in one, with no depth of its own, gives each object its own model
(one job each), and the page says what a scene would need. No layout is made up.
"""

from __future__ import annotations

from dataclasses import replace
import numpy as np

from kiln.stages import scene_problem

from app.segment.prompts import has_prompt
from app.web.server.usertext import UIError
from app.web.state.uploads import KeptObject, SessionState, require_image

# objects one Generate makes: each is a job (built-in) or a reconstruction (a scene)
MAX_OBJECTS = 4
# outline colours of the kept objects on the canvas (RGB), object 1 first
KEPT_COLOURS = ((0, 200, 255), (255, 90, 220), (255, 170, 0))


def has_selection(state: SessionState) -> bool:
    """The current selection holds something (clicks' mask, the transparency, a mask file)."""
    return state.mask is not None and bool(state.mask.any())


def keep_object(state: SessionState) -> SessionState:
    """The current selection kept as the next object; the selection starts again empty (the
    show-selection toggle as it was). UIError when there is nothing to keep, or no room."""
    require_image(state)
    if not has_selection(state):
        raise UIError(f"select object {len(state.kept) + 1} first (click it or drag a box around it), "
                      "then add another")
    if len(state.kept) + 1 >= MAX_OBJECTS:
        raise UIError(f"one Generate makes at most {MAX_OBJECTS} objects; this selection is the last")
    assert state.mask is not None
    kept = KeptObject(mask=state.mask.copy(), clicks=state.clicks, box=state.box, use_alpha=state.use_alpha,
                      mask_file=state.mask_file, mask_note=state.mask_note)
    n = len(state.kept) + 2
    return replace(state, kept=state.kept + (kept,), clicks=(), box=None, mask=None, use_alpha=False,
                   mask_file=None, mask_note=f"object {n - 1} kept: now select object {n}")


def drop_kept(state: SessionState) -> SessionState:
    """Forget the kept objects; the current selection stays."""
    return replace(state, kept=(), mask_note="")


def as_selection(state: SessionState, kept: KeptObject) -> SessionState:
    """``state`` with ``kept`` as its selection (what ``app.web.photo.form`` checks and reads)."""
    return replace(state, mask=kept.mask, clicks=kept.clicks, box=kept.box, use_alpha=kept.use_alpha,
                   mask_file=kept.mask_file, mask_note=kept.mask_note, kept=())


def objects_of(state: SessionState) -> list[SessionState]:
    """Each object Generate makes, as a state whose selection is that object's: the kept ones,
    then the current selection when it holds something (or is the only one, so that its own
    checks say what is missing)."""
    out = [as_selection(state, k) for k in state.kept]
    if not out or has_selection(state) or has_prompt(state.clicks, state.box):
        out.append(replace(state, kept=()))
    return out


def kept_summary(state: SessionState) -> str:
    """The kept objects as the mask info lists them ("" when none)."""
    if not state.kept:
        return ""
    parts = []
    for n, k in enumerate(state.kept, start=1):
        share = 100.0 * float(np.count_nonzero(k.mask)) / max(1, k.mask.size)
        parts.append(f"object {n} ({share:.1f}% of the image)")
    current = len(state.kept) + 1
    return (f"**Kept:** {', '.join(parts)}; the selection above is object {current}. "
            "Generate makes every object.")


def generate_note(backend: str, count: int) -> str:
    """What Generate makes of ``count`` objects with the reconstruction ``backend``."""
    if count < 2:
        return ""
    problem = scene_problem(backend)
    if not problem:
        return f"{count} objects: one scene, a GLB with a node per object, placed as SAM 3D Objects lays them out"
    return f"{count} objects, each its own model: {problem}"


def kept_outlines(out: np.ndarray, kept: tuple[KeptObject, ...], thickness: int) -> None:
    """Draw each kept object's outline on ``out`` ((h, w, 3) uint8, in place) in its colour,
    numbered at its top left."""
    import cv2

    for n, k in enumerate(kept, start=1):
        if k.mask.shape != out.shape[:2] or not k.mask.any():
            continue
        colour = KEPT_COLOURS[(n - 1) % len(KEPT_COLOURS)]
        contours, _ = cv2.findContours(k.mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        cv2.drawContours(out, contours, -1, (0, 0, 0), 3 * thickness + 1)
        cv2.drawContours(out, contours, -1, colour, thickness + 1)
        ys, xs = np.nonzero(k.mask)
        org = (int(xs.min()), max(12 * thickness, int(ys.min()) - 4))
        scale = 0.5 * thickness
        cv2.putText(out, str(n), org, cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 3 * thickness, cv2.LINE_AA)
        cv2.putText(out, str(n), org, cv2.FONT_HERSHEY_SIMPLEX, scale, colour, thickness, cv2.LINE_AA)

