"""Start the web UI: ``python -m app`` / ``kiln serve`` / ``./run.sh``.

Safe defaults: binds 127.0.0.1. Binding any other address needs ``--listen``
*and* either a login (``--auth user:pass`` or ``KILN_AUTH=user:pass``) or an
explicit, loudly logged ``--no-auth``. Uploads are limited to what an image of
``app.max_pixels`` can need (``kiln.imageio.upload_limit_bytes``). Gradio keeps its uploads and the results it serves in
its own folder (``var/gradio`` next to the job store, emptied at start); the job store itself is
on Gradio's block list, so no URL reaches another session's job files.
``RequestGuard`` sits in front of Gradio: it gives each browser its own cookie,
serves a result, an upload or a canvas image only to the browser it belongs to, caps
request bodies, and names each request's client (behind ``app.trusted_proxies``, the one
they forward).
In front of it, ``app.web.server.ops.OpsRoutes`` answers ``/healthz`` and ``/metrics`` (to this
machine, or ``app.ops_networks``). Behind it, ``app.web.page.viewer_light.NeutralViewerLight`` serves the 3D viewer's light without
its tint.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import re
import sys
import threading
import time
from collections import OrderedDict, deque
from urllib.parse import parse_qs
from pathlib import Path
from typing import Callable, Optional, Sequence

from app.web.server import browser as browser_ids
from app.web.server.browser_files import OwnedFiles, uploaded_paths
from app.web.server.proxies import TrustedProxies
from app.web.server.results import RESULT_NAME_RE

log = logging.getLogger("kiln.app")

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


class LaunchError(Exception):
    """The server must not start as asked (unsafe binding, bad flags). The message says why."""


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_auth(text: Optional[str]) -> Optional[tuple[str, str]]:
    """'user:pass' -> ('user', 'pass'); None/'' -> None. Both parts must be non-empty."""
    if not text:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise LaunchError("auth must look like USER:PASSWORD (both non-empty)")
    return user, password


def check_binding(host: str, listen: bool, auth: Optional[tuple[str, str]], no_auth: bool) -> None:
    """Refuse unsafe combinations; warn loudly about the explicit opt-out."""
    if is_loopback(host):
        return
    if not listen:
        raise LaunchError(f"refusing to bind {host}: serving beyond this machine needs --listen "
                          "(and --auth USER:PASS, KILN_AUTH, or an explicit --no-auth)")
    if auth is None and not no_auth:
        raise LaunchError(f"refusing to bind {host} without a login: pass --auth USER:PASS or set "
                          "KILN_AUTH=USER:PASS (or --no-auth to serve to anyone who can reach it)")
    if auth is None:
        banner = "!" * 72
        log.warning("\n%s\n!! --no-auth: Kiln is serving on %s WITHOUT A LOGIN.\n!! Anyone who can "
                    "reach this address can upload images and run jobs.\n%s", banner, host, banner)


# every request other than an upload carries a few kB of JSON; this bounds the rest
MAX_BODY_BYTES = 1 << 20
# tab (session hash) -> browser bindings remembered; the least recently used go first
MAX_BOUND_TABS = 100_000
# Routes that answer without a login when the server has one: the login page itself
# (Gradio's "/" shows it to a visitor who is not logged in) and what it is drawn with.
PUBLIC_PATHS = {"/", "/login", "/login/", "/logout", "/favicon.ico", "/theme.css", "/gradio_api/theme.css",
                "/manifest.json", "/robots.txt",
                # launch() itself calls it, without a login, before it returns; it only runs the
                # app's start-up events, once
                "/gradio_api/startup-events"}
PUBLIC_PREFIXES = ("/assets/", "/static/", "/svelte/", "/pwa_icon")
_HASH_IN_PATH_RE = re.compile(r"/(?:heartbeat|stream)/([^/]+)")
_HASH_IN_JSON_RE = re.compile(rb'"session_hash"\s*:\s*"([^"]*)"')
# multipart framing around the one file an upload request carries
UPLOAD_OVERHEAD_BYTES = 64 << 10


def _cookie(header: str, name: str) -> Optional[str]:
    from http.cookies import CookieError, SimpleCookie

    jar = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None else None


class TabBindings:
    """Gradio names a tab by a ``session_hash`` the client chooses, and keys its queue,
    event stream, cancel, heartbeat (whose end drops the tab) and stored state by it. The
    first browser that uses a hash owns it; ``claim`` is False for any other browser."""

    def __init__(self, max_tabs: int = MAX_BOUND_TABS):
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self.max_tabs = max_tabs

    def claim(self, session_hash: str, browser: str) -> bool:
        with self._lock:
            owner = self._owners.get(session_hash)
            if owner is None:
                self._owners[session_hash] = browser
                while len(self._owners) > self.max_tabs:
                    self._owners.popitem(last=False)
                return True
            self._owners.move_to_end(session_hash)
            return owner == browser


class UploadQuota:
    """Upload bytes per client address in a sliding hour: Gradio stores every upload
    for a day whether or not a handler ever uses it."""

    WINDOW_S = 3600.0

    def __init__(self, bytes_per_hour: int, clock=time.monotonic):
        self.limit = bytes_per_hour
        self._clock = clock
        self._sent: dict[str, deque] = {}
        self._lock = threading.Lock()

    def take(self, client: str, nbytes: int) -> bool:
        """Count ``nbytes`` for ``client``; False (and nothing counted) past the limit."""
        now = self._clock()
        with self._lock:
            q = self._sent.setdefault(client, deque())
            while q and now - q[0][0] > self.WINDOW_S:
                q.popleft()
            if sum(n for _, n in q) + nbytes > self.limit:
                return False
            q.append((now, nbytes))
            if len(self._sent) > 10_000:   # forget clients that sent nothing for an hour
                for c in [c for c, d in self._sent.items() if not d or now - d[-1][0] > self.WINDOW_S]:
                    del self._sent[c]
            return True


def _logged_in(scope, cookie_header: str) -> bool:
    """With Gradio's login on (``launch(auth=...)``): does the request carry a valid login?
    ``scope['app']`` is Gradio's FastAPI app (Starlette sets it before the middleware)."""
    app = scope.get("app")
    if app is None or (getattr(app, "auth", None) is None and getattr(app, "auth_dependency", None) is None):
        return True
    if getattr(app, "auth_dependency", None) is not None:
        return True   # a custom dependency: Gradio's own routes check it
    cid = getattr(app, "cookie_id", "")
    token = _cookie(cookie_header, f"access-token-{cid}") or _cookie(cookie_header, f"access-token-unsecure-{cid}")
    return token is not None and token in getattr(app, "tokens", {})


