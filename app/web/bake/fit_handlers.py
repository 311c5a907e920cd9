"""The bake tab's "Fit the camera to the photo": the photo's camera alone, fitted to the
object's mask as a job on the workers (the fit renders with Kiln's rasterizer, GPU when there
is one, so it runs where every rendering stage runs, with the same progress, Cancel and
crash isolation), before anything is baked. When it is done the tab shows the model's
silhouette over the photo and the fit's figures, and keeps the fit for the tab
(``ctx.fits``, ``app.web.state.fitted_cameras``): the tab's next Bake uses that camera as it is, without
fitting again (``handlers_bake``). Changing the photo, the mask or the model drops it.

Each handler is ``handler(page, ctx, caller, *inputs) -> {component: value}`` over the tab's
``app.web.page.layout.BakeTab``; the fit's inputs are ``BakeTab.fit_form``. The fit is a job of the
tab like a Bake (one at a time; ``ctx.active``), shown through an ``Outcome`` of kind "fit".
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator, Optional

import gradio as gr

from app.web.bake import fit_picture as fitview
from app.web.state import browser_jobs as jobs
from app.web.page import status_line as statusview
from app.web.server import usertext
from app.web.bake.bake_form import fit_request
from app.web.server.context import AppContext
from app.web.state.fitted_cameras import StoredFit
from app.web.bake.bake_handlers import idle_buttons
from app.web.photo.generate_handlers import BUSY, kept_refusal
from app.web.state.job_outcome import Outcome, not_started
from app.web.page.layout import BAKE_PROGRESS_ID, FIT_LABEL, Page, Updates
from app.web.server.requestinfo import Caller, refusal

def fitting_buttons(page: Page) -> Updates:
    """The tab's Fit, Bake and Cancel while its fit runs."""
    t = page.bake_tab
    return {t.fit_button: gr.update(value="Fitting…", interactive=False), t.bake_button: gr.update(interactive=False),
            t.cancel: gr.update(interactive=True)}


def on_fit(page: Page, ctx: AppContext, caller: Caller, mesh: Optional[str], splat: Optional[str],
           photo: Optional[str], mask: Optional[str], reuse: bool, source: str, camera: Optional[str],
           focal) -> Updates:
    """Read and check the files at once (a ``gr.Error`` says what is wrong, and stays on the
    progress line: ``show_fit_refusal``); forget the tab's earlier fit and its picture."""
    return kept_refusal(ctx, caller, "fit", _check_fit, page, ctx, caller, mesh, splat, photo, mask, reuse,
                        source, camera, focal)


def _check_fit(page: Page, ctx: AppContext, caller: Caller, mesh: Optional[str], splat: Optional[str],
               photo: Optional[str], mask: Optional[str], reuse: bool, source: str, camera: Optional[str],
               focal) -> Updates:
    session = caller.session
    if ctx.active.busy(session):
        raise refusal(BUSY)
    if ctx.sup_error:
        raise refusal(usertext.public_text(ctx.sup_error))
    if camera or focal:
        raise refusal("The photo's camera is given (a camera file or a focal length): remove it to fit one, "
                      "or press Bake to use it.")
    try:
        checked, _ = fit_request(ctx, session, mesh, splat, photo, mask, source, reuse)
    except usertext.UIError as e:
        raise refusal(usertext.public_text(str(e))) from None
    if not ctx.active.press(session):
        raise refusal(BUSY)
    ctx.fits.drop(session)
    t = page.bake_tab
    notes = "\n".join(f"- {usertext.public_text(n)}" for n in checked.notes)
    return {t.progress: statusview.progress_html(note="Starting…", dom_id=BAKE_PROGRESS_ID), t.notes: notes,
            t.fit_view: gr.update(value=None, visible=False), t.fit_info: "", **fitting_buttons(page)}


def show_fit_refusal(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """After a refused Fit: why, on the tab's progress line, until the next action."""
    text = ctx.active.take_refusal(caller.session, "fit")
    if text is None:
        return {page.bake_tab.progress: gr.skip()}
    return {page.bake_tab.progress: statusview.progress_html(note=f"Not started: {text}", note_state="refused",
                                                            dom_id=BAKE_PROGRESS_ID)}


def run_fit(page: Page, ctx: AppContext, caller: Caller, mesh: Optional[str], splat: Optional[str],
            photo: Optional[str], mask: Optional[str], reuse: bool, source: str, camera: Optional[str],
            focal) -> Iterator[Updates]:
    """The Fit ``on_fit`` let through: submit the fit job at once and stream its progress;
    when it is done, keep the fit for the tab (what it was fitted to, by ``fit_key``) and
    leave the outcome for ``show_fit_outcome``."""
    from worker.jobs.bakeinputs import fit_key

    session = caller.session
    t = page.bake_tab
    last, note, key = None, "", ""
    pressed = ctx.active.pending_since(session)
    try:
        checked, settings = fit_request(ctx, session, mesh, splat, photo, mask, source, reuse)
        key = fit_key(checked)
        steps = jobs.follow_fit(ctx, session, checked, settings, pressed_at=pressed)
        for note, last, view in jobs.progress_views(ctx, steps, dom_id=BAKE_PROGRESS_ID):
            yield {t.progress: view}
    except usertext.UIError as e:   # a file changed between the check and the slot
        note = f"Cannot start: {usertext.public_text(str(e))}"
    finally:
        ctx.active.end_pending(session)
    if last is None:
        ctx.active.keep_outcome(session, not_started(note, kind="fit"))
    else:
        waited = max(0.0, (last.created or 0.0) - (pressed or last.created or time.time()))
        kept = _keep(ctx, session, last, key) if last.state == "done" else None
        said = "camera fitted: press Bake to bake with it" if kept is not None else note
        ctx.active.keep_outcome(session, Outcome(status=last, note=said, kind="fit", waited_s=waited))
    yield {t.progress: gr.skip()}


def _keep(ctx: AppContext, session: str, st, key: str) -> Optional[StoredFit]:
    """A done fit job kept as the tab's fit (its picture published for the tab's browser)."""
    report = st.stats.camera_fit
    camera = st.outputs.get("camera")
    if report is None or not camera or not Path(camera).is_file():
        return None
    fit = StoredFit(job_id=st.id, key=key, camera=Path(camera), report=report,
                    picture=fitview.fit_picture(ctx, session, st.id))
    ctx.fits.put(session, fit)
    return fit


def show_fit_outcome(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """After ``run_fit``: its end on the progress line; when it is done, the fitted silhouette
    over the photo and the fit's figures, with what Bake will do with it."""
    t = page.bake_tab
    out = ctx.active.take_outcome(caller.session, "fit")
    if out is None:
        return idle_buttons(page)
    shown = {t.progress: out.progress_html(BAKE_PROGRESS_ID), **idle_buttons(page)}
    fit = ctx.fits.get(caller.session)
    if fit is not None and fit.job_id == out.job_id:
        shown[t.fit_view] = gr.update(value=fit.picture, visible=fit.picture is not None)
        shown[t.fit_info] = fitview.fit_figures(fit.report, ctx.settings.bake.fit_min_iou)
    return shown


def on_fit_inputs_changed(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """The photo, its mask, the model (mesh, splat, its source) or the camera changed: the
    tab's fit no longer holds, so it is dropped, and its picture and figures go."""
    t = page.bake_tab
    if ctx.fits.drop(caller.session) is None:
        return {t.fit_info: gr.skip()}
    return {t.fit_view: gr.update(value=None, visible=False), t.fit_info: fitview.DROPPED}
