"""Sessions of the web UI: a tab's state is keyed by the browser cookie and the tab, kept on
disk, limited per client and in total; a served app refuses another browser's tab, needs the
login on every route, says nosniff, and shows no server paths."""

from __future__ import annotations

import dataclasses
import io
import json
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from PIL import Image

from app.web.server import browser
from app.web.photo import form
from app.web.state import history
from app.web.server import usertext
from app.web.photo import selection
from app.web.page import status_line as statusview
from app.web.state import uploads
from app.web.state.sessions import WORK_BYTES_MAX, SessionLimits, SessionStore
from kiln.settings import load
from synthetic import make_object_image

APP = load().app


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def blob_png():
    rgb, _ = make_object_image(256, "blob", seed=3)
    return _png(rgb)


# -- the store ------------------------------------------------------------------

def test_a_sessions_image_lives_on_disk_and_full_size_is_decoded_again_for_a_job(tmp_path):
    big = np.zeros((3000, 4000, 3), np.uint8)
    big[1000:2000, 1500:2500] = (200, 60, 40)
    store = SessionStore(tmp_path / "s", SessionLimits())
    st = uploads.load_upload(_png(big), APP)
    assert st.image.work.shape == (768, 1024, 3) and st.image.size == (3000, 4000)
    st = selection.add_click(st, 512, 384, False, _Seg())
    store.put("web-a-1", "10.0.0.1", st)
    rec = store._records["web-a-1"]
    assert rec.image.work.size == 0 and rec.image.work_alpha is None   # nothing decoded in memory
    assert isinstance(rec.image.source, Path) and rec.image.source.read_bytes() == st.image.source
    back = store.get("web-a-1")
    assert np.array_equal(back.image.work, st.image.work) and np.array_equal(back.mask, st.mask)
    rgb, mask = form.job_inputs(back)
    assert rgb.shape == (3000, 4000, 3) and mask.shape == (3000, 4000)
    assert np.array_equal(rgb, big)
    # the record stays small whatever the image decodes to
    assert store.usage()["bytes"] < len(st.image.source) + WORK_BYTES_MAX


class _Seg:
    """A segmenter stand-in: the object is where the image is not black."""

    def segment(self, work, clicks):
        return work.max(axis=2) > 0

    def prepare(self, work):
        pass


def test_limits_per_client_and_in_total_refuse_politely_before_decoding(tmp_path, blob_png):
    mb = 1024 * 1024
    store = SessionStore(tmp_path / "s", SessionLimits(max_sessions=3, max_sessions_per_client=2,
                                                       max_bytes=64 * mb, max_bytes_per_client=32 * mb))
    st = uploads.load_upload(blob_png, APP)
    store.put("web-a-1", "1.1.1.1", st)
    store.put("web-a-2", "1.1.1.1", st)
    with pytest.raises(usertext.UIError, match=r"already has 2 tabs with an image .*limit is 2"):
        store.admit("web-a-3", "1.1.1.1", len(blob_png))
    store.admit("web-a-1", "1.1.1.1", len(blob_png))      # replacing its own image is fine
    with pytest.raises(usertext.UIError, match="more than the 32 MB allowed"):
        store.admit("web-b-1", "2.2.2.2", 40 * mb)
    store.put("web-b-1", "2.2.2.2", st)
    with pytest.raises(usertext.UIError, match="holding images for 3 tabs, its limit"):
        store.admit("web-c-1", "3.3.3.3", len(blob_png))
    with pytest.raises(usertext.UIError, match="holding images for 3 tabs"):
        store.put("web-c-1", "3.3.3.3", st)             # checked again when it is kept
    assert store.usage()["sessions"] == 3 and store.get("web-c-1").image is None
    store.drop("web-a-1")                               # a tab closed
    store.admit("web-c-1", "3.3.3.3", len(blob_png))
    assert len(list((tmp_path / "s").iterdir())) == 2   # the dropped tab's files are gone


def _tab(browser_token: str, tab: str) -> str:
    return browser.session_name(browser_token, tab)


A_COOKIE, B_COOKIE = "a" * 43, "b" * 43


