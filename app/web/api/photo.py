"""The endpoints a script calls (``gradio_client``), documented in docs/api.md.

Each endpoint acts on the caller's own session, named as a page tab's is
(``app.web.server.browser.session_name``: the ``kiln_browser`` cookie plus Gradio's session hash),
and its jobs and results belong to that cookie, as a browser's do. A
``gradio_client.Client`` keeps both for its whole life: it stores the cookie the server
sets on its first request and sends one session hash with every call, so its upload,
generate, status and result calls meet in one session, and its result files download
only with its cookie (``app.web.server.launch.RequestGuard``). Another client, or a page, has
another cookie and reaches none of it.

The page's own events stay callable by the page but are hidden from the API
listing: they take page-shaped values and are no interface to keep stable. The endpoints
are registered from ``app.web.api.endpoints.ENDPOINT_TABLE``; ``/bake`` lives in ``app.web.api.bake``,
``/fit_camera`` in ``app.web.api.fit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional

import gradio as gr

from kiln.formats import OUTPUT_TAIL, base_key, extra_keys, format_of, object_key, output_key
from kiln.settings import JOB_SETTINGS, Settings, SettingsError

from app.web.photo import form
from app.web.state import history
from app.web.state import browser_jobs as jobs
from app.web.server import usertext
from app.web.photo import selection
from app.web.page import status_line as statusview
from app.web.state import uploads
from app.web.server.context import AppContext
from app.web.server.requestinfo import Caller, refusal

# generate's parameters -> the setting each sets (kiln.settings checks ranges and names it)
SETTING_OF = JOB_SETTINGS
PARAM_OF = {key: name for name, key in SETTING_OF.items()}


def setting_overrides(values: dict[str, Any]) -> dict:
    """generate's parameters (None: the server's setting) as dotted setting keys."""
    return {SETTING_OF[name]: v for name, v in values.items() if v is not None}


def api_settings(base: Settings, values: dict[str, Any]) -> Settings:
    """``base`` with generate's parameters; UIError naming the parameter and its setting:
    "seed: -1 is out of range; allowed 0 to 2147483647 (setting 'seed')"."""
    try:
        return base.override(setting_overrides(values))
    except SettingsError as e:
        text = str(e)
        m = form.SETTING_RE.match(text)
        if m is None or m.group(1) not in PARAM_OF:
            raise usertext.UIError(text) from None
        raise usertext.UIError(f"{PARAM_OF[m.group(1)]}: {text[m.end():].strip()} (setting '{m.group(1)}')") from None


def describe_state(st: uploads.SessionState) -> dict:
    """What /upload_image and /select answer: the image and where its mask comes from."""
    img = st.image
    if img is None:
        return {"image": None, "mask": None}
    h, w = img.size
    out: dict[str, Any] = {"image": img.name, "width": w, "height": h, "has_alpha": img.has_alpha}
    if st.mask is None or not st.mask.any():
        out["mask"] = None
        return out
    source = "alpha" if st.use_alpha else "file" if st.mask_file else "prompt"
    mc = selection.assess_mask(st.mask, st.clicks if source == "prompt" else (), img.work)
    out["mask"] = {"source": source, "share": round(mc.share, 5), "pieces": mc.pieces,
                   "note": usertext.public_text(st.mask_note), "warnings": mc.warnings}
    return out


def describe_job(st) -> dict:
    """A job status (``worker.jobs.jobstore.JobStatus``) without server paths."""
    out = {"job": st.id, "state": st.state, "stage": st.stage, "progress": round(float(st.progress or 0), 4),
           "message": usertext.public_text(st.message or ""),
           "error": usertext.public_text(st.error) if st.error else None,
           "created": st.created, "finished": st.finished}
    total = (st.timings or {}).get("total_s")
    if isinstance(total, (int, float)):
        out["total_s"] = round(float(total), 2)
    if st.state == "done":
        out["outputs"] = sorted(k for k in (st.outputs or {}) if base_key(k) in OUTPUT_TAIL)
        fit = fit_figures(st)
        if fit is not None:
            out["camera_fit"] = fit
        pipeline = st.stats.pipeline if st.stats is not None else None
        if pipeline is not None and pipeline.files:
            # each model file's size and contents, as --report has them, without server paths
            # a scene object's file names its object (``obj@bench``: "object": "bench")
            out["files"] = [{"format": format_of(f.key), **({"object": f.key.partition("@")[2]} if "@" in f.key else {}),
                             **{k: v for k, v in f.to_dict().items() if k not in ("key", "name")}}
                            for f in pipeline.files]
    return out


def fit_figures(st) -> Optional[dict[str, Any]]:
    """A done job's fitted camera in figures, without the camera (IoU, coverage, inside, the
    tie-break, the time): a fit job's, or a bake's that fitted its camera or was given one
    fitted before; None when it has none."""
    if st.stats.camera_fit is not None:
        return st.stats.camera_fit.figures()
    model = st.stats.pipeline.model if st.stats.pipeline is not None else None
    return dict(model.camera_fit) if model is not None and model.camera_fit else None


def to_work_pixels(st: uploads.SessionState, x: float, y: float) -> tuple[float, float]:
    """Full-image pixel (x, y) -> the working copy's pixel, where clicks and boxes live."""
    img = uploads.require_image(st)
    H, W = img.size
    h, w = img.work.shape[:2]
    return float(x) * w / W, float(y) * h / H


