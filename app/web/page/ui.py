"""The Gradio page, put together: ``layout`` builds the components (``app.web.page.layout.Page``),
``wire`` connects their events to the handlers (``app.web.photo.image_handlers``,
``app.web.photo.generate_handlers``, ``app.web.page.page_handlers``), ``api_endpoints.register`` adds the script endpoints.
The logic lives in plain modules beside them (``uploads``, ``selection``, ``form``, ``jobs``,
``statusview``, ``results``, ``history``, ``outcome``)."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from app.web.api import endpoints as api_endpoints
from app.web.server.context import AppContext
from app.web.page.layout import layout
from app.web.page.wiring import wire


def build_ui(ctx: AppContext, examples: list[Path] | None = None) -> gr.Blocks:
    page = layout(ctx.settings, examples)
    wire(page, ctx)
    api_endpoints.register(page.demo, ctx)   # the script endpoints (docs/api.md); hides the page's own
    return page.demo
