"""The web UI's handlers without a browser: uploads, clicks -> mask, settings -> job,
errors shown to the person, results only for their own session, safe server flags."""

from __future__ import annotations

import io
from dataclasses import replace
import logging
import time
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from app.web.state import tab_jobs as active
from app.web.server import browser
from app.web.photo import form
from app.web.state import history
from app.web.state import browser_jobs as jobs
from app.web.server import usertext
from app.web.server import results
from app.web.photo import selection
from app.web.page import status_line as statusview
from app.web.state import uploads
from app.segment.segment import GrabCutSegmenter, box_mask, image_key, keep_clicked_components
from kiln.records import Capabilities, JobStats, PipelineStats
from kiln.settings import AppSettings, Settings
from synthetic import make_object_image
from worker.jobs.jobstore import JobStatus

APP = AppSettings()
# the form's values in GenerateForm's order: bake_texture, simplify, texture, views, mode, seed, ply
FORM = (False, 0.95, 512, 8, "fast", 0, False)


def _png(arr: np.ndarray, mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr, mode).save(buf, format="PNG")
    return buf.getvalue()


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max(1, (a | b).sum()))


@pytest.fixture(scope="module")
def seg():
    return GrabCutSegmenter()


@pytest.fixture(scope="module")
def blob():
    rgb, mask = make_object_image(256, "blob", seed=3)
    return rgb, mask


def test_click_on_object_gives_its_mask(seg, blob):
    rgb, gt = blob
    st = uploads.load_upload(_png(rgb), APP, name="blob.png")
    assert st.image.work.shape == (256, 256, 3) and st.mask is None and not st.use_alpha
    st = selection.add_click(st, 128, 128, background=False, segmenter=seg)
    assert st.mask.dtype == bool and st.mask.shape == gt.shape
    assert _iou(st.mask, gt) > 0.9
    rgb_in, mask_in = form.job_inputs(st)
    assert rgb_in.shape == (256, 256, 3) and mask_in.dtype == bool
    assert np.array_equal(mask_in, st.mask)


def test_same_clicks_same_mask(seg, blob):
    """The worker's reconstruction cache is keyed by the mask: re-segmenting must be stable."""
    rgb, _ = blob
    a = seg.segment(rgb, [(128, 128, 1)])
    b = seg.segment(rgb, [(128, 128, 1)])
    assert np.array_equal(a, b)


def test_background_click_removes_pixels_and_undo_restores(seg, blob):
    rgb, gt = blob
    st = selection.add_click(uploads.load_upload(_png(rgb), APP), 128, 128, False, seg)
    before = st.mask.copy()
    ys, xs = np.nonzero(gt & before)
    # a point inside the object, away from the object click
    far = np.argmax((xs - 128) ** 2 + (ys - 128) ** 2)
    bx, by = int(xs[far] * 0.7 + 128 * 0.3), int(ys[far] * 0.7 + 128 * 0.3)
    assert before[by, bx]
    st2 = selection.add_click(st, bx, by, background=True, segmenter=seg)
    assert st2.clicks[-1] == (bx, by, 0)
    assert not st2.mask[by, bx], "a background click must leave its pixel out of the mask"
    assert st2.mask.sum() < before.sum()
    st3 = selection.undo_click(st2, seg)
    assert st3.clicks == st.clicks and np.array_equal(st3.mask, before)
    st4 = selection.clear_clicks(st3)
    assert st4.clicks == () and st4.mask is None
    with pytest.raises(usertext.UIError, match="select the object"):
        form.job_inputs(st4)


def test_only_background_clicks_select_nothing(seg, blob):
    st = selection.add_click(uploads.load_upload(_png(blob[0]), APP), 5, 5, background=True, segmenter=seg)
    assert st.mask is None and st.clicks == ((5.0, 5.0, 0),)


def test_click_without_image_and_outside_image(seg, blob):
    with pytest.raises(usertext.UIError, match="upload an image first"):
        selection.add_click(uploads.SessionState(), 3, 3, False, seg)
    st = uploads.load_upload(_png(blob[0]), APP)
    with pytest.raises(usertext.UIError, match="outside"):
        selection.add_click(st, 900, 10, False, seg)


def test_alpha_is_the_mask_until_clicked(seg):
    rgb, gt = make_object_image(200, "ellipse")
    rgba = np.dstack([rgb, gt.astype(np.uint8) * 255])
    st = uploads.load_upload(_png(rgba, "RGBA"), APP, name="cut.png")
    assert st.use_alpha and st.image.has_alpha
    assert np.array_equal(form.job_inputs(st)[1], gt)
    clicked = selection.add_click(st, 100, 100, False, seg)
    assert not clicked.use_alpha and clicked.clicks == ((100.0, 100.0, 1),)
    back = uploads.set_use_alpha(clicked, True)
    assert back.use_alpha and np.array_equal(form.full_mask(back), gt)
    off = uploads.set_use_alpha(back, False)
    assert not off.use_alpha
    # an opaque image offers no alpha mode
    opaque = uploads.set_use_alpha(uploads.load_upload(_png(rgb), APP), True)
    assert not opaque.use_alpha


def test_large_upload_is_segmented_small_and_masked_full_size(seg):
    rgb, gt = make_object_image(512, "ellipse")
    big = np.asarray(Image.fromarray(rgb).resize((2048, 1536), Image.NEAREST))
    gt_big = np.asarray(Image.fromarray(gt).resize((2048, 1536), Image.NEAREST))
    st = uploads.load_upload(_png(big), APP)
    assert st.image.work.shape == (768, 1024, 3) and st.image.size == (1536, 2048)
    st = selection.add_click(st, 512, 384, False, seg)
    assert st.mask.shape == (768, 1024)
    rgb_full, mask_full = form.job_inputs(st)
    assert rgb_full.shape == (1536, 2048, 3) and mask_full.shape == (1536, 2048)
    assert _iou(mask_full, gt_big) > 0.9


@pytest.mark.parametrize("payload,settings,match", [
    (b"GIF89a but then nothing useful", APP, "not an image|could not be opened|corrupt"),
    (b"plain text" * 50, APP, "not an image"),
    (_png(np.zeros((300, 300, 3), np.uint8)), AppSettings(max_pixels=65536), "90,000 pixels; the limit is 65,536"),
    (_png(np.random.default_rng(0).integers(0, 255, (800, 800, 3), dtype=np.uint8)),
     AppSettings(max_upload_mb=1), "limit is 1.0 MB"),
    (_png(np.zeros((8, 40, 3), np.uint8)), APP, "at least 16 pixels"),
])
def test_bad_uploads_are_refused_with_a_reason(payload, settings, match):
    with pytest.raises(usertext.UIError, match=match):
        uploads.load_upload(payload, settings)


def test_upload_by_path_honours_exif_and_cmyk(tmp_path):
    img = Image.new("CMYK", (40, 20), (0, 255, 255, 0))
    exif = Image.Exif()
    exif[0x0112] = 6
    p = tmp_path / "phone.jpg"
    img.save(p, format="JPEG", exif=exif.tobytes())
    st = uploads.load_upload(str(p), APP)
    assert st.image.name == "phone.jpg"
    rgb = st.image.full()[0]
    assert st.image.size == (40, 20) and rgb.shape == (40, 20, 3)   # rotated upright
    assert rgb[20, 10, 0] > 200 and rgb[20, 10, 1] < 60


