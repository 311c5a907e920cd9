"""``/bake``: texture a model the script already has (``kiln bake`` over HTTP), documented in
docs/api.md. The files are checked as ``kiln bake`` checks them (``worker.bakeinputs``) before
a job is queued; the job then runs on the same workers, with the same guarantees, and its
GLB is published to this client alone, like ``/generate``'s."""

from __future__ import annotations

from typing import Any, Iterator, Optional

import gradio as gr

from app.web import history, jobs, usertext
from app.web.api import JobAnswer, stream_job
from app.web.bakeform import bake_request
from app.web.context import AppContext
from app.web.requestinfo import Caller, refusal

def bake(ctx: AppContext, caller: Caller, mesh: str, splat: Optional[str] = None, image: Optional[str] = None,
         mask: Optional[str] = None, camera: Optional[str] = None, focal: Optional[float] = None,
         principal: Optional[list] = None, camera_frame: Optional[str] = None, fit_camera: Optional[bool] = None,
         source: Optional[str] = None, uvs: Optional[str] = None, session_image: Optional[bool] = None,
         simplify_ratio: Optional[float] = None, texture_size: Any = None, views: Optional[int] = None,
         bake_mode: Optional[str] = None, seed: Optional[int] = None, formats: Any = None,
         texture_format: Optional[str] = None, units: Optional[str] = None,
         progress=gr.Progress()) -> Iterator[JobAnswer]:
    """Bake a textured GLB from a mesh the script has (GLB/glTF, OBJ, PLY, STL), with its splat
    (3DGS PLY), its photo (image + mask, or the session's image and selection with
    session_image) and the photo's camera (camera: a source_camera JSON, or focal [+
    principal] with camera_frame; none: fitted to the mask). source: the splat's tool (auto,
    kiln, inria, sam3d, trellis); uvs: auto, keep or new. formats, texture_format, units: the
    files to write besides the GLB, as /generate takes them. Yields (status, glb, ply, files) as
    the job changes; the last has the GLB and the other formats. Bad files are refused before a
    job is queued."""
    session = caller.session
    values = dict(simplify_ratio=simplify_ratio, texture_size=texture_size, views=views,
                  bake_mode=bake_mode, seed=seed, formats=formats, texture_format=texture_format, units=units)
    if ctx.sup_error:
        raise refusal(usertext.public_text(ctx.sup_error))
    try:
        checked, settings = bake_request(ctx, session, mesh, splat, image, mask, camera, focal, principal,
                                         camera_frame, fit_camera, source, uvs, session_image, values)
    except usertext.UIError as e:
        raise refusal(usertext.public_text(str(e))) from None
    if not ctx.active.press(session):
        raise refusal("this session already has a job running; wait for it or call /cancel")
    try:
        info = history.JobInfo(checked.request.names.get("mesh", "model"))
        yield from stream_job(ctx, session, jobs.follow_bake(ctx, session, checked, settings, info=info), progress)
    finally:
        ctx.active.end_pending(session)
