"""File references a script sends that Gradio will not take, answered with the reason.

A script (``gradio_client``) sends a file as a reference: a path in the server's upload folder
(what ``handle_file`` on a local file becomes), or a URL. Gradio refuses a path it did not
receive as an upload and a URL on the server's own network, while it prepares the event's
inputs, before any handler of Kiln's runs; and since the server does not show its own errors
(``show_error`` off: they may name its paths), the client got ``{"error": null}``. Here such
a refusal becomes a ``gr.Error`` that names the input and says what to send instead."""

from __future__ import annotations

from typing import Any, Iterator, Optional

import gradio as gr
from gradio_client import utils as client_utils

from app.web.server.requestinfo import refusal
from app.web.server.usertext import public_text

SEND_THE_FILE = "send the file itself: gradio_client's handle_file(a file on your machine) uploads it"


def _file_refs(value: Any) -> Iterator[dict]:
    if client_utils.is_file_obj_with_meta(value):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _file_refs(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _file_refs(v)


def refused_reference(labels: list[str], inputs: list[Any], error: BaseException) -> Optional[str]:
    """Why Gradio refused a file reference among ``inputs`` (one per input, named by
    ``labels``), as a sentence: the first reference that is a URL or a path outside the
    upload folder; None when none of them is (the error was about something else)."""
    from gradio import utils as gr_utils

    upload = gr_utils.abspath(gr_utils.get_upload_folder())
    for label, value in zip(labels, inputs):
        for ref in _file_refs(value):
            path = str(ref.get("path") or ref.get("url") or "")
            if client_utils.is_http_url_like(path):
                why = public_text(str(error)).strip().rstrip(".") or type(error).__name__
                return f"{label}: the server does not fetch {path} ({why}); {SEND_THE_FILE}"
            if path and not gr_utils.is_in_or_equal(gr_utils.abspath(path), upload):
                return (f"{label}: {public_text(path)} is a path on the server, which it does not read "
                        f"for a script; {SEND_THE_FILE}")
    return None


class CheckedBlocks(gr.Blocks):
    """``gr.Blocks`` whose events answer a refused file reference with its reason
    (``refused_reference``) instead of Gradio's silent error."""

    async def preprocess_data(self, block_fn, inputs, state, explicit_call: bool = False):
        try:
            return await super().preprocess_data(block_fn, inputs, state, explicit_call)
        except gr.Error:
            raise
        except Exception as e:
            labels = [str(getattr(b, "label", None) or getattr(b, "elem_id", None) or "a file")
                      for b in block_fn.inputs]
            reason = refused_reference(labels, list(inputs), e)
            if reason is None:
                raise
            raise refusal(reason) from None
