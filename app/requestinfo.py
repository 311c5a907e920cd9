"""What a Gradio request says about its caller: the tab's session, the client's address; and
the error a caller is shown for something they can fix."""

from __future__ import annotations

import gradio as gr

from . import browser


def session_of(request: gr.Request | None) -> str:
    """This browser tab's session name (see ``browser.session_name``)."""
    cookies = getattr(request, "cookies", None) if request is not None else None
    token = cookies.get(browser.BROWSER_COOKIE) if cookies is not None else None
    return browser.session_name(token, getattr(request, "session_hash", None))


def client_of(request: gr.Request | None) -> str:
    """The client's network address: what the per-client limits count."""
    client = getattr(request, "client", None) if request is not None else None
    return str(getattr(client, "host", None) or "unknown")


def refusal(message: str) -> gr.Error:
    """A gr.Error for something the person can fix: shown, but no traceback in the log."""
    return gr.Error(message, print_exception=False)