def test_a_reloaded_page_takes_over_the_closed_tabs_image_clicks_and_mask(tmp_path, blob_png):
    store = SessionStore(tmp_path / "s", SessionLimits())
    old, new = _tab(A_COOKIE, "tab-1"), _tab(A_COOKIE, "tab-2")
    st = selection.add_click(uploads.load_upload(blob_png, APP, name="horse.png"), 128, 128, False, _Seg())
    st = uploads.set_show_mask(st, False)
    store.put(old, "1.1.1.1", st)
    store.park(old)                                     # the old page's close came first
    assert store.get(old).image is None and store.usage() | {"bytes": 0} == \
        {"sessions": 0, "parked": 1, "bytes": 0, "clients": {}}
    back = store.adopt(new, "1.1.1.1")
    assert back.image.name == "horse.png" and back.clicks == st.clicks and not back.show_mask
    assert np.array_equal(back.mask, st.mask) and np.array_equal(back.image.work, st.image.work)
    assert store.usage()["parked"] == 0 and len(list((tmp_path / "s").iterdir())) == 1   # moved, not copied
    assert back.image.full()[0].shape[:2] == st.image.size   # the full-size upload came along
    # a page that already has an image keeps it
    other = uploads.load_upload(_png(np.full((64, 64, 3), 9, np.uint8)), APP, name="other.png")
    store.put(_tab(A_COOKIE, "tab-3"), "1.1.1.1", other)
    store.park(new)
    assert store.adopt(_tab(A_COOKIE, "tab-3"), "1.1.1.1").image.name == "other.png"
    # the person removes the image: a reload brings back nothing
    store.drop(_tab(A_COOKIE, "tab-3"))
    assert store.usage()["parked"] == 0 and store.adopt(_tab(A_COOKIE, "tab-4"), "1.1.1.1").image is None


def test_a_page_loaded_before_the_old_tab_closed_gets_a_copy_it_can_change_alone(tmp_path, blob_png):
    store = SessionStore(tmp_path / "s", SessionLimits())
    old, new = _tab(A_COOKIE, "tab-1"), _tab(A_COOKIE, "tab-2")
    st = selection.add_click(uploads.load_upload(blob_png, APP, name="horse.png"), 128, 128, False, _Seg())
    store.put(old, "1.1.1.1", st)
    copy = store.adopt(new, "1.1.1.1")                  # the reload's load came first
    assert copy.image.name == "horse.png" and np.array_equal(copy.mask, st.mask)
    store.put(new, "1.1.1.1", dataclasses.replace(copy, mask=~copy.mask, clicks=()))
    assert np.array_equal(store.get(old).mask, st.mask)          # the original is untouched
    assert np.array_equal(store.get(new).mask, ~st.mask)
    store.drop(old)                                     # the old tab's files go, the copy's stay
    assert store.get(new).image.full()[0].shape[:2] == st.image.size


def test_nothing_passes_between_browsers_or_to_cookie_less_pages(tmp_path, blob_png):
    store = SessionStore(tmp_path / "s", SessionLimits())
    st = uploads.load_upload(blob_png, APP, name="horse.png")
    a = _tab(A_COOKIE, "tab-1")
    store.put(a, "1.1.1.1", st)
    assert store.adopt(_tab(B_COOKIE, "tab-1"), "1.1.1.1").image is None
    store.park(a)
    assert store.adopt(_tab(B_COOKIE, "tab-2"), "1.1.1.1").image is None
    assert store.adopt(_tab(None, "tab-1"), "1.1.1.1").image is None
    anon = _tab(None, "tab-9")
    store.put(anon, "1.1.1.1", st)
    store.park(anon)                                    # no browser to keep it for: freed
    assert store.usage()["parked"] == 1 and store.adopt(_tab(None, "tab-9"), "1.1.1.1").image is None


