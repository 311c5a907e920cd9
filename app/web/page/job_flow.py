"""One skeleton for every job a tab starts (Generate, Bake, "Fit the camera to the photo"):
press (the checks every kind shares, then the kind's own, before anything is queued), the
refusal kept on the progress line, submit and follow with the progress bar, the outcome left
in the active-jobs record for the handler that shows it, and Cancel.

A kind of job is data (``JobFlow``): its name in the record and the job store, its progress
bar, its buttons, and three functions of its own (check, submit, outcome). The handlers in
``app.web.photo.generate_handlers``, ``app.web.bake.bake_handlers`` and
``app.web.bake.fit_handlers`` are one line each over these functions, so a rule about jobs
(the order of the checks, what a refusal leaves, how long a job waited) has one home.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import gradio as gr

from app.web.page import status_line as statusview
from app.web.page.layout import Page, Updates
from app.web.server import usertext
from app.web.server.context import AppContext
from app.web.server.requestinfo import FAULT_LOG, Caller, fault_reason, log, refusal
from app.web.state import browser_jobs as jobs
from app.web.state.job_outcome import Outcome, not_started

BUSY = "This page's job is still running; wait for it or press Cancel."


@dataclass(frozen=True)
class JobFlow:
    """One kind of job as a tab runs it.

    Args:
        kind: "image", "bake" or "fit": its key in the active-jobs record and its kind in the
            job store.
        progress: the tab's progress bar (a component of the page).
        dom_id: the bar's DOM id.
        idle: the tab's buttons when no job runs (fresh dicts each call: Gradio consumes an
            update's keys as it applies it).
        check: (page, ctx, caller, form) -> what the tab shows once the press is let through;
            raises ``usertext.UIError`` (or a ``gr.Error``) for what the kind refuses. Runs
            after the checks every kind shares (the tab's own job, the pool's start-up error).
        submit: (ctx, session, form, pressed_at) -> the job's follow steps
            (``browser_jobs.follow_*``); raises ``usertext.UIError`` when it cannot start.
        outcome: (ctx, session, last status, waited seconds, last note) -> the ``Outcome``
            kept for the tab.
        once: (page, ctx, session, status) -> what to show once it first exists while the
            job runs (the bake's fitted silhouette), else None.
    """

    kind: str
    progress: Callable[[Page], Any]
    dom_id: str
    idle: Callable[[Page], Updates]
    check: Callable[[Page, AppContext, Caller, Any], Updates]
    submit: Callable[[AppContext, str, Any, Optional[float]], Iterator]
    outcome: Callable[[AppContext, str, Any, float, str], Outcome]
    once: Optional[Callable[[Page, AppContext, str, Any], Optional[Updates]]] = None

    def bar(self, st: Any = None, note: str = "", note_state: str = "idle") -> str:
        return statusview.progress_html(st, note=note, dom_id=self.dom_id, note_state=note_state)


def press(flow: JobFlow, page: Page, ctx: AppContext, caller: Caller, form: Any) -> Updates:
    """Refuse at once what cannot run, before the job is submitted: a ``gr.Error`` the page
    shows as a pop-up, and why is kept for ``show_refusal`` (not while the tab's own job
    runs, whose bar says more than "still running"). Else the tab is marked pending and
    shows what ``flow.check`` returns."""
    session = caller.session
    try:
        if ctx.active.busy(session):
            raise refusal(BUSY)
        if ctx.sup_error:
            raise refusal(usertext.public_text(ctx.sup_error))
        try:
            shown = flow.check(page, ctx, caller, form)
        except usertext.UIError as e:
            raise refusal(usertext.public_text(str(e))) from None
        except gr.Error:
            raise
        except Exception as e:  # noqa: BLE001 - a fault in a check is a refusal with its reason
            log.exception("%s in the %s check", FAULT_LOG, flow.kind)
            raise refusal(f"the check before the job failed: {fault_reason(e)}") from None
        if not ctx.active.press(session):     # another press of this tab got in first
            raise refusal(BUSY)
        return shown
    except gr.Error as e:
        if not ctx.active.busy(session):
            ctx.active.keep_refusal(session, flow.kind, str(e.message))
        raise


def show_refusal(flow: JobFlow, page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """After a refused press: why, on the tab's progress line, where it stays until the next
    action (the pop-up goes after a few seconds)."""
    text = ctx.active.take_refusal(caller.session, flow.kind)
    if text is None:
        return {flow.progress(page): gr.skip()}
    return {flow.progress(page): flow.bar(note=f"Not started: {text}", note_state="refused")}


def run(flow: JobFlow, page: Page, ctx: AppContext, caller: Caller, form: Any) -> Iterator[Updates]:
    """The press ``press`` let through: submit the job at once (the supervisor's queue holds
    it until a worker is free, so a reload finds it waiting) and stream its progress bar; its
    end goes to the active-jobs record as an ``Outcome`` for the kind's show-outcome handler
    (Gradio's Model3D mounts only from a plain handler, not from a generator)."""
    session = caller.session
    bar = flow.progress(page)
    last, note = None, ""
    pressed = ctx.active.pending_since(session)
    shown_once = flow.once is None
    try:
        # pending (for Cancel) until the follow steps submit the job, e.g. while the pool starts
        steps = flow.submit(ctx, session, form, pressed)
        for note, last, view in jobs.progress_views(ctx, steps, dom_id=flow.dom_id):
            extra = None if shown_once or flow.once is None else flow.once(page, ctx, session, last)
            shown_once = shown_once or extra is not None
            yield {bar: view, **(extra or {})}
    except usertext.UIError as e:   # e.g. a file changed between the check and the slot
        note = f"Cannot start: {usertext.public_text(str(e))}"
    except Exception as e:  # noqa: BLE001 - the job's follower failed: said on its bar, logged
        log.exception("%s while following a %s job", FAULT_LOG, flow.kind)
        note = f"Cannot follow the job: {fault_reason(e)}"
    finally:
        ctx.active.end_pending(session)
    if last is None:
        ctx.active.keep_outcome(session, not_started(note, kind=flow.kind))
    else:
        # the wait in Gradio's queue before the job was submitted counts in "Done in": the
        # figure stored with the job, which a reloaded page reads too (one "Done in" for both)
        info = jobs.job_infos(ctx, [last]).get(last.id)
        waited = info.waited_s if info is not None else \
            max(0.0, (last.created or 0.0) - (pressed or last.created or time.time()))
        ctx.active.keep_outcome(session, flow.outcome(ctx, session, last, waited, note))
    yield {bar: gr.skip()}


def failed_bar(flow: JobFlow, page: Page, action: str, e: BaseException) -> Updates:
    """A fault no check foresaw in one of the tab's job handlers (``event_fn``'s ``fallback``):
    said on the tab's progress line, where refusals are."""
    return {flow.progress(page): flow.bar(note=f"{action} failed: {fault_reason(e)}. Reload the page to see "
                                               "where the job stands.", note_state="refused")}


def cancel(flow: JobFlow, page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """Cancel the tab's job (its worker is killed and replaced, or it leaves the queue), or
    its press not yet submitted (which ``cancels=`` in the wiring drops)."""
    st = jobs.cancel_jobs(ctx, caller.session)
    if st is not None:
        return {flow.progress(page): flow.bar(st), **flow.idle(page)}
    note = "Cancelled before it started." if ctx.active.take_pending(caller.session) else "Nothing to cancel."
    return {flow.progress(page): flow.bar(note=note), **flow.idle(page)}
