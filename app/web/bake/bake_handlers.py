"""The "Bake a model" tab's handlers: Bake (checked at once, then submitted to the job queue),
the outcome shown when it ends, and Cancel. A camera the tab fitted first ("Fit the camera to
the photo", ``app.web.bake.fit_handlers``) is what its Bake uses, as it is. Each is ``handler(page, ctx, caller, *inputs) ->
{component: value}`` over the tab's ``app.web.page.layout.BakeTab`` (generators yield such dicts).

A tab runs one job at a time, whichever tab of the page started it (``ctx.active`` is keyed by
the page's session). The job belongs to the browser like any other: it is listed in the
history, its GLB downloads as ``<mesh name>-<n>.glb``, and it goes on when the page closes
until ``app.orphan_grace_s`` passes unfollowed.
"""

from __future__ import annotations

from typing import Iterator, Optional

import gradio as gr

from app.web.bake import fit_picture as fitview
from app.web.state import history
from app.web.state import browser_jobs as jobs
from app.web.page import status_line as statusview
from app.web.server import usertext
from app.web.bake.bake_form import BakeForm, bake_request
from app.web.page import job_flow
from app.web.page.job_flow import JobFlow
from app.web.server.context import AppContext
from app.web.state.job_outcome import Outcome, job_outcome
from app.web.page.layout import BAKE_PROGRESS_ID, FIT_LABEL, Page, Updates
from app.web.server.requestinfo import Caller


def _progress(st=None, note: str = "") -> str:
    return statusview.progress_html(st, note=note, dom_id=BAKE_PROGRESS_ID)


def idle_buttons(page: Page) -> Updates:
    t = page.bake_tab
    return {t.bake_button: gr.update(value="Bake", interactive=True), t.cancel: gr.update(interactive=False),
            t.fit_button: gr.update(value=FIT_LABEL, interactive=True)}


def running_buttons(page: Page) -> Updates:
    t = page.bake_tab
    return {t.bake_button: gr.update(value="Baking…", interactive=False), t.cancel: gr.update(interactive=True),
            t.fit_button: gr.update(interactive=False)}


def _request(ctx: AppContext, session: str, values: BakeForm):
    """The tab's values as a checked bake (``app.web.bake.bake_form``); a simplify ratio of 0 is none.
    Returns (checked, settings, note): with the tab's fitted camera (``ctx.fits``) and no camera
    given, the bake uses that camera as fitted, no refit, and ``note`` says so; a fit made for
    another photo, mask or model (``fit_key``) is dropped first, and ``note`` says that."""
    from worker.jobs.bakeinputs import fit_key

    v = values
    stored = ctx.fits.get(session)
    note = ""
    if stored is not None and not v.camera and not v.focal:
        checked, settings = bake_request(ctx, session, v.mesh, v.splat, v.photo, v.mask, str(stored.camera), None,
                                         None, v.frame, False, v.source, v.uvs, v.reuse, v.settings_values(),
                                         camera_fitted=True, more_photos=v.more_photos(), objects=v.objects())
        if fit_key(checked) == stored.key:
            return checked, settings, fitview.stored_fit_note(stored.report)
        ctx.fits.drop(session)
        note = fitview.DROPPED
    checked, settings = bake_request(ctx, session, v.mesh, v.splat, v.photo, v.mask, v.camera, v.focal or None,
                                     None, v.frame, v.fit, v.source, v.uvs, v.reuse, v.settings_values(),
                                     more_photos=v.more_photos(), objects=v.objects())
    return checked, settings, note


def _check(page: Page, ctx: AppContext, caller: Caller, values: BakeForm) -> Updates:
    """Bake's own check: the files read and checked at once (a UIError says what is wrong with
    which file); then what was read shows, and the last result is cleared."""
    checked, _, said = _request(ctx, caller.session, values)
    t = page.bake_tab
    notes = "\n".join(f"- {usertext.public_text(n)}" for n in ([said] if said else []) + list(checked.notes))
    shown = {t.progress: _progress(note="Starting…"), t.notes: notes, t.model: None,
             t.download: gr.update(visible=False), t.more_files: gr.update(value=None, visible=False),
             t.file_sizes: "", **running_buttons(page)}
    if not checked.request.camera_fitted:   # the tab's fit, if any, is not what this bake uses
        shown.update({t.fit_view: gr.update(value=None, visible=False), t.fit_info: ""})
    return shown


def _submit(ctx: AppContext, session: str, values: BakeForm, pressed: Optional[float]) -> Iterator:
    checked, settings, _ = _request(ctx, session, values)
    info = history.JobInfo(checked.request.names.get("mesh", "model"))
    return jobs.follow_bake(ctx, session, checked, settings, info=info, pressed_at=pressed)


def _outcome(ctx: AppContext, session: str, last, waited: float, note: str) -> Outcome:
    return job_outcome(ctx, session, last, waited)


def _shown_once(page: Page, ctx: AppContext, session: str, st) -> Optional[Updates]:
    return _fit_picture(page, ctx, session, st)


BAKE = JobFlow(kind="bake", progress=lambda page: page.bake_tab.progress, dom_id=BAKE_PROGRESS_ID,
               idle=idle_buttons, check=_check, submit=_submit, outcome=_outcome, once=_shown_once)


