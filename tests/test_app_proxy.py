"""Behind a reverse proxy (app/web/server/proxies.py, app.trusted_proxies): a trusted proxy's users
are counted apart, by the address it forwards; an X-Forwarded-For from anyone else changes
nothing, also from 127.0.0.1, which uvicorn would believe by default."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest

from app.web.server import browser
from app.web.server.proxies import TrustedProxies, parse_address
from synthetic import make_object_image
from test_app_sessions import Tab, _png, serve_with_fake_pool

PROXY = "127.0.0.2"   # the trusted proxy: a second loopback address this test connects from


@pytest.fixture(scope="module")
def blob_png():
    return _png(make_object_image(256, "blob", seed=3)[0])


@pytest.mark.parametrize("peer,forwarded,client", [
    # not a trusted proxy: the connecting address, whatever the header says
    ("198.51.100.7", ["203.0.113.5"], "198.51.100.7"),
    ("127.0.0.1", ["203.0.113.5"], "127.0.0.1"),
    # a trusted proxy: the address it appended (the right-most), not what the client sent before it
    ("10.0.0.2", ["203.0.113.5"], "203.0.113.5"),
    ("10.0.0.2", ["6.6.6.6, 203.0.113.5"], "203.0.113.5"),
    # a chain of trusted proxies is passed over, also across several header lines
    ("10.0.0.2", ["6.6.6.6, 203.0.113.5, 10.0.0.3"], "203.0.113.5"),
    ("10.0.0.2", ["6.6.6.6, 203.0.113.5", "10.0.0.3"], "203.0.113.5"),
    # every hop a trusted proxy: the farthest of them
    ("10.0.0.2", ["10.0.0.9, 10.0.0.3"], "10.0.0.9"),
    # an entry that is no address: counted against the nearest trusted proxy
    ("10.0.0.2", ["203.0.113.5, unknown"], "10.0.0.2"),
    ("10.0.0.2", ["203.0.113.5, unknown, 10.0.0.3"], "10.0.0.3"),
    # no header, or an empty one: the proxy itself
    ("10.0.0.2", [], "10.0.0.2"),
    ("10.0.0.2", [" , "], "10.0.0.2"),
    # ports, brackets, IPv4 seen over IPv6: one client, one name
    ("10.0.0.2", ["203.0.113.5:51234"], "203.0.113.5"),
    ("10.0.0.2", ["[2001:db8::1]:443"], "2001:db8::1"),
    ("::ffff:10.0.0.2", ["::ffff:203.0.113.5"], "203.0.113.5"),
    ("::ffff:198.51.100.7", ["203.0.113.5"], "198.51.100.7"),
    # a peer that is no IP (a unix socket, a test client) is never a proxy
    ("testclient", ["203.0.113.5"], "testclient"),
])
def test_the_client_is_the_address_a_trusted_proxy_forwards(peer, forwarded, client):
    assert TrustedProxies(["10.0.0.0/24"]).client(peer, forwarded) == client


def test_no_trusted_proxy_means_no_header_is_read():
    none = TrustedProxies()
    assert not none and none.client("10.0.0.2", ["203.0.113.5"]) == "10.0.0.2"
    assert parse_address("unknown") is None and str(parse_address("1.2.3.4:80")) == "1.2.3.4"


def test_the_guard_counts_uploads_and_hands_on_the_forwarded_client():
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route, Router
    from starlette.testclient import TestClient

    from app.web.server.launch import RequestGuard

    async def echo(request):
        await request.body()
        return PlainTextResponse(request.client.host)

    inner = Router(routes=[Route("/{path:path}", echo, methods=["GET", "POST"])])
    guard = RequestGuard(inner, owner_of=lambda p: None, max_upload_bytes=10_000,
                         upload_bytes_per_hour=1000, proxies=TrustedProxies(["10.0.0.2"]))
    via_proxy = TestClient(guard, client=("10.0.0.2", 40000))
    spoofer = TestClient(guard, client=("198.51.100.7", 40000))

    def upload(client, forwarded):
        return client.post("/gradio_api/upload", content=b"x" * 600, headers={"X-Forwarded-For": forwarded})

    # what the app behind the guard (Gradio's handlers) sees as the client
    assert via_proxy.get("/", headers={"X-Forwarded-For": "203.0.113.5"}).text == "203.0.113.5"
    assert spoofer.get("/", headers={"X-Forwarded-For": "203.0.113.5"}).text == "198.51.100.7"
    # two people behind the proxy: a quota each
    assert upload(via_proxy, "203.0.113.5").status_code == 200
    assert upload(via_proxy, "203.0.113.6").status_code == 200
    assert upload(via_proxy, "203.0.113.5").status_code == 429
    # a client that is no proxy gets nothing for a new header each time: one quota
    assert upload(spoofer, "192.0.2.1").status_code == 200
    r = upload(spoofer, "192.0.2.2")
    assert r.status_code == 429 and "uploaded more than" in r.text


# -- a served app behind a proxy ----------------------------------------------------

@pytest.fixture(scope="module")
def behind_proxy(tmp_path_factory):
    overrides = {"app.trusted_proxies": PROXY, "app.max_sessions_per_client": 2,
                 "app.upload_mb_per_client_hour": 1}
    for base, ctx, fns in serve_with_fake_pool(tmp_path_factory.mktemp("proxied"), overrides):
        yield SimpleNamespace(base=base, ctx=ctx, fns=fns)


def _person(served, forwarded: str | None = None, via_proxy: bool = True) -> httpx.Client:
    """A browser of its own; through the proxy (connecting from PROXY) or straight from
    127.0.0.1, with an X-Forwarded-For on every request when ``forwarded`` is given."""
    transport = httpx.HTTPTransport(local_address=PROXY if via_proxy else "127.0.0.1")
    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    client = httpx.Client(base_url=served.base, transport=transport, headers=headers, timeout=60)
    assert client.get("/").status_code == 200 and client.cookies.get(browser.BROWSER_COOKIE)
    return client


def _tabs_kept(served, client: httpx.Client, name: str, n: int, png: bytes, forwarded=None) -> list[bool]:
    """Upload ``png`` in ``n`` tabs of ``client``; which uploads were kept. ``forwarded``:
    a list of X-Forwarded-For values, one per tab (a client that changes it each time)."""
    kept = []
    for i in range(n):
        if forwarded is not None:
            client.headers["X-Forwarded-For"] = forwarded[i]
        code, msg = Tab(client, served.fns, f"{name}{i:04d}").upload("blob.png", png)
        assert code == 200, code
        kept.append("Cannot use this file" not in json.dumps(msg))
    return kept


def test_a_trusted_proxys_users_have_limits_of_their_own(behind_proxy, blob_png):
    clients = lambda: behind_proxy.ctx.sessions.usage()["clients"]   # noqa: E731
    # two people behind the proxy: the client sent a made-up address first, the proxy appended
    # the one it saw; each gets the 2 tabs of app.max_sessions_per_client
    ann = _person(behind_proxy, "6.6.6.6, 203.0.113.5")
    bob = _person(behind_proxy, "203.0.113.6")
    assert _tabs_kept(behind_proxy, ann, "ann", 3, blob_png) == [True, True, False]
    assert _tabs_kept(behind_proxy, bob, "bob", 2, blob_png) == [True, True]
    assert clients() == {"203.0.113.5": 2, "203.0.113.6": 2}

    # not through the proxy: 127.0.0.1 naming another address in each tab is still 127.0.0.1
    # (uvicorn by default believes X-Forwarded-For from 127.0.0.1: Kiln switches that off)
    spoofer = _person(behind_proxy, via_proxy=False)
    made_up = ["192.0.2.1", "192.0.2.2", "192.0.2.3"]
    assert _tabs_kept(behind_proxy, spoofer, "spoof", 3, blob_png, made_up) == [True, True, False]
    assert clients() == {"203.0.113.5": 2, "203.0.113.6": 2, "127.0.0.1": 2}

    # the upload quota (1 MiB an hour here): Ann's is spent, Bob's is not; the spoofer's
    # made-up addresses share one
    big = {"files": ("big.png", b"x" * 700_000, "image/png")}
    assert ann.post("/gradio_api/upload", files=big).status_code == 200
    assert ann.post("/gradio_api/upload", files=big).status_code == 429
    assert bob.post("/gradio_api/upload", files=big).status_code == 200
    spoofer.headers["X-Forwarded-For"] = "192.0.2.4"
    assert spoofer.post("/gradio_api/upload", files=big).status_code == 200
    spoofer.headers["X-Forwarded-For"] = "192.0.2.5"
    assert spoofer.post("/gradio_api/upload", files=big).status_code == 429
    for name in list(behind_proxy.ctx.sessions._records):   # the tabs close
        behind_proxy.ctx.sessions.drop(name)
