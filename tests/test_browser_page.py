"""The page as it looks and as it is reached, in Chromium against the app served as a person
starts it (``browser_helpers.serve``):

- the 3D preview lights a neutral texture neutrally (it used to tint white and cream
  models lavender): a mesh of one grey is baked, and the viewer's pixels of it are grey;
- at 1400x1000 and at 1280x720 a result's viewer and its download are on screen without
  scrolling; at 390x844 Generate comes right after the image, and no label is cut off or drawn over an
  icon (drop zones, the upload box, the selection's check boxes), at either size;
- every button has an accessible name (Chromium's accessibility tree), on both tabs, with a
  result shown; the object can be selected from the keyboard;
- a file dropped on the upload box while it holds an image replaces the image (a click on
  it opens the file chooser for the same).

Screenshots go to test-artifacts/browser/ (p*.png).
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

import numpy as np
import pytest

from browser_helpers import (ARTIFACTS, assert_viewer_draws, click_image, open_page, progress,
                             require_browser, shown_image, upload, viewer_shot, wait_state, write_png)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_browser()

# the viewers' clear colour (page.py: clear_color=(0.93, 0.93, 0.95, 1))
CLEAR_RGB = np.array([237, 237, 242])


def _model_pixels(shot: np.ndarray) -> np.ndarray:
    """The pixels of the model in a viewer's canvas: the largest region unlike the clear
    colour (the label and the buttons over the canvas are smaller), its rim eroded away
    (there the model blends with the clear colour)."""
    import cv2

    unlike = (np.abs(shot.astype(int) - CLEAR_RGB).sum(-1) > 30).astype(np.uint8)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(unlike, connectivity=4)
    if n < 2:
        return np.zeros((0, 3), int)
    biggest = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    core = cv2.erode((labels == biggest).astype(np.uint8), np.ones((7, 7), np.uint8)).astype(bool)
    return shot[core].astype(int)


def _settled_model_pixels(page, viewer: str, timeout_s: float = 30.0) -> tuple[np.ndarray, np.ndarray]:
    """(canvas, model pixels) once the model covers a real part of the canvas and two shots
    in a row agree (the environment light arrives after the first frames)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        shot = viewer_shot(page, viewer)
        px = _model_pixels(shot)
        if len(px) > 0.02 * shot.shape[0] * shot.shape[1]:
            mean = px.mean(0)
            if last is not None and np.abs(mean - last).max() < 0.5:
                return shot, px
            last = mean
        assert time.monotonic() < deadline, f"the model in {viewer} did not settle within {timeout_s:.0f} s"
        page.wait_for_timeout(300)


def test_the_viewer_lights_a_neutral_texture_neutrally(server, browser, tmp_path):
    """A ball of one grey, baked on the "Bake a model" tab: its texture is grey, and so is
    every pixel the viewer draws of it (chroma |R-B|, |G-B| within a few levels; the tinted
    light drew grey 200 as about 200, 190, 208)."""
    import trimesh
    from PIL import Image

    ball = trimesh.creation.icosphere(subdivisions=3, radius=0.5)
    ball.visual.vertex_colors = np.tile(np.array([160, 160, 160, 255], np.uint8), (len(ball.vertices), 1))
    mesh = tmp_path / "grey_ball.ply"
    ball.export(mesh)
    ctx, page = open_page(browser, server, 1400, 1000)
    try:
        page.get_by_role("tab", name="Bake a model").click()
        page.set_input_files("#kiln-bake-mesh input[type=file]", str(mesh))
        page.wait_for_function("() => document.querySelector('#kiln-bake-mesh').innerText.includes('grey_ball')")
        page.click("#kiln-bake-button")
        page.wait_for_function("() => { const e = document.querySelector('#kiln-bake-progress');"
                               " return e && ['done', 'failed', 'refused'].includes(e.dataset.state); }",
                               timeout=240_000)
        assert page.evaluate("() => document.querySelector('#kiln-bake-progress').dataset.state") == "done", \
            page.inner_text("#kiln-bake-progress-box")
        page.wait_for_selector("#kiln-bake-dl", state="visible")
        with page.expect_download() as dl:
            page.click("#kiln-bake-dl")
        dl.value.save_as(tmp_path / "baked.glb")
        scene = trimesh.load(tmp_path / "baked.glb", force="scene")
        textures = [g.visual.material.baseColorTexture for g in scene.geometry.values()
                    if getattr(getattr(g.visual, "material", None), "baseColorTexture", None) is not None]
        assert textures, "the baked GLB has no texture"
        tex = np.asarray(textures[0].convert("RGB")).astype(int)
        assert np.abs(tex - 160).max() <= 2, "the texture itself is not the mesh's grey"

        assert_viewer_draws(page, viewer="#kiln-bake-model")
        shot, px = _settled_model_pixels(page, "#kiln-bake-model")
        Image.fromarray(shot).save(ARTIFACTS / "p0_neutral_light.jpg")
        rb, gb = px[:, 0] - px[:, 2], px[:, 1] - px[:, 2]
        summary = (f"model pixels {len(px)}, mean RGB {px.mean(0).round(1)}, mean R-B {rb.mean():.2f}, "
                   f"mean G-B {gb.mean():.2f}, 99th percentile |R-B| {np.percentile(np.abs(rb), 99):.0f}, "
                   f"|G-B| {np.percentile(np.abs(gb), 99):.0f}")
        assert abs(rb.mean()) <= 2 and abs(gb.mean()) <= 2, f"tinted: {summary}"
        assert np.percentile(np.abs(rb), 99) <= 5 and np.percentile(np.abs(gb), 99) <= 5, f"tinted: {summary}"
        # lit, not flat: the light still shades the ball
        assert px.mean(0).min() > 60 and px[:, 1].std() > 3, summary
    finally:
        ctx.close()


