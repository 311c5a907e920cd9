"""What a Gradio request says about its caller: the tab's session, the client's address; the
error a caller is shown for something they can fix; and the Gradio event function made
from a handler of plain values (``event_fn``), which hands the handler the caller the
server derived from the request, never anything the client names."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import typing
from dataclasses import dataclass
from typing import Any, Callable, Optional

import gradio as gr

from app.web.server import browser
from app.web.server.usertext import public_text

log = logging.getLogger("kiln.app")

# what a handler's fault is called in the log, so a test (the page's fuzz) can tell a fault
# that reached the safety net from a refusal the handler foresaw
FAULT_LOG = "handler fault"


def session_of(request: gr.Request | None) -> str:
    """This browser tab's session name (see ``browser.session_name``)."""
    cookies = getattr(request, "cookies", None) if request is not None else None
    token = cookies.get(browser.BROWSER_COOKIE) if cookies is not None else None
    return browser.session_name(token, getattr(request, "session_hash", None))


def client_of(request: gr.Request | None) -> str:
    """The client's network address: what the per-client limits count. ``RequestGuard`` has
    already put the request's client there (``app.web.server.proxies``: behind a trusted proxy, the
    address it forwards), so it is read, never derived, here."""
    client = getattr(request, "client", None) if request is not None else None
    return str(getattr(client, "host", None) or "unknown")


def refusal(message: str) -> gr.Error:
    """A gr.Error for something the person can fix: shown, but no traceback in the log."""
    return gr.Error(message, print_exception=False)


def fault_reason(e: BaseException) -> str:
    """An unforeseen exception as the end of a sentence a person can read: its own message
    (server paths cut), else its kind. The log has the traceback."""
    text = public_text(str(e)).strip().rstrip(".")
    return text or type(e).__name__


@dataclass(frozen=True)
class Caller:
    """Who an event comes from: the session (``browser.session_name``: cookie + tab), which
    keys its state, jobs and results, and the client's address, which the limits count."""

    session: str
    client: str = "unknown"


def caller_of(request: gr.Request | None) -> Caller:
    return Caller(session_of(request), client_of(request))


def event_fn(handler: Callable, *bound: Any,
             present: Optional[Callable[[Caller, Any], Any]] = None, form: Optional[type] = None,
             fallback: Optional[Callable[[BaseException], Any]] = None) -> Callable:
    """``handler(*bound, caller, *inputs)`` as a function Gradio calls with the event's
    inputs and its request: the handler gets ``caller_of(request)``. ``present(caller,
    answer)``, when given, turns each answer into what Gradio gets (a value only the
    caller's browser may see becomes a file of that browser's).

    Gradio finds the request (and ``gr.SelectData``, ``gr.Progress``) by the function's
    annotations and defaults, which ``functools.partial`` hides from it; so this function
    carries the handler's own parameters after ``caller``, with their annotations and
    defaults (what a script's client sees), and the request before the first parameter
    with a default. A generator handler gives a generator function. ``fn.handler`` is the
    handler (the tests read the wiring by it).

    ``form``: a frozen dataclass (a tab's form, e.g. ``app.web.photo.form.GenerateForm``) whose
    fields are the event's inputs in order; the handler takes ``(*bound, caller, form_record)``
    and Gradio sees one parameter per field.

    ``fallback(exc) -> answer``: what the page shows when the handler raises anything but a
    ``gr.Error`` (a fault no check foresaw): a sentence under the control, where a refusal
    would be, instead of Gradio's bare "Error" badge; the traceback goes to the log. A
    generator's fault ends it with that answer."""
    sig = inspect.signature(handler)
    if form is not None:
        params = [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    default=inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default)
                  for f in dataclasses.fields(form)]
        hints: dict[str, Any] = {}
    else:
        params = list(sig.parameters.values())[len(bound) + 1:]
        hints = typing.get_type_hints(handler)
    at = next((i for i, p in enumerate(params) if p.default is not p.empty), len(params))
    request = inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)

    def call(args: tuple) -> tuple[Caller, Any]:
        items = list(args)
        caller = caller_of(items.pop(at))
        if form is not None:
            return caller, handler(*bound, caller, form(*items))
        return caller, handler(*bound, caller, *items)

    def shown(caller: Caller, answer: Any) -> Any:
        return present(caller, answer) if present is not None else answer

    def fault(e: Exception) -> Any:
        if fallback is None or isinstance(e, gr.Error):
            raise e
        log.exception("%s in %s", FAULT_LOG, handler.__name__)
        return fallback(e)

    if inspect.isgeneratorfunction(handler):
        def fn(*args):
            try:
                caller, answers = call(args)
                with contextlib.closing(answers):   # closed early (a cancel): the handler is too
                    for answer in answers:
                        yield shown(caller, answer)
            except Exception as e:  # noqa: BLE001 - the page's safety net (``fallback``)
                yield fault(e)
    else:
        def fn(*args):
            try:
                caller, answer = call(args)
                return shown(caller, answer)
            except Exception as e:  # noqa: BLE001 - the page's safety net (``fallback``)
                return fault(e)
    setattr(fn, "__signature__", sig.replace(parameters=[*params[:at], request, *params[at:]]))
    fn.__annotations__ = {**{p.name: hints[p.name] for p in params if p.name in hints}, "request": gr.Request}
    fn.__name__ = fn.__qualname__ = handler.__name__
    fn.__doc__ = handler.__doc__
    fn.__module__ = handler.__module__
    setattr(fn, "handler", handler)
    return fn
