"""Start the web UI: ``python -m app`` / ``kiln serve`` / ``./run.sh``.

Safe defaults: binds 127.0.0.1. Binding any other address needs ``--listen``
*and* either a login (``--auth user:pass`` or ``KILN_AUTH=user:pass``) or an
explicit, loudly logged ``--no-auth``. Uploads are limited to
``app.max_upload_mb``. Gradio keeps its uploads and the results it serves in
its own folder (``var/gradio`` next to the job store); the job store itself is
on Gradio's block list, so no URL reaches another session's job files.
``RequestGuard`` sits in front of Gradio: it gives each browser its own cookie,
serves a result file only to the browser whose session made it, and caps
request bodies.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

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


class RequestGuard:
    """ASGI middleware in front of Gradio.

    - Each browser without a valid ``kiln_browser`` cookie gets a random one
      (HttpOnly, SameSite=Lax); session names are derived from it
      (``app.handlers.session_name``).
    - A request for ``…/kiln-<job>.glb|ply`` (Gradio serves files under ``/file=<path>``
      and ``/file/<path>``) is answered 403 unless the job's session belongs to the
      requesting browser's cookie: Gradio serves any file in its folder to whoever
      knows the path, and a result URL can leak (history, logs, a shared link).
    - Request bodies above ``max_upload_bytes`` (uploads) or ``MAX_BODY_BYTES``
      (everything else) are refused with 413: Gradio checks each uploaded file's
      size, but not how many files one request carries, nor other bodies.

    ``owner_of(file_name) -> session | None``: the session of a published result.
    """

    def __init__(self, app, owner_of: Callable[[str], Optional[str]], max_upload_bytes: int,
                 max_body_bytes: int = MAX_BODY_BYTES):
        from . import handlers

        self.app = app
        self.owner_of = owner_of
        self._h = handlers
        self.max_upload_bytes = max_upload_bytes
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        H = self._h
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        token = _cookie(headers.get("cookie", ""), H.BROWSER_COOKIE)
        path = scope.get("path", "")
        limit = self.max_upload_bytes if path.rstrip("/").endswith("/upload") else self.max_body_bytes
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            await _refuse(send, 413, f"request body exceeds the maximum allowed size of {limit:,} bytes")
            return
        # Any route's last segment, normalised as Gradio's file routes (/file=<path> and the
        # older /file/<path>) normalise the path they open ('/.', '//', a trailing '/');
        # case-folded, as a case-insensitive file system would open KILN-<job>.GLB too.
        name = Path(os.path.abspath(path or "/")).name
        if H.RESULT_NAME_RE.fullmatch(name.lower()) and not H.session_owned_by(self.owner_of(name), token):
            await _refuse(send, 403, "this result belongs to another browser session")
            return
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

        set_cookie = None
        if H.browser_id(token) is None:
            set_cookie = (f"{H.BROWSER_COOKIE}={H.new_browser_token()}; Path=/; HttpOnly; SameSite=Lax"
                          .encode("latin-1"))

        async def send_with_cookie(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if set_cookie is not None:
                    message = dict(message, headers=[*message.get("headers", []), (b"set-cookie", set_cookie)])
            await send(message)

        try:
            await self.app(scope, capped_receive, send_with_cookie)
        except _BodyTooLarge:
            if not started:
                await _refuse(send, 413, f"request body exceeds the maximum allowed size of {limit:,} bytes")


class _BodyTooLarge(Exception):
    pass


async def _refuse(send, status: int, text: str) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def build_parser() -> argparse.ArgumentParser:
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
    return p


def _overrides(pairs: Sequence[str]) -> dict:
    out = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LaunchError(f"--set needs KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def launch(settings, host: Optional[str] = None, port: Optional[int] = None, share_on_network: bool = False,
           auth: Optional[tuple[str, str]] = None, no_auth: bool = False, examples: bool = True,
           block: bool = True, context=None):
    """Build and start the server. Returns ``(demo, context, url)``; with ``block`` it
    serves until interrupted, then shuts the workers down.

    ``context``: an ``app.context.AppContext`` to use (tests inject one with a stand-in
    supervisor); by default one is made from ``settings`` and started in the background.
    """
    host = host or (settings.app.host if not share_on_network or not is_loopback(settings.app.host)
                    else "0.0.0.0")
    port = port or settings.app.port
    check_binding(host, share_on_network, auth, no_auth)

    jobs_dir = Path(settings.app.jobs_dir).resolve()
    files_dir = (jobs_dir.parent / "gradio").resolve()
    files_dir.mkdir(parents=True, exist_ok=True)
    # Gradio reads this when building components: its uploads and served copies live here
    os.environ["GRADIO_TEMP_DIR"] = str(files_dir)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

    t0 = time.perf_counter()
    from .context import AppContext
    from .ui import CSS, build_ui

    ctx = context or AppContext(settings, files_dir)
    example_paths = []
    if examples:
        from .examples import ensure_examples

        try:
            example_paths = ensure_examples(jobs_dir.parent / "examples")
        except OSError as e:
            log.warning("examples not written: %s", e)
    demo = build_ui(ctx, example_paths)
    # the queue's size bounds everything waiting; Generate has its own, smaller bound
    demo.queue(max_size=settings.worker.max_queue + 64, default_concurrency_limit=4)
    blocked = [str(jobs_dir), str(Path(settings.app.cache_dir).resolve()), str(Path("checkpoints").resolve())]
    from starlette.middleware import Middleware

    max_upload = int(settings.app.max_upload_mb * 1024 * 1024)
    guard = Middleware(RequestGuard, owner_of=ctx.publisher.owner,
                       max_upload_bytes=max_upload + UPLOAD_OVERHEAD_BYTES)
    _, url, _ = demo.launch(
        server_name=host, server_port=port, auth=auth, share=False, inbrowser=False,
        max_file_size=max_upload, app_kwargs={"middleware": [guard]},
        allowed_paths=[], blocked_paths=blocked, show_error=True, quiet=True,
        prevent_thread_lock=True, css=CSS, footer_links=["settings"], ssr_mode=False,
        enable_monitoring=False, mcp_server=False)
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

    try:
        settings = settings_mod.load(args.config, _overrides(args.set))
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
