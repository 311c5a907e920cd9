"""The page's handlers for a job: Generate (checked at once, then submitted to the supervisor's queue),
the outcome shown when it ends, Cancel, and a loaded page following its browser's job.

Each is ``handler(page, ctx, caller, *inputs) -> {component: value}`` (generators yield
such dicts; ``app.web.page.wiring`` connects them). What a tab's job came to is an ``Outcome`` kept in
the active-jobs record (``ctx.active``) under the tab's session, never in a ``gr.State``.

Why a job's end is shown by a second handler: Gradio 6.31's Model3D never mounts its viewer
when a generator sets its value, so the generators here stream only the progress bar and
leave the outcome in the record for ``show_outcome``, a plain handler run after them.
Jobs belong to the browser, not the tab: a page loaded later (a reload, a second tab) shows
the browser's history and follows its running job (``app.web.state.browser_jobs``).
"""

from __future__ import annotations

from dataclasses import astuple
from typing import Iterator, Optional

import gradio as gr

from kiln.stages import scene_problem

from app.web.page import job_flow
from app.web.page.job_flow import BUSY, JobFlow
from app.web.photo import form
from app.web.photo.objects import generate_note
from app.web.photo.form import GenerateForm
from app.web.state import history
from app.web.state import browser_jobs as jobs
from app.web.page import status_line as statusview
from app.web.server.context import AppContext
from app.web.state.job_outcome import Outcome, browser_history, job_outcome
from app.web.page.layout import Page, Updates
from app.web.server.requestinfo import Caller, refusal

__all__ = ["BUSY"]   # re-exported: the refusal's words, which tests and the API compare with


def idle_buttons(page: Page) -> Updates:
    # fresh dicts each time: Gradio consumes an update's keys as it applies it, so a shared
    # one came back without its value and left the button saying "Running…"
    return {page.generate: gr.update(value="Generate", interactive=True), page.cancel: gr.update(interactive=False)}


def running_buttons(page: Page) -> Updates:
    return {page.generate: gr.update(value="Running…", interactive=False), page.cancel: gr.update(interactive=True)}


def _check(page: Page, ctx: AppContext, caller: Caller, values: GenerateForm) -> Updates:
    """Generate's own checks (after ``job_flow.press``'s): an image, the form's values and the
    selection on the working copy, room in the queue. The setting boxes then show the values
    the job will use (e.g. the seed rounded)."""
    s = ctx.settings
    st = ctx.sessions.get(caller.session)
    if st.image is None:
        raise refusal("Upload an image first.")
    used, count = form.check_objects(st, s, values)
    running, waiting = jobs.queue_load(ctx)
    # the built-in reconstruction makes each object its own job; a scene is one job
    wanted = count if count > 1 and scene_problem(used.reconstruct.backend) else 1
    if waiting + wanted > s.worker.max_queue:
        room = max(0, s.worker.max_queue - waiting)
        raise refusal(f"The job queue is full ({waiting} waiting); try again in a few minutes." if not room else
                      f"The job queue has room for {room} more job{'s' if room != 1 else ''} and these "
                      f"{count} objects make {wanted}; try again in a few minutes, or drop kept objects.")
    note = "Starting…"
    if running + waiting >= ctx.workers:
        note = "Waiting for a free worker" + (f" ({waiting} other job{'s' if waiting != 1 else ''} waiting)…"
                                             if waiting else "…")
    return {page.progress: statusview.progress_html(note=note), page.model: None,
            page.glb_download: gr.update(visible=False), page.ply_download: gr.update(visible=False),
            page.more_files: gr.update(value=None, visible=False), page.file_sizes: "", **running_buttons(page),
            page.views: used.views.count, page.simplify: used.mesh.simplify_ratio, page.seed: used.seed}


def _submit(ctx: AppContext, session: str, values: GenerateForm, pressed: Optional[float]) -> Iterator:
    st_now = ctx.sessions.get(session)
    info = None
    if st_now.image is not None:
        info = history.JobInfo(st_now.image.name, history.thumbnail_uri(st_now.image.work))
    if st_now.kept:
        with ctx.decodes:
            rgb, masks, settings = form.objects_request(st_now, ctx.settings, values)
        del st_now
        if len(masks) == 1:
            return jobs.follow_job(ctx, session, rgb, masks[0], settings, info=info, pressed_at=pressed)
        if not scene_problem(settings.reconstruct.backend):   # one scene, laid out by the reconstruction
            return jobs.follow_job(ctx, session, rgb, masks[0], settings, info=info, pressed_at=pressed,
                                   more_masks=tuple(masks[1:]))
        return jobs.follow_each(ctx, session, rgb, masks, settings, info=info, pressed_at=pressed)
    with ctx.decodes:   # the full-size image is decoded again for the job
        request_ = form.job_request(st_now, ctx.settings, values)
    del st_now
    # follow_job lets go of the full-size arrays once the job store has them
    steps = jobs.follow_job(ctx, session, *request_, info=info, pressed_at=pressed)
    del request_
    return steps