# Elements whose text must not be cut or drawn over, each as (what, block, text inside it).
_CHECKBOXES = [("Background clicks", "#kiln-bg", ".label-text"), ("Show selection", "#kiln-show-mask", ".label-text"),
               ("Use transparency as mask", "#kiln-alpha", ".label-text")]

# For each element: problems with it, as text ('' when none). A box cuts its content when
# its content is larger than it (scroll sizes), or a part lies outside it; a drop zone's
# label must not cover its icon or its text.
_LAYOUT_PROBLEMS_JS = """
([checks, zones]) => {
  const problems = [];
  const rect = (e) => e.getBoundingClientRect();
  const inside = (a, b) => a.left >= b.left - 1 && a.right <= b.right + 1 && a.top >= b.top - 1 && a.bottom <= b.bottom + 1;
  const overlap = (a, b) => a.width > 0 && b.width > 0 && a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const cuts = (e) => e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1;
  for (const [what, block, text] of checks) {
    const b = document.querySelector(block);
    if (!b || b.offsetParent === null) { problems.push(`${what}: not shown`); continue; }
    const t = b.querySelector(text);
    if (cuts(b)) problems.push(`${what}: its box cuts it (${b.scrollWidth}x${b.scrollHeight} in ${b.clientWidth}x${b.clientHeight})`);
    if (!t || !inside(rect(t), rect(b))) problems.push(`${what}: its text lies outside its box`);
  }
  for (const zone of zones) {
    const z = document.querySelector(zone);
    if (!z || z.offsetParent === null) continue;
    const label = z.querySelector('label[data-testid=block-label]');
    const drop = z.querySelector('button.upload-container');
    const words = z.querySelector('[data-testid=upload-text]');
    const icon = z.querySelector('[data-testid=upload-icon]');
    if (label && cuts(label)) problems.push(`${zone}: its label is cut`);
    if (drop && words) {
      if (cuts(drop) || !inside(rect(words), rect(drop))) problems.push(`${zone}: the drop zone cuts its text`);
      if (label && overlap(rect(label), rect(words))) problems.push(`${zone}: the label covers the drop zone's text`);
      if (label && icon && overlap(rect(label), rect(icon))) problems.push(`${zone}: the label covers the upload icon`);
    }
    const file = z.querySelector('.file-preview-holder');
    if (label && file && overlap(rect(label), rect(file))) problems.push(`${zone}: the label covers the file`);
  }
  return problems;
}
"""

_ZONES = ["#kiln-upload", "#kiln-mask-file", "#kiln-bake-mesh", "#kiln-bake-splat", "#kiln-bake-photo",
          "#kiln-bake-mask", "#kiln-bake-camera"]


def _layout_problems(page, checks=()) -> list[str]:
    return page.evaluate(_LAYOUT_PROBLEMS_JS, [list(checks), _ZONES])


def _unnamed_buttons(ctx, page) -> list[str]:
    """Buttons in Chromium's accessibility tree (what a screen reader is given) without a
    name, each described by its DOM node's outer HTML."""
    cdp = ctx.new_cdp_session(page)
    try:
        nodes = cdp.send("Accessibility.getFullAXTree")["nodes"]
        out = []
        for n in nodes:
            if n.get("ignored") or n.get("role", {}).get("value") != "button":
                continue
            if str(n.get("name", {}).get("value", "")).strip():
                continue
            html = "?"
            if "backendDOMNodeId" in n:
                html = cdp.send("DOM.getOuterHTML", {"backendNodeId": n["backendDOMNodeId"]})["outerHTML"][:200]
            out.append(html)
        return out
    finally:
        cdp.detach()