# -- the endpoints: handler(ctx, caller, *parameters) ------------------------------------
# A parameter whose Python default is None is optional for clients; the request goes
# before the first of them (requestinfo.event_fn), as a page handler's does.

class JobAnswer(NamedTuple):
    """What /generate yields and /result answers: the job (``describe_job``) and its
    published files, once it is done: the GLB, the Gaussians' .ply, and the other formats
    asked for (``files``: OBJ zip, STL, PLY mesh)."""

    info: dict
    glb: Optional[str] = None
    ply: Optional[str] = None
    files: Optional[list[str]] = None


def job_answer(st, files: dict[str, str]) -> JobAnswer:
    """A done job's answer from its published ``files`` (output key -> path); the status's
    sizes are the published files' (an OBJ zip's members are renamed for the download)."""
    info = describe_job(st)
    for f in info.get("files", ()):
        key = output_key(f["format"])
        path = files.get(object_key(key, f["object"]) if "object" in f else key)
        if path is not None:
            f["bytes"] = Path(path).stat().st_size
    extra = [files[k] for k in extra_keys(files)]
    return JobAnswer(info, files.get("glb"), files.get("ply"), extra or None)


def upload_image(ctx: AppContext, caller: Caller, image: str, mask: Optional[str] = None,
                 use_alpha: bool = True) -> dict:
    """Upload an image (PNG, JPEG, WebP, TIFF…) to this session, replacing any earlier one.
    mask: optional mask file of the image's size (a non-constant alpha marks the object,
    else white = object). use_alpha: with no mask file, use the image's transparency as
    the mask (default true). Returns the image's size and the mask's source and share."""
    if not image:
        raise refusal("image: no file was given")
    app_settings = ctx.settings.app
    with ctx.sessions.edit(caller.session, caller.client) as (_, save):
        try:
            ctx.sessions.admit(caller.session, caller.client, Path(image).stat().st_size)
            with ctx.decodes:
                st = uploads.load_upload(image, app_settings, name=Path(image).name)
                if mask:
                    st = uploads.set_mask_file(st, mask, app_settings, name=Path(mask).name)
            if not mask and not use_alpha:
                st = uploads.set_use_alpha(st, False)
            save(st)
        except (usertext.UIError, OSError) as e:
            save(uploads.SessionState())
            raise _fail(e) from None
    return describe_state(st)


def _prompts(points: Optional[list], box: Optional[list]) -> tuple[list, Optional[list]]:
    """/select's points as (x, y, label) and box as [x0, y0, x1, y1]; refused naming the
    parameter when malformed, or when neither is given."""
    try:
        pts = [(float(p[0]), float(p[1]), int(p[2])) for p in (points or [])]
        if any(lb not in (0, 1) for _, _, lb in pts):
            raise usertext.UIError("points: a label is 1 (object) or 0 (background)")
        bx = [float(v) for v in box] if box else None
        if bx is not None and len(bx) != 4:
            raise usertext.UIError("box: give [x0, y0, x1, y1]")
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        # any JSON may arrive: {} for a point (KeyError), 1e999 as a label (OverflowError)
        raise refusal("points: give [[x, y, label], ...] with label 1 (object) or 0 (background); "
                      "box: give [x0, y0, x1, y1]") from None
    except usertext.UIError as e:
        raise _fail(e) from None
    if not pts and bx is None:
        raise refusal("points or box: give at least one")
    return pts, bx


