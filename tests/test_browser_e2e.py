"""End to end in a real browser: Playwright drives Debian's Chromium against the app
started as a subprocess (``python -m app``) on a free localhost port, with a real
spawned worker and small settings so each job takes seconds on a CPU.

Session A: Generate before any upload is refused with a visible reason; upload,
click the object, check the mask overlay, generate without texture baking, then
toggle baking on and generate again (the previous result's download hides at
once; the reconstruction must come from the cache), download the GLB and load it
with trimesh. Session B, at the same time in a second browser context: has a
broken file refused, uploads its own image, starts a slow job (A segments while
it runs, then presses Generate and is told it waits for a free worker: B's job
runs until cancelled, so the wait does not depend on timing) and cancels it, then
generates again after A; neither session sees the other's results (history, result
URLs), and no URL reaches the job store. Screenshots and the server log go to
test-artifacts/browser/.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from browser_helpers import ARTIFACTS, HELD_SEED, MESH_HELD_SEEDS, require_browser
from browser_helpers import (assert_viewer_draws as _assert_viewer_draws, click_image as _click_image,
                             open_page, progress as _progress, shown_image as _shown_image, upload as _upload,
                             wait_state as _wait_state, write_png as _write_png)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_browser()


@pytest.fixture(scope="module")
def server(shared_server):
    """The app as a person starts it (shared with the other browser modules); (url, workdir,
    log path)."""
    url, work, log_path, _ = shared_server
    return url, work, log_path


@pytest.fixture(scope="module")
def held_server(shared_server):
    """The same app, for a test whose jobs' seeds are ``MESH_HELD_SEEDS``: the shared server's
    fault rule holds such a job's first attempt in the 'mesh' stage (the worker sleeps there)
    until the test kills that worker; the retry then runs without the fault. So a job is
    mid-stage exactly as long as the test needs. (url, workdir, log path, process)"""
    return shared_server


def _open(browser, url):
    return open_page(browser, url, 1400, 1100)


def _wait_new_job(page, previous_job: str, states, timeout=240):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        st = _progress(page)
        if st[1] and st[1] != previous_job and st[0] in states:
            return st
        time.sleep(0.25)
    raise AssertionError(f"no new job reached {states} within {timeout} s; last: {_progress(page)}")


def _download_glb(page, dest: Path) -> Path:
    with page.expect_download() as dl:
        page.click("#kiln-dl-glb")
    dl.value.save_as(dest)
    return dest


def _download_url(page) -> str:
    with page.expect_download() as dl:
        page.click("#kiln-dl-glb")
    return dl.value.url


def _wait_toast(page, text: str) -> None:
    page.wait_for_function("(t) => Array.from(document.querySelectorAll('.toast-body'))"
                           ".some(e => e.innerText.includes(t))", arg=text)


def _textures(glb: Path) -> list:
    import trimesh

    scene = trimesh.load(glb, force="scene")
    assert len(scene.geometry) >= 1 and sum(len(g.faces) for g in scene.geometry.values()) > 100
    out = []
    for g in scene.geometry.values():
        mat = getattr(g.visual, "material", None)
        tex = getattr(mat, "baseColorTexture", None)
        if tex is not None:
            out.append(tex)
    return out


def test_upload_click_generate_download_in_two_sessions(server, browser, tmp_path):
    from synthetic import make_object_image

    url, work, log_path = server
    rgb_a, gt_a = make_object_image(320, "blob", seed=5)
    img_a = _write_png(tmp_path / "object_a.png", rgb_a)
    rgb_b, gt_b = make_object_image(288, "ellipse", seed=9)
    img_b = _write_png(tmp_path / "object_b.png", rgb_b)

    ctx_a, a = _open(browser, url)
    ctx_b, b = _open(browser, url)
    try:
        # the status line comes from the workers' capability report
        a.wait_for_function("() => document.querySelector('#kiln-status').innerText.includes('CPU only')")
        # plain words first; the technical detail one click away
        assert "Backends" not in a.inner_text("#kiln-status")
        a.click("#kiln-status summary")
        a.wait_for_function("() => document.querySelector('#kiln-status').innerText.includes('Backends')")
        # idle: Generate enabled, Cancel not; no baking -> no texture size / bake mode
        assert a.locator("#kiln-generate").is_enabled() and a.locator("#kiln-cancel").is_disabled()
        assert a.locator("#kiln-texture input").is_disabled()
        assert a.locator("#kiln-mode input").first.is_disabled()

        # -- A: Generate before an upload says why nothing happens ----------------
        a.click("#kiln-generate")
        _wait_toast(a, "Upload an image first")
        # the refusal stays on the progress line after the pop-up (until the next action)
        a.wait_for_function("() => { const e = document.querySelector('#kiln-progress');"
                            " return e && e.dataset.state === 'refused'; }")
        assert "Not started: Upload an image first." in _progress(a)[2]

        # -- A: upload, click, the overlay shows the mask ------------------------
        _upload(a, img_a)
        assert np.abs(_shown_image(a).astype(int) - rgb_a).mean() < 6   # untouched before a click
        _click_image(a, 0.5, 0.5, "Mask:")
        shown = _shown_image(a).astype(int)
        assert shown.shape == rgb_a.shape
        inside = gt_a & (np.hypot(*np.mgrid[0:320, 0:320] - 160) > 20)    # away from the click dot
        import cv2
        core = cv2.erode(gt_a.astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool) & inside
        # the object keeps its colours (JPEG noise only); the background is dimmed
        assert np.abs(shown[core] - rgb_a[core]).mean() < 4, "object recoloured"
        assert np.abs(shown[core].mean(0) - rgb_a[core].mean(0)).max() < 2, "object tinted"
        assert shown[~gt_a].mean() < 0.6 * rgb_a[~gt_a].mean(), "background not dimmed"
        a.screenshot(path=str(ARTIFACTS / "a1_mask.jpg"), full_page=True)
        # "Show selection" off: the photo alone; on again: the selection
        a.locator("#kiln-show-mask input").uncheck()
        a.wait_for_function("() => true")
        deadline = time.monotonic() + 30
        while np.abs(_shown_image(a).astype(int) - rgb_a).mean() > 6:
            assert time.monotonic() < deadline, "photo alone not shown"
            a.wait_for_timeout(200)
        a.screenshot(path=str(ARTIFACTS / "a1b_photo_alone.jpg"), full_page=True)
        a.locator("#kiln-show-mask input").check()
        deadline = time.monotonic() + 30
        while _shown_image(a)[~gt_a].mean() > 0.6 * rgb_a[~gt_a].mean():
            assert time.monotonic() < deadline, "selection not shown again"
            a.wait_for_timeout(200)

        # -- B meanwhile: a broken file is refused with the reason, then its own image
        bad = tmp_path / "broken.png"
        bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really" * 20)
        b.set_input_files("#kiln-upload input[type=file]", str(bad))
        b.wait_for_function("() => document.querySelector('#kiln-mask-info').innerText.includes('Cannot use')")
        assert "broken.png" in b.inner_text("#kiln-mask-info")
        _upload(b, img_b)
        _click_image(b, 0.5, 0.5, "Mask:")
        b.screenshot(path=str(ARTIFACTS / "b1_mask.jpg"), full_page=True)

        # -- A: generate with baking off (config default here) -------------------
        assert not a.locator("#kiln-bake input").is_checked()
        a.click("#kiln-generate")
        st1 = _wait_state(a, ("done", "failed", "cancelled"))
        assert st1[0] == "done", st1
        glb1 = _download_glb(a, tmp_path / "a_vertex_colours.glb")
        assert _textures(glb1) == [], "baking was off: expected vertex colours"
        _assert_viewer_draws(a)

        # -- B: a job held in its bake until cancelled (its seed picks the shared server's
        # one fault rule: the job sleeps there, so it is still running however fast it is)
        b.locator("#kiln-bake input").check()     # bake mode is disabled until baking is on
        b.locator("#kiln-mode label:not(.disabled)", has_text="opt").click()
        b.locator("#kiln-views input[type=number]").fill("48")
        b.locator("#kiln-views input[type=number]").press("Enter")
        b.locator("#kiln-seed input").fill(str(HELD_SEED))
        b.locator("#kiln-seed input").press("Enter")
        b.click("#kiln-generate")
        running = _wait_state(b, ("running", "done", "failed"))
        assert running[0] == "running", running
        # while its job runs: Generate says Running… and is disabled, Cancel is enabled
        assert b.locator("#kiln-generate").is_disabled() and "Running" in b.inner_text("#kiln-generate")
        assert b.locator("#kiln-cancel").is_enabled()
        assert b.locator("#kiln-texture input").is_enabled()    # baking on
        b.screenshot(path=str(ARTIFACTS / "b1b_running.jpg"), full_page=True)
        # while B's job runs, A can still segment: clear and click the same spot again
        # (same clicks -> same mask, so A's next job can reuse its reconstruction)
        mask_before = _shown_image(a)
        a.click("#kiln-clear")
        a.wait_for_function("() => document.querySelector('#kiln-mask-info').innerText.includes('click the object')")
        _click_image(a, 0.5, 0.5, "Mask:")
        assert np.abs(_shown_image(a).astype(int) - mask_before.astype(int)).mean() < 2
        assert _progress(b)[0] == "running", "segmentation had to wait for the running job"

        # -- A: bake on, Generate while B's job holds the only worker: A is told it waits
        # (B's job runs until cancelled below, so A's wait does not depend on timing)
        glb1_url = _download_url(a)
        a.locator("#kiln-bake input").check()
        a.click("#kiln-generate")
        a.wait_for_selector("#kiln-dl-glb", state="hidden")   # the old result's button
        # the press's own note first ("Waiting for a free worker…"), then the job in line
        a.wait_for_function("() => { const e = document.querySelector('#kiln-progress');"
                            " return e && e.dataset.state === 'queued'; }")
        waiting_a = _progress(a)
        assert _progress(b)[0] == "running", "B's job ended before A pressed Generate"
        a.screenshot(path=str(ARTIFACTS / "a1b_waiting.jpg"), full_page=True)
        b.click("#kiln-cancel")
        cancelled = _wait_state(b, ("cancelled", "failed", "done"), timeout=30)
        assert cancelled[0] == "cancelled", cancelled
        assert "Cancelled by user" in cancelled[2], cancelled
        b.wait_for_function("() => !document.querySelector('#kiln-generate').disabled")
        assert b.locator("#kiln-cancel").is_disabled() and "Generate" in b.inner_text("#kiln-generate")
        b.screenshot(path=str(ARTIFACTS / "b2_cancelled.jpg"), full_page=True)

        # -- A's job runs once B's is cancelled: its reconstruction is reused ---------
        # B generates again with fast settings; one worker serves both in turn
        b.locator("#kiln-mode label", has_text="fast").click()
        b.locator("#kiln-views input[type=number]").fill("4")
        b.locator("#kiln-views input[type=number]").press("Enter")
        b.locator("#kiln-seed input").fill("0")      # not held this time
        b.locator("#kiln-seed input").press("Enter")
        b.click("#kiln-generate")
        b.wait_for_function("() => /Waiting for a free worker|Rendering|Reconstructing|Done/.test("
                            "document.querySelector('#kiln-progress').innerText)")
        b.screenshot(path=str(ARTIFACTS / "b3_waiting.jpg"), full_page=True)
        st2 = _wait_new_job(a, st1[1], ("done", "failed", "cancelled"))
        assert st2[0] == "done", st2
        assert "reused from cache" in st2[2], st2
        glb2 = _download_glb(a, tmp_path / "a_textured.glb")
        textures = _textures(glb2)
        assert textures, "baking was on: expected a base colour texture"
        tex = np.asarray(textures[0].convert("RGB"))
        assert tex.shape[:2] == (256, 256) and tex.std() > 5, "texture is blank"
        _assert_viewer_draws(a)
        a.screenshot(path=str(ARTIFACTS / "a2_result.jpg"), full_page=True)

        # A pressed Generate while B's job ran on the only worker: A was told it waits, in line
        assert waiting_a[2].startswith("Waiting for a free worker: 1st in line"), waiting_a
        stb = _wait_new_job(b, cancelled[1], ("done", "failed", "cancelled"))
        assert stb[0] == "done", stb
        glb_b = _download_glb(b, tmp_path / "b_textured.glb")
        assert _textures(glb_b) and glb_b.read_bytes() != glb2.read_bytes()
        b.screenshot(path=str(ARTIFACTS / "b4_result.jpg"), full_page=True)

        # -- a result URL serves its own browser only -----------------------------
        for own_url in (glb1_url, _download_url(a)):
            assert a.request.get(own_url).status == 200
            resp = b.request.get(own_url)
            assert resp.status == 403, f"session B fetched A's result {own_url}: {resp.status}"

        # -- each browser's history lists only its own jobs ------------------------
        for page, own, other, own_files, other_files in (
                (a, [st1[1], st2[1]], [cancelled[1], stb[1]], ["object_a-1.glb", "object_a-2.glb"],
                 ["object_b-1.glb"]),
                (b, [cancelled[1], stb[1]], [st1[1], st2[1]], ["object_b-1.glb"], ["object_a-1.glb"])):
            if page.locator("#kiln-history").count() == 0:   # the accordion renders when opened
                page.get_by_text("History (this browser)").click()
            page.wait_for_function("(id) => { const e = document.querySelector('#kiln-history');"
                                   " return e && e.innerText.includes(id); }", arg=own[-1])
            text = page.inner_text("#kiln-history")
            assert all(j in text for j in own), text
            assert not any(j in text for j in other), text
            files = _file_list(page)
            assert all(n in files for n in own_files) and not any(n in files for n in other_files), files
        a.screenshot(path=str(ARTIFACTS / "a3_history.jpg"), full_page=True)

        # -- files are served from Gradio's folder, never from the job store ------
        job_glb = next((work / "var" / "jobs").glob(f"*/{st2[1]}/outputs/*.glb"))
        resp = a.request.get(url + "gradio_api/file=" + str(job_glb))
        assert resp.status in (403, 404), f"job store file was served: {resp.status}"
        # -- history entries name the image; the GLB downloads as <image-name>-<n>.glb
        assert "object_a.png" in a.inner_text("#kiln-history")
        assert a.locator("#kiln-history img.kiln-thumb").count() >= 2
        assert "object_a-2.glb" in a.inner_text("#kiln-history")

        # -- clear the image, upload another: the old result leaves the page (the history keeps it)
        a.locator("#kiln-upload button[aria-label='Clear']").first.click()
        a.wait_for_selector("#kiln-dl-glb", state="hidden")
        _upload(a, img_b)
        assert _progress(a)[0] == "idle"
        assert a.locator("#kiln-model canvas").count() == 0, "the old model is still in the viewer"
        assert "object_a-2.glb" in _file_list(a)
        a.screenshot(path=str(ARTIFACTS / "a4_new_image.jpg"), full_page=True)
    finally:
        for c in (ctx_a, ctx_b):
            c.close()
        if log_path.exists():
            shutil.copy(log_path, ARTIFACTS / "server.log.txt")


def test_box_prompt_and_mask_file(server, browser, tmp_path):
    """Dragging a rectangle selects the object (a drag adds no click); a new upload clears
    the last error; an RGBA mask file is read by its alpha."""
    from synthetic import make_object_image

    url, _, _ = server
    rgb, gt = make_object_image(320, "ellipse", seed=4)
    img = _write_png(tmp_path / "boxed.png", rgb)
    ctx, page = _open(browser, url)
    try:
        _upload(page, img)
        # "Find the object": selected without a click (the object on a plain background)
        page.click("#kiln-find")
        page.wait_for_function("() => document.querySelector('#kiln-mask-info').innerText.includes('found automatically')")
        assert "Mask:" in page.inner_text("#kiln-mask-info")
        page.screenshot(path=str(ARTIFACTS / "c00_found.jpg"), full_page=True)
        page.click("#kiln-clear")
        page.wait_for_function("() => document.querySelector('#kiln-mask-info').innerText.includes('click the object')")
        ys, xs = np.nonzero(gt)
        box = page.locator("#kiln-canvas img").bounding_box()
        sx, sy = box["width"] / 320, box["height"] / 320
        # the displayed image is square here, so the element's box is the image
        x0, y0 = box["x"] + (xs.min() - 8) * sx, box["y"] + (ys.min() - 8) * sy
        x1, y1 = box["x"] + (xs.max() + 8) * sx, box["y"] + (ys.max() + 8) * sy
        page.mouse.move(x0, y0)
        page.mouse.down()
        page.mouse.move((x0 + x1) / 2, (y0 + y1) / 2, steps=5)
        page.mouse.move(x1, y1, steps=5)
        page.screenshot(path=str(ARTIFACTS / "c0_dragging.jpg"), full_page=True)
        page.mouse.up()
        page.wait_for_function("() => document.querySelector('#kiln-mask-info').innerText.includes('and a box')")
        info = page.inner_text("#kiln-mask-info")
        assert "0 object / 0 background clicks and a box" in info, info
        shown = _shown_image(page).astype(int)
        core = gt.copy()
        core[:, :] &= np.hypot(*np.mgrid[0:320, 0:320] - 160) < 40
        assert np.abs(shown[core] - rgb[core]).mean() < 4, "object recoloured"
        assert shown[~gt].mean() < 0.6 * rgb[~gt].mean(), "background not dimmed"
        page.screenshot(path=str(ARTIFACTS / "c1_box.jpg"), full_page=True)
        # a click afterwards is a click, and keeps the box
        _click_image(page, 0.5, 0.5, "1 object / 0 background clicks and a box")

        # a bad setting is refused naming its field
        page.locator("#kiln-seed input").fill("-3")
        page.locator("#kiln-seed input").press("Tab")
        page.click("#kiln-generate")
        _wait_toast(page, "Seed:")
        page.wait_for_function("() => { const e = document.querySelector('#kiln-progress');"
                               " return e && e.dataset.state === 'refused' && e.innerText.includes('Seed:'); }")
        page.locator("#kiln-seed input").fill("0")
        page.locator("#kiln-seed input").press("Tab")

        # a mask of the wrong size is refused naming the file
        wrong = tmp_path / "wrong_size.png"
        Image.fromarray(np.zeros((50, 60), np.uint8)).save(wrong)
        page.set_input_files("#kiln-mask-file input[type=file]", str(wrong))
        page.wait_for_function("() => document.querySelector('#kiln-mask-info').innerText.includes('Cannot use this mask')")
        assert "wrong_size.png is 60x50 pixels" in page.inner_text("#kiln-mask-info")
        page.screenshot(path=str(ARTIFACTS / "c2_mask_refused.jpg"), full_page=True)
        # the refused file left the box: the drop zone is back
        page.wait_for_selector("#kiln-mask-file input[type=file]", state="attached")
        # an RGBA mask file: alpha = object, colour channels noise
        rng = np.random.default_rng(1)
        rgba = np.dstack([rng.integers(0, 256, (320, 320, 3), dtype=np.uint8), gt.astype(np.uint8) * 255])
        mpath = tmp_path / "rgba_mask.png"
        Image.fromarray(rgba, "RGBA").save(mpath)
        page.set_input_files("#kiln-mask-file input[type=file]", str(mpath))
        page.wait_for_function("() => document.querySelector('#kiln-mask-info').innerText.includes('alpha channel')")
        assert "from mask file" in page.inner_text("#kiln-mask-info")
        page.screenshot(path=str(ARTIFACTS / "c3_mask_file.jpg"), full_page=True)
    finally:
        ctx.close()


def _worker_pids(server_pid: int) -> list[int]:
    """The spawned worker processes of the server (multiprocessing's spawn children; not its
    resource tracker)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == server_pid and b"spawn_main" in cmd:
            pids.append(int(d.name))
    return pids