def test_overlay_shows_mask_and_clicks(seg, blob):
    rgb, _ = blob
    st = uploads.load_upload(_png(rgb), APP)
    plain = selection.render_overlay(st)
    assert np.array_equal(plain, st.image.work)
    st = selection.add_click(st, 128, 128, False, seg)
    st = selection.add_click(st, 10, 10, True, seg)
    ov = selection.render_overlay(st)
    assert ov.shape == rgb.shape and ov.dtype == np.uint8
    # the object keeps the photo's colours exactly (away from the click dots), the
    # background is dimmed, the edge is drawn outside the object, dots green / red
    assert ov[30, 240].sum() < 0.5 * rgb[30, 240].sum()
    away = np.hypot(*np.mgrid[0:256, 0:256] - 128) > 20
    away &= np.hypot(*np.mgrid[0:256, 0:256] - 10) > 20
    assert np.array_equal(ov[st.mask & away], rgb[st.mask & away])
    import cv2
    def grown(r):
        return cv2.dilate(st.mask.astype(np.uint8), np.ones((2 * r + 1, 2 * r + 1), np.uint8)).astype(bool)
    # a light line right at the edge with a dark one around it: the edge reads on any background
    light, dark = ov[grown(1) & ~st.mask & away], ov[grown(2) & ~grown(1) & away]
    assert (light.min(1) > 225).mean() > 0.8 and (dark.max(1) < 30).mean() > 0.6
    photo_alone = selection.render_overlay(uploads.set_show_mask(st, False))
    assert np.array_equal(photo_alone, st.image.work)
    g = ov[128, 128]
    assert g[1] > 150 and g[0] < 120
    r = ov[10, 10]
    assert r[0] > 150 and r[1] < 120
    assert selection.render_overlay(uploads.SessionState()) is None
    assert "Mask:" in selection.mask_summary(st) and "1 object / 1 background" in selection.mask_summary(st)


def test_keep_clicked_components_drops_islands():
    m = np.zeros((50, 50), bool)
    m[5:15, 5:15] = True
    m[30:40, 30:40] = True
    kept = keep_clicked_components(m, [(10, 10, 1)])
    assert kept[10, 10] and not kept[35, 35]
    assert keep_clicked_components(m, [(45, 2, 1)]).sum() == m.sum()


def test_settings_from_the_form():
    base = Settings()
    ov = form.GenerateForm(False, 0.97, "512", 8, "fast", 3, True).overrides()
    s = form.job_settings(base, ov)
    assert (s.bake.enabled, s.mesh.simplify_ratio, s.bake.texture_size, s.views.count,
            s.bake.mode, s.seed, s.export.gaussians_ply) == (False, 0.97, 512, 8, "fast", 3, True)
    # everything else stays as configured
    assert s.reconstruct == base.reconstruct and s.worker == base.worker
    assert "vertex colours" in jobs.settings_summary(s) and "+ply" in jobs.settings_summary(s)
    with pytest.raises(usertext.UIError, match="^Simplify ratio: 1.5 is out of range"):
        form.job_settings(base, form.GenerateForm(True, 1.5, 1024, 16, "opt", 0, False).overrides())
    with pytest.raises(usertext.UIError, match="^Texture size: .*power of two"):
        form.job_settings(base, form.GenerateForm(True, 0.9, 768, 16, "opt", 0, False).overrides())
    with pytest.raises(usertext.UIError, match="^Seed: "):
        form.job_settings(base, form.GenerateForm(True, 0.9, 1024, 16, "opt", -4, False).overrides())


def test_job_inputs_refuse_empty_and_full_masks(blob):
    st = uploads.load_upload(_png(blob[0]), APP)
    tiny = np.zeros((256, 256), bool)
    tiny[0, :5] = True
    with pytest.raises(usertext.UIError, match="only 5 pixels"):
        form.job_inputs(replace(st, mask=tiny, clicks=((1, 0, 1),)))
    with pytest.raises(usertext.UIError, match="whole image"):
        form.job_inputs(replace(st, mask=np.ones((256, 256), bool), clicks=((1, 0, 1),)))


def test_progress_html_names_stage_and_escapes_reasons():
    st = JobStatus(id="20260101-000000-abcdef", session="web-a", state="running", stage="bake",
                   progress=0.42, message="step 10/40", seq=5)
    out = statusview.progress_html(st)
    assert 'data-state="running"' in out and 'data-stage="bake"' in out
    assert "Baking texture" in out and "42%" in out and "width:42.0%" in out
    failed = JobStatus(id="x", session="web-a", state="failed", stage="rasterize",
                       error="worker crashed with SIGSEGV during stage 'rasterize' <script>")
    out = statusview.progress_html(failed)
    assert "Failed: worker crashed with SIGSEGV" in out and "<script>" not in out and "&lt;script&gt;" in out
    done = JobStatus(id="x", session="web-a", state="done", progress=1.0, timings={"total_s": 12.3},
                     stats=JobStats(pipeline=PipelineStats(reconstruction_cached=True)))
    assert "Done in 12.3 s" in statusview.progress_html(done) and "reused from cache" in statusview.progress_html(done)
    both = replace(done, stats=JobStats(pipeline=PipelineStats(reconstruction_cached=True, views_cached=True)))
    assert "(reconstruction and views reused from cache)" in statusview.progress_html(both)
    # the page's hand-over and the wait in the supervisor's queue both count, each named
    waited = replace(done, timings={"total_s": 12.3, "queued_s": 2.0})
    assert "Done in 15.3 s (of which 3.0 s handing it to the server, 2.0 s waiting for a worker)" \
        in statusview.progress_html(waited, waited_s=3.0)
    assert "Done in 12.6 s (of which 2.0 s waiting for a worker)" in statusview.progress_html(waited, waited_s=0.3)
    # what "auto" chose, and a shape simplified away, are said on the done line
    auto = replace(done, stats=JobStats(pipeline=PipelineStats(texture_size_auto=2048, faces=70)))
    text = statusview.progress_html(auto)
    assert "texture 2048 px (auto)" in text and "only 70 faces: a lower simplify ratio keeps more" in text
    assert "only" not in statusview.progress_html(replace(done, stats=JobStats(pipeline=PipelineStats(faces=5000))))
    cancelled = JobStatus(id="c", session="web-a", state="cancelled", error="cancelled by user")
    assert "Cancelled by user" in statusview.progress_html(cancelled)
    assert 'data-state="idle"' in statusview.progress_html()


def test_progress_text_before_the_first_stage_and_without_repeating_the_stage():
    starting = JobStatus(id="j", session="web-a", state="running", stage=None, message="running on worker 0")
    assert "Starting — 0% — running on worker 0" in statusview.progress_html(starting)
    views = JobStatus(id="j", session="web-a", state="running", stage="render_views", progress=0.3,
                      message="render_views: view 7/48")
    assert "Rendering views — 30% — view 7/48" in statusview.progress_html(views)
    retry = JobStatus(id="j", session="web-a", state="queued",
                      message="worker crashed with SIGSEGV during stage 'bake'; retrying with safe backends")
    assert "Worker crashed with SIGSEGV" in statusview.progress_html(retry)


class _Pool:
    """The parts of AppContext that ``follow_job`` uses, around a supervisor stand-in."""

    def __init__(self, sup=None, error=None, ready=True):
        import threading

        self.sup, self.sup_error = sup, error
        self.sup_ready = threading.Event()
        if ready:
            self.sup_ready.set()
        self.active = active.ActiveJobs()
        self.summaries = {}
        self.settings = Settings()