def _strings_in(body: bytes) -> list[str]:
    """Every text in a JSON body, however deep (the paths and URLs of Gradio's file
    values among them); [] for a body that is not JSON, which names no file to Gradio."""
    try:
        todo = [json.loads(body)]
    except (ValueError, RecursionError):
        return []
    found = []
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            found.append(v)
        elif isinstance(v, dict):
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
    return found


def _session_hashes(scope, body: bytes) -> set[str]:
    """The Gradio session hashes a request names: in its query, path or JSON body."""
    found = set()
    qs = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    found.update(qs.get("session_hash", []))
    m = _HASH_IN_PATH_RE.search(scope.get("path", ""))
    if m:
        found.add(m.group(1))
    found.update(h.decode("latin-1") for h in _HASH_IN_JSON_RE.findall(body))
    return {h for h in found if h}


class RequestGuard:
    """ASGI middleware in front of Gradio.

    - Each browser without a valid ``kiln_browser`` cookie gets a random one
      (HttpOnly, SameSite=Lax), also injected into the request itself, so every
      request has a browser; session names are derived from it
      (``app.web.server.browser.session_name``).
    - A Gradio session hash (a tab) belongs to the first browser that uses it: any
      other browser naming it (query, path, JSON body) is answered 403, so nobody can
      read a tab's event stream, cancel its events, end its session or reach its state.
    - With a login (``--auth``), every route but the login page and its assets needs it
      (401): Gradio leaves ``/cancel``, ``/heartbeat``, ``/reset`` and more open.
    - Every response says ``X-Content-Type-Options: nosniff``: served files are never
      sniffed into something a browser would run.
    - The client of a request is its connecting address, or, when that is one of
      ``proxies`` (``app.trusted_proxies``), the client its ``X-Forwarded-For`` names
      (``app.web.server.proxies``); ``scope['client']`` is set to it, so the quota below and
      Gradio's handlers (``requestinfo.client_of``) count the same client.
    - Uploads count against ``upload_bytes_per_hour`` per client (429 past it).
    - A request for any ``….glb`` / ``….ply`` (Gradio serves files under ``/file=<path>``
      and ``/file/<path>``) is answered 403 unless it is a result published for a session
      of the requesting browser's cookie: Gradio serves any file in its folder to whoever
      knows the path, and a result URL can leak (history, logs, a shared link).
    - The same for uploads and canvas images (``owned``, ``app.web.server.browser_files``): the paths
      an upload answer names are granted to the uploading browser before the answer leaves,
      and any route naming a granted file is answered 403 for every other browser.
    - A request whose JSON body names a file of another browser (an upload or canvas image
      granted to others, a result published for another browser's session) is answered
      403: Gradio takes any file in its folder as an event's input, so another browser's
      upload given to the upload handler would come back as that browser's canvas, and
      another's result given to the bake tab as a model of its own.
    - Request bodies above ``max_upload_bytes`` (uploads) or ``MAX_BODY_BYTES``
      (everything else) are refused with 413: Gradio checks each uploaded file's
      size, but not how many files one request carries, nor other bodies.

    ``owner_of(path) -> session | None``: the session of a published result, from the
    normalised path a request names (``ResultPublisher.owner``).
    """

    def __init__(self, app, owner_of: Callable[[str], Optional[str]], max_upload_bytes: int,
                 max_body_bytes: int = MAX_BODY_BYTES, upload_bytes_per_hour: Optional[int] = None,
                 tabs: Optional[TabBindings] = None, owned: Optional[OwnedFiles] = None,
                 proxies: Optional[TrustedProxies] = None):
        self.app = app
        self.owner_of = owner_of
        self.max_upload_bytes = max_upload_bytes
        self.max_body_bytes = max_body_bytes
        self.quota = UploadQuota(upload_bytes_per_hour) if upload_bytes_per_hour else None
        self.tabs = tabs or TabBindings()
        self.owned = owned
        self.proxies = proxies or TrustedProxies()

    def _as_from_client(self, scope):
        """``scope`` with ``client`` set to the request's client (``TrustedProxies.client``):
        the one place a request's client is derived."""
        peer, port = scope.get("client") or ("unknown", 0)
        forwarded = [v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == b"x-forwarded-for"]
        client = self.proxies.client(str(peer), forwarded)
        return scope if client == peer else dict(scope, client=(client, 0))

    def _may_use(self, path: str, token: Optional[str]) -> bool:
        """False when ``path`` (any text a request carries) names a file that belongs to a
        browser other than ``token``'s: a result published for another browser's session,
        or an upload or canvas image granted to others only. Files nobody owns are left to
        Gradio (an example, or a browser's own upload of a mesh named ``….glb``)."""
        served = os.path.abspath(path)
        if RESULT_NAME_RE.fullmatch(Path(served).name):
            owner = self.owner_of(served)
            if owner is not None and not browser_ids.session_owned_by(owner, token):
                return False
        return not self._owned_by_another(served, token)

    def _owned_by_another(self, served: str, token: Optional[str]) -> bool:
        """True for an upload or canvas image granted to browsers other than ``token``'s only."""
        owners = self.owned.owners(served) if self.owned is not None else None
        return owners is not None and browser_ids.browser_id(token) not in owners

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            scope = self._as_from_client(scope)
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        cookie_header = headers.get("cookie", "")
        token = _cookie(cookie_header, browser_ids.BROWSER_COOKIE)
        path = scope.get("path", "")
        is_upload = path.rstrip("/").endswith("/upload")
        limit = self.max_upload_bytes if is_upload else self.max_body_bytes
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            await _refuse(send, 413, f"request body exceeds the maximum allowed size of {limit:,} bytes")
            return
        if not (path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)) and not _logged_in(scope, cookie_header):
            await _refuse(send, 401, "log in first")
            return
        set_cookie = None
        if browser_ids.browser_id(token) is None:
            token = browser_ids.new_browser_token()
            set_cookie = f"{browser_ids.BROWSER_COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax".encode("latin-1")
            # the request itself carries it too: Gradio's handlers see one browser per request
            jar = f"{cookie_header}; {browser_ids.BROWSER_COOKIE}={token}" if cookie_header else f"{browser_ids.BROWSER_COOKIE}={token}"
            scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers", []) if k.lower() != b"cookie"]
                         + [(b"cookie", jar.encode("latin-1"))])
        if is_upload and self.quota is not None:
            client = (scope.get("client") or ("unknown", 0))[0]
            if not self.quota.take(client, int(length) if length.isdigit() else limit):
                await _refuse(send, 429, f"this computer has uploaded more than "
                                         f"{self.quota.limit / (1 << 20):.0f} MB in the last hour; "
                                         "try again later")
                return
        if scope.get("method") == "POST" and not is_upload:
            # a JSON body may name a tab: read it (it is small, capped above), then replay it
            try:
                body = await _read_body(receive, limit)
            except _BodyTooLarge:
                await _refuse(send, 413, f"request body exceeds the maximum allowed size of {limit:,} bytes")
                return
            receive = _replay(body, receive)
        else:
            body = b""
        browser = browser_ids.browser_id(token)
        if any(not self.tabs.claim(h, browser) for h in _session_hashes(scope, body)):
            await _refuse(send, 403, "this tab belongs to another browser")
            return
        if any(not self._may_use(text, token) for text in _strings_in(body)):
            await _refuse(send, 403, "this request names a file of another browser")
            return
        # Any route's path, normalised as Gradio's file routes (/file=<path> and the older
        # /file/<path>) normalise the path they open ('/.', '//', '..', a trailing '/'). Every
        # .glb/.ply name (any case) is a result: served only to the browser that owns it.
        served = os.path.abspath(path or "/")
        name = Path(served).name
        if RESULT_NAME_RE.fullmatch(name) and not browser_ids.session_owned_by(self.owner_of(served), token):
            await _refuse(send, 403, "this result belongs to another browser session")
            return
        if self._owned_by_another(served, token):
            await _refuse(send, 403, "this file belongs to another browser")
            return
        if is_upload and self.owned is not None:
            send = _granting_uploads(send, self.owned, browser)
        received = 0
        started = False

        async def capped_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:   # a chunked body, without Content-Length
                    raise _BodyTooLarge
            return message

        async def send_with_cookie(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                extra = [(b"x-content-type-options", b"nosniff")]
                if set_cookie is not None:
                    extra.append((b"set-cookie", set_cookie))
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-content-type-options"]
                message = dict(message, headers=kept + extra)
            await send(message)

        try:
            await self.app(scope, capped_receive, send_with_cookie)
        except _BodyTooLarge:
            if not started:
                await _refuse(send, 413, f"request body exceeds the maximum allowed size of {limit:,} bytes")


class _BodyTooLarge(Exception):
    pass


def _granting_uploads(send, owned: OwnedFiles, browser: Optional[str]):
    """A send() for the upload route's answer: its body (a short JSON list of the stored
    paths) is held until complete, each path granted to ``browser``, then sent; so no path
    is known outside the server before it has an owner."""
    status = 0
    held: list[bytes] = []

    async def granting(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            held.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = b"".join(held)
            if status == 200:
                for p in uploaded_paths(body):
                    owned.grant(p, browser)
            message = dict(message, body=body)
        await send(message)

    return granting


async def _read_body(receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive):
    """A receive() that hands the app the body already read, then the rest (disconnects)."""
    sent = False

    async def again():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def _refuse(send, status: int, text: str) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()),
                            (b"x-content-type-options", b"nosniff")]})
    await send({"type": "http.response.body", "body": body})


