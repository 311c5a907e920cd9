"""The Gradio page, put together: ``layout`` builds the components (``app.page.Page``),
``wire`` connects their events to the handlers (``app.handlers_image``,
``app.handlers_job``, ``app.handlers_page``), ``api_endpoints.register`` adds the script endpoints.
The logic lives in plain modules beside them (``uploads``, ``selection``, ``form``, ``jobs``,
``statusview``, ``results``, ``history``, ``outcome``)."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from . import api_endpoints
from .context import AppContext
from .page import layout
from .wiring import wire


def build_ui(ctx: AppContext, examples: list[Path] | None = None) -> gr.Blocks:
    page = layout(ctx.settings, examples)
    wire(page, ctx)
    api_endpoints.register(page.demo, ctx)   # the script endpoints (docs/api.md); hides the page's own
    return page.demo
