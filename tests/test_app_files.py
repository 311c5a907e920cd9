"""Uploaded photos and the page's working copy are bound to their browser, as results are
(app/web/server/browser_files.py, RequestGuard): the browser that uploaded a file, or was shown a
canvas image, fetches it; another browser and a client without the cookie get 403, through
the page's routes and the script API; a server starts with Gradio's folder empty."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from PIL import Image

from app.web.server import browser
from app.web.server.browser_files import OwnedFiles, uploaded_paths
from app.web.server.requestinfo import Caller, event_fn
from synthetic import make_object_image
from test_app_sessions import Tab, _png, serve_with_fake_pool

ALICE, BOB = "a" * 43, "b" * 43


def _session(token: str | None, tab: str = "tab1") -> str:
    return browser.session_name(token, tab)


def test_owned_files_are_known_by_every_spelling_of_their_path(tmp_path):
    owned = OwnedFiles(tmp_path / "canvas")
    up = tmp_path / ("f" * 64) / "photo.png"
    up.parent.mkdir()
    up.write_bytes(b"png")
    assert owned.owners(up) is None                       # nobody's yet: left to Gradio
    owned.grant(str(up), "alice")
    for spelling in (str(up), str(up) + "/", f"{up.parent}/../{up.parent.name}/photo.png", f"{up.parent}//photo.png"):
        assert owned.owners(spelling) == {"alice"}, spelling
    owned.grant(up, "bob")       # the same bytes under the same name from another browser
    assert owned.owners(up) == {"alice", "bob"}
    assert owned.owners(up.with_name("other.png")) is None
    assert uploaded_paths(json.dumps([str(up)]).encode()) == [str(up)]
    assert uploaded_paths(b'{"error": "x"}') == [] and uploaded_paths(b"not json") == []


def test_files_whose_file_is_gone_are_forgotten(tmp_path, monkeypatch):
    from app.web.server import browser_files as ownedfiles

    monkeypatch.setattr(ownedfiles, "PRUNE_AT", 3)
    owned = OwnedFiles(tmp_path / "canvas")
    files = []
    for i in range(4):
        f = tmp_path / f"d{i}" / "x.png"
        f.parent.mkdir()
        f.write_bytes(b"x")
        files.append(f)
    for f in files[:3]:
        owned.grant(f, "alice")
    files[0].unlink()
    owned.grant(files[3], "alice")                        # past PRUNE_AT: the gone one goes
    assert owned.owners(files[0]) is None and all(owned.owners(f) == {"alice"} for f in files[1:])


def test_a_canvas_image_is_a_file_of_its_browser_encoded_as_gradio_would(tmp_path):
    from gradio.processing_utils import encode_pil_to_bytes

    owned = OwnedFiles(tmp_path / "canvas")
    pixels = make_object_image(200, "blob", seed=2)[0]
    path = Path(owned.publish_canvas(_session(ALICE), pixels))
    assert path.parent == tmp_path / "canvas" and path.suffix == ".jpeg"
    assert path.read_bytes() == encode_pil_to_bytes(Image.fromarray(pixels), "jpeg")
    assert owned.owners(path) == {browser.browser_id(ALICE)}
    # shown again in any tab of the browser: the same file; another browser: a file of its own
    assert owned.publish_canvas(_session(ALICE, "tab2"), pixels) == str(path)
    other = owned.publish_canvas(_session(BOB), pixels)
    assert other != str(path) and owned.owners(other) == {browser.browser_id(BOB)}
    # a cookie-less session's canvas: nobody may fetch it (it gets no result either)
    assert owned.owners(owned.publish_canvas(_session(None), pixels)) == frozenset()


def test_event_fn_presents_every_answer_to_its_caller():
    """``present`` sees the caller and each answer; a generator closed early closes the handler."""
    closed = []

    def answers(caller: Caller, n: int):
        try:
            for i in range(n):
                yield i
        finally:
            closed.append(caller.session)

    def once(caller: Caller, n: int):
        return n

    present = lambda caller, answer: (caller.session, answer)   # noqa: E731
    request = SimpleNamespace(cookies={browser.BROWSER_COOKIE: ALICE}, session_hash="tab1",
                              client=SimpleNamespace(host="127.0.0.1"))
    assert event_fn(once, present=present)(4, request) == (_session(ALICE), 4)
    gen = event_fn(answers, present=present)(3, request)
    assert next(gen) == (_session(ALICE), 0)
    gen.close()
    assert closed == [_session(ALICE)]


def _guarded(owned: OwnedFiles, results: dict | None = None):
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route, Router

    from app.web.server.launch import RequestGuard

    async def upload(request):
        """As Gradio's upload route answers: the stored paths, as JSON (here in two pieces)."""
        await request.body()
        names = request.query_params.getlist("name")
        if request.query_params.get("fail"):
            return JSONResponse(names, status_code=400)
        body = json.dumps(names).encode()
        return StreamingResponse(iter([body[:5], body[5:]]), media_type="application/json")

    async def any_route(request):
        return PlainTextResponse(f"served {request.url.path}")

    async def event(request):
        return PlainTextResponse(f"ran with {len(await request.body())} bytes")

    inner = Router(routes=[Route("/gradio_api/upload", upload, methods=["POST"]),
                           Route("/gradio_api/queue/join", event, methods=["POST"]),
                           Route("/{path:path}", any_route, methods=["GET", "HEAD"])])
    results = results if results is not None else {}   # as ResultPublisher.owner: by the path's folder and name
    return RequestGuard(inner, owner_of=lambda p: results.get("/".join(p.split("/")[-2:])),
                        max_upload_bytes=10_000, owned=owned)