def select(ctx: AppContext, caller: Caller, points: Optional[list] = None, box: Optional[list] = None) -> dict:
    """Select the object with prompts instead of a mask: points [[x, y, label], ...]
    (label 1 = object, 0 = background) and/or box [x0, y0, x1, y1], in the uploaded
    image's pixels. Replaces the session's mask (alpha or mask file included)."""
    with ctx.sessions.edit(caller.session, caller.client) as (st, save):
        pts, bx = _prompts(points, box)
        try:
            st = selection.clear_clicks(st)
            if bx is not None:
                (x0, y0), (x1, y1) = to_work_pixels(st, bx[0], bx[1]), to_work_pixels(st, bx[2], bx[3])
                st = selection.set_box(st, x0, y0, x1, y1, ctx.segmenter)
            for x, y, label in pts:
                wx, wy = to_work_pixels(st, x, y)
                st = selection.add_click(st, wx, wy, label == 0, ctx.segmenter)
            save(st)
        except usertext.UIError as e:
            raise _fail(e) from None
    return describe_state(st)


# /generate's mask parameter: the one value it takes
AUTO_MASK = "auto"


def generate(ctx: AppContext, caller: Caller, bake: Optional[bool] = None, simplify_ratio: Optional[float] = None,
             texture_size: Any = None, views: Optional[int] = None, bake_mode: Optional[str] = None,
             seed: Optional[int] = None, gaussians_ply: Optional[bool] = None, mask: Optional[str] = None,
             formats: Any = None, texture_format: Optional[str] = None, units: Optional[str] = None,
             faces: Optional[int] = None, progress=gr.Progress()) -> Iterator[JobAnswer]:
    """Make a 3D model of the session's image and mask. The parameters are the page's
    settings (kiln.settings names the setting each sets; null keeps the server's), and
    mask: "auto" finds the object automatically in the session's image (as the server's
    app.auto_mask says: SAM 2 when its checkpoint is installed, else rembg when it and its
    model are, else from a plain or smooth background) instead of using the
    session's selection, transparency or mask file; refused with the reason when no single
    object stands out. formats: the files to write besides the GLB (a list, or "obj,stl": obj,
    stl, ply), texture_format: png, jpeg or webp, units: the STL's, m or mm; faces: an exact
    face count instead of simplify_ratio (within 2 %). Yields (status,
    glb, ply, files) as the job changes; the last has the GLB (and the .ply with gaussians_ply,
    and the other formats in files), its status each file's size; with mask "auto" each status
    says how the object was found. A failed or cancelled job raises its reason."""
    session = caller.session
    if mask not in (None, "", AUTO_MASK):
        raise refusal(f'mask: give "{AUTO_MASK}" to find the object automatically, or leave it out '
                      "to use the session's selection, transparency or mask file")
    auto = mask == AUTO_MASK
    values = dict(bake=bake, simplify_ratio=simplify_ratio, texture_size=texture_size, views=views,
                  bake_mode=bake_mode, seed=seed, gaussians_ply=gaussians_ply, formats=formats,
                  texture_format=texture_format, units=units, faces=faces)
    st = ctx.sessions.get(session)
    settings = _checked_settings(ctx, st, values, mask_found=auto)
    if ctx.sup_error:
        raise refusal(usertext.public_text(ctx.sup_error))
    if not ctx.active.press(session):
        raise refusal("this session already has a job running; wait for it or call /cancel")
    try:
        found = None
        try:
            with ctx.decodes:
                if auto:
                    rgb, mask_px, found = form.found_object_inputs(
                        st, ctx.finder, settings.reconstruct,
                        instead="select it with /select (points or a box) or upload its mask with /upload_image")
                else:
                    rgb, mask_px = form.job_inputs(st)
        except usertext.UIError as e:
            raise _fail(e) from None
        assert st.image is not None   # job_inputs refuses a session without an image
        # kept with the job: its result downloads as '<image-name>-<n>.glb', as the page's do
        info = history.JobInfo(st.image.name, history.thumbnail_uri(st.image.work))
        del st
        steps = jobs.follow_job(ctx, session, rgb, mask_px, settings, info=info)
        del rgb, mask_px
        said = describe_found(found) if found is not None else None
        for answer in stream_job(ctx, session, steps, progress):
            yield answer if said is None else answer._replace(info={**answer.info, "mask": said})
    finally:
        ctx.active.end_pending(session)