def _outcome(ctx: AppContext, session: str, last, waited: float, note: str) -> Outcome:
    return objects_outcome(ctx, session, last, waited)


def objects_outcome(ctx: AppContext, session: str, last, waited: Optional[float] = None) -> Outcome:
    """``job_outcome`` of ``last``; for a Generate of several objects each made its own model
    (``JobInfo.objects``), every object's GLB among the downloads (the viewer shows the last
    one), the progress line saying how many were made and what a scene would need. A scene job
    (one GLB with a node per object) says so too."""
    from dataclasses import replace as with_fields

    out = job_outcome(ctx, session, last, waited)
    info = jobs.job_infos(ctx, [last]).get(last.id)
    siblings = info.objects if info is not None else ()
    backend = _backend_of(ctx, last.id)
    if len(siblings) < 2:
        scene = last.stats.pipeline.scene if last.state == "done" and last.stats.pipeline else ()
        if len(scene) > 1:
            return with_fields(out, note=_joined(out.note, generate_note("sam3d", len(scene))))
        return out
    statuses = {st.id: st for st in jobs.browser_jobs(ctx, session)}
    glbs, done = [], 0
    for job_id in siblings:
        st = statuses.get(job_id)
        if st is None:
            continue
        if st.state == "done":
            done += 1
        other = out if job_id == last.id else (job_outcome(ctx, session, st) if st.state == "done" else None)
        if other is not None and other.glb:
            glbs.append(other.glb)
    why = scene_problem(backend or "builtin")
    note = f"{done} of {len(siblings)} objects made. {why[:1].upper()}{why[1:]}"
    return with_fields(out, note=_joined(out.note, note), extra=tuple(glbs) + out.extra)


def _joined(first: str, second: str) -> str:
    return f"{first}; {second}" if first else second


def _backend_of(ctx: AppContext, job_id: str) -> Optional[str]:
    settings = jobs.stored_settings(ctx, job_id) or {}
    value = (settings.get("reconstruct") or {}).get("backend")
    return str(value) if value else None


GENERATE = JobFlow(kind="image", progress=lambda page: page.progress, dom_id="kiln-progress", idle=idle_buttons,
                   check=_check, submit=_submit, outcome=_outcome)


def on_generate(page: Page, ctx: AppContext, caller: Caller, values: GenerateForm) -> Updates:
    """Refuse at once what cannot run, before the job is submitted (``job_flow.press``), and
    clear the previous result. Queued in a group of its own so it runs at once: Gradio 6.31
    shows no gr.Error raised by a queue=False event."""
    return job_flow.press(GENERATE, page, ctx, caller, values)