def test_parked_states_give_way_to_new_uploads_and_are_not_tabs(tmp_path, blob_png):
    st = uploads.load_upload(blob_png, APP)
    one = SessionStore(tmp_path / "probe", SessionLimits())
    one.put("web-x-1", "c", st)
    size = one.usage()["bytes"]
    store = SessionStore(tmp_path / "s", SessionLimits(max_sessions_per_client=1,
                                                       max_bytes_per_client=int(1.5 * size)))
    for i, cookie in enumerate((A_COOKIE, B_COOKIE)):
        store.put(_tab(cookie, "t"), "1.1.1.1", st)
        store.park(_tab(cookie, "t"))
        assert store.usage()["parked"] == 1             # the older browser's gave way
    store.put(_tab(A_COOKIE, "u"), "1.1.1.1", st)       # one tab, one parked: over the bytes
    assert store.usage()["parked"] == 0 and store.usage()["sessions"] == 1


def test_unused_sessions_expire(tmp_path, blob_png):
    now = [0.0]
    store = SessionStore(tmp_path / "s", SessionLimits(ttl_s=60), clock=lambda: now[0])
    store.put("web-a-1", "1.1.1.1", uploads.load_upload(blob_png, APP))
    now[0] = 50
    assert store.get("web-a-1").image is not None       # using it keeps it
    now[0] = 100
    assert store.usage()["sessions"] == 1
    now[0] = 111
    assert store.usage()["sessions"] == 0 and store.get("web-a-1").image is None


