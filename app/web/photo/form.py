"""The job a Generate press asks for: the form's values as settings (an invalid one named by
its field) and the full-size image and mask, refused before any slow work when not usable."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from kiln.formats import PRIMARY
from kiln.settings import JOB_SETTINGS, Settings, SettingsError, from_dict, setting_value
from worker.jobs.inputs import InputProblem, check_reconstructable

from app.web.server.usertext import UIError
from app.web.photo.selection import MIN_MASK_PIXELS, assess_mask
from app.web.state.uploads import SessionState, require_image


@dataclass(frozen=True)
class GenerateForm:
    """The photo tab's settings boxes as one record: each field is named as its component in
    ``app.web.page.layout.Page`` (which lists them in this order), and maps to the setting
    ``kiln.settings.JOB_SETTINGS`` names in the same order. ``formats``: the formats besides
    the GLB that are ticked (the settings add the GLB); None for the last three keeps the
    server's."""

    bake_texture: bool
    simplify: Any
    texture: Any
    views: Any
    mode: str
    seed: Any
    ply: bool
    formats: Any = None
    texture_format: Any = None
    units: Any = None
    faces: Any = None

    def overrides(self) -> dict:
        """The values as dotted setting keys (checked later by kiln.settings)."""
        texture = (self.texture if str(self.texture) == "auto" else int(self.texture)) \
            if self.texture not in (None, "") else None
        values = (bool(self.bake_texture), self.simplify, texture, self.views, self.mode, self.seed,
                  bool(self.ply), list(self.formats) if isinstance(self.formats, (list, tuple)) else self.formats,
                  self.texture_format or None, self.units or None,
                  self.faces if self.faces not in (None, "") else None)
        return dict(zip(JOB_SETTINGS.values(), values))


# job settings a job from before Kiln wrote other formats lacks; their defaults stand in
_NEWER = ("export.formats", "export.texture_format", "export.units", "mesh.faces")


def form_values(settings: Optional[dict]) -> Optional[GenerateForm]:
    """The photo tab's boxes showing a job's settings (``Settings.to_dict()``), so a reloaded
    page shows what its last job used; None when ``settings`` is not such a dict."""
    if not isinstance(settings, dict) or not all(_has(settings, key) for key in JOB_SETTINGS.values()
                                                 if key not in _NEWER):
        return None
    try:
        job = from_dict(settings)
    except (SettingsError, KeyError, TypeError, ValueError):
        return None
    # the formats box lists only what goes beside the GLB
    values: list[Any] = [[f for f in job.export.formats if f != PRIMARY] if key == "export.formats"
                         else setting_value(job, key) for key in JOB_SETTINGS.values()]
    return GenerateForm(*values)


