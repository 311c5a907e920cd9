"""The page's 3D viewer shows a Kiln GLB's texture in every texture encoding Kiln writes: PNG,
JPEG and WebP (the last through ``EXT_texture_webp``, which the GLB declares required, so a
viewer without that extension would refuse the whole file and draw nothing).

Each GLB is made as a person makes it: a ball whose upper half is red and lower half blue is
baked on the "Bake a model" tab with the texture file set to each format, in Chromium against
the app served as a person starts it (``browser_helpers.serve``). The downloaded GLB is checked
to hold its texture in that encoding, and the viewer's pixels of the ball to show both the
red and the blue (a viewer that dropped the texture draws the material's white, or nothing).

Screenshots go to test-artifacts/browser/ (t_<format>.png).
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from browser_helpers import ARTIFACTS, assert_viewer_draws, open_page, require_browser, viewer_shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_browser()

# the viewers' clear colour (page.py: clear_color=(0.93, 0.93, 0.95, 1))
CLEAR_RGB = np.array([237, 237, 242])
RED = (220, 30, 30)
BLUE = (30, 60, 220)
MIME = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


@pytest.fixture(scope="module")
def two_colour_ball(tmp_path_factory):
    """A ball, red above its equator and blue below (vertex colours, which the bake turns
    into its texture)."""
    import trimesh

    ball = trimesh.creation.icosphere(subdivisions=4, radius=0.5)
    colours = np.where(ball.vertices[:, 1:2] > 0, np.array([*RED, 255]), np.array([*BLUE, 255]))
    ball.visual.vertex_colors = colours.astype(np.uint8)
    path = tmp_path_factory.mktemp("ball") / "two_colour_ball.ply"
    ball.export(path)
    return path


def _glb_texture(path) -> tuple[dict, np.ndarray]:
    """(the GLB's JSON document, its first image decoded to (H, W, 3) uint8)."""
    import io

    from PIL import Image

    from pipeline.io.glb_texture import split_glb

    doc, binary = split_glb(path.read_bytes())
    view = doc["bufferViews"][doc["images"][0]["bufferView"]]
    start = view.get("byteOffset", 0)
    data = binary[start:start + view["byteLength"]]
    return doc, np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _model_pixels(shot: np.ndarray) -> np.ndarray:
    """The pixels of the model: the largest region unlike the clear colour (the viewer's
    label and buttons are smaller), its rim eroded away (blended with the clear colour)."""
    import cv2

    unlike = (np.abs(shot.astype(int) - CLEAR_RGB).sum(-1) > 30).astype(np.uint8)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(unlike, connectivity=4)
    if n < 2:
        return np.zeros((0, 3), int)
    biggest = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    core = cv2.erode((labels == biggest).astype(np.uint8), np.ones((7, 7), np.uint8)).astype(bool)
    return shot[core].astype(int)


def _colour_shares(px: np.ndarray) -> tuple[float, float]:
    """(share of red pixels, share of blue pixels) among the model's: a channel that leads
    the others by 60 levels, whatever the shading."""
    r, g, b = px[:, 0], px[:, 1], px[:, 2]
    red = (r - np.maximum(g, b) > 60).mean()
    blue = (b - np.maximum(r, g) > 60).mean()
    return float(red), float(blue)


def _settled_shot(page, viewer: str, timeout_s: float = 30.0) -> np.ndarray:
    """The viewer's canvas once the model covers a real part of it and two shots in a row
    agree (the environment light arrives after the first frames)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        shot = viewer_shot(page, viewer)
        px = _model_pixels(shot)
        if len(px) > 0.02 * shot.shape[0] * shot.shape[1]:
            mean = px.mean(0)
            if last is not None and np.abs(mean - last).max() < 0.5:
                return shot
            last = mean
        assert time.monotonic() < deadline, f"the model in {viewer} did not settle within {timeout_s:.0f} s"
        page.wait_for_timeout(300)


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp"])
def test_the_viewer_shows_the_texture_in_each_format(server, browser, two_colour_ball, tmp_path, fmt):
    from PIL import Image

    ctx, page = open_page(browser, server, 1400, 1000)
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    try:
        page.get_by_role("tab", name="Bake a model").click()
        page.set_input_files("#kiln-bake-mesh input[type=file]", str(two_colour_ball))
        page.wait_for_function(
            "() => document.querySelector('#kiln-bake-mesh').innerText.includes('two_colour_ball')")
        page.locator("#kiln-bake-texture-format").get_by_label(fmt, exact=True).check()
        page.click("#kiln-bake-button")
        page.wait_for_function("() => { const e = document.querySelector('#kiln-bake-progress');"
                               " return e && ['done', 'failed', 'refused'].includes(e.dataset.state); }",
                               timeout=240_000)
        assert page.evaluate("() => document.querySelector('#kiln-bake-progress').dataset.state") == "done", \
            page.inner_text("#kiln-bake-progress-box")
        page.wait_for_selector("#kiln-bake-dl", state="visible")
        with page.expect_download() as dl:
            page.click("#kiln-bake-dl")
        glb = tmp_path / f"ball_{fmt}.glb"
        dl.value.save_as(glb)

        # the file holds its texture in the chosen encoding, and the texture is the ball's colours
        doc, tex = _glb_texture(glb)
        assert doc["images"][0]["mimeType"] == MIME[fmt], json.dumps(doc["images"])
        if fmt == "webp":
            assert "EXT_texture_webp" in doc.get("extensionsRequired", []), doc.get("extensionsRequired")
        tex_red, tex_blue = _colour_shares(tex.reshape(-1, 3).astype(int))
        assert tex_red > 0.2 and tex_blue > 0.2, f"the texture is not the ball's: red {tex_red:.2f}, blue {tex_blue:.2f}"

        assert_viewer_draws(page, viewer="#kiln-bake-model")
        shot = _settled_shot(page, "#kiln-bake-model")
        Image.fromarray(shot).save(ARTIFACTS / f"t_{fmt}.png")
        px = _model_pixels(shot)
        red, blue = _colour_shares(px)
        summary = (f"{fmt}: model pixels {len(px)}, mean RGB {px.mean(0).round(1)}, red {red:.2f}, blue {blue:.2f}; "
                   f"console: {[c for c in console if c.startswith(('error', 'warning'))][-5:]}")
        print(summary)
        assert red > 0.15 and blue > 0.15, f"the viewer does not show the texture's colours: {summary}"
    finally:
        ctx.close()
