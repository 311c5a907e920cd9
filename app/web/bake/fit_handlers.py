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

from pathlib import Path
from typing import Iterator, Optional

import gradio as gr

from app.web.bake import fit_picture as fitview
from app.web.state import browser_jobs as jobs
from app.web.page import status_line as statusview
from app.web.server import usertext
from app.web.bake.bake_form import FitForm, fit_request
from app.web.page import job_flow
from app.web.page.job_flow import JobFlow
from app.web.server.context import AppContext
from app.web.state.fitted_cameras import StoredFit
from app.web.bake.bake_handlers import idle_buttons
from app.web.state.job_outcome import Outcome
from app.web.page.layout import BAKE_PROGRESS_ID, FIT_LABEL, Page, Updates
from app.web.server.requestinfo import Caller, refusal


def fitting_buttons(page: Page) -> Updates:
    """The tab's Fit, Bake and Cancel while its fit runs."""
    t = page.bake_tab
    return {t.fit_button: gr.update(value="Fitting…", interactive=False), t.bake_button: gr.update(interactive=False),
            t.cancel: gr.update(interactive=True)}


def _check(page: Page, ctx: AppContext, caller: Caller, values: FitForm) -> Updates:
    """The fit's own check: no camera given, the files read and checked at once; then the
    tab's earlier fit and its picture are forgotten."""
    if values.camera or values.focal:
        raise refusal("The photo's camera is given (a camera file or a focal length): remove it to fit one, "
                      "or press Bake to use it.")
    checked, _ = fit_request(ctx, caller.session, values.mesh, values.splat, values.photo, values.mask,
                             values.source, values.reuse, values.more_photos())
    ctx.fits.drop(caller.session)
    t = page.bake_tab
    notes = "\n".join(f"- {usertext.public_text(n)}" for n in checked.notes)
    return {t.progress: statusview.progress_html(note="Starting…", dom_id=BAKE_PROGRESS_ID), t.notes: notes,
            t.fit_view: gr.update(value=None, visible=False), t.fit_info: "", **fitting_buttons(page)}


def _submit(ctx: AppContext, session: str, values: FitForm, pressed: Optional[float]) -> Iterator:
    from worker.jobs.bakeinputs import fit_key

    checked, settings = fit_request(ctx, session, values.mesh, values.splat, values.photo, values.mask,
                                    values.source, values.reuse, values.more_photos())
    steps = jobs.follow_fit(ctx, session, checked, settings, pressed_at=pressed)
    key = fit_key(checked)
    for note, st in steps:
        if st is not None and st.state == "done":   # kept for the tab before its outcome is shown
            _keep(ctx, session, st, key)
        yield note, st


def _outcome(ctx: AppContext, session: str, last, waited: float, note: str) -> Outcome:
    fit = ctx.fits.get(session)
    kept = fit is not None and fit.job_id == last.id
    said = "camera fitted: press Bake to bake with it" if kept else note
    return Outcome(status=last, note=said, kind="fit", waited_s=waited)


FIT = JobFlow(kind="fit", progress=lambda page: page.bake_tab.progress, dom_id=BAKE_PROGRESS_ID,
              idle=idle_buttons, check=_check, submit=_submit, outcome=_outcome)


def on_fit(page: Page, ctx: AppContext, caller: Caller, values: FitForm) -> Updates:
    """Fit pressed: refused at once with the reason kept on the progress line
    (``job_flow.press``), else marked pending."""
    return job_flow.press(FIT, page, ctx, caller, values)


def show_fit_refusal(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """After a refused Fit: why, on the tab's progress line, until the next action."""
    return job_flow.show_refusal(FIT, page, ctx, caller)


def run_fit(page: Page, ctx: AppContext, caller: Caller, values: FitForm) -> Iterator[Updates]:
    """The Fit ``on_fit`` let through (``job_flow.run``): submitted at once, its progress
    streamed; when it is done the fit is kept for the tab (what it was fitted to, by
    ``fit_key``) and the outcome left for ``show_fit_outcome``."""
    yield from job_flow.run(FIT, page, ctx, caller, values)


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
