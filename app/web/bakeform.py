"""A bake's parameters (the page's "Bake a model" tab, ``/bake``) as a checked job request:
the files read and checked as ``kiln bake`` checks them (``worker.bakeinputs``), the settings
checked by ``kiln.settings``, before any job is queued."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from app.web import usertext
from app.web.api import api_settings
from app.web.context import AppContext


def bake_request(ctx: AppContext, session: str, mesh: str, splat: Optional[str], image: Optional[str],
                 mask: Optional[str], camera: Optional[str], focal: Any, principal: Any, camera_frame: Any,
                 fit_camera: Any, source: Any, uvs: Any, session_image: Any, settings_values: dict):
    """(``worker.bakeinputs.CheckedBake``, its settings) from a bake's parameters, checked;
    UIError naming the parameter or file that is wrong. ``session_image``: the session's
    image and selection are the photo (the page's first tab, or ``/upload_image``)."""
    from worker.bakeinputs import BakeFiles, bake_settings, check_bake
    from worker.inputs import InputProblem

    from app.web import form

    if not mesh:
        raise usertext.UIError("mesh: no file was given")
    simplify_asked = settings_values.get("simplify_ratio") is not None
    settings = bake_settings(api_settings(ctx.settings, settings_values), simplify_asked)
    try:
        files = BakeFiles(
            mesh=Path(mesh), splat=_path(splat), image=_path(image), mask=_path(mask), camera=_path(camera),
            focal=float(focal) if focal not in (None, "", 0) else None,
            principal=(float(principal[0]), float(principal[1])) if principal else None,
            camera_frame=str(camera_frame or "opengl"), fit_camera=bool(fit_camera),
            source=str(source or "auto"), uvs=str(uvs or "auto"))
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        # any JSON may arrive: {"a": 1} as principal (KeyError), 10**400 as focal (OverflowError)
        raise usertext.UIError("focal is a number of pixels and principal [cx, cy]") from None
    pixels = None
    if session_image:
        st = ctx.sessions.get(session)
        with ctx.decodes:
            pixels = form.job_inputs(st)   # UIError: no image, or no usable selection
    try:
        return check_bake(files, settings, simplify_asked, photo_pixels=pixels), settings
    except InputProblem as e:
        raise usertext.UIError(as_parameters(str(e))) from None


def _path(value) -> Optional[Path]:
    return Path(value) if value else None


# the command line's flags as the page's and the API's parameters, in the checks' messages
_FLAG_RE = re.compile(r"--(keep-uvs|new-uvs|[a-z][a-z-]*)")
_FLAG_AS = {"keep-uvs": 'uvs "keep"', "new-uvs": 'uvs "new"', "simplify-ratio": "simplify_ratio"}


def as_parameters(text: str) -> str:
    """A ``kiln bake`` check's message with its flags named as parameters ("pass it as --splat"
    -> "pass it as splat")."""
    return _FLAG_RE.sub(lambda m: _FLAG_AS.get(m.group(1), m.group(1).replace("-", "_")), text)