def test_edits_of_one_session_run_one_at_a_time(tmp_path, blob_png):
    store = SessionStore(tmp_path / "s", SessionLimits())
    store.put("web-a-1", "c", uploads.load_upload(blob_png, APP))
    inside, overlap = [0], []

    def click(i):
        with store.edit("web-a-1", "c") as (st, save):
            inside[0] += 1
            overlap.append(inside[0])
            time.sleep(0.01)   # widen the window a lost update would need
            save(uploads.SessionState(st.image, st.clicks + ((float(i), 1.0, 1),), st.mask, st.use_alpha))
            inside[0] -= 1

    threads = [threading.Thread(target=click, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(overlap) == 1 and len(store.get("web-a-1").clicks) == 8


def test_public_text_cuts_absolute_paths():
    assert usertext.public_text("see /srv/kiln/var/workers/worker-0.log for more") == "see worker-0.log for more"
    assert usertext.public_text("No such file: '/tmp/x/gradio/abc/kiln-1.glb'") == "No such file: 'kiln-1.glb'"
    assert usertext.public_text("ratio 1/2, http://host/a/b") == "ratio 1/2, http://host/a/b"
    st = SimpleNamespace(id="j", state="failed", stage="uv", progress=0.5, error="stage 'uv' failed: "
                         "OSError: [Errno 28] No space left on device: '/srv/var/jobs/web-x/j/out.tmp'",
                         message="", timings={}, stats={}, created=0)
    assert "/srv" not in statusview.progress_html(st) and "out.tmp" in statusview.progress_html(st)
    assert "/srv" not in history.history_html([st]) and "out.tmp" in history.history_html([st])


# -- a served app ---------------------------------------------------------------

class _FakeSup:
    """What AppContext and the handlers use of a supervisor; records submitted jobs."""

    def __init__(self):
        self.submitted = []

    def start(self):
        return self

    def capabilities(self):
        return {"device": "cpu"}

    def shutdown(self):
        pass

    def jobs(self, session=None):
        return []

    def queue_length(self):
        return 0

    def submit(self, rgb, mask, settings, session):
        self.submitted.append(session)
        raise RuntimeError("the test pool runs no jobs (see /srv/secret/var/jobs)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import os

    from app.web.server.context import AppContext
    from app.segment.segment import GrabCutSegmenter, SegmenterChoice
    from app.web.server.launch import launch

    var = tmp_path_factory.mktemp("served")
    old_tmp = os.environ.get("GRADIO_TEMP_DIR")
    settings = load(None, {"app.jobs_dir": str(var / "jobs"), "app.cache_dir": str(var / "cache"),
                           "app.max_sessions_per_client": 3})
    sup = _FakeSup()
    ctx = AppContext(settings, var / "gradio", supervisor_factory=lambda: sup,
                     segmenter_loader=lambda: SegmenterChoice(GrabCutSegmenter(), "GrabCut", "test"))
    ctx.start(wait=True)
    port = _free_port()
    demo, ctx, url = launch(settings, port=port, block=False, examples=False, context=ctx)
    try:
        yield SimpleNamespace(base=f"http://127.0.0.1:{port}", ctx=ctx, sup=sup, var=var,
                              fns=_fn_indices(httpx.get(f"http://127.0.0.1:{port}/config").json()))
    finally:
        demo.close()
        if old_tmp is None:
            os.environ.pop("GRADIO_TEMP_DIR", None)
        else:
            os.environ["GRADIO_TEMP_DIR"] = old_tmp


def _fn_indices(config: dict) -> dict:
    """'elem_id:event' -> (fn_index, component id), from Gradio's page config."""
    ids = {c["id"]: c["props"].get("elem_id") for c in config["components"]}
    out = {}
    for dep in config["dependencies"]:
        for comp, event in dep["targets"]:
            if comp is not None:
                out.setdefault(f"{ids.get(comp)}:{event}", (dep["id"], comp))
    return out


def serve_with_fake_pool(var: Path, overrides: dict):
    """The app served in this process on a free port around a supervisor stand-in, with
    settings ``overrides`` (the job store and cache under ``var``); yields (base URL, context,
    page event indices), then closes it and puts back the environment ``launch`` set."""
    import os

    from app.segment.segment import GrabCutSegmenter, SegmenterChoice
    from app.web.server.context import AppContext
    from app.web.server.launch import launch

    saved = {k: os.environ.get(k) for k in ("GRADIO_TEMP_DIR", "FORWARDED_ALLOW_IPS")}
    settings = load(None, {"app.jobs_dir": str(var / "jobs"), "app.cache_dir": str(var / "cache"), **overrides})
    ctx = AppContext(settings, var / "gradio", supervisor_factory=_FakeSup,
                     segmenter_loader=lambda: SegmenterChoice(GrabCutSegmenter(), "GrabCut", "test"))
    ctx.start(wait=True)
    port = _free_port()
    demo, ctx, _ = launch(settings, port=port, block=False, examples=False, context=ctx)
    base = f"http://127.0.0.1:{port}"
    try:
        yield base, ctx, _fn_indices(httpx.get(base + "/config").json())
    finally:
        demo.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Tab:
    """One browser tab speaking Gradio's queue protocol over HTTP."""

    def __init__(self, client: httpx.Client, fns: dict, session_hash: str):
        self.client, self.fns, self.hash = client, fns, session_hash

    def call(self, target: str, data: list, event_data=None, timeout: float = 60.0):
        """(HTTP status, the completed message or None)."""
        fn, comp = self.fns[target]
        r = self.client.post("/gradio_api/queue/join", json={
            "data": data, "fn_index": fn, "trigger_id": comp, "session_hash": self.hash,
            "event_data": event_data})
        if r.status_code != 200:
            return r.status_code, None
        event_id = r.json()["event_id"]
        with self.client.stream("GET", "/gradio_api/queue/data", params={"session_hash": self.hash},
                                timeout=timeout) as stream:
            if stream.status_code != 200:
                return stream.status_code, None
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                msg = json.loads(line[5:])
                if msg.get("msg") == "process_completed" and msg.get("event_id") == event_id:
                    return 200, msg
        return 0, None

    def upload(self, name: str, data: bytes):
        r = self.client.post("/gradio_api/upload", files={"files": (name, data, "image/png")})
        assert r.status_code == 200, r.text
        return self.call("kiln-upload:upload", [{"path": r.json()[0], "orig_name": name,
                                                  "meta": {"_type": "gradio.FileData"}}])

    def click(self, x, y):
        return self.call("kiln-canvas:select", [False], event_data={"index": [x, y], "value": None})


def _browser(served) -> httpx.Client:
    client = httpx.Client(base_url=served.base, timeout=60)
    assert client.get("/").status_code == 200 and client.cookies.get(browser.BROWSER_COOKIE)
    return client


def _settings_form(served):
    s = served.ctx.settings
    return [s.bake.enabled, s.mesh.simplify_ratio, s.bake.texture_size, s.views.count, s.bake.mode,
            s.seed, s.export.gaussians_ply, [f for f in s.export.formats if f != "glb"],
            s.export.texture_format, s.export.units, s.mesh.faces]   # GenerateForm's fields, in order


def test_another_browser_sending_a_tabs_session_hash_gets_nothing_of_it(served, blob_png, monkeypatch):
    alice_browser, mallory_browser = _browser(served), _browser(served)
    alice = Tab(alice_browser, served.fns, "alicetab0001")
    code, msg = alice.upload("blob.png", blob_png)
    assert code == 200 and msg["success"], msg
    code, msg = alice.click(128, 128)
    assert code == 200 and msg["success"]
    alice_session = browser.session_name(alice_browser.cookies.get(browser.BROWSER_COOKIE), "alicetab0001")
    assert served.ctx.sessions.get(alice_session).mask.any()

    # Mallory (her own cookie) learned Alice's tab hash: every use of it is refused
    stolen = Tab(mallory_browser, served.fns, "alicetab0001")
    assert stolen.call("kiln-clear:click", [])[0] == 403
    assert stolen.click(10, 10)[0] == 403
    assert stolen.call("kiln-generate:click", _settings_form(served))[0] == 403
    c = mallory_browser
    assert c.get("/gradio_api/queue/data", params={"session_hash": "alicetab0001"}).status_code == 403
    assert c.post("/gradio_api/cancel", json={"session_hash": "alicetab0001", "fn_index": 7,
                                              "event_id": "x"}).status_code == 403
    assert c.get("/gradio_api/heartbeat/alicetab0001").status_code == 403
    assert c.get("/gradio_api/deep_link", params={"session_hash": "alicetab0001"}).status_code == 403
    assert c.post("/gradio_api/run/predict", json={"data": [], "fn_index": 8,
                                                   "session_hash": "alicetab0001"}).status_code == 403

    # Second layer: even if the hash check were gone, state is keyed by cookie + tab, so the
    # stolen hash lands in a session of Mallory's own: empty.
    from app.web.server.launch import TabBindings

    monkeypatch.setattr(TabBindings, "claim", lambda self, h, b: True)
    code, msg = stolen.call("kiln-clear:click", [])
    assert code == 200 and msg["output"]["data"][0] is None           # no image to see
    assert "Upload an image" in json.dumps(msg["output"]["data"][1])
    code, msg = stolen.call("kiln-generate:click", _settings_form(served))
    assert code == 200 and not msg["success"] and "Upload an image first" in json.dumps(msg)
    code, msg = stolen.click(128, 128)
    assert code == 200 and msg["output"]["data"][0] is None
    monkeypatch.undo()

    # Alice's tab is untouched, nothing ran for Mallory
    st = served.ctx.sessions.get(alice_session)
    assert st.image is not None and st.mask is not None and st.mask.any() and len(st.clicks) == 1
    assert not any("alicetab" in s or s != alice_session for s in served.sup.submitted)
    code, msg = alice.call("kiln-generate:click", _settings_form(served))
    assert code == 200 and msg["success"], msg   # her own Generate still passes its check


def test_per_client_tab_limit_is_refused_politely_and_the_server_keeps_answering(served, blob_png):
    browser = _browser(served)
    limit = served.ctx.settings.app.max_sessions_per_client
    before = served.ctx.sessions.usage()["clients"].get("127.0.0.1", 0)
    results = []
    for i in range(limit - before + 2):
        results.append(Tab(browser, served.fns, f"limittab{i:04d}").upload("b.png", blob_png))
    refused = [msg for code, msg in results if "Cannot use this file" in json.dumps(msg)]
    assert len(refused) == 2 and "tabs with an image open" in json.dumps(refused[0])
    assert served.ctx.sessions.usage()["clients"]["127.0.0.1"] == limit
    assert browser.get("/").status_code == 200
    for name in list(served.ctx.sessions._records):   # the tabs close
        served.ctx.sessions.drop(name)


def test_served_files_say_nosniff_and_errors_show_no_server_paths(served, blob_png):
    browser = _browser(served)
    r = browser.post("/gradio_api/upload", files={"files": ("x.png", blob_png, "image/png")})
    path = r.json()[0]
    assert r.headers["x-content-type-options"] == "nosniff"
    f = browser.get("/gradio_api/file=" + path)
    assert f.status_code == 200 and f.headers["x-content-type-options"] == "nosniff"
    assert browser.get("/").headers["x-content-type-options"] == "nosniff"
    # a refused upload and a job the pool cannot start: the reasons, without server paths
    tab = Tab(browser, served.fns, "pathtab0001")
    code, msg = tab.upload("broken.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    assert "Cannot use this file" in json.dumps(msg)
    tab.upload("blob.png", blob_png)
    tab.click(128, 128)
    code, msg = tab.call("kiln-generate:click", _settings_form(served))
    assert msg["success"]
    fn, _ = served.fns["kiln-generate:click"]
    r = browser.post("/gradio_api/queue/join", json={"data": _settings_form(served), "fn_index": fn + 1,
                                                     "session_hash": "pathtab0001", "trigger_id": None})
    texts = []
    with browser.stream("GET", "/gradio_api/queue/data", params={"session_hash": "pathtab0001"}) as s:
        for line in s.iter_lines():
            texts.append(line)
            if '"process_completed"' in line:
                break
    joined = "\n".join(texts)
    assert "Could not start the job: RuntimeError: the test pool runs no jobs" in joined or \
        "Could not start the job" in joined, joined[-2000:]
    assert "/srv/secret" not in joined and str(served.var) not in joined


def test_under_auth_every_route_needs_the_login(tmp_path):
    import os

    from app.web.server.context import AppContext
    from app.segment.segment import GrabCutSegmenter, SegmenterChoice
    from app.web.server.launch import launch

    old_tmp = os.environ.get("GRADIO_TEMP_DIR")
    settings = load(None, {"app.jobs_dir": str(tmp_path / "jobs"), "app.cache_dir": str(tmp_path / "cache")})
    ctx = AppContext(settings, tmp_path / "gradio", supervisor_factory=_FakeSup,
                     segmenter_loader=lambda: SegmenterChoice(GrabCutSegmenter(), "GrabCut", "test"))
    ctx.start(wait=True)
    port = _free_port()
    demo, ctx, url = launch(settings, port=port, block=False, examples=False, context=ctx,
                            auth=("kiln", "secret-pass"))
    try:
        anon = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        assert anon.get("/").status_code == 200               # the login page
        open_before = {
            "cancel": anon.post("/gradio_api/cancel", json={"session_hash": "t", "fn_index": 0,
                                                            "event_id": "e"}),
            "heartbeat": anon.get("/gradio_api/heartbeat/t"),
            "reset": anon.post("/gradio_api/reset", json={"event_id": "e"}),
            "monitoring": anon.get("/monitoring/anything"),
            "stream": anon.post("/gradio_api/stream/e/close"),
            "config": anon.get("/config"),
            "queue_join": anon.post("/gradio_api/queue/join", json={"fn_index": 0, "data": [],
                                                                    "session_hash": "t"}),
            "upload": anon.post("/gradio_api/upload", files={"files": ("a.png", b"x", "image/png")}),
        }
        assert {k: r.status_code for k, r in open_before.items()} == dict.fromkeys(open_before, 401)
        login = anon.post("/login", data={"username": "kiln", "password": "secret-pass"})
        assert login.status_code == 200, login.text
        assert anon.post("/gradio_api/cancel", json={"session_hash": "t", "fn_index": 0,
                                                     "event_id": "e"}).status_code == 200
        assert anon.get("/config").status_code == 200
        wrong = httpx.Client(base_url=f"http://127.0.0.1:{port}")
        assert wrong.post("/login", data={"username": "kiln", "password": "nope"}).status_code != 200
        assert wrong.post("/gradio_api/cancel", json={"session_hash": "u", "fn_index": 0,
                                                      "event_id": "e"}).status_code == 401
    finally:
        demo.close()
        if old_tmp is None:
            os.environ.pop("GRADIO_TEMP_DIR", None)
        else:
            os.environ["GRADIO_TEMP_DIR"] = old_tmp