def on_bake(page: Page, ctx: AppContext, caller: Caller, values: BakeForm) -> Updates:
    """Bake pressed: refused at once with the reason kept on the progress line
    (``job_flow.press``), else marked pending."""
    return job_flow.press(BAKE, page, ctx, caller, values)


def show_bake_refusal(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """After a refused Bake: why, on the tab's progress line, until the next action."""
    return job_flow.show_refusal(BAKE, page, ctx, caller)


def run_bake(page: Page, ctx: AppContext, caller: Caller, values: BakeForm) -> Iterator[Updates]:
    """The Bake ``on_bake`` let through (``job_flow.run``): submitted at once, its progress and
    the fitted silhouette streamed, its ``Outcome`` left for ``show_bake_outcome``."""
    yield from job_flow.run(BAKE, page, ctx, caller, values)


def _fit_picture(page: Page, ctx: AppContext, session: str, st) -> Optional[Updates]:
    """The fitted silhouette over the photo, once the job's worker has drawn it (before the
    texture is baked); None until then."""
    if st is None or st.kind != "bake":
        return None
    picture = fitview.fit_picture(ctx, session, st.id)
    return None if picture is None else {page.bake_tab.fit_view: gr.update(value=picture, visible=True)}


def bake_outcome_view(page: Page, out: Optional[Outcome]) -> Updates:
    """A bake's outcome on its tab: the progress bar, the model in the viewer, the download,
    the browser's history (shared with the first tab), Bake enabled again."""
    t = page.bake_tab
    if out is None:
        return idle_buttons(page)
    shown = {t.progress: out.progress_html(BAKE_PROGRESS_ID),
             t.download: gr.update(value=out.glb, visible=True) if out.glb else gr.update(visible=False),
             t.more_files: gr.update(value=out.extra_files(), visible=bool(out.extra)),
             t.file_sizes: out.sizes_markdown(), **idle_buttons(page)}
    if out.glb:
        shown[t.model] = out.glb
    pipeline = out.status.stats.pipeline if out.status is not None else None
    warnings = pipeline.warnings if pipeline else ()
    model = pipeline.model if pipeline else None
    fitted = fitview.fit_summary(model.camera_fit if model else None)
    if fitted and model is not None and model.camera == "fitted before":
        fitted = f"Baked with the camera fitted before, not fitted again. {fitted}"
    if not fitted and model is not None:
        fitted = fitview.given_camera_summary(model.camera, model.silhouette)
    lines = [f"- {fitted}"] if fitted else []
    if pipeline is not None and pipeline.scene:   # a scene: a line per object, as kiln bake --scene says
        lines = [f"- {usertext.public_text(o.describe())}" for o in pipeline.scene]
    if model is not None and len(model.photos) > 1:   # several photos: a line each, as kiln bake says
        lines += [f"- {usertext.public_text(p.describe(n))}" for n, p in enumerate(model.photos, start=1)]
    lines += [f"- **{usertext.public_text(w)}**" for w in warnings]
    if lines:
        shown[t.notes] = "\n".join(lines)
    if out.history is not None:
        shown.update({page.history: out.history.html, page.history_files: out.history.file_list()})
    return shown


def show_bake_outcome(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """After ``run_bake``: the tab's outcome, taken from the record."""
    return bake_outcome_view(page, ctx.active.take_outcome(caller.session, "bake"))


def follow_bake_on_load(page: Page, ctx: AppContext, caller: Caller) -> Iterator[Updates]:
    """A page just loaded: if its browser's newest bake job is queued or running, follow it on
    this tab (Cancel works on it; the result lands here); if it ended, leave its outcome for
    ``show_followed_bake``, so the tab looks as it did before the reload. The first tab's
    Generate or follower keeps the tab's one job when it has one."""
    session = caller.session
    t = page.bake_tab
    while not ctx.sup_ready.is_set():
        yield {t.progress: gr.skip()}
        ctx.sup_ready.wait(1.0)
    statuses = [st for st in jobs.browser_jobs(ctx, session) if st.kind == "bake"] if ctx.sup else []
    live = jobs.live_job(statuses)
    if not statuses or ctx.active.busy(session):
        yield {t.progress: gr.skip()}
        return
    if live is None:
        ctx.active.keep_outcome(session, job_outcome(ctx, session, statuses[-1]))
        yield {t.progress: gr.skip()}
        return
    first = jobs.progress_view(ctx, live, BAKE_PROGRESS_ID)
    yield {t.progress: first, **running_buttons(page)}
    last = live
    fit_shown = False
    for _, last, view in jobs.progress_views(ctx, jobs.follow_existing(ctx, session, live.id),
                                             dom_id=BAKE_PROGRESS_ID, shown=first):
        picture = None if fit_shown else _fit_picture(page, ctx, session, last)
        fit_shown = fit_shown or picture is not None
        yield {t.progress: view, **(picture or {})}
    if last.terminal:
        ctx.active.keep_outcome(session, job_outcome(ctx, session, last))
    yield {t.progress: gr.skip()}


def show_followed_bake(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """After ``follow_bake_on_load``: the bake outcome it left, if any (nothing else changes)."""
    out = ctx.active.take_outcome(caller.session, "bake")
    return bake_outcome_view(page, out) if out is not None else {page.bake_tab.progress: gr.skip()}


def on_bake_cancel(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """Cancel the tab's job (a bake or a fit), or its press not yet submitted (``job_flow.cancel``)."""
    return job_flow.cancel(BAKE, page, ctx, caller)