def test_the_guard_grants_an_upload_to_its_browser_before_anyone_learns_its_path(tmp_path):
    from starlette.testclient import TestClient

    owned = OwnedFiles(tmp_path / "canvas")
    app = _guarded(owned)
    alice, mallory, anon = TestClient(app), TestClient(app), TestClient(app, cookies=None)
    alice.get("/")
    mallory.get("/")
    stored = "/srv/var/gradio/" + "e" * 64 + "/photo.png"
    r = alice.post("/gradio_api/upload", params={"name": stored}, content=b"x")
    assert r.status_code == 200 and r.json() == [stored]
    assert owned.owners(stored) == {browser.browser_id(alice.cookies.get(browser.BROWSER_COOKIE))}
    url = "/gradio_api/file=" + stored
    variants = (url, url + "/", url.replace("/file=", "/file/"), url.replace("/photo.png", "/../" + "e" * 64 + "/photo.png"),
                "/gradio_api/file=var/gradio/" + "e" * 64 + "/photo.png")   # relative: Gradio resolves it
    for variant in variants:
        assert alice.get(variant).status_code == 200, variant
        r = mallory.get(variant)
        assert r.status_code == 403 and "belongs to another browser" in r.text, variant
        assert TestClient(app).get(variant).status_code == 403, variant            # no cookie at all
    assert TestClient(app).head(url).status_code == 403
    # an upload Gradio refused names no file of anyone's
    failed = "/srv/var/gradio/" + "f" * 64 + "/photo.png"
    assert alice.post("/gradio_api/upload", params={"name": failed, "fail": 1}, content=b"x").status_code == 400
    assert owned.owners(failed) is None
    del anon


def test_the_guard_refuses_an_event_given_another_browsers_file(tmp_path):
    """Gradio takes any file in its folder as an event's input: another browser's upload
    given to the upload handler would come back as the caller's canvas, another's result
    given to the bake tab as a model of the caller's own."""
    from starlette.testclient import TestClient

    owned = OwnedFiles(tmp_path / "canvas")
    results: dict = {}
    app = _guarded(owned, results)
    alice, mallory = TestClient(app), TestClient(app)
    alice.get("/")
    mallory.get("/")
    token = alice.cookies.get(browser.BROWSER_COOKIE)
    photo = "/srv/var/gradio/" + "e" * 64 + "/photo.png"
    alice.post("/gradio_api/upload", params={"name": photo}, content=b"x")
    results["0123/horse-1.glb"] = browser.session_name(token, "tab1")
    result = "/srv/var/gradio/results/0123/horse-1.glb"

    def join(client, *values):
        data = [{"path": v, "orig_name": Path(v).name, "meta": {"_type": "gradio.FileData"}} for v in values]
        return client.post("/gradio_api/queue/join", json={"data": [data], "fn_index": 1, "session_hash": "t"
                                                           + client.cookies.get(browser.BROWSER_COOKIE)[:8]})

    assert join(alice, photo, result).status_code == 200
    for named in (photo, result, "http://127.0.0.1:7860/gradio_api/file=" + photo,
                  photo.replace("/photo.png", "/../" + "e" * 64 + "/photo.png")):
        r = join(mallory, named)
        assert r.status_code == 403 and "names a file of another browser" in r.text, named
    # a mesh someone uploads for the bake tab is theirs, whatever its name; examples are nobody's
    mesh = "/srv/var/gradio/" + "d" * 64 + "/mesh.glb"
    mallory.post("/gradio_api/upload", params={"name": mesh}, content=b"x")
    assert join(mallory, mesh, "/srv/var/gradio/" + "a" * 64 + "/toy.png").status_code == 200
    assert join(alice, mesh).status_code == 403
    assert mallory.post("/gradio_api/queue/join", content=b"[" * 100_000).status_code == 200   # no JSON: no file