def describe_found(found) -> dict:
    """How /generate's mask "auto" found the object (an ``app.segment.automask.AutoMask``):
    source "auto", method ("border-model", "sam2" or "rembg"), score (0..1), share of the image."""
    return {"source": "auto", "method": found.method, "score": round(float(found.score), 4),
            "share": round(found.share, 5)}


def stream_job(ctx: AppContext, session: str, steps, progress) -> Iterator[JobAnswer]:
    """A followed job (``jobs.follow_job`` / ``follow_bake``'s steps) as an endpoint yields it:
    an answer per change, Gradio's progress bar, the published files once done; a job that
    could not start, failed or was cancelled raises its reason."""
    last = None
    for note, last in steps:
        if last is None:
            if note != jobs.WAITING_FOR_POOL:
                raise refusal(usertext.public_text(note))
            progress(0.0, desc=note)
            continue
        progress(float(last.progress or 0.0), desc=statusview.stage_label(last.stage))
        if not last.terminal:
            yield JobAnswer(describe_job(last))
    if last is None or last.state != "done":
        state = last.state if last is not None else "not started"
        why = usertext.public_text(last.error or "") if last is not None else ""
        raise refusal(f"job {last.id if last else ''} {state}" + (f": {why}" if why else ""))
    yield job_answer(last, publish(ctx, session, last))


def _checked_settings(ctx: AppContext, st: uploads.SessionState, values: dict,
                      mask_found: bool = False) -> Settings:
    """The job's settings from /generate's parameters, after the page's fast checks of the
    session's image and mask (present, not full, not a speck) on the working copy; with
    ``mask_found`` (mask "auto"), of the image only."""
    try:
        settings = api_settings(ctx.settings, values)   # built once: the job runs with these
        uploads.require_image(st)
        form.check_selection(st, settings, mask_found=mask_found)
    except usertext.UIError as e:
        raise _fail(e) from None
    return settings


def status(ctx: AppContext, caller: Caller) -> dict:
    """This client's jobs, oldest first, and which of them this session follows."""
    return {"jobs": [describe_job(st) for st in jobs.browser_jobs(ctx, caller.session)],
            "running": ctx.active.get(caller.session)}


def result(ctx: AppContext, caller: Caller, job: str) -> JobAnswer:
    """The files of a finished job of this client: (status, glb, ply, files)."""
    st = next((j for j in jobs.browser_jobs(ctx, caller.session) if j.id == str(job or "")), None)
    if st is None:
        raise refusal(f"job: no job {str(job)[:64]!r} of this client")
    if st.state != "done":
        raise refusal(f"job {st.id} is {st.state}" + (f": {usertext.public_text(st.error)}" if st.error else ""))
    return job_answer(st, publish(ctx, caller.session, st))


def cancel(ctx: AppContext, caller: Caller) -> dict:
    """Cancel this session's running job; answers the ids cancelled."""
    ids = ctx.active.get(caller.session)
    jobs.cancel_jobs(ctx, caller.session)
    return {"cancelled": ids}


def _fail(e: Exception) -> gr.Error:
    return refusal(usertext.public_text(str(e)))


def publish(ctx: AppContext, session: str, st) -> dict[str, str]:
    """A done job's files, published for this session's browser only."""
    try:
        statuses = jobs.browser_jobs(ctx, session)
        stem = history.result_stems(statuses, jobs.job_infos(ctx, statuses)).get(st.id)
        return {k: str(p) for k, p in ctx.publisher.publish(session, st, stem).items()}
    except (OSError, usertext.UIError) as e:
        raise refusal(f"the result could not be prepared for download: {usertext.public_text(str(e))}") from None