class _Sup:
    """Jobs that advance one step per status call; records cancels."""

    def __init__(self, steps=3, refuse=None):
        self.steps, self.refuse = steps, refuse
        self.calls, self.cancelled, self.submitted = {}, [], []

    def submit(self, rgb, mask, settings, session):
        if self.refuse:
            raise self.refuse
        job = f"job{len(self.submitted)}"
        self.submitted.append((job, session))
        return self.job(job)

    def job(self, job_id):   # a worker.pool.jobhandle.Job's calls, answered by this stand-in
        return SimpleNamespace(id=job_id, status=lambda: self.status(job_id),
                               cancel=lambda timeout=5.0, reason="": self.cancel(job_id, reason))

    def status(self, job_id):
        n = self.calls[job_id] = self.calls.get(job_id, 0) + 1
        if job_id in self.cancelled:
            return JobStatus(id=job_id, session="web-a", state="cancelled", seq=n)
        state = "done" if n > self.steps else "running"
        return JobStatus(id=job_id, session="web-a", state=state, seq=n, stage="mesh")

    def cancel(self, job_id, reason=""):
        self.cancelled.append(job_id)
        self.reasons = {**getattr(self, "reasons", {}), job_id: reason}
        return True


def test_follow_job_waits_for_the_pool_then_follows_to_the_end(blob):
    import threading

    rgb, mask = blob
    ctx = _Pool(_Sup(), ready=False)
    steps = jobs.follow_job(ctx, "web-a", rgb, mask, Settings(), poll_s=0)
    assert next(steps) == (jobs.WAITING_FOR_POOL, None)   # Generate pressed while workers start
    threading.Timer(0.3, ctx.sup_ready.set).start()
    got = list(steps)
    assert all(note == jobs.WAITING_FOR_POOL for note, st in got if st is None)
    states = [st.state for _, st in got if st is not None]
    assert states == ["running"] * 3 + ["done"]
    assert ctx.sup.submitted == [("job0", "web-a")] and ctx.sup.cancelled == []
    assert ctx.active.get("web-a") == [] and "job0" in ctx.summaries


def test_follow_job_closed_early_leaves_the_job_to_the_browser_until_cancel_or_grace(blob):
    """The page went away (a reload): the job goes on for the browser's next page. Cancel
    pressed in the tab cancels it; a job no page follows is cancelled after the grace."""
    rgb, mask = blob
    ctx = _Pool(_Sup(steps=100))
    steps = jobs.follow_job(ctx, "web-a", rgb, mask, Settings(), poll_s=0)
    next(steps)
    assert ctx.active.get("web-a") == ["job0"]
    steps.close()
    assert ctx.sup.cancelled == [] and "job0" in ctx.active.followed()
    # the next page follows it: each pull counts as followed
    again = jobs.follow_existing(ctx, "web-b", "job0", poll_s=0)
    next(again)
    seen = ctx.active.followed()["job0"]
    next(again)
    assert ctx.active.followed()["job0"] >= seen and ctx.active.get("web-b") == ["job0"]
    again.close()
    # nobody follows it: within the grace nothing happens, after it the reaper cancels
    grace = ctx.settings.app.orphan_grace_s
    assert jobs.reap_orphans(ctx, now=ctx.active.followed()["job0"] + grace - 1) == []
    # (a moment past the grace: seen + grace - seen can round to just under grace in floats)
    assert jobs.reap_orphans(ctx, now=ctx.active.followed()["job0"] + grace + 0.01) == ["job0"]
    assert ctx.sup.cancelled == ["job0"] and ctx.active.get("web-b") == [] and not ctx.active.followed()
    assert ctx.sup.reasons["job0"] == jobs.orphan_reason(grace)      # the job's status says why
    # Cancel pressed while the tab's Generate was still on its way: cancelled on submit
    assert ctx.active.press("web-c")
    assert jobs.cancel_jobs(ctx, "web-c") is None and ctx.active.take_pending("web-c")
    steps = jobs.follow_job(ctx, "web-c", rgb, mask, Settings(), poll_s=0)
    next(steps)
    assert ctx.sup.cancelled == ["job0", "job1"]
    # and a tab that pressed Cancel while following stops its job when its generator closes
    assert ctx.active.press("web-d")          # a new press: the old Cancel is spent
    steps = jobs.follow_job(ctx, "web-d", rgb, mask, Settings(), poll_s=0)
    next(steps)
    ctx.active.request_cancel("web-d")
    steps.close()
    assert ctx.sup.cancelled == ["job0", "job1", "job2"]


def test_follow_job_beats_while_nothing_changes():
    """An unchanged job still yields every beat, so Gradio can drop a closed page's generator."""
    class Job:
        id = "j"

        def status(self):
            return JobStatus(id="j", session="web-a", state="running", seq=1, stage="mesh")

    got = jobs.watch_job(Job(), poll_s=0.01, beat_s=0.05)
    t0 = time.monotonic()
    first, second = next(got), next(got)
    assert first.seq == second.seq == 1 and time.monotonic() - t0 >= 0.05


def test_follow_job_says_why_it_cannot_start(blob):
    rgb, mask = blob
    failed_pool = _Pool(None, error="worker pool failed to start: WorkerStartError: no worker")
    assert list(jobs.follow_job(failed_pool, "web-a", rgb, mask, Settings())) == [
        ("worker pool failed to start: WorkerStartError: no worker", None)]
    full = _Pool(_Sup(refuse=RuntimeError("queue is full (16 waiting)")))
    (note, st), = jobs.follow_job(full, "web-a", rgb, mask, Settings())
    assert st is None and note == "Could not start the job: queue is full (16 waiting)"


def test_session_names_come_from_the_browser_cookie_and_the_tab():
    alice, mallory = browser.new_browser_token(), browser.new_browser_token()
    tab = "k2x9q1w0e7r"
    own = browser.session_name(alice, tab)
    assert own == browser.session_name(alice, tab) and own != browser.session_name(alice, "othertab")
    # the session hash is the client's to choose: with another browser's cookie the same
    # hash lands in a different session, so it never reaches the first one's jobs
    assert browser.session_name(mallory, tab) != own
    assert browser.session_owned_by(own, alice) and not browser.session_owned_by(own, mallory)
    assert not browser.session_owned_by(own, None) and not browser.session_owned_by(own, "short")
    # no cookie (an API script): a session of its own that owns no downloadable result
    anon = browser.session_name(None, tab)
    assert anon.startswith("web-anon-") and not browser.session_owned_by(anon, None)
    assert not browser.session_owned_by("cli", alice) and not browser.session_owned_by(None, alice)
    from worker.jobs.jobstore import safe_session
    assert safe_session(own) == own            # usable as the job store's folder name as it is


def _guarded_app(owner_of, max_upload_bytes=10_000):
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route, Router

    from app.web.server.launch import RequestGuard

    async def any_route(request):
        body = await request.body()
        return PlainTextResponse(f"served {request.url.path} ({len(body)} bytes)")

    # in the served app the guard sits inside Starlette's error middleware, around the router
    inner = Router(routes=[Route("/{path:path}", any_route, methods=["GET", "HEAD", "POST"])])
    return RequestGuard(inner, owner_of=owner_of, max_upload_bytes=max_upload_bytes)