def build_parser() -> argparse.ArgumentParser:
    from kiln.settings import RAY_FLAG_HELP

    p = argparse.ArgumentParser(
        prog="kiln serve",
        description="Start the Kiln web UI. Binds 127.0.0.1 unless --listen is given.")
    p.add_argument("--config", help="settings YAML (default: configs/default.yaml)")
    p.add_argument("--host", help="bind address (default: app.host, 127.0.0.1); "
                                  "non-loopback needs --listen")
    p.add_argument("--port", type=int, help="port (default: app.port, 7860)")
    p.add_argument("--listen", "--share-on-network", dest="listen", action="store_true",
                   help="allow binding a non-loopback address (0.0.0.0 when --host is not given); "
                        "needs --auth/KILN_AUTH or --no-auth")
    p.add_argument("--auth", metavar="USER:PASS", help="require this login (default: $KILN_AUTH)")
    p.add_argument("--no-auth", action="store_true",
                   help="with --listen: serve without a login (logged as a warning)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting, e.g. --set worker.count=2")
    p.add_argument("--no-examples", action="store_true", help="do not generate/show example images")
    p.add_argument("--ray", metavar="ADDRESS", help=RAY_FLAG_HELP)
    return p


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def keep_big_buffers_mmapped(threshold: int = 1 << 20) -> bool:
    """glibc raises its mmap threshold (up to 32 MB) each time a big mmapped block is freed;
    from then on the 16 MB blocks PIL decodes into and the arrays made from them come from
    the handler threads' heaps, whose freed memory stays in the process: a flood of 40 MP
    uploads left 1.8 GB behind. A fixed threshold keeps every buffer above it mmapped, so
    freeing it returns it. False where this is not glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, threshold))   # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def empty_folder(folder: Path) -> None:
    """Remove everything in ``folder``. Gradio's folder at start: what an earlier server left
    there (after a crash Gradio's own clean-up never ran) is garbage (tabs' images live in
    the session store, which starts empty too; results are published again), and an upload
    in it would have no owner to check against (``app.web.server.browser_files``)."""
    import shutil

    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def only_kilns_proxy_rule() -> None:
    """Switch off uvicorn's own reading of X-Forwarded-For: by default it believes the header
    from 127.0.0.1 and ::1 (``FORWARDED_ALLOW_IPS``) and rewrites the client before Kiln
    sees the request, so any local process, or a same-host proxy's clients, could name the
    address their limits count. ``app.trusted_proxies`` is the one rule
    (``RequestGuard``)."""
    if os.environ.get("FORWARDED_ALLOW_IPS"):
        log.warning("FORWARDED_ALLOW_IPS is ignored: list reverse proxies in app.trusted_proxies")
    os.environ["FORWARDED_ALLOW_IPS"] = ""


def launch(settings, host: Optional[str] = None, port: Optional[int] = None, share_on_network: bool = False,
           auth: Optional[tuple[str, str]] = None, no_auth: bool = False, examples: bool = True,
           block: bool = True, context=None):
    """Build and start the server. Returns ``(demo, context, url)``; with ``block`` it
    serves until interrupted, then shuts the workers down.

    ``context``: an ``app.web.server.context.AppContext`` to use (tests inject one with a stand-in
    supervisor); by default one is made from ``settings`` and started in the background.
    """
    host = host or (settings.app.host if not share_on_network or not is_loopback(settings.app.host)
                    else "0.0.0.0")
    port = port or settings.app.port
    check_binding(host, share_on_network, auth, no_auth)

    jobs_dir = Path(settings.app.jobs_dir).resolve()
    files_dir = (jobs_dir.parent / "gradio").resolve()
    files_dir.mkdir(parents=True, exist_ok=True)
    empty_folder(files_dir)
    # Gradio reads this when building components: its uploads and served copies live here
    os.environ["GRADIO_TEMP_DIR"] = str(files_dir)
    only_kilns_proxy_rule()
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

    t0 = time.perf_counter()
    keep_big_buffers_mmapped()
    from app.web.server.context import AppContext
    from app.web.page.assets import CSS
    from app.web.page.ui import build_ui

    ctx = context or AppContext(settings, files_dir)
    example_paths = []
    if examples:
        from app.web.page.example_images import ensure_examples

        try:
            example_paths = ensure_examples(jobs_dir.parent / "examples")
        except OSError as e:
            log.warning("examples not written: %s", e)
    demo = build_ui(ctx, example_paths)
    # the queue's size bounds everything waiting; Generate has its own, smaller bound
    demo.queue(max_size=settings.worker.max_queue + 64, default_concurrency_limit=4)
    blocked = [str(jobs_dir), str(Path(settings.app.cache_dir).resolve()), str(Path("checkpoints").resolve())]
    from starlette.middleware import Middleware

    from kiln.imageio import upload_limit_bytes

    max_upload = upload_limit_bytes(settings.app.max_pixels, settings.app.max_upload_mb)
    guard = Middleware(RequestGuard, owner_of=ctx.publisher.owner, owned=ctx.owned,
                       proxies=TrustedProxies(settings.app.trusted_proxies),
                       max_upload_bytes=max_upload + UPLOAD_OVERHEAD_BYTES,
                       upload_bytes_per_hour=int(settings.app.upload_mb_per_client_hour * 1024 * 1024))
    from app.web.page.viewer_light import NeutralViewerLight
    from app.web.server.ops import OpsRoutes, context_health, context_metrics

    # /healthz and /metrics, before the guard: no login, no cookie; loopback or app.ops_networks only
    ops = Middleware(OpsRoutes, health=lambda: context_health(ctx), metrics=lambda: context_metrics(ctx),
                     networks=settings.app.ops_networks, proxies=TrustedProxies(settings.app.trusted_proxies))

    _, url, _ = demo.launch(
        server_name=host, server_port=port, auth=auth, share=False, inbrowser=False,
        # health and metrics, then the guard; then the 3D viewer's light, neutral (app.web.page.viewer_light)
        max_file_size=max_upload, app_kwargs={"middleware": [ops, guard, Middleware(NeutralViewerLight)]},
        # show_error off: an unexpected exception's text (paths, internals) never reaches the
        # page; what a person should read is raised as gr.Error, which is shown regardless
        allowed_paths=[], blocked_paths=blocked, show_error=False, quiet=True,
        prevent_thread_lock=True, css=CSS, footer_links=["settings"], ssr_mode=False,
        # run_history off: Kiln keeps its own per-browser history (app/web/state/history.py)
        enable_monitoring=False, mcp_server=False, run_history=False)
    if context is None:
        # after the page is up: spawning workers competes for the CPU with Gradio's start
        ctx.start()
    shown = url if url else f"http://{host}:{port}/"
    if host in ("0.0.0.0", "::"):
        shown = f"http://127.0.0.1:{port}/ (listening on all interfaces)"
    print(f"Kiln UI ready in {time.perf_counter() - t0:.1f} s: {shown}", flush=True)
    if not block:
        return demo, ctx, shown
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        # SIGTERM (systemd, docker stop, a test's terminate()) shuts down like Ctrl+C,
        # so the spawned workers are stopped instead of being orphaned
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        print("stopping…", flush=True)
    finally:
        demo.close()
        ctx.shutdown()
    return demo, ctx, shown


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    from kiln import settings as settings_mod
    from worker.child.env import passive_openmp

    passive_openmp(os.environ)   # before segmentation imports torch (worker.child.env)

    try:
        settings = settings_mod.load(args.config, {**settings_mod.parse_set(args.set),
                                                   **settings_mod.ray_overrides(args.ray)})
        auth = parse_auth(args.auth if args.auth is not None else os.environ.get("KILN_AUTH"))
        if auth and args.no_auth:
            raise LaunchError("--no-auth contradicts --auth/KILN_AUTH; pick one")
        launch(settings, host=args.host, port=args.port, share_on_network=args.listen, auth=auth,
               no_auth=args.no_auth, examples=not args.no_examples)
    except (LaunchError, settings_mod.SettingsError) as e:
        print(f"kiln serve: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"kiln serve: cannot start the server: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