def _page_top(page, selector: str) -> float:
    """Where ``selector`` starts, in page pixels from the top of the document."""
    return page.evaluate("(s) => document.querySelector(s).getBoundingClientRect().top + window.scrollY", selector)


def _rgba_object(tmp_path: Path, name: str, seed: int) -> Path:
    """An object with transparency (the "Use transparency as mask" box is shown for it)."""
    from PIL import Image

    from synthetic import make_object_image

    rgb, gt = make_object_image(320, "blob", seed=seed)
    path = tmp_path / name
    Image.fromarray(np.dstack([rgb, gt.astype(np.uint8) * 255]), "RGBA").save(path)
    return path


def test_result_on_screen_at_1400x1000_and_every_button_named(server, browser, tmp_path):
    """At 1400x1000 (and 1280x720) the result's viewer and its download lie inside the first screen; the
    labels and drop zones are whole; every button has a name, on both tabs; the object can
    be selected from the keyboard ("Find the object" focused, Enter)."""
    from synthetic import make_object_image

    img = write_png(tmp_path / "plain_ellipse.png", make_object_image(320, "ellipse", seed=4)[0])
    ctx, page = open_page(browser, server, 1400, 1000)
    try:
        assert _layout_problems(page) == []          # the empty drop zones
        assert _unnamed_buttons(ctx, page) == []
        upload(page, img)
        # the keyboard: focus "Find the object" and press Enter
        page.locator("#kiln-find").focus()
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.querySelector('#kiln-mask-info').innerText.includes('found automatically')")
        assert _layout_problems(page, _CHECKBOXES[:2]) == []    # the upload box holds the file now
        page.click("#kiln-generate")
        st = wait_state(page, ("done", "failed", "cancelled"))
        assert st[0] == "done", st
        page.wait_for_selector("#kiln-dl-glb", state="visible")
        assert_viewer_draws(page)
        page.evaluate("() => window.scrollTo(0, 0)")
        page.wait_for_function("() => window.scrollY === 0")
        page.screenshot(path=str(ARTIFACTS / "p1_result_1400x1000.jpg"))
        for what in ("#kiln-model", "#kiln-dl-glb", "#kiln-canvas"):
            box = page.locator(what).bounding_box()
            assert box["y"] >= 0 and box["y"] + box["height"] <= 1000, f"{what} is not on the first screen: {box}"
        # a laptop's 1280x720: the viewer shrinks to keep itself and the download on screen
        page.set_viewport_size({"width": 1280, "height": 720})
        page.wait_for_function("() => document.querySelector('#kiln-model').getBoundingClientRect().height < 420")
        page.evaluate("() => window.scrollTo(0, 0)")
        page.wait_for_function("() => window.scrollY === 0")
        page.screenshot(path=str(ARTIFACTS / "p1_result_1280x720.jpg"))
        for what in ("#kiln-model", "#kiln-dl-glb"):
            box = page.locator(what).bounding_box()
            assert box["y"] >= 0 and box["y"] + box["height"] <= 720, f"{what} is not on a 1280x720 screen: {box}"
        assert_viewer_draws(page)
        page.set_viewport_size({"width": 1400, "height": 1000})
        assert _unnamed_buttons(ctx, page) == []     # the viewer's own buttons, the downloads
        page.get_by_role("tab", name="Bake a model").click()
        page.wait_for_selector("#kiln-bake-mesh input[type=file]", state="attached")
        assert _layout_problems(page) == []
        assert _unnamed_buttons(ctx, page) == []
    finally:
        ctx.close()


def test_phone_generate_after_the_image_and_nothing_cut(server, browser, tmp_path):
    """At 390x844: the image, then its selection, then Generate and the result (the mask
    file, examples and settings come after); nothing is cut or drawn over, the three
    selection boxes included (for an image with transparency); every button has a name."""
    ctx, page = open_page(browser, server, 390, 844)
    try:
        assert _layout_problems(page) == []
        page.screenshot(path=str(ARTIFACTS / "p2_phone_empty.jpg"), full_page=True)
        path = _rgba_object(tmp_path, "cut_out.png", seed=5)
        upload(page, path)
        page.wait_for_selector("#kiln-alpha", state="visible")
        problems = _layout_problems(page, _CHECKBOXES)
        page.screenshot(path=str(ARTIFACTS / "p3_phone_image.jpg"), full_page=True)
        assert problems == []
        generate = _page_top(page, "#kiln-generate")
        # it was 2.4 screens down, under the mask file, the examples and the settings
        assert generate < 1.5 * 844, f"Generate starts {generate:.0f} px down the page"
        assert _page_top(page, "#kiln-canvas") < generate < _page_top(page, "#kiln-model")
        assert _page_top(page, "#kiln-model") < _page_top(page, "#kiln-settings") < _page_top(page, "#kiln-mask-file")
        assert _unnamed_buttons(ctx, page) == []
    finally:
        ctx.close()