def _has(data: dict, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


# the form's labels for the setting keys it sets, so an error names the box to fix
FIELD_LABELS = {"bake.enabled": "Bake texture", "mesh.simplify_ratio": "Simplify ratio",
                "bake.texture_size": "Texture size", "views.count": "Bake views",
                "bake.mode": "Bake mode", "seed": "Seed", "export.gaussians_ply": "Also export Gaussians",
                "export.formats": "Also download as", "export.texture_format": "Texture file",
                "export.units": "STL units", "mesh.faces": "Faces"}
SETTING_RE = re.compile(r"setting '([\w.]+)'(?: = |: )?")


def field_error(message: str) -> str:
    """A settings error as the form names it: "setting 'seed' = -1 is out of range; …" ->
    "Seed: -1 is out of range; …"."""
    m = SETTING_RE.match(message)
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


def nothing_selected(has_alpha: bool) -> str:
    """Why a job cannot start without a selection, with every way to make one this image
    offers (its transparency only when it has some)."""
    ways = "click on it, drag a box around it, or press \"Find the object\""
    if has_alpha:
        ways += "; or tick \"Use transparency as mask\""
    return f"select the object first: {ways}"


def full_mask(state: SessionState, alpha: Optional[np.ndarray] = None) -> np.ndarray:
    """(H, W) bool mask at the upload's full size, ready for a job. ``alpha``: the
    full-size alpha when the caller has decoded it already (``WorkImage.full``)."""
    import cv2

    img = require_image(state)
    if state.use_alpha and img.has_alpha:
        if alpha is None:
            alpha = img.full()[1]
        assert alpha is not None   # has_alpha: the upload has an alpha channel
        return alpha >= 128
    if state.mask_file:
        return _full_mask_file(state)
    if state.mask is None:
        raise UIError(nothing_selected(img.has_alpha))
    H, W = img.size
    if state.mask.shape == (H, W):
        return state.mask.copy()
    up = cv2.resize(state.mask.astype(np.float32), (W, H), interpolation=cv2.INTER_LINEAR)
    return up >= 0.5


def _full_mask_file(state: SessionState) -> np.ndarray:
    from kiln.imageio import ImageError
    from kiln.maskfile import load_mask

    H, W = require_image(state).size
    assert state.mask_file   # full_mask asks only for a state with a mask file
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
    img = require_image(state)
    if not state.use_alpha and (state.mask is None or not state.mask.any()):
        full_mask(state)   # says what is missing before the slow decode
    rgb, alpha = img.full()
    return rgb, checked_full_mask(state, alpha)


def checked_full_mask(state: SessionState, alpha: Optional[np.ndarray]) -> np.ndarray:
    """``full_mask`` of the selection, refused (UIError) when it covers too few pixels or the
    whole image: the one home of that rule for every job the tab makes (``job_inputs``,
    ``objects_request``)."""
    mask = full_mask(state, alpha)
    n = int(mask.sum())
    if n < MIN_MASK_PIXELS:
        raise UIError(f"the mask covers only {n} pixels; click on the object to select more of it")
    if n == mask.size:
        raise UIError("the mask covers the whole image; add a background click outside the object")
    return mask


def found_object_inputs(state: SessionState, finder, reconstruct,
                        instead: str = "select it with clicks or a box") -> tuple[np.ndarray, np.ndarray, Any]:
    """(rgb (H, W, 3) uint8, mask (H, W) bool, ``app.segment.automask.AutoMask``): the
    session's image at full size and its object found automatically by ``finder`` (an
    ``app.segment.automask.Finder``: SAM 2, rembg or the border model as ``app.auto_mask``
    and what is installed say), checked as ``job_inputs`` checks a selection and as the
    reconstruction would (``reconstruct``: its settings). UIError saying why no single
    object was found and what to do ``instead``."""
    img = require_image(state)
    rgb, _ = img.full()
    found = finder.find(rgb)
    if not found.found:
        raise UIError(f"no single object found automatically: {found.problem}; {instead}")
    n = int(found.mask.sum())
    if n < MIN_MASK_PIXELS:
        raise UIError(f"the object found automatically covers only {n} pixels; {instead}")
    try:
        check_reconstructable(rgb, found.mask, reconstruct, "the object found automatically")
    except InputProblem as e:
        raise UIError(str(e)) from None
    return rgb, found.mask, found


def check_job_request(state: SessionState, base: Settings, form: GenerateForm) -> Settings:
    """The settings a Generate press asks for (``base`` with the form's values), after what
    ``job_request`` would refuse, checked on the working copy (``check_selection``)."""
    used = job_settings(base, form.overrides())
    check_selection(state, used)
    return used


def check_selection(state: SessionState, settings: Settings, mask_found: bool = False) -> None:
    """What ``job_inputs`` refuses, checked on the working copy without decoding the full-size
    image (fast, for the check before a job waits in the queue), against the job's own
    ``settings`` (built once by the caller). ``mask_found``: the object is to be found
    automatically (``found_object_inputs``), so only the image is checked here."""
    img = require_image(state)
    if mask_found:
        return
    if state.use_alpha and img.work_alpha is not None:
        mask = img.work_alpha >= 128
    elif state.mask is None:
        raise UIError(nothing_selected(img.has_alpha))
    else:
        mask = state.mask
    if not mask.any():
        raise UIError("the mask is empty; click on the object to select it")
    if mask.all():
        raise UIError("the mask covers the whole image; add a background click outside the object")
    mc = assess_mask(mask)
    if mc.speck:
        raise UIError(f"the selection is only a speck ({100 * mc.share:.2f} % of the image); "
                      "drag a box around the whole object or click on more of it")
    try:   # what the reconstruction would refuse (e.g. a selection too thin for its grid)
        check_reconstructable(img.work, mask, settings.reconstruct, "the selection")
    except InputProblem as e:
        raise UIError(str(e)) from None


def job_request(state: SessionState, base: Settings, form: GenerateForm) -> tuple[np.ndarray, np.ndarray, Settings]:
    """(rgb, mask, settings) of the job a Generate press asks for: ``job_inputs`` of the
    session and ``base`` with the form's values. UIError when either is not usable."""
    rgb, mask = job_inputs(state)
    return rgb, mask, job_settings(base, form.overrides())


def check_objects(state: SessionState, base: Settings, form: GenerateForm) -> tuple[Settings, int]:
    """``check_job_request`` for every object Generate makes (``app.web.photo.objects``: the
    kept selections and the current one): (the settings, how many objects). A refusal names
    the object when there are several."""
    from app.web.photo.objects import objects_of

    used = job_settings(base, form.overrides())
    objects = objects_of(state)
    for n, one in enumerate(objects, start=1):
        try:
            check_selection(one, used)
        except UIError as e:
            if len(objects) == 1:
                raise
            raise UIError(f"object {n}: {e}") from None
    return used, len(objects)


def objects_request(state: SessionState, base: Settings,
                    form: GenerateForm) -> tuple[np.ndarray, list[np.ndarray], Settings]:
    """(rgb, a full-size mask per object, settings) of a Generate press with several objects
    (``job_request``'s checks on each; the image decoded once)."""
    from app.web.photo.objects import objects_of

    objects = objects_of(state)
    img = require_image(state)
    rgb, alpha = img.full()
    masks = []
    for n, one in enumerate(objects, start=1):
        try:
            masks.append(checked_full_mask(one, alpha))
        except UIError as e:
            raise UIError(f"object {n}: {e}") from None
    return rgb, masks, job_settings(base, form.overrides())
