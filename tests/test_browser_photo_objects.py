"""Several objects on the "Photo to 3D" tab in a real browser against a real server and worker
(issue 39, item 3): two squares selected one after the other with "Add another object", then
Generate: with the built-in reconstruction each becomes its own model, both GLBs are offered
for download, and the progress line says what a scene would need. Screenshots go to
test-artifacts/browser/."""

from __future__ import annotations

import pytest

from browser_helpers import ARTIFACTS, open_page, require_browser, upload, wait_state, write_png

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_browser()


def click_pixel(page, x: float, y: float, expect: str) -> None:
    """Click image pixel (x, y) of the canvas, where the image is drawn inside its element
    (scaled down to fit, centred, in a box larger than itself), then wait for the
    mask info to say ``expect``."""
    img = page.locator("#kiln-canvas img")
    box = img.bounding_box()
    w, h = img.evaluate("(i) => [i.naturalWidth, i.naturalHeight]")
    scale = min(box["width"] / w, box["height"] / h)
    left, top = (box["width"] - w * scale) / 2, (box["height"] - h * scale) / 2
    img.click(position={"x": left + x * scale, "y": top + y * scale})
    page.wait_for_function("(t) => document.querySelector('#kiln-mask-info').innerText.includes(t)", arg=expect)


def test_two_objects_of_one_photo_make_a_model_each_and_say_what_a_scene_needs(server, browser, tmp_path):
    from test_photo_objects import two_boxes

    ctx, page = open_page(browser, server)
    try:
        # twice the size: a photo smaller than the canvas's box is drawn unscaled in it
        upload(page, write_png(tmp_path / "boxes.png", two_boxes().repeat(2, axis=0).repeat(2, axis=1)))
        click_pixel(page, 140, 200, "Mask:")
        page.click("#kiln-keep")
        page.wait_for_function("() => document.querySelector('#kiln-mask-info').innerText.includes('Kept:')")
        info = page.inner_text("#kiln-mask-info")
        assert "each its own model" in info and "reconstruct.backend = sam3d" in info, info
        page.wait_for_selector("#kiln-drop-kept", state="visible")
        click_pixel(page, 440, 200, "object 2")
        page.click("#kiln-generate")
        state, _, text = wait_state(page, ("done", "failed", "cancelled"))
        assert state == "done", text
        page.wait_for_function("() => document.querySelector('#kiln-progress').innerText.includes('objects made')")
        text = page.inner_text("#kiln-progress")
        assert "2 of 2 objects made" in text and "SAM 3D Objects" in text, text
        page.wait_for_function("() => document.querySelector('#kiln-dl-more').innerText.includes('boxes-2')")
        listed = page.inner_text("#kiln-dl-more")   # Gradio breaks a name before its extension
        assert "boxes-1" in listed and "boxes-2" in listed, listed
        sizes = page.inner_text("#kiln-file-sizes")
        assert sizes.count("boxes-1.glb") == 1 and sizes.count("boxes-2.glb") == 1, sizes
        page.screenshot(path=str(ARTIFACTS / "p1_two_objects.jpg"), full_page=True)
    finally:
        ctx.close()
