"""The page's events: which component's event runs which handler, with which inputs, and
which outputs it may set. A handler returns ``{component: value}`` for some of those
outputs (Gradio raises on a component not declared here), so every output is named, never
counted.

Queues: the supervisor's queue is the job queue. A Generate (or Bake) that its check lets
through is submitted at once and followed in the unlimited group ``JOBS``, so a job waiting
for a worker exists in the job store from the first second, and a reload, another tab or the
API finds it there, like a running one (the supervisor refuses past ``worker.max_queue``).
The check, the selection and a loaded page's follower each run in a group of their own, so
people can segment and pages load while jobs run.
"""

from __future__ import annotations

from typing import Any

from functools import partial

import gradio as gr

from app.web.bake import bake_handlers as baking
from app.web.bake import fit_handlers as fitting
from app.web.photo import image_handlers as image
from app.web.photo import generate_handlers as job
from app.web.page import page_handlers as around
from app.web.server.context import AppContext
from app.web.bake.bake_form import BakeForm, FitForm
from app.web.photo.form import GenerateForm
from app.web.page.layout import Page
from app.web.page.assets import BOX_JS, HISTORY_JS, RANGE_JS, REPLACE_JS
from app.web.page import job_flow
from app.web.page.job_flow import JobFlow
from app.web.server.requestinfo import event_fn, fault_reason

# follows submitted jobs: one event per job in progress, its wait in the supervisor's queue
JOBS = "jobs"


def wire(page: Page, ctx: AppContext) -> None:
    """Connect every event of ``page`` to its handler for ``ctx``."""
    with page.demo:
        _wire_image(page, ctx)
        page.demo.load(None, None, None, js=BOX_JS)
        page.demo.load(None, None, None, js=REPLACE_JS)
        page.demo.load(None, None, None, js=RANGE_JS)
        page.demo.load(None, None, None, js=HISTORY_JS)
        # texture size and bake mode mean nothing without baking
        page.bake_texture.change(partial(around.on_bake_texture, page), [page.bake_texture], [page.texture, page.mode, page.views],
                         queue=False, show_progress="hidden")
        _wire_job(page, ctx)
        _wire_bake(page, ctx)
        _wire_around(page, ctx)


def upload_outputs(page: Page) -> list:
    return [*page.selection_view, page.upload, page.mask_file, *result_view(page)]


def result_view(page: Page) -> list:
    """What shows the last job's result: a new image takes it off the page."""
    return [page.progress, page.model, page.glb_download, page.ply_download, page.more_files, page.file_sizes]


def _on_job(page: Page, ctx: AppContext, flow: JobFlow, action: str):
    """``event_fn`` for a job's handlers: a fault is said on the tab's progress line."""
    def on(handler, form=None):
        return event_fn(handler, page, ctx, form=form,
                        fallback=lambda e: job_flow.failed_bar(flow, page, action, e))
    return on


def _wire_image(page: Page, ctx: AppContext) -> None:
    def on(handler):
        return event_fn(handler, page, ctx, present=partial(image.canvas_as_file, page, ctx),
                        fallback=partial(image.failed_view, page, handler.__name__))

    view = page.selection_view
    seg: dict[str, Any] = dict(concurrency_id="segment", concurrency_limit=4, show_progress="minimal")
    if page.examples is not None:
        # an example fills the upload box, then runs the upload handler as a drop would
        page.examples.load_input_event.then(on(image.on_upload), [page.upload], upload_outputs(page),
                                            api_visibility="undocumented")
    # .upload/.clear fire on what the person does only, not when a handler sets the box
    page.upload.upload(on(image.on_upload), [page.upload], upload_outputs(page), **seg)
    # a file dropped on the filled upload box (REPLACE_JS hands it to the hidden box)
    page.replace.upload(on(image.on_replace), [page.replace], [*upload_outputs(page), page.replace], **seg)
    page.upload.clear(on(image.on_upload_cleared), None, [*view, *result_view(page), page.upload], **seg)
    page.canvas.select(on(image.on_click), [page.background], view, **seg)
    page.find.click(on(image.on_find), None, view, **seg)
    page.undo.click(on(image.on_undo), None, view, **seg)
    page.clear.click(on(image.on_clear), None, view, **seg)
    page.keep.click(on(image.on_keep), None, view, **seg)
    page.drop_kept.click(on(image.on_drop_kept), None, view, **seg)
    page.use_alpha.input(on(image.on_alpha), [page.use_alpha], view, **seg)
    page.show_mask.input(on(image.on_show_mask), [page.show_mask], view, **seg)
    page.box_button.click(on(image.on_box), [page.box_input], view, **seg)
    page.mask_file.upload(on(image.on_mask_file), [page.mask_file], [*view, page.mask_file], **seg)
    page.mask_file.clear(on(image.on_mask_file), [page.mask_file], [*view, page.mask_file], **seg)


def result_outputs(page: Page) -> list:
    """What an outcome sets (``handlers_job.outcome_view``)."""
    return [*result_view(page), page.history, page.history_files, page.generate, page.cancel]


