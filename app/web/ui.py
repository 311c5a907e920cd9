"""The Gradio page, put together: ``layout`` builds the components (``app.web.page.Page``),
``wire`` connects their events to the handlers (``app.web.handlers_image``,
``app.web.handlers_job``, ``app.web.handlers_page``), ``api_endpoints.register`` adds the script endpoints.
The logic lives in plain modules beside them (``uploads``, ``selection``, ``form``, ``jobs``,
``statusview``, ``results``, ``history``, ``outcome``)."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from app.web import api_endpoints
from app.web.context import AppContext
from app.web.page import layout
from app.web.wiring import wire


def build_ui(ctx: AppContext, examples: list[Path] | None = None) -> gr.Blocks:
    page = layout(ctx.settings, examples)
    wire(page, ctx)
    api_endpoints.register(page.demo, ctx)   # the script endpoints (docs/api.md); hides the page's own
    return page.demo