def _file_list(page) -> str:
    """The history's file list as text; Gradio shows a name's stem and extension apart."""
    return page.inner_text("#kiln-history-files").replace("\n.", ".")


def _open_history(page) -> None:
    if page.locator("#kiln-history").count() == 0:   # the accordion renders when opened
        page.get_by_text("History (this browser)").click()
    page.wait_for_selector("#kiln-history")


def test_reload_mid_job_reconnects_and_after_shows_history(held_server, browser, tmp_path):
    """Reloading while the job runs does not cancel it: the reloaded page follows it (live
    progress, Running…/Cancel), the result lands there; reloading afterwards shows the
    browser's history with the image's name and thumbnail, and the GLB downloads as
    <image-name>-<n>.glb (to this browser only). A seed the form rounds shows rounded."""
    import signal

    from synthetic import make_object_image

    url, work, log_path, proc = held_server
    rgb, _ = make_object_image(288, "blob", seed=11)
    img = _write_png(tmp_path / "teapot.png", rgb)
    ctx, page = _open(browser, url)
    other_ctx = wait_ctx = None
    try:
        page.wait_for_function("() => document.querySelector('#kiln-status').innerText.includes('CPU only')")
        _upload(page, img)
        _click_image(page, 0.5, 0.5, "Mask:")
        selected = _shown_image(page)
        # the seed box takes a fraction (424242.6); the job uses it rounded (424243, a seed
        # the fault rule holds), and the box says so after Generate
        held, waiting_seed = (str(s) for s in MESH_HELD_SEEDS)
        page.locator("#kiln-seed input").fill(f"{MESH_HELD_SEEDS[0] - 1}.6")
        page.locator("#kiln-seed input").press("Tab")
        page.click("#kiln-generate")
        page.wait_for_function("(s) => document.querySelector('#kiln-seed input').value === s", arg=held)
        # held in 'mesh' by the fault rule
        page.wait_for_function("() => { const e = document.querySelector('#kiln-progress');"
                               " return e && e.dataset.stage === 'mesh' && e.dataset.state === 'running'; }",
                               timeout=120_000)
        state, job, text = _progress(page)
        page.screenshot(path=str(ARTIFACTS / "r1_before_reload.jpg"), full_page=True)

        # -- reload mid-job: the new page follows the same job ----------------------
        page.reload()
        page.wait_for_selector("#kiln-upload input[type=file]", state="attached")
        page.wait_for_function("(j) => { const e = document.querySelector('#kiln-progress');"
                               " return e && e.dataset.job === j && e.dataset.state === 'running'; }",
                               arg=job, timeout=30_000)
        assert "Simplifying mesh" in _progress(page)[2]
        # the image and its selection came back with the page: the same overlay as before,
        # and the upload box names the file again
        page.wait_for_function("() => document.querySelector('#kiln-mask-info').innerText.includes('Mask:')")
        page.wait_for_function("() => document.querySelector('#kiln-upload').innerText.includes('teapot.png, from before')")
        assert np.abs(_shown_image(page).astype(int) - selected.astype(int)).mean() < 3
        page.wait_for_function("() => document.querySelector('#kiln-generate').disabled")
        # and the form shows the settings the job runs with (the seed as used)
        page.wait_for_function("(s) => document.querySelector('#kiln-seed input').value === s", arg=held)
        assert "Running" in page.inner_text("#kiln-generate") and page.locator("#kiln-cancel").is_enabled()
        _open_history(page)
        page.wait_for_function("(j) => document.querySelector('#kiln-history').innerText.includes(j)", arg=job)
        assert "teapot.png" in page.inner_text("#kiln-history")
        page.screenshot(path=str(ARTIFACTS / "r2_reconnected.jpg"), full_page=True)

        # -- a second browser's Generate while the only worker is held: its job exists at
        # once, waits in line, and a reload finds it waiting with its settings -------------
        wait_ctx, waiter = _open(browser, url)
        # another image: the crash count that stops retries is kept per input
        _upload(waiter, _write_png(tmp_path / "pot.png", make_object_image(288, "blob", seed=12)[0]))
        _click_image(waiter, 0.5, 0.5, "Mask:")
        waiter.locator("#kiln-seed input").fill(waiting_seed)    # held in 'mesh' too
        waiter.locator("#kiln-seed input").press("Tab")
        waiter.click("#kiln-generate")
        waiter.wait_for_function("() => { const e = document.querySelector('#kiln-progress');"
                                 " return e && e.dataset.state === 'queued' && e.dataset.job; }")
        _, waiting_job, waiting_text = _progress(waiter)
        assert waiting_job != job and "Waiting for a free worker: 1st in line" in waiting_text, waiting_text
        waiter.screenshot(path=str(ARTIFACTS / "r2b_waiting.jpg"), full_page=True)
        waiter.reload()
        waiter.wait_for_selector("#kiln-upload input[type=file]", state="attached")
        waiter.wait_for_function("(j) => { const e = document.querySelector('#kiln-progress');"
                                 " return e && e.dataset.job === j && e.dataset.state === 'queued'; }",
                                 arg=waiting_job, timeout=30_000)
        assert "1st in line" in _progress(waiter)[2]
        waiter.wait_for_function("(s) => document.querySelector('#kiln-seed input').value === s", arg=waiting_seed)
        assert "Running" in waiter.inner_text("#kiln-generate") and waiter.locator("#kiln-cancel").is_enabled()
        waiter.screenshot(path=str(ARTIFACTS / "r2c_waiting_after_reload.jpg"), full_page=True)

        # release the hold: the worker dies, the retry runs without the fault; the reloaded
        # page's progress moves on and the result lands here
        pids = _worker_pids(proc.pid)
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)
        page.wait_for_function("(j) => { const e = document.querySelector('#kiln-progress');"
                               " return e && e.dataset.job === j && e.dataset.stage === 'export'; }",
                               arg=job, timeout=180_000)
        done = _wait_state(page, ("done", "failed", "cancelled"))
        assert done[0] == "done" and done[1] == job, done
        page.wait_for_selector("#kiln-dl-glb", state="visible")
        with page.expect_download() as dl:
            page.click("#kiln-dl-glb")
        assert dl.value.suggested_filename == "teapot-1.glb"
        result_url = dl.value.url
        dl.value.save_as(tmp_path / "teapot-1.glb")
        _textures(tmp_path / "teapot-1.glb")            # a real GLB with a mesh
        assert page.locator("#kiln-generate").is_enabled() and page.locator("#kiln-cancel").is_disabled()
        _assert_viewer_draws(page)
        page.screenshot(path=str(ARTIFACTS / "r3_done_after_reload.jpg"), full_page=True)

        # the waiting job got the worker (its first attempt is held too): it runs on the
        # reloaded page; released the same way, it ends there
        waiter.wait_for_function("(j) => { const e = document.querySelector('#kiln-progress');"
                                 " return e && e.dataset.job === j && e.dataset.stage === 'mesh'; }",
                                 arg=waiting_job, timeout=120_000)
        assert "s so far" in _progress(waiter)[2]
        pids = _worker_pids(proc.pid)
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)
        waited = _wait_state(waiter, ("done", "failed", "cancelled"))
        assert waited[0] == "done" and waited[1] == waiting_job, waited
        wait_ctx.close()

        # -- reload after: the browser's history, with name, thumbnail, download name ---
        page.reload()
        page.wait_for_selector("#kiln-upload input[type=file]", state="attached")
        _open_history(page)
        page.wait_for_function("(j) => document.querySelector('#kiln-history').innerText.includes(j)", arg=job)
        hist = page.inner_text("#kiln-history")
        assert "teapot.png" in hist and "teapot-1.glb" in hist and "done" in hist, hist
        thumb = page.locator(f"#kiln-history li[data-job='{job}'] img.kiln-thumb")
        assert thumb.count() == 1 and thumb.evaluate("e => e.naturalWidth") > 0
        # nothing to reconnect to: the page shows the last result as it did before
        assert _wait_state(page, ("done",), timeout=30)[1] == job
        page.wait_for_selector("#kiln-dl-glb", state="visible")
        _assert_viewer_draws(page)
        assert page.locator("#kiln-generate").is_enabled() and page.locator("#kiln-cancel").is_disabled()
        assert np.abs(_shown_image(page).astype(int) - selected.astype(int)).mean() < 3
        assert page.locator("#kiln-seed input").input_value() == held
        assert "teapot-1.glb" in _file_list(page)
        files = page.locator("#kiln-history-files tr", has_text="teapot-1").locator("a[download]")
        with page.expect_download() as dl:
            files.first.click()
        assert dl.value.suggested_filename == "teapot-1.glb"
        page.screenshot(path=str(ARTIFACTS / "r4_history_after_reload.jpg"), full_page=True)

        # -- another browser sees none of it ---------------------------------------
        other_ctx, other = _open(browser, url)
        _open_history(other)
        assert job not in other.inner_text("#kiln-history")
        assert other.locator("#kiln-canvas img").count() == 0        # nor this browser's image
        assert _progress(other)[1] != job
        assert other.request.get(result_url).status == 403
        assert page.request.get(result_url).status == 200
    finally:
        for c in (ctx, other_ctx, wait_ctx):
            if c is not None:
                c.close()
        if log_path.exists():
            shutil.copy(log_path, ARTIFACTS / "server.log.txt")