def test_request_guard_serves_results_only_to_their_browser():
    from starlette.testclient import TestClient

    owners = {}     # as ResultPublisher.owner: by the served path's folder and name
    app = _guarded_app(lambda path: owners.get("/".join(path.split("/")[-2:])))
    alice, mallory = TestClient(app), TestClient(app)
    first = alice.get("/")
    cookie = first.cookies.get(browser.BROWSER_COOKIE)
    assert first.status_code == 200 and browser.browser_id(cookie) is not None
    assert "HttpOnly" in first.headers["set-cookie"] and "SameSite=Lax" in first.headers["set-cookie"]
    assert "set-cookie" not in alice.get("/").headers            # kept once the browser has it
    mallory.get("/")
    assert mallory.cookies.get(browser.BROWSER_COOKIE) != cookie

    owners["0123/horse-1.glb"] = browser.session_name(cookie, "tab1")
    url = "/gradio_api/file=/srv/var/gradio/results/0123/horse-1.glb"
    assert alice.get(url).status_code == 200
    old_route = url.replace("/file=", "/file/")             # Gradio's deprecated twin route
    assert alice.get(old_route).status_code == 200
    assert alice.get(url.replace("/results/0123/", "/results/0123/../0123/")).status_code == 200
    for variant in (url, url + "/", url + "/.", url.replace(".glb", ".GLB"),
                    url.replace("/results/0123/", "/results/0123/../0123/"), old_route,
                    old_route.replace("/file/", "/file//")):
        r = mallory.get(variant)
        assert r.status_code == 403 and "another browser session" in r.text, variant
    assert TestClient(app).head(url).status_code == 403       # no cookie at all
    # the same name in another folder, a result this server never published (e.g. before
    # a restart), any other GLB/PLY: nobody's
    for other in ("/gradio_api/file=/srv/var/gradio/results/4567/horse-1.glb",
                  "/gradio_api/file=/srv/var/gradio/x/kiln-20260101-000000-ffffff.ply",
                  "/gradio_api/file=/srv/var/gradio/abc/upload.Ply"):
        assert alice.get(other).status_code == 403, other
    # other files are left to Gradio's own rules
    assert mallory.get("/gradio_api/file=/srv/var/gradio/abc/image.jpeg").status_code == 200


def test_request_guard_caps_request_bodies():
    from starlette.testclient import TestClient

    from app.web.server.launch import MAX_BODY_BYTES

    client = TestClient(_guarded_app(lambda name: None, max_upload_bytes=10_000))
    assert client.post("/gradio_api/upload", content=b"x" * 9_000).status_code == 200
    big = client.post("/gradio_api/upload", content=b"x" * 10_001)
    assert big.status_code == 413 and "maximum allowed size" in big.text
    assert client.post("/gradio_api/queue/join", content=b"{}").status_code == 200
    assert client.post("/gradio_api/queue/join", content=b"x" * (MAX_BODY_BYTES + 1)).status_code == 413

    def chunks():                       # no Content-Length: counted as it arrives
        for _ in range(12):
            yield b"x" * 1000
    r = client.post("/gradio_api/upload", content=chunks())
    assert r.status_code == 413 and "maximum allowed size" in r.text


def test_watch_job_yields_changes_until_terminal():
    seq = [("queued", 0, None), ("running", 1, "reconstruct"), ("running", 1, "reconstruct"),
           ("running", 2, "bake"), ("done", 3, "export")]

    class Job:
        id, i = "j", 0

        def status(self):
            state, s, stage = seq[min(self.i, len(seq) - 1)]
            self.i += 1
            return JobStatus(id=self.id, session="web-a", state=state, seq=s, stage=stage)

    got = [(st.state, st.seq) for st in jobs.watch_job(Job(), poll_s=0)]
    assert got == [("queued", 0), ("running", 1), ("running", 2), ("done", 3)]


def _done_job(tmp_path, session: str, name: str) -> JobStatus:
    out = tmp_path / "jobs" / session / name / "outputs"
    out.mkdir(parents=True)
    (out / "model.glb").write_bytes(b"glTF-" + name.encode())
    (out / "model.ply").write_bytes(b"ply-" + name.encode())
    return JobStatus(id=name, session=session, state="done", created=time.time(),
                     outputs={"glb": str(out / "model.glb"), "ply": str(out / "model.ply")})


def test_results_are_published_per_browser_as_image_name_n_outside_the_job_store(tmp_path):
    alice, bob = "A" * 43, "B" * 43                      # two browsers' cookies
    a_tab1, a_tab2 = browser.session_name(alice, "t1"), browser.session_name(alice, "t2")
    b_tab = browser.session_name(bob, "t1")
    pub = results.ResultPublisher(tmp_path / "gradio" / "results")
    a = _done_job(tmp_path, a_tab1, "20260101-000000-aaaaaa")
    b = _done_job(tmp_path, b_tab, "20260101-000000-bbbbbb")
    fa = pub.publish(a_tab1, a, "My_photo-1")
    fb = pub.publish(b_tab, b, "My_photo-1")
    assert set(fa) == {"glb", "ply"} and fa["glb"].name == "My_photo-1.glb"
    assert fa["glb"].read_bytes() == b"glTF-" + a.id.encode()
    # copies live outside the job store, in per-browser folders with unguessable names, so
    # two browsers' 'My_photo-1.glb' stay apart and each is owned by its own browser
    assert (tmp_path / "jobs") not in fa["glb"].parents
    assert fa["glb"].parent != fb["glb"].parent and len(fa["glb"].parent.name) == 32
    assert pub.owner(str(fa["glb"])) == a_tab1 and pub.owner(str(fb["glb"])) == b_tab
    assert pub.owner(str(tmp_path / "elsewhere" / "My_photo-1.glb")) is None
    assert pub.owner(str(fa["glb"].parent / "My_photo-9.glb")) is None
    assert pub.owner(str(fa["glb"].with_suffix(".txt"))) is None
    # another tab of the same browser gets the same files; another browser is refused
    assert pub.publish(a_tab2, a, "My_photo-1") == fa            # published once, then reused
    with pytest.raises(usertext.UIError, match="another browser"):
        pub.publish(a_tab1, b, "My_photo-1")
    # a name taken by another job is never overwritten
    a_other = _done_job(tmp_path, a_tab2, "20260101-000009-eeeeee")
    clash = pub.publish(a_tab2, a_other, "My_photo-1")
    assert clash["glb"].name == "My_photo-1-eeeeee.glb" and fa["glb"].read_bytes() == b"glTF-" + a.id.encode()
    # with the image's name known, results download as <image-name>-<n>.<ext>, n counted
    # over the browser's done jobs of that image, oldest first; unknown images count as 'model'
    a2 = replace(a, id="20260101-000002-dddddd", created=a.created + 5)
    infos = {a.id: history.JobInfo("My photo.png", "data:image/jpeg;base64,xx"),
             a2.id: history.JobInfo("My photo.png")}
    assert history.result_stems([a2, a], infos) == {a.id: "My_photo-1", a2.id: "My_photo-2"}
    assert history.result_stems([a2, a], {}) == {a.id: "model-1", a2.id: "model-2"}
    hist = history.history_files(a_tab2, [a, b], pub, infos)
    assert [n for _, n in hist] == ["My_photo-1.glb", "My_photo-1.ply"]    # b: another browser's
    assert [p for p, _ in hist] == [str(fa["glb"]), str(fa["ply"])]
    page = history.history_html([a, a2], {a.id: "vertex colours"}, infos)
    assert page.index("dddddd") < page.index("aaaaaa") and "My photo.png" in page
    assert 'src="data:image/jpeg;base64,xx"' in page and "My_photo-2.glb" in page
    failed = JobStatus(id="20260101-000001-cccccc", session="web-a", state="failed", error="boom | bad",
                       created=time.time() + 1)
    listed = history.history_html([a, failed], {a.id: "texture 512px fast"})
    assert listed.index("cccccc") < listed.index("aaaaaa")          # newest first
    assert "failed: boom | bad" in listed and "texture 512px fast" in listed
    assert pub.publish("web-a", failed) == {}
    # a restarted server drops copies older than its age limit, keeps fresh ones
    import os
    old_dir = fa["glb"].parent
    os.utime(old_dir, (time.time() - 7200, time.time() - 7200))
    results.ResultPublisher(tmp_path / "gradio" / "results", prune_age_s=3600)
    assert not old_dir.exists() and fb["glb"].exists()


