"""What the browser tests share: the app started as a person starts it (``python -m app`` on a
free localhost port, a real spawned worker, small settings so a job takes seconds on a CPU),
Debian's Chromium driven by Playwright, and the page's usual steps (upload, click, the
progress line, the viewer drawing). Screenshots and server logs go to ``ARTIFACTS``."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts" / "browser"
# SwiftShader gives headless Chromium a software WebGL, so the 3D viewer really draws
LAUNCH_ARGS = ["--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
               "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]

SMALL_CONFIG = """
reconstruct: {{resolution: 64, num_gaussians: 3000, max_image_side: 256}}
views: {{count: 4, resolution: 128}}
mesh: {{simplify_ratio: 0.9}}
bake: {{enabled: false, texture_size: 256, mode: fast, steps: 400, stop_when_stalled: false}}
worker: {{count: 1, device: cpu}}
app: {{jobs_dir: {var}/jobs, cache_dir: {var}/cache}}
"""


def require_browser() -> None:
    """Skip the calling test module, saying why, without Playwright or Chromium."""
    if sync_playwright is None:
        pytest.skip("playwright is not installed (pip install playwright)", allow_module_level=True)
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"{CHROMIUM} not found (apt-get install chromium)", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The app that several browser modules share (tests/conftest.py's ``shared_server``): their
# tests together may hold more tabs from 127.0.0.1 than the per-client limit (8) at once, and
# none of them is about that limit (tests/test_app_sessions.py is)
# the seed that holds a job in its bake on the shared server until it is cancelled (conftest)
HELD_SEED = 424242
# the seeds whose jobs' first attempt is held in 'mesh' on the shared server until the test
# kills the worker (the retry runs without the fault): a job mid-stage exactly as long as the
# test needs (test_browser_e2e's reload test; it had a server of its own for this)
MESH_HELD_SEEDS = (424243, 424244)
SHARED_FAULTS = ",".join([f"hang@bake:seed={HELD_SEED}"]
                         + [f"hang@mesh:attempt=1:seed={s}" for s in MESH_HELD_SEEDS])

# an earlier server's job that the disk budget removed, which the shared server finds in its
# job store at start (test_browser_page_pass's history entry of a removed job): the cookie of
# the browser it belonged to (a valid token's shape), and why it was removed
OLD_BROWSER = "old-browser-token-0123456789abcdefghijklmn"
REMOVED_WHY = "the job store was over app.jobs_max_mb (1 MB)"


def leave_a_removed_job(var: Path) -> None:
    """An earlier server's done job of ``OLD_BROWSER``, its files removed by the disk budget
    an hour after it ended, exactly as the housekeeper removes them; its id in
    ``var/removed_job``. No other browser sees it."""
    from dataclasses import replace

    from kiln.settings import Settings
    from synthetic import make_object_image
    from worker.jobs.jobstore import JobStore
    from worker.upkeep.budget import remove_job_files

    from app.web.server.browser import session_name
    from app.web.state.history import JobInfo, save_info

    store = JobStore(var / "jobs")
    rgb, mask = make_object_image(64, "ellipse", seed=1)
    st = store.create(rgb, mask, Settings(), session_name(OLD_BROWSER, "an-old-tab"))
    now = time.time()
    done = replace(st, state="done", progress=1.0, started=now - 7300, finished=now - 7200,
                   timings={"queued_s": 0.1, "total_s": 3.0}, seq=st.seq + 1)
    store.write_status(done)
    save_info(store.job_dir(st.id), JobInfo("old_photo.png", summary="texture 256px fast, 4 views"))
    remove_job_files(store.job_dir(st.id), done, when=now - 3600, why=REMOVED_WHY)
    (var / "removed_job").write_text(st.id)

SHARED_CONFIG = SMALL_CONFIG.replace("cache_dir: {var}/cache}}",
                                     "cache_dir: {var}/cache, max_sessions_per_client: 200}}")
assert SHARED_CONFIG != SMALL_CONFIG


def serve(tmp_path_factory, name: str, extra_env: dict | None = None, config: str | None = None,
          before_start=None):
    """Start ``python -m app`` as a person does, on a free port; yields (url, workdir, log
    path, process) until the caller is done. ``before_start(var)``: runs first with the
    server's var folder (its job store is ``var/jobs``), e.g. to leave an earlier server's jobs."""
    work = tmp_path_factory.mktemp(name)
    var = work / "var"
    cfg = work / "small.yaml"
    cfg.write_text((config or SMALL_CONFIG).format(var=var))
    if before_start is not None:
        before_start(var)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log_path = ARTIFACTS / f"{name}.log"
    port = free_port()
    # the checkout under test, not whichever copy of Kiln the interpreter has installed
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), **(extra_env or {}))
    env.pop("KILN_AUTH", None)
    log_file = open(log_path, "w")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "app", "--port", str(port), "--config", str(cfg)],
                            cwd=work, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() - t0 > 120:
                pytest.fail(f"server did not answer within 120 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.3)
        yield url, work, log_path, proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log_file.close()


def chromium():
    """Yields a headless Chromium (Playwright's Browser) until the caller is done."""
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            yield b
        finally:
            b.close()


def open_page(browser, url, width: int = 1400, height: int = 1100):
    """A new browser context (a browser of its own: its own cookie) on the page, loaded."""
    ctx = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
    page = ctx.new_page()
    page.set_default_timeout(30_000)
    page.goto(url)
    page.wait_for_selector("#kiln-upload input[type=file]", state="attached")
    return ctx, page


def write_png(path: Path, arr: np.ndarray) -> Path:
    Image.fromarray(arr).save(path)
    return path


def upload(page, path: Path):
    page.set_input_files("#kiln-upload input[type=file]", str(path))
    page.wait_for_function(
        "() => document.querySelector('#kiln-mask-info').innerText.includes('%s')" % path.name)
    page.wait_for_selector("#kiln-canvas img")


def click_image(page, fx: float, fy: float, expect: str):
    img = page.locator("#kiln-canvas img")
    box = img.bounding_box()
    img.click(position={"x": box["width"] * fx, "y": box["height"] * fy})
    page.wait_for_function(
        "(t) => document.querySelector('#kiln-mask-info').innerText.includes(t)", arg=expect)


def shown_image(page) -> np.ndarray:
    """The canvas image exactly as the server sent it: (H, W, 3) uint8."""
    src = page.locator("#kiln-canvas img").get_attribute("src")
    data = page.request.get(src).body()
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def progress(page) -> tuple[str, str, str]:
    """The progress line's (data-state, data-job, text)."""
    return page.evaluate("""() => { const e = document.querySelector('#kiln-progress');
        return e ? [e.dataset.state || '', e.dataset.job || '', e.innerText] : ['', '', '']; }""")


def wait_state(page, states, timeout=240) -> tuple[str, str, str]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        st = progress(page)
        if st[0] in states:
            return st
        time.sleep(0.25)
    raise AssertionError(f"job did not reach {states} within {timeout} s; last: {progress(page)}")


def viewer_shot(page, viewer: str = "#kiln-model") -> np.ndarray:
    """The 3D viewer's canvas as drawn now: (H, W, 3) uint8."""
    return np.asarray(Image.open(io.BytesIO(page.locator(f"{viewer} canvas").screenshot())).convert("RGB"))


def assert_viewer_draws(page, timeout_s: float = 20.0, viewer: str = "#kiln-model") -> None:
    """The 3D preview really shows the model: a WebGL canvas with more than its clear colour.
    The first model takes seconds to appear (the viewer loads, SwiftShader compiles shaders)."""
    page.wait_for_selector(f"{viewer} canvas", timeout=30000)
    deadline = time.monotonic() + timeout_s
    while True:
        if viewer_shot(page, viewer).reshape(-1, 3).std(axis=0).max() > 10:
            return
        assert time.monotonic() < deadline, f"3D viewer still shows a blank canvas after {timeout_s:.0f} s"
        page.wait_for_timeout(250)


def bake_state(page) -> str:
    """The Bake tab's job state, as its progress box's ``data-state`` says it."""
    return page.evaluate("() => (document.querySelector('#kiln-bake-progress') || {dataset: {}}).dataset.state")


def wait_bake_state(page, state: str, timeout_s: float = 240) -> None:
    """Wait until the Bake tab's job is in ``state``; fail at once on failed or cancelled."""
    t0 = time.monotonic()
    while bake_state(page) != state:
        assert bake_state(page) not in ("failed", "cancelled"), page.inner_text("#kiln-bake-progress-box")
        assert time.monotonic() - t0 < timeout_s, page.inner_text("#kiln-bake-progress-box")
        time.sleep(0.25)   # polling a state with a deadline, not guessing a duration