def test_bake_a_model_tab(server, browser, tmp_path):
    """The second tab: a point cloud given as the mesh is refused naming the file; a mesh
    with colours of its own bakes through the worker, shows in the viewer and downloads."""
    import trimesh

    url, _, _ = server
    ball = trimesh.creation.icosphere(subdivisions=3, radius=0.5)
    ball.visual.vertex_colors = np.column_stack([
        (127 + 127 * np.sign(ball.vertices[:, 0])).astype(np.uint8), np.full(len(ball.vertices), 90, np.uint8),
        (127 - 127 * np.sign(ball.vertices[:, 0])).astype(np.uint8), np.full(len(ball.vertices), 255, np.uint8)])
    mesh = tmp_path / "ball.ply"
    ball.export(mesh)
    cloud = tmp_path / "cloud.ply"
    cloud.write_text("ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\n"
                     "property float z\nend_header\n0 0 0\n")
    ctx, page = _open(browser, url)
    try:
        page.get_by_role("tab", name="Bake a model").click()
        page.wait_for_selector("#kiln-bake-mesh input[type=file]", state="attached")
        page.set_input_files("#kiln-bake-mesh input[type=file]", str(cloud))
        page.wait_for_function("() => document.querySelector('#kiln-bake-mesh').innerText.includes('cloud')")
        page.click("#kiln-bake-button")
        _wait_toast(page, "cloud.ply has no faces")
        page.wait_for_function("() => { const e = document.querySelector('#kiln-bake-progress');"
                               " return e && e.dataset.state === 'refused' && e.innerText.includes('no faces'); }")
        page.screenshot(path=str(ARTIFACTS / "d0_bake_refused.jpg"), full_page=True)
        page.locator("#kiln-bake-mesh button[aria-label='Clear']").first.click()
        page.set_input_files("#kiln-bake-mesh input[type=file]", str(mesh))
        page.wait_for_function("() => document.querySelector('#kiln-bake-mesh').innerText.includes('ball')")
        page.click("#kiln-bake-button")
        page.wait_for_function("() => document.querySelector('#kiln-bake-notes').innerText.includes('vertex colours')")
        _wait_bake_done(page)
        _assert_viewer_draws(page, viewer="#kiln-bake-model")
        page.wait_for_selector("#kiln-bake-dl", state="visible")
        page.screenshot(path=str(ARTIFACTS / "d1_baked.jpg"), full_page=True)
        with page.expect_download() as dl:
            page.click("#kiln-bake-dl")
        assert dl.value.suggested_filename == "ball-1.glb"
        dl.value.save_as(tmp_path / "got.glb")
        assert _textures(tmp_path / "got.glb"), "the baked GLB has no texture"
    finally:
        ctx.close()