# -- a served app --------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    var = tmp_path_factory.mktemp("owned")
    leftover = var / "gradio" / ("c" * 64) / "someones-photo.png"   # a crashed server's upload
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"left behind")
    for base, ctx, fns in serve_with_fake_pool(var, {}):
        yield SimpleNamespace(base=base, ctx=ctx, var=var, leftover=leftover, fns=fns)


def _browser(served) -> httpx.Client:
    client = httpx.Client(base_url=served.base, timeout=60)
    assert client.get("/").status_code == 200 and client.cookies.get(browser.BROWSER_COOKIE)
    return client


def _fetched_by(served, path: str, owner: httpx.Client, other: httpx.Client) -> tuple[int, int, int, bytes]:
    """(owner's status, another browser's, a cookie-less client's, the owner's bytes)."""
    url = "/gradio_api/file=" + path
    mine = owner.get(url)
    return mine.status_code, other.get(url).status_code, httpx.get(served.base + url).status_code, mine.content


def test_a_restarted_server_starts_with_gradios_folder_empty(served):
    assert not served.leftover.exists() and not served.leftover.parent.exists()


def test_the_pages_upload_and_working_copy_reach_their_browser_only(served):
    alice, bob = _browser(served), _browser(served)
    rgb = make_object_image(256, "blob", seed=5)[0]
    png = _png(rgb)
    r = alice.post("/gradio_api/upload", files={"files": ("alices-photo.png", png, "image/png")})
    uploaded = r.json()[0]
    tab = Tab(alice, served.fns, "filetab0001")
    code, msg = tab.call("kiln-upload:upload", [{"path": uploaded, "orig_name": "alices-photo.png",
                                                 "meta": {"_type": "gradio.FileData"}}])
    assert code == 200 and msg["success"], msg
    working = msg["output"]["data"][0]["path"]     # the canvas before a click: the working copy
    code, msg = tab.click(128, 128)                                # ... and with a selection
    selected = msg["output"]["data"][0]["path"]
    assert len({uploaded, working, selected}) == 3

    mine, other, anon, data = _fetched_by(served, uploaded, alice, bob)
    assert (mine, other, anon) == (200, 403, 403) and data == png
    for path in (working, selected):
        mine, other, anon, data = _fetched_by(served, path, alice, bob)
        assert (mine, other, anon) == (200, 403, 403), path
        assert Image.open(io.BytesIO(data)).size == (256, 256)
    seen = np.asarray(Image.open(io.BytesIO(_fetched_by(served, working, alice, bob)[3])), np.int16)
    assert np.abs(seen - rgb).mean() < 4, "the working copy, as a JPEG"
    # other spellings of the same files, and Gradio's deprecated route
    for path in (uploaded, selected):
        twisted = path.replace("/gradio/", "/gradio/./").replace(Path(path).parent.name, Path(path).parent.name + "/../"
                                                                 + Path(path).parent.name)
        for url in ("/gradio_api/file=" + twisted, "/gradio_api/file/" + path):
            assert alice.get(url).status_code == 200 and bob.get(url).status_code == 403, url
    # nor can Bob have it shown or used by naming it as an input: the page's upload event, the API
    given = {"path": uploaded, "orig_name": "x.png", "meta": {"_type": "gradio.FileData"}}
    assert Tab(bob, served.fns, "bobtab0001").call("kiln-upload:upload", [given])[0] == 403
    assert bob.post("/gradio_api/call/upload_image", json={"data": [given, None, True]}).status_code == 403
    assert alice.post("/gradio_api/call/upload_image", json={"data": [given, None, True]}).status_code == 200
    # Bob's own upload of other bytes is his alone
    theirs = bob.post("/gradio_api/upload", files={"files": ("bobs.png", _png(rgb[::-1].copy()), "image/png")}).json()[0]
    assert _fetched_by(served, theirs, bob, alice)[:3] == (200, 403, 403)
    served.ctx.sessions.drop(browser.session_name(alice.cookies.get(browser.BROWSER_COOKIE), "filetab0001"))


def test_an_api_clients_upload_is_its_own(served, tmp_path):
    from gradio_client import Client, handle_file

    photo = tmp_path / "api-photo.png"
    Image.fromarray(make_object_image(160, "blob", seed=6)[0]).save(photo)
    mine = Client(served.base, verbose=False, download_files=str(tmp_path / "mine"))
    other = Client(served.base, verbose=False, download_files=str(tmp_path / "other"))
    try:
        info = mine.predict(handle_file(str(photo)), api_name="/upload_image")
        assert info["image"] == "api-photo.png"
        stored, = (served.var / "gradio").glob("*/api-photo.png")
        url = served.base + "/gradio_api/file=" + str(stored)
        got = httpx.get(url, cookies=mine.cookies)
        assert got.status_code == 200 and got.content == photo.read_bytes()
        assert httpx.get(url, cookies=other.cookies).status_code == 403
        assert httpx.get(url).status_code == 403
    finally:
        mine.close()
        other.close()