def _drop_file(page, selector: str, path: Path) -> None:
    """Drop ``path`` on ``selector`` as a person's drag from the desktop does: dragenter,
    dragover and drop with a DataTransfer that holds the file."""
    page.evaluate("""([selector, data, name]) => {
        const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
        const dt = new DataTransfer();
        dt.items.add(new File([bytes], name, {type: 'image/png'}));
        const target = document.querySelector(selector);
        for (const type of ['dragenter', 'dragover', 'drop'])
            target.dispatchEvent(new DragEvent(type, {bubbles: true, cancelable: true, dataTransfer: dt}));
    }""", [selector, base64.b64encode(path.read_bytes()).decode("ascii"), path.name])


def test_a_file_dropped_on_the_filled_upload_box_replaces_the_image(server, browser, tmp_path):
    """Drop on the box that shows the image's file: the new image replaces the old (canvas,
    its selection, the file in the box); a click on the box opens the file chooser, whose
    file replaces it too; a broken file dropped there is refused with its reason and leaves
    the box empty for the next drop."""
    from synthetic import make_object_image

    first = write_png(tmp_path / "first.png", make_object_image(320, "blob", seed=5)[0])
    second_rgb = make_object_image(288, "ellipse", seed=9)[0]
    second = write_png(tmp_path / "second.png", second_rgb)
    ctx, page = open_page(browser, server, 1400, 1000)
    try:
        upload(page, first)
        click_image(page, 0.5, 0.5, "Mask:")
        _drop_file(page, "#kiln-upload .file-preview-holder", second)
        page.wait_for_function("() => document.querySelector('#kiln-mask-info').innerText.includes('second.png')")
        page.wait_for_function("() => document.querySelector('#kiln-upload').innerText.includes('second')")
        assert "first" not in page.inner_text("#kiln-upload")
        assert "Mask:" not in page.inner_text("#kiln-mask-info")      # the old selection went with the image
        shown = shown_image(page)
        assert shown.shape == second_rgb.shape and np.abs(shown.astype(int) - second_rgb).mean() < 6
        assert progress(page)[0] == "idle"
        page.screenshot(path=str(ARTIFACTS / "p4_dropped_on_filled_box.jpg"))

        # a click on the filled box (its file name) opens the chooser: the chosen file replaces it
        with page.expect_file_chooser() as chooser:
            page.click("#kiln-upload .file-preview-holder .filename")
        chooser.value.set_files(str(first))
        page.wait_for_function("() => document.querySelector('#kiln-mask-info').innerText.includes('first.png')")
        page.wait_for_function("() => document.querySelector('#kiln-upload').innerText.includes('first')")

        broken = tmp_path / "broken.png"
        broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really" * 20)
        _drop_file(page, "#kiln-upload .file-preview-holder", broken)
        page.wait_for_function("() => document.querySelector('#kiln-mask-info').innerText.includes('Cannot use')")
        assert "broken.png" in page.inner_text("#kiln-mask-info")
        page.wait_for_selector("#kiln-upload input[type=file]", state="attached")   # the drop zone is back
        upload(page, second)
    finally:
        ctx.close()


def test_a_typed_value_out_of_range_is_named_when_the_slider_clamps_it(server, browser):
    """Gradio's slider clamps 1.5 to 0.999 when the box loses focus; the page says so under
    the slider, and the note goes with the next value in range."""
    ctx, page = open_page(browser, server, 1400, 1000)
    try:
        box = page.locator("#kiln-simplify input[type=number]")
        box.fill("1.5")
        box.press("Tab")
        page.wait_for_function("() => { const n = document.querySelector('#kiln-simplify .kiln-range-note');"
                               " return n && n.innerText.includes('outside'); }")
        note = page.inner_text("#kiln-simplify .kiln-range-note")
        assert "Simplify ratio" in note and "1.5 is outside 0 to 0.999" in note and "set to 0.999" in note, note
        assert float(box.input_value()) == pytest.approx(0.999)      # Gradio's clamp, now said
        page.locator("#kiln-simplify").screenshot(path=str(ARTIFACTS / "p5_range_note.jpg"))
        box.fill("0.9")
        box.press("Tab")
        page.wait_for_function("() => { const n = document.querySelector('#kiln-simplify .kiln-range-note');"
                               " return n && n.innerText.trim() === ''; }")
        assert not page.locator("#kiln-simplify .kiln-range-note").is_visible()
    finally:
        ctx.close()