def _wait_bake_done(page, timeout_s: float = 240) -> None:
    """Until the bake tab's progress says done; fails with its text after ``timeout_s``."""
    t0 = time.monotonic()
    while page.evaluate("() => (document.querySelector('#kiln-bake-progress') || {dataset: {}}).dataset.state") \
            != "done":
        assert time.monotonic() - t0 < timeout_s, page.inner_text("#kiln-bake-progress-box")
        time.sleep(0.25)   # polling a state with a deadline, not guessing a duration


def test_a_fitted_camera_shows_its_silhouette_over_the_photo(server, browser, tmp_path):
    """The bake tab with a photo and mask but no camera: the worker fits the camera and the
    page shows the model's silhouette over the photo (a file this browser may fetch), and
    the notes say how well it fits."""
    import trimesh
    from PIL import Image

    url, _, _ = server
    ball = trimesh.creation.icosphere(subdivisions=3, radius=0.5)
    ball.visual.vertex_colors = np.full((len(ball.vertices), 4), (200, 120, 60, 255), np.uint8)
    mesh = tmp_path / "ball.ply"
    ball.export(mesh)
    yy, xx = np.mgrid[:240, :320]
    disc = (xx - 170) ** 2 + (yy - 115) ** 2 < 70 ** 2
    photo, mask = tmp_path / "photo.png", tmp_path / "mask.png"
    rgb = np.full((240, 320, 3), 90, np.uint8)
    rgb[disc] = (200, 120, 60)
    Image.fromarray(rgb).save(photo)
    Image.fromarray(disc.astype(np.uint8) * 255).save(mask)
    ctx, page = _open(browser, url)
    try:
        page.get_by_role("tab", name="Bake a model").click()
        page.wait_for_selector("#kiln-bake-mesh input[type=file]", state="attached")
        for box, path in (("mesh", mesh), ("photo", photo), ("mask", mask)):
            page.set_input_files(f"#kiln-bake-{box} input[type=file]", str(path))
            page.wait_for_function("(a) => document.querySelector(a[0]).innerText.includes(a[1])",
                                   arg=[f"#kiln-bake-{box}", path.stem])
        page.click("#kiln-bake-button")
        _wait_bake_done(page)
        page.wait_for_function("() => { const i = document.querySelector('#kiln-bake-fit-view img');"
                               " return i && i.complete && i.naturalWidth === 320; }")
        page.wait_for_function("() => document.querySelector('#kiln-bake-notes').innerText"
                               ".includes('Camera fitted to the mask')")
        page.screenshot(path=str(ARTIFACTS / "d2_fitted_camera.jpg"), full_page=True)
    finally:
        ctx.close()
