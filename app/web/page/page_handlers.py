"""The page's handlers around the image and the job: the status line, what a loaded page
shows first, the settings boxes that depend on baking, and a closed tab.

Like the others (``app.web.photo.image_handlers``, ``app.web.photo.generate_handlers``) each returns
``{component: value}``; those that act for a tab take its ``Caller``."""

from __future__ import annotations

import gradio as gr

from app.web.server import usertext
from app.web.page import status_line as statusview
from app.web.server.context import AppContext
from app.web.state.browser_jobs import queue_load, typical_job_seconds
from app.web.state.job_outcome import browser_history
from app.web.page.layout import Page, Updates
from app.web.server.requestinfo import Caller


def status_line(page: Page, ctx: AppContext) -> str:
    """The status line: device and backends once the workers are up, segmenter, jobs
    running and waiting (the CLI's jobs on the same pool too)."""
    running, waiting = queue_load(ctx)
    note = ctx.sup_error or ("" if ctx.sup_ready.is_set() else "workers starting…")
    return usertext.public_text(statusview.status_line(ctx.capabilities(), ctx.segmenter_text, running, waiting,
                                                       note, typical_job_seconds(ctx)))


def on_status(page: Page, ctx: AppContext) -> Updates:
    """The timer's tick: the status line again."""
    return {page.status: status_line(page, ctx)}


def on_load(page: Page, ctx: AppContext, caller: Caller) -> Updates:
    """A page loaded: the status line and its browser's history at once."""
    hist = browser_history(ctx, caller.session)
    return {page.status: status_line(page, ctx), page.history: hist.html, page.history_files: hist.file_list()}


def on_bake_texture(page: Page, on: bool) -> Updates:
    """Texture size, bake mode and the views rendered for the bake mean nothing without
    baking (vertex colours come from the reconstruction)."""
    return {c: gr.update(interactive=bool(on)) for c in (page.texture, page.mode, page.views)}


def on_unload(ctx: AppContext, caller: Caller) -> None:
    """The tab closed (its heartbeat ended): park its image for the browser's next page (a
    reload) and forget its record (its outcome not shown included) and its fitted camera; its job goes on for
    the browser's next page until ``app.orphan_grace_s`` passes unfollowed."""
    ctx.sessions.park(caller.session)
    ctx.active.drop_session(caller.session)
    ctx.fits.drop(caller.session)