def test_job_info_is_kept_with_the_job_and_says_why_the_page_cancelled(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    assert history.load_info(d) is None
    info = history.JobInfo("cat.png", "data:image/jpeg;base64,yy", "vertex colours", waited_s=2.5)
    history.save_info(d, info)
    history._INFO_CACHE.clear()                    # as a new server reads it
    assert history.load_info(d) == info
    (d / history.INFO_FILE).write_text("{broken")
    history._INFO_CACHE.clear()
    assert history.load_info(d) is None
    done = JobStatus(id="20260101-000000-aaaaaa", session="web-a", state="done", created=1.0,
                     timings={"total_s": 10.0})
    cancelled = JobStatus(id="20260101-000001-bbbbbb", session="web-a", state="cancelled", created=2.0,
                          error="cancelled by user")
    page = history.history_html([done, cancelled], None, {
        done.id: info, cancelled.id: history.JobInfo("cat.png", cancel_reason=jobs.orphan_reason(120))})
    assert "done in 12.5 s" in page and "vertex colours" in page      # "Done in" counts the wait
    assert "no page of this browser followed it for 120 s" in page


def test_status_line():
    caps = Capabilities(device="cpu", cuda=False, gsplat=False, nvdiffrast=False, moderngl=True)
    line = statusview.status_line(caps, "GrabCut — no SAM2 checkpoint", running=1, waiting=2)
    assert "CPU" in line and "moderngl" in line and "gsplat" not in line
    assert "1 running, 2 waiting" in line and "GrabCut — no SAM2 checkpoint" in line
    assert "workers starting" in statusview.status_line({}, "GrabCut", 0, 0).lower()
    # plain words first, the technical detail folded away
    plain, detail = line.split("<details", 1)
    assert "CPU only" in plain and "using GrabCut: drag a box" in plain and "moderngl" not in plain
    assert "Backends" in detail
    # what a model takes is said as measured here, never guessed
    assert "no model timed on this server yet" in plain
    assert "a model took about 12 s here lately" in statusview.status_line(caps, "GrabCut", 0, 0, typical_s=11.6)


def test_active_jobs_per_session():
    act = active.ActiveJobs()
    act.add("web-a", "j1")
    act.add("web-b", "j2")
    assert act.get("web-a") == ["j1"] and act.get("web-b") == ["j2"]
    # two Generates of one session overlap (two workers): the first one ending must not
    # hide the second from Cancel
    act.add("web-a", "j3")
    act.discard("web-a", "j1")
    assert act.get("web-a") == ["j3"]
    act.discard("web-a", "j3")
    assert act.get("web-a") == [] and act.get("web-b") == ["j2"]
    assert act.press("web-c")
    assert act.take_pending("web-c") and not act.take_pending("web-c")
    assert act.press("web-c")
    act.end_pending("web-c")
    assert not act.take_pending("web-c")
    assert act.press("web-c")
    act.add("web-c", "j4")                 # its job was submitted: nothing pending any more
    assert not act.take_pending("web-c")


def test_active_jobs_one_press_at_a_time_and_the_outcome_until_shown():
    """A tab with a job or a waiting Generate gets no second one; the time of the press
    is kept for "Done in"; a tab's outcome is kept until taken, and a new press or a
    closed tab drops it."""
    from app.web.state.job_outcome import not_started

    act = active.ActiveJobs()
    assert act.press("web-a", at=100.0) and act.pending_since("web-a") == 100.0 and act.busy("web-a")
    assert not act.press("web-a", at=200.0) and act.pending_since("web-a") == 100.0
    act.add("web-a", "j1")
    assert act.pending_since("web-a") is None and act.busy("web-a") and not act.press("web-a")
    act.finished("j1")
    assert not act.busy("web-a") and act.tabs == {}        # nothing left of the tab
    act.keep_outcome("web-a", not_started("Cannot start: no image"))
    assert act.take_outcome("web-a").note == "Cannot start: no image"
    assert act.take_outcome("web-a") is None and act.tabs == {}
    act.keep_outcome("web-a", not_started("old"))
    act.request_cancel("web-a")
    assert act.cancel_wanted("web-a") and act.press("web-a")
    assert act.take_outcome("web-a") is None and not act.cancel_wanted("web-a")
    assert act.press("web-b")
    act.keep_outcome("web-b", not_started("b's"))
    act.drop_session("web-b")
    assert act.take_outcome("web-b") is None and not act.busy("web-b")


def test_image_key_depends_on_content_and_shape():
    a = np.zeros((4, 6, 3), np.uint8)
    assert image_key(a) == image_key(a.copy())
    assert image_key(a) != image_key(a.reshape(6, 4, 3))
    b = a.copy()
    b[0, 0, 0] = 1
    assert image_key(a) != image_key(b)


# -- server flags -------------------------------------------------------------

def test_binding_rules(caplog):
    from app.web.server.launch import LaunchError, check_binding, is_loopback, parse_auth

    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    check_binding("127.0.0.1", listen=False, auth=None, no_auth=False)
    with pytest.raises(LaunchError, match="needs --listen"):
        check_binding("0.0.0.0", listen=False, auth=("u", "p"), no_auth=False)
    with pytest.raises(LaunchError, match="without a login"):
        check_binding("0.0.0.0", listen=True, auth=None, no_auth=False)
    check_binding("0.0.0.0", listen=True, auth=("u", "p"), no_auth=False)
    with caplog.at_level(logging.WARNING, logger="kiln.app"):
        check_binding("0.0.0.0", listen=True, auth=None, no_auth=True)
    assert "WITHOUT A LOGIN" in caplog.text
    assert parse_auth("me:s3:cret") == ("me", "s3:cret") and parse_auth("") is None
    with pytest.raises(LaunchError, match="USER:PASSWORD"):
        parse_auth("nopassword")


def test_main_refuses_unsafe_binding_before_starting_anything(capsys, monkeypatch):
    from app.web.server.launch import main

    monkeypatch.delenv("KILN_AUTH", raising=False)
    assert main(["--host", "0.0.0.0", "--port", "7999"]) == 2
    assert "needs --listen" in capsys.readouterr().err
    assert main(["--listen", "--port", "7999"]) == 2
    assert "without a login" in capsys.readouterr().err
    monkeypatch.setenv("KILN_AUTH", "broken")
    assert main(["--listen", "--port", "7999"]) == 2
    assert "USER:PASSWORD" in capsys.readouterr().err
    assert main(["--set", "app.max_upload_mb=-1"]) == 2
    assert "app.max_upload_mb" in capsys.readouterr().err


# -- SAM2 wiring (random weights: checks the plumbing, not the mask quality) ----

def _save_random_sam2(path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("sam2")
    import sam2  # noqa: F401  (registers sam2's hydra configs)
    from hydra import compose
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    torch.manual_seed(0)
    cfg = compose(config_name="configs/sam2.1/sam2.1_hiera_t.yaml")
    OmegaConf.resolve(cfg)
    torch.save({"model": instantiate(cfg.model, _recursive_=True).state_dict()}, path)


def test_broken_sam2_checkpoint_falls_back_to_grabcut_with_reason(tmp_path):
    pytest.importorskip("sam2")
    from app.segment.segment import choose_segmenter

    bad = tmp_path / "sam2.1_hiera_tiny.pt"
    bad.write_bytes(b"\x00not a checkpoint" * 10)
    choice = choose_segmenter(AppSettings(sam2_checkpoint=str(bad)))
    assert isinstance(choice.segmenter, GrabCutSegmenter)
    assert choice.description == "GrabCut" and "cannot be read" in choice.reason
    missing = choose_segmenter(AppSettings(sam2_checkpoint=str(tmp_path / "gone" / "sam2.1_hiera_small.pt")))
    assert "does not exist" in missing.reason


@pytest.mark.timing(reason="a click with a cached embedding must take under 5 s")
def test_sam2_segmenter_caches_embedding_and_never_touches_cuda(tmp_path, monkeypatch, blob):
    torch = pytest.importorskip("torch")
    ckpt = tmp_path / "sam2.1_hiera_tiny.pt"
    _save_random_sam2(ckpt)

    def no_cuda(*a, **k):
        raise AssertionError("the app process initialised CUDA")
    monkeypatch.setattr(torch.cuda, "_lazy_init", no_cuda)
    monkeypatch.setattr(torch.cuda, "init", no_cuda)

    from app.segment.segment import Sam2Segmenter, choose_segmenter

    choice = choose_segmenter(AppSettings(sam2_checkpoint=str(ckpt)))
    assert isinstance(choice.segmenter, Sam2Segmenter), choice.reason
    assert choice.description.startswith("SAM2") and choice.reason == ""
    sam = choice.segmenter
    rgb, _ = blob
    st = uploads.load_upload(_png(rgb), APP)
    selection.prepare_segmenter(st, sam)                       # embedding starts in the background
    st = selection.add_click(st, 128, 128, False, sam)
    assert st.mask.shape == (256, 256) and st.mask.dtype == bool
    st = selection.add_click(st, 20, 20, True, sam)
    st = selection.undo_click(st, sam)
    assert sam.embeddings_computed == 1, "the image embedding must be computed once per image"
    t = time.perf_counter()
    selection.add_click(st, 140, 120, False, sam)
    click_s = time.perf_counter() - t
    assert click_s < 5.0, f"a click with a cached embedding took {click_s:.2f} s"
    # another image gets its own embedding; the first stays cached
    other = uploads.load_upload(_png(np.ascontiguousarray(rgb[::-1])), APP)
    selection.add_click(other, 128, 128, False, sam)
    selection.add_click(st, 128, 128, False, sam)
    assert sam.embeddings_computed == 2


# -- the served app, without a browser ------------------------------------------

SERVE_PROBE = '''
import json, os, signal, sys, time
from pathlib import Path

def main():
    import httpx
    import numpy as np
    from kiln.settings import load
    from app.web.server import browser
    from app.web.photo import form
    from app.web.state import history
    from app.web.state import browser_jobs as jobs
    from app.web.server import usertext
    from app.web.server import results
    from app.web.photo import selection
    from app.web.page import status_line as statusview
    from app.web.state import uploads
    from app.web.server.launch import launch

    var, port = sys.argv[1], int(sys.argv[2])
    # browsers with known cookies, so the fault rule can name tab 1's session
    ALICE, MALLORY = "a" * 43, "m" * 43
    S1, S2, S3 = (browser.session_name(ALICE, t) for t in ("tab1", "tab2", "tab3"))
    M1 = browser.session_name(MALLORY, "tab1")
    os.environ["KILN_TEST_FAULTS"] = "hang@mesh:attempt=1:session=" + S1
    sys.path.insert(0, "tests")
    from synthetic import make_object_image

    settings = load(None, {"app.max_upload_mb": 1, "app.jobs_dir": var + "/jobs",
                           "app.cache_dir": var + "/cache", "worker.count": 1, "worker.device": "cpu",
                           "reconstruct.resolution": 64, "reconstruct.num_gaussians": 3000,
                           "reconstruct.max_image_side": 256, "views.count": 4, "views.resolution": 128,
                           "bake.enabled": False, "app.orphan_grace_s": 3})
    demo, ctx, url = launch(settings, port=port, block=False, examples=False)
    out = {}
    try:
        base = "http://127.0.0.1:%d" % port
        page = httpx.get(base + "/")
        out["page"] = page.status_code
        out["cookie"] = page.headers.get("set-cookie", "")
        alice = httpx.Client(base_url=base, cookies={browser.BROWSER_COOKIE: ALICE})
        mallory = httpx.Client(base_url=base, cookies={browser.BROWSER_COOKIE: MALLORY})
        up = "/gradio_api/upload"
        big = httpx.post(base + up, files={"files": ("big.png", b"x" * (2 * 1024 * 1024))})
        out["big_upload"] = [big.status_code, big.text[:200]]
        many = httpx.post(base + up, files=[("files", ("p%d.png" % i, b"x" * 400_000)) for i in range(4)])
        out["many_files_upload"] = many.status_code
        def chunks():
            for i in range(4):
                yield (b"--b\\r\\nContent-Disposition: form-data; name=\\"files\\"; filename=\\"c%d.png\\"\\r\\n"
                       b"Content-Type: image/png\\r\\n\\r\\n" % i)
                for _ in range(8):
                    yield b"x" * 50_000
                yield b"\\r\\n"
            yield b"--b--\\r\\n"
        out["chunked_upload"] = httpx.post(base + up, content=chunks(),
                                           headers={"content-type": "multipart/form-data; boundary=b"}).status_code
        small = httpx.post(base + up, files={"files": ("small.png", b"x" * 1000)})
        out["small_upload"] = [small.status_code, small.json()]
        secret = settings.app.jobs_dir + "/web-other/secret.txt"
        os.makedirs(os.path.dirname(secret), exist_ok=True)
        open(secret, "w").write("another session's file")
        files = {"job_store": os.path.abspath(secret), "source": os.path.abspath("app/web/server/launch.py"),
                 "configs": os.path.abspath("configs/default.yaml"), "etc": "/etc/passwd",
                 "traversal": var + "/gradio/../jobs/web-other/secret.txt"}
        out["refused_files"] = {k: httpx.get(base + "/gradio_api/file=" + v).status_code for k, v in files.items()}

        # Generate pressed while the worker pool is still starting; the job hangs in 'mesh'
        # (fault rule for tab 1's first attempts), and the page goes away (a reload)
        rgb, mask = make_object_image(160, "blob", seed=1)
        info = history.JobInfo("probe photo.png", history.thumbnail_uri(rgb))
        steps = jobs.follow_job(ctx, S1, rgb, mask, settings, info=info, pressed_at=time.time(), poll_s=0.1)
        out["first_note"] = next(steps)[0]
        for note, st in steps:
            if st is not None and st.state == "running" and st.stage == "mesh":
                break
        steps.close()
        job = st.id
        # hung by fault, so only a cancel could end it now: closing the page must not. The
        # reaper's own tick, run here at once rather than waited for, is what would cancel it
        out["reaped_at_close"] = jobs.reap_orphans(ctx)
        out["after_close"] = ctx.sup.job(job).status().state
        # the browser's next page (tab 2) finds it and follows it; another browser does not
        out["live_for_tab2"] = getattr(jobs.live_job(jobs.browser_jobs(ctx, S2)), "id", None) == job
        out["live_for_mallory"] = jobs.live_job(jobs.browser_jobs(ctx, M1)) is None
        again = jobs.follow_existing(ctx, S2, job, poll_s=0.1)
        next(again)
        # release the hang: the killed worker's job is retried without the fault and ends done
        os.kill(ctx.sup.workers()[0]["pid"], signal.SIGKILL)
        for note, last in again:
            pass
        out["reconnected_job"] = [last.state, last.attempts]
        # a job no page follows is cancelled after app.orphan_grace_s (3 s here)
        steps = jobs.follow_job(ctx, S1, rgb, mask, settings, info=info, poll_s=0.1)
        for note, st in steps:
            if st is not None and st.state == "running" and st.stage == "mesh":
                break
        steps.close()
        ended = ctx.sup.job(st.id).wait(timeout=60)
        out["orphan"] = ended.state, ended.error
        # the worker is free for the next job (tab 2 has no fault)
        last = None
        for note, last in jobs.follow_job(ctx, S2, rgb, mask, settings, info=info, poll_s=0.1):
            pass
        out["next_job"] = [last.state, last.error]
        statuses = jobs.browser_jobs(ctx, S2)
        stems = history.result_stems(statuses, jobs.job_infos(ctx, statuses))
        published = ctx.publisher.publish(S2, last, stems[last.id])
        out["published_name"] = published["glb"].name
        path = "/gradio_api/file=" + str(published["glb"])
        glb = open(last.outputs["glb"], "rb").read()
        own = alice.get(path)
        out["own_result"] = [own.status_code, own.content == glb]
        out["other_browser_result"] = mallory.get(path).status_code
        out["old_route"] = [alice.get(path.replace("/file=", "/file/")).status_code,
                            mallory.get(path.replace("/file=", "/file/")).status_code]
        out["no_cookie_result"] = httpx.get(base + path).status_code
        out["caps"] = ctx.capabilities().to_dict()
        out["sup_error"] = ctx.sup_error
        out["pipeline_modules"] = sorted(m for m in sys.modules if m.split(".")[0] == "pipeline")
        import torch
        out["cuda_initialized"] = torch.cuda.is_initialized()
    finally:
        demo.close()
        ctx.shutdown()
    # a restarted server (a new AppContext on the same job store): tab 3 of the browser sees
    # the browser's history with names and thumbnails; another browser sees none of it
    from app.web.server.context import AppContext
    ctx2 = AppContext(settings, Path(var) / "gradio").start(wait=True)
    try:
        hist = jobs.browser_jobs(ctx2, S3)
        infos = jobs.job_infos(ctx2, hist)
        out["restart_history"] = [[st.state, infos[st.id].image_name, infos[st.id].thumbnail[:15]]
                                  for st in hist if st.id in infos]
        out["restart_html"] = history.history_html(hist, None, infos)
        out["restart_files"] = [n for _, n in history.history_files(S3, hist, ctx2.publisher, infos)]
        out["restart_mallory"] = len(jobs.browser_jobs(ctx2, M1))
    finally:
        ctx2.shutdown()
    print("RESULT " + json.dumps(out))

if __name__ == "__main__":
    main()
'''


@pytest.mark.timing(reason="app.orphan_grace_s is 3 s: the closed page's job must still run when the next tab looks")
def test_served_app_guards_files_and_uploads_frees_workers_and_stays_off_cuda(tmp_path):
    import json
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    script = tmp_path / "serve_probe.py"
    script.write_text(SERVE_PROBE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the checkout under test, not whichever copy of Kiln the interpreter has installed (the
    # script's own folder, not the checkout, is first on its path)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "var"), str(port)], cwd=root,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(root)))
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(line[len("RESULT "):])
    assert out["page"] == 200
    assert out["cookie"].startswith(browser.BROWSER_COOKIE + "=") and "HttpOnly" in out["cookie"]
    assert out["big_upload"][0] == 413 and "maximum allowed size" in out["big_upload"][1]
    # each file under the limit, together over it; and a body without Content-Length
    assert out["many_files_upload"] == 413
    assert out["chunked_upload"] == 413
    assert out["small_upload"][0] == 200
    # uploads land in Gradio's folder next to the job store, not in /tmp/gradio
    assert out["small_upload"][1][0].startswith(str(tmp_path / "var" / "gradio"))
    assert out["refused_files"] == dict.fromkeys(out["refused_files"], 403), out["refused_files"]
    # Generate while the workers start: the person is told, and the job runs once they are up;
    # the page going away mid-job leaves it running; the browser's next page follows it to
    # the end (another browser does not see it); a job no page follows is cancelled after
    # app.orphan_grace_s, and the worker serves the next job
    assert out["first_note"] == jobs.WAITING_FOR_POOL
    assert out["reaped_at_close"] == [] and out["after_close"] == "running"
    assert out["live_for_tab2"] and out["live_for_mallory"]
    assert out["reconnected_job"] == ["done", 2]
    assert out["orphan"] == ["cancelled", jobs.orphan_reason(3)]
    assert out["next_job"] == ["done", None]
    assert out["published_name"] == "probe_photo-2.glb"     # the browser's 2nd done result of it
    # after a restart the browser's history is back, with names, thumbnails and reasons
    states = sorted(st for st, _, _ in out["restart_history"])
    assert states == ["cancelled", "done", "done"], out["restart_history"]
    assert all(name == "probe photo.png" and thumb.startswith("data:image/jpeg")
               for _, name, thumb in out["restart_history"])
    assert "no page of this browser followed it for 3 s" in out["restart_html"]
    assert out["restart_files"] == ["probe_photo-2.glb", "probe_photo-1.glb"]
    assert out["restart_mallory"] == 0
    # a result URL works for the browser whose session made it, and for no one else
    assert out["own_result"] == [200, True]
    assert out["other_browser_result"] == 403 and out["no_cookie_result"] == 403
    assert out["old_route"] == [200, 403], "Gradio's /file/<path> twin route must be guarded too"
    assert out["sup_error"] is None and out["caps"]["device"] == "cpu"
    assert out["pipeline_modules"] == [], "the app process imported pipeline/"
    assert out["cuda_initialized"] is False


def test_box_prompt_selects_the_object_and_keeps_clicks(seg, blob):
    rgb, gt = blob
    st = uploads.load_upload(_png(rgb), APP)
    ys, xs = np.nonzero(gt)
    st = selection.set_box(st, xs.max() + 6, ys.max() + 6, xs.min() - 6, ys.min() - 6, seg)   # any corner order
    assert st.box[0] < st.box[2] and st.box[1] < st.box[3] and st.clicks == ()
    iou = (st.mask & gt).sum() / (st.mask | gt).sum()
    assert iou > 0.8, iou
    assert not (st.mask & ~box_mask(st.mask.shape, st.box)).any(), "nothing outside the box"
    st = selection.add_click(st, 5, 5, True, seg)       # a click keeps the box
    assert st.box is not None and len(st.clicks) == 1
    st = selection.undo_click(st, seg)
    assert st.box is not None and st.clicks == ()
    st = selection.undo_click(st, seg)
    assert st.box is None and st.mask is None
    with pytest.raises(usertext.UIError, match="too small"):
        selection.set_box(st, 10, 10, 12, 12, seg)
    assert "and a box" in selection.mask_summary(selection.set_box(st, xs.min(), ys.min(), xs.max(), ys.max(), seg))


def test_tiny_and_scattered_masks_warned_and_specks_refused(blob):
    rgb, _ = blob
    st = uploads.load_upload(_png(rgb), APP)
    tiny = np.zeros((256, 256), bool)
    tiny[100:106, 100:106] = True           # 36 px: 0.05 % -> a speck
    st_tiny = replace(st, mask=tiny, clicks=((102.0, 102.0, 1),))
    assert "tiny" in selection.mask_summary(st_tiny)
    with pytest.raises(usertext.UIError, match="speck"):
        form.check_job_request(st_tiny, Settings(), form.GenerateForm(*FORM))
    small = np.zeros((256, 256), bool)
    small[100:112, 100:112] = True          # 144 px: 0.22 % -> warned, allowed
    st_small = replace(st, mask=small, clicks=((105.0, 105.0, 1),))
    assert "tiny" in selection.mask_summary(st_small)
    form.check_job_request(st_small, Settings(), form.GenerateForm(*FORM))
    st512 = uploads.load_upload(_png(np.full((512, 512, 3), 120, np.uint8)), APP)
    line = np.zeros((512, 512), bool)
    line[256:258, 10:502] = True            # 984 px, thinner than the reconstruction's grid cells
    # kept (pipeline.recon.thin_parts): it used to be refused as "too thin" for the grid
    form.check_job_request(replace(st512, mask=line, clicks=((256.0, 256.0, 1),)), Settings(), form.GenerateForm(*FORM))
    pieces = np.zeros((256, 256), bool)
    for i in range(6):
        pieces[20 + 35 * i:40 + 35 * i, 20:60] = True
    assert "6 pieces" in selection.mask_summary(replace(st, mask=pieces, clicks=((30.0, 30.0, 1),)))
    assert "⚠" not in selection.mask_summary(replace(st, mask=np.pad(np.ones((100, 100), bool), 78),
                                             clicks=((128.0, 128.0, 1),)))


def test_validation_errors_name_the_field(blob):
    rgb, gt = blob
    st = replace(uploads.load_upload(_png(rgb), APP), mask=gt)
    values = list(FORM)
    values[5] = -1    # seed
    with pytest.raises(usertext.UIError, match=r"^Seed: -1 is out of range"):
        form.check_job_request(st, Settings(), form.GenerateForm(*values))
    values = list(FORM)
    values[3] = 0     # views
    with pytest.raises(usertext.UIError, match=r"^Bake views: 0 is out of range"):
        form.check_job_request(st, Settings(), form.GenerateForm(*values))


def test_mask_file_on_the_page(tmp_path, blob):
    """An RGBA mask file whose alpha marks the object and whose colour is noise is read by
    its alpha; a wrong size, an empty or full mask are refused naming the file."""
    rgb, gt = blob
    st = uploads.load_upload(_png(rgb), APP, name="photo.png")
    rng = np.random.default_rng(0)
    rgba = np.dstack([rng.integers(0, 256, (256, 256, 3), dtype=np.uint8), gt.astype(np.uint8) * 255])
    path = tmp_path / "m.png"
    Image.fromarray(rgba, "RGBA").save(path)
    st2 = uploads.set_mask_file(st, path, APP, name="m.png")
    assert np.array_equal(st2.mask, gt) and st2.mask_file == str(path)
    assert "m.png: read by its alpha channel" in selection.mask_summary(st2) and "from mask file" in selection.mask_summary(st2)
    rgb_full, mask_full = form.job_inputs(st2)
    assert np.array_equal(mask_full, gt)
    wrong = tmp_path / "wrong.png"
    Image.fromarray(np.zeros((100, 80), np.uint8)).save(wrong)
    with pytest.raises(usertext.UIError, match=r"wrong.png is 80x100 pixels but the image is 256x256"):
        uploads.set_mask_file(st, wrong, APP)
    empty = tmp_path / "empty.png"
    Image.fromarray(np.zeros((256, 256), np.uint8)).save(empty)
    with pytest.raises(usertext.UIError, match="empty.png marks nothing"):
        uploads.set_mask_file(st, empty, APP)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(usertext.UIError, match="mask file bad.png"):
        uploads.set_mask_file(st, bad, APP)
    # a click goes back to prompting; the alpha-mode switch leaves the file too
    st3 = selection.add_click(st2, 128, 128, True, GrabCutSegmenter())
    assert st3.mask_file is None and st3.mask_note == ""


def test_stage_labels_name_every_stage_and_no_other():
    """The progress bar's labels follow the one stage list (kiln.stages)."""
    from kiln.stages import FIT_STAGES, MODEL_STAGES, SCENE_STEPS, STAGES

    assert set(statusview.STAGE_LABELS) == set(STAGES) | set(MODEL_STAGES) | set(FIT_STAGES) | set(SCENE_STEPS)


def test_a_jobs_settings_come_back_into_the_form_as_they_were_used():
    from app.web.photo import form
    from kiln.settings import load

    base = load()
    values = (True, 0.8, 512, 12, "opt", 7, True, ["obj", "stl"], "jpeg", "mm")
    used = form.job_settings(base, form.GenerateForm(*values).overrides())
    assert form.form_values(used.to_dict()) == form.GenerateForm(*values, 0)
    assert form.form_values({"bake": {}}) is None and form.form_values(None) is None
    # a job from before Kiln wrote other formats: its export section lacks them, the defaults stand in
    old = used.to_dict()
    old["export"] = {"gaussians_ply": True}
    assert form.form_values(old) == form.GenerateForm(*values[:7], [], "png", "m", 0)


def test_small_wordings_a_user_noticed():
    """One number for one thing, a plural that agrees, what "auto" chose."""
    from app.web.state.browser_jobs import settings_summary
    from app.web.photo.selection import MaskCheck, percent
    from kiln.settings import Settings as S

    assert "1 view," in settings_summary(S().override({"views.count": 1}))
    assert "16 views," in settings_summary(S().override({"views.count": 16}))
    assert settings_summary(S().override({"bake.enabled": True, "bake.texture_size": "auto", "bake.mode": "fast"})) \
        .startswith("texture auto fast,")
    assert settings_summary(S().override({"bake.enabled": True, "bake.texture_size": 512, "bake.mode": "opt"})) \
        .startswith("texture 512px opt,")
    tiny = MaskCheck(share=0.0006, pieces=1, speck=False)
    assert percent(tiny.share) == "0.06%" and percent(0.287) == "28.7%"
    assert tiny.warnings and all("%" not in w for w in tiny.warnings)   # the share is said once


def test_the_history_info_cache_is_bounded(tmp_path, monkeypatch):
    """Issue 37: a month's server saw every job's page note kept in memory for good. The cache
    keeps the most recently used ``INFO_CACHE_MAX``; an entry that went is read from its file."""
    from app.web.state import history

    monkeypatch.setattr(history, "INFO_CACHE_MAX", 5)
    history._INFO_CACHE.clear()
    dirs = []
    for i in range(12):
        d = tmp_path / f"job{i}"
        d.mkdir()
        history.save_info(d, history.JobInfo(image_name=f"photo{i}.jpg"))
        dirs.append(d)
    assert len(history._INFO_CACHE) == 5
    assert history.load_info(dirs[0]).image_name == "photo0.jpg"   # from its file
    assert len(history._INFO_CACHE) == 5 and str(dirs[0] / history.INFO_FILE) in history._INFO_CACHE