def _wire_job(page: Page, ctx: AppContext) -> None:
    on = _on_job(page, ctx, job.GENERATE, "Generate")

    check = page.generate.click(
        on(job.on_generate, form=GenerateForm), page.form,
        [*result_view(page), page.generate, page.cancel, page.views, page.simplify, page.seed],
        concurrency_id="check", concurrency_limit=None, show_progress="hidden",
    )
    gen_event = check.success(
        on(job.run_job, form=GenerateForm), page.form, [page.progress],
        concurrency_id=JOBS, concurrency_limit=None, show_progress="hidden",
    )
    # after the success branch, so the job's event keeps the index right after the click's
    check.failure(on(job.show_refusal), None, [page.progress], queue=False, show_progress="hidden")
    gen_event.then(on(job.show_outcome), None, result_outputs(page), queue=False, show_progress="hidden")
    load_event = page.demo.load(
        on(job.follow_on_load), None,
        [page.progress, page.generate, page.cancel, page.history, page.history_files, *page.form],
        concurrency_id="follow", concurrency_limit=None, show_progress="hidden")
    load_event.then(on(job.show_followed_outcome), None, result_outputs(page), queue=False,
                    show_progress="hidden")
    page.cancel.click(on(job.on_cancel), None, [page.progress, page.generate, page.cancel],
                      cancels=[gen_event, load_event], queue=False)
    # a row of the history clicked: its model in the viewer (a plain handler: Model3D mounts)
    page.history_button.click(on(job.on_history_pick), [page.history_pick], result_outputs(page), queue=False,
                              show_progress="hidden")


def bake_result_outputs(page: Page) -> list:
    """What a bake's outcome sets (``handlers_bake.bake_outcome_view``)."""
    t = page.bake_tab
    return [t.progress, t.model, t.download, t.more_files, t.file_sizes, t.notes, *bake_buttons(page), page.history,
            page.history_files]


def bake_buttons(page: Page) -> list:
    """The bake tab's buttons, which every event that starts or ends its job sets."""
    t = page.bake_tab
    return [t.fit_button, t.bake_button, t.cancel]


def _wire_bake(page: Page, ctx: AppContext) -> None:
    on = _on_job(page, ctx, baking.BAKE, "Bake")

    t = page.bake_tab
    check = t.bake_button.click(
        on(baking.on_bake, form=BakeForm), t.form,
        [t.progress, t.notes, t.model, t.download, t.more_files, t.file_sizes, t.fit_view, t.fit_info,
         *bake_buttons(page)],
        concurrency_id="check", concurrency_limit=None, show_progress="hidden",
    )
    bake_event = check.success(
        on(baking.run_bake, form=BakeForm), t.form, [t.progress, t.fit_view],
        concurrency_id=JOBS, concurrency_limit=None, show_progress="hidden",
    )
    check.failure(on(baking.show_bake_refusal), None, [t.progress], queue=False, show_progress="hidden")
    bake_event.then(on(baking.show_bake_outcome), None, bake_result_outputs(page), queue=False,
                    show_progress="hidden")
    load_event = page.demo.load(on(baking.follow_bake_on_load), None, [t.progress, t.fit_view, *bake_buttons(page)],
                                concurrency_id="follow", concurrency_limit=None, show_progress="hidden")
    load_event.then(on(baking.show_followed_bake), None, bake_result_outputs(page), queue=False,
                    show_progress="hidden")
    fit_event = _wire_fit(page, ctx)
    t.cancel.click(on(baking.on_bake_cancel), None, [t.progress, *bake_buttons(page)],
                   cancels=[bake_event, load_event, fit_event], queue=False)


def _wire_fit(page: Page, ctx: AppContext):
    """"Fit the camera to the photo": checked at once, then a fit job followed like a bake's
    (``handlers_fit``); any change of what a fit holds for drops the tab's fit. Returns the
    event that follows the job (Cancel stops it)."""
    on = _on_job(page, ctx, fitting.FIT, "Fit the camera")

    t = page.bake_tab
    check = t.fit_button.click(on(fitting.on_fit, form=FitForm), t.fit_form,
                               [t.progress, t.notes, t.fit_view, t.fit_info, *bake_buttons(page)],
                               concurrency_id="check", concurrency_limit=None, show_progress="hidden")
    fit_event = check.success(on(fitting.run_fit, form=FitForm), t.fit_form, [t.progress],
                              concurrency_id=JOBS, concurrency_limit=None, show_progress="hidden")
    check.failure(on(fitting.show_fit_refusal), None, [t.progress], queue=False, show_progress="hidden")
    fit_event.then(on(fitting.show_fit_outcome), None, [t.progress, t.fit_view, t.fit_info, *bake_buttons(page)],
                   queue=False, show_progress="hidden")
    for box in t.fit_depends_on:
        # .change on files fires on an upload and a clear; .input on the others fires on what
        # the person does only (a handler setting a box leaves the fit alone)
        trigger = box.change if isinstance(box, gr.File) else box.input
        trigger(event_fn(fitting.on_fit_inputs_changed, page, ctx,
                         fallback=lambda e: {t.fit_info: f"⚠ Dropping the fitted camera failed: {fault_reason(e)}."}),
                None, [t.fit_view, t.fit_info], queue=False, show_progress="hidden")
    return fit_event


def _wire_around(page: Page, ctx: AppContext) -> None:
    page.timer.tick(partial(around.on_status, page, ctx), None, [page.status], show_progress="hidden",
                    queue=False)
    page.demo.load(event_fn(around.on_load, page, ctx,
                            fallback=lambda e: {page.status: f"⚠ Loading the page's history failed: {fault_reason(e)}."}),
                   None, [page.status, page.history, page.history_files], queue=False)
    seg: dict[str, Any] = dict(concurrency_id="segment", concurrency_limit=4, show_progress="hidden")
    page.demo.load(event_fn(image.on_restore, page, ctx, present=partial(image.canvas_as_file, page, ctx),
                            fallback=partial(image.failed_view, page, "on_restore")),
                   None, [*page.selection_view, page.show_mask, page.upload],
                   queue=False).then(event_fn(image.prepare_restored, ctx), None, None, **seg)
    page.demo.unload(event_fn(around.on_unload, ctx))