def show_refusal(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """After a refused Generate: why, on the progress line."""
    return job_flow.show_refusal(GENERATE, page, ctx, caller)


def run_job(page: Page, ctx: AppContext, caller: Caller, values: GenerateForm) -> Iterator[Updates]:
    """The Generate ``on_generate`` let through (``job_flow.run``): submitted at once, its
    progress streamed, its ``Outcome`` left for ``show_outcome``."""
    yield from job_flow.run(GENERATE, page, ctx, caller, values)


def outcome_view(page: Page, out: Optional[Outcome], idle_when_empty: bool = True) -> Updates:
    """An outcome as the page shows it: progress bar, the model in the viewer, download
    buttons, the browser's history, Generate enabled again. With no outcome: only the
    buttons back to idle (``idle_when_empty``), or nothing."""
    if out is None:
        return idle_buttons(page) if idle_when_empty else {page.progress: gr.skip()}
    shown = {page.progress: out.progress_html(),
             page.glb_download: gr.update(value=out.glb, visible=True) if out.glb else gr.update(visible=False),
             page.ply_download: gr.update(value=out.ply, visible=True) if out.ply else gr.update(visible=False),
             page.more_files: gr.update(value=out.extra_files(), visible=bool(out.extra)),
             page.file_sizes: out.sizes_markdown(), **idle_buttons(page)}
    if out.glb:
        shown[page.model] = out.glb
    if out.history is not None:
        shown.update({page.history: out.history.html, page.history_files: out.history.file_list()})
    return shown


def show_outcome(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """After ``run_job``: the tab's outcome, taken from the record (Generate enabled again
    even without one: the press was cancelled or dropped)."""
    return outcome_view(page, ctx.active.take_outcome(caller.session))


def show_followed_outcome(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """After ``follow_on_load``: the outcome it left, if any; else the buttons stay as the
    page's own Generate set them."""
    return outcome_view(page, ctx.active.take_outcome(caller.session), idle_when_empty=False)


def on_history_pick(page: Page, ctx: AppContext, caller: Caller, job_id: str) -> Updates:
    """A row of the history clicked (``pageassets.HISTORY_JS`` hands over its job id): that
    job's model in the viewer with its downloads, if it is a done job of this browser's (an
    id from anywhere else shows nothing of it). While the tab's own job runs, its progress
    bar and buttons stay as they are."""
    from dataclasses import replace as with_fields

    job_id = str(job_id or "").strip()
    st = next((s for s in jobs.browser_jobs(ctx, caller.session) if s.id == job_id), None)
    busy = ctx.active.busy(caller.session)
    if st is None or st.state != "done" or not history.makes_model(st):
        note = statusview.progress_html(note="That result is not in this browser's history any more.",
                                        note_state="refused")
        return {page.progress: gr.skip() if busy else note}
    out = job_outcome(ctx, caller.session, st)
    info = jobs.job_infos(ctx, [st]).get(st.id)
    name = info.image_name if info is not None else "an earlier result"
    shown = outcome_view(page, with_fields(out, note=(f"{out.note}; " if out.note else "") +
                                           f"shown from the history: {name}"))
    if busy:
        for c in (page.progress, page.generate, page.cancel):
            shown.pop(c, None)
    return shown


def on_cancel(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """Cancel the tab's job, or its Generate not yet submitted (``job_flow.cancel``)."""
    return job_flow.cancel(GENERATE, page, ctx, caller)


def follow_on_load(page: Page, ctx: AppContext, caller: Caller) -> Iterator[Updates]:
    """A page just loaded (a reload, another tab): once the workers are up, show the
    browser's history, its newest job's settings in the form and, if that job is queued or
    running, follow it here with live progress (Cancel works on it; the result lands here
    when done); if it ended, leave its outcome for ``show_followed_outcome``, so the page
    looks as it did before the reload."""
    session = caller.session
    while not ctx.sup_ready.is_set():
        yield {page.progress: gr.skip()}   # a beat a second: Gradio drops the generator of a closed page
        ctx.sup_ready.wait(1.0)
    if ctx.sup is None:
        yield {page.progress: gr.skip()}
        return
    statuses = jobs.browser_jobs(ctx, session)
    own = [st for st in statuses if st.kind == "image"]   # the bake tab follows its own
    live = jobs.live_job(own)
    newest = own[-1] if own else None
    idle = not ctx.active.busy(session)      # else this page's own Generate shows its job
    hist = browser_history(ctx, session, statuses)
    shown = {page.history: hist.html, page.history_files: hist.file_list()}
    if newest is not None and idle:
        values = form.form_values(jobs.stored_settings(ctx, newest.id))
        if values is not None:
            shown.update(zip(page.form, astuple(values)))
    if live is None or not idle:
        if newest is not None and idle:
            ctx.active.keep_outcome(session, objects_outcome(ctx, session, newest, _waited(ctx, newest)))
        yield shown
        return
    first = jobs.progress_view(ctx, live)
    yield {page.progress: first, **running_buttons(page), **shown}
    last = live
    for _, last, view in jobs.progress_views(ctx, jobs.follow_existing(ctx, session, live.id), shown=first):
        yield {page.progress: view}
    if last.terminal:
        ctx.active.keep_outcome(session, objects_outcome(ctx, session, last, _waited(ctx, live)))
    yield {page.progress: gr.skip()}


def _waited(ctx: AppContext, st) -> float:
    """How long the job's Generate waited for a worker slot, as the page recorded it."""
    info = jobs.job_infos(ctx, [st]).get(st.id)
    return info.waited_s if info is not None else 0.0
