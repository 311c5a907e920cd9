"""``/fit_camera``: the photo's camera of a model the script has, fitted to the object's mask
without baking anything (the bake tab's "Fit the camera to the photo" over HTTP), documented
in docs/api.md. Checked as ``/bake`` is, run as a fit job on the same workers; it answers the
camera file (the form ``kiln bake --camera`` and ``/bake``'s ``camera`` read), the fit's
figures and its picture (the model's silhouette over the photo), each only for this client.
``/bake`` with that file as ``camera`` and ``camera_fitted`` true bakes with it as fitted."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional

import gradio as gr

from app.web.bake import fit_picture as fitview
from app.web.state import browser_jobs as jobs
from app.web.server import usertext
from app.web.api.photo import describe_job
from app.web.bake.bake_form import fit_request, listed_photos
from app.web.server.context import AppContext
from app.web.server.requestinfo import Caller, refusal


class FitAnswer(NamedTuple):
    """What /fit_camera yields: the job's status (with ``camera_fit``, the fit's figures, and
    ``photo_projection``, what a bake will do with it, once done), then the camera file and
    the picture of the fit (None until it is done)."""

    info: dict
    camera: Optional[str] = None
    camera_fit: Optional[str] = None


def projection_said(iou: float, min_iou: float) -> dict:
    """Whether a bake given this fitted camera (``camera_fitted``) projects the photo, and why."""
    if fitview.projects_photo(iou, min_iou):
        why = f"silhouette IoU {iou:.2f} is at least {min_iou:.2f} (bake.fit_min_iou)"
    else:
        why = (f"skipped: silhouette IoU {iou:.2f} is below {min_iou:.2f} (bake.fit_min_iou): the model's outline "
               "does not match the mask well enough for the photo's pixels to land on the right texels")
    return {"projected": fitview.projects_photo(iou, min_iou), "min_iou": min_iou, "why": why}


def fit_camera(ctx: AppContext, caller: Caller, mesh: str, splat: Optional[str] = None, image: Optional[str] = None,
               mask: Optional[str] = None, source: Optional[str] = None, session_image: Optional[bool] = None,
               more_images: Any = None, more_masks: Any = None, progress=gr.Progress()) -> Iterator[FitAnswer]:
    """Fit the camera of the photo (image + mask, or the session's image and selection with
    session_image) to a mesh the script has (GLB/glTF, OBJ, PLY, STL), without baking; the
    splat (3DGS PLY, from the tool source names) lends its colours to tell front from back.
    Yields (status, camera, camera_fit) as the job changes; the last has the camera file
    (JSON: source_camera and the fit's figures, what /bake's camera takes with camera_fitted)
    and the fitted silhouette over the photo (PNG), and its status the figures
    (camera_fit) and whether a bake will project the photo (photo_projection). more_images,
    more_masks: photos after the first, each fitted too (their silhouettes beside the first's in
    the picture)."""
    session = caller.session
    if ctx.sup_error:
        raise refusal(usertext.public_text(ctx.sup_error))
    try:
        checked, settings = fit_request(ctx, session, mesh, splat, image, mask, source, session_image,
                                        listed_photos(more_images, more_masks))
    except usertext.UIError as e:
        raise refusal(usertext.public_text(str(e))) from None
    if not ctx.active.press(session):
        raise refusal("this session already has a job running; wait for it or call /cancel")
    stem = Path(checked.request.names.get("mesh", "model")).stem or "model"
    last = None
    try:
        for note, last in jobs.follow_fit(ctx, session, checked, settings):
            if last is None:
                if note != jobs.WAITING_FOR_POOL:
                    raise refusal(usertext.public_text(note))
                progress(0.0, desc=note)
                continue
            progress(float(last.progress or 0.0), desc="Fitting the camera")
            if not last.terminal:
                yield FitAnswer(describe_job(last))
    finally:
        ctx.active.end_pending(session)
    if last is None or last.state != "done" or last.stats.camera_fit is None:
        state = last.state if last is not None else "not started"
        why = usertext.public_text(last.error or "") if last is not None else ""
        raise refusal(f"job {last.id if last else ''} {state}" + (f": {why}" if why else ""))
    info = describe_job(last)
    info["photo_projection"] = projection_said(last.stats.camera_fit.iou, ctx.settings.bake.fit_min_iou)
    yield FitAnswer(info, *published_fit(ctx, session, last, stem))


def published_fit(ctx: AppContext, session: str, st, stem: str) -> tuple[Optional[str], Optional[str]]:
    """(camera file, picture) of a done job that fitted a camera (a fit job, or a bake that
    fitted one), published for ``session``'s browser as '<stem>.camera.json' and
    '<stem>.camera_fit.png'; None for each it does not have."""
    from worker.jobs.bakejob import FIT_CAMERA, FIT_IMAGE

    out = []
    for name in (FIT_CAMERA, FIT_IMAGE):
        path = jobs.job_output(ctx, st.id, name)
        try:
            data = path.read_bytes() if path is not None else None
        except OSError:
            data = None
        out.append(ctx.owned.publish_file(session, data, f"{stem}.{name}") if data else None)
    return out[0], out[1]

