"""``/healthz`` and ``/metrics``: what a load balancer and a Prometheus server ask for.

``OpsRoutes`` is ASGI middleware in front of everything else (the ``RequestGuard`` and Gradio),
so the two answer without a login and without a browser cookie, and nothing else changes.
They answer only to this machine (loopback), or to the networks ``app.ops_networks`` lists;
to anyone else, 404 as if they were not there. The client is the connecting address or, from
one of ``app.trusted_proxies``, the one its ``X-Forwarded-For`` names (the guard's rule): a
reverse proxy on this machine does not make the world loopback.

- ``GET /healthz``: ``{"status": "ok" | "unavailable", "reasons": [...], "workers": ...,
  "queue": n, "running": n, "disk": {...}}``; 200 when a worker is ready and a job fits on the
  disk, else 503 (``worker.upkeep.health``).
- ``GET /metrics``: Prometheus' text format (``worker.upkeep.telemetry``); 503 until the
  workers' supervisor exists.
"""

from __future__ import annotations

import json
from typing import Callable, Iterable, Optional

from app.web.server.proxies import TrustedProxies, parse_address

HEALTH_PATH = "/healthz"
METRICS_PATH = "/metrics"
# prometheus_client.CONTENT_TYPE_LATEST, written out: importing the library just for it is not worth it
METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class OpsRoutes:
    """``health() -> (status code, JSON-able dict)``; ``metrics() -> (status code, text bytes)``."""

    def __init__(self, app, health: Callable[[], tuple[int, dict]], metrics: Callable[[], tuple[int, bytes]],
                 networks: Iterable[str] = (), proxies: Optional[TrustedProxies] = None):
        self.app = app
        self.health = health
        self.metrics = metrics
        self.allowed = TrustedProxies(networks)   # the same parsing as app.trusted_proxies
        self.proxies = proxies or TrustedProxies()

    def allows(self, scope) -> bool:
        peer = str((scope.get("client") or ("",))[0])
        forwarded = [v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == b"x-forwarded-for"]
        client = self.proxies.client(peer, forwarded)
        ip = parse_address(client)
        return ip is not None and (ip.is_loopback or self.allowed.trusts(client))

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path not in (HEALTH_PATH, METRICS_PATH):
            await self.app(scope, receive, send)
            return
        if not self.allows(scope):
            await _answer(send, 404, b"text/plain; charset=utf-8", b"Not Found")
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _answer(send, 405, b"text/plain; charset=utf-8", b"Method Not Allowed")
            return
        if path == HEALTH_PATH:
            code, body = self.health()
            await _answer(send, code, b"application/json", json.dumps(body).encode())
        else:
            code, text = self.metrics()
            await _answer(send, code, METRICS_TYPE, text)


async def _answer(send, status: int, content_type: bytes, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff")]})
    await send({"type": "http.response.body", "body": body})


def context_health(ctx) -> tuple[int, dict]:
    """The health of an ``AppContext``: its supervisor's, or why there is none yet."""
    sup = ctx.sup
    if sup is None:
        why = ctx.sup_error or "the workers are starting"
        return 503, {"status": "unavailable", "reasons": [why]}
    h = sup.health()
    return (200 if h.ok else 503), h.to_dict()


def context_metrics(ctx) -> tuple[int, bytes]:
    sup = ctx.sup
    if sup is None:
        return 503, b"# the workers' supervisor is not running yet\n"
    return 200, sup.telemetry.render()
