"""The bake tab's "Fit the camera to the photo" in a real browser against a real server and
worker: the button runs the fit alone, the page shows the fitted silhouette over the photo and
the fit's figures before anything is baked, Bake then uses that camera (the notes say so, no
refit), and a new mask drops the fit. Screenshots go to test-artifacts/browser/."""

from __future__ import annotations


import numpy as np
import pytest

from browser_helpers import ARTIFACTS, open_page, require_browser, wait_bake_state

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_browser()


def _text(page, selector: str) -> str:
    return page.inner_text(selector)


def test_fit_the_camera_first_then_bake_with_it(server, browser, tmp_path):
    from PIL import Image

    from fit_helpers import fit_scene

    scene = fit_scene(tmp_path / "scene")
    ctx, page = open_page(browser, server)
    try:
        page.get_by_role("tab", name="Bake a model").click()
        page.wait_for_selector("#kiln-bake-mesh input[type=file]", state="attached")
        for box, path in (("mesh", scene.mesh), ("photo", scene.photo), ("mask", scene.mask)):
            page.set_input_files(f"#kiln-bake-{box} input[type=file]", str(path))
            page.wait_for_function("(a) => document.querySelector(a[0]).innerText.includes(a[1])",
                                   arg=[f"#kiln-bake-{box}", path.stem])
        button = page.locator("#kiln-bake-fit-button")
        assert button.inner_text().strip() == "Fit the camera to the photo"
        button.click()
        wait_bake_state(page, "done")
        page.wait_for_function("() => { const i = document.querySelector('#kiln-bake-fit-view img');"
                               " return i && i.complete && i.naturalWidth === 320; }")
        page.wait_for_function("() => document.querySelector('#kiln-bake-fit-info').innerText"
                               ".includes('Bake will use this camera')")
        info = _text(page, "#kiln-bake-fit-info")
        assert "Camera fitted to the mask in" in info and "silhouette IoU" in info and "covering" in info
        assert "Tie-break:" in info and "no refit" in info
        assert "camera fitted: press Bake" in _text(page, "#kiln-bake-progress-box")
        # nothing was baked: no model, no download
        assert not page.locator("#kiln-bake-dl").is_visible()
        # the picture is the model over the photo: its tint differs from the photo inside the mask
        src = page.locator("#kiln-bake-fit-view img").get_attribute("src")
        import io

        shown = np.asarray(Image.open(io.BytesIO(page.request.get(src).body())).convert("RGB"), np.int16)
        photo = np.asarray(Image.open(scene.photo).convert("RGB"), np.int16)
        mask = np.asarray(Image.open(scene.mask)) > 127
        assert np.abs(shown - photo)[mask].mean() > 10
        page.screenshot(path=str(ARTIFACTS / "f1_fitted_before_baking.png"), full_page=True)

        page.click("#kiln-bake-button")
        page.wait_for_function("() => document.querySelector('#kiln-bake-notes').innerText"
                               ".includes('Baking with the camera fitted before')")
        wait_bake_state(page, "done")
        page.wait_for_function("() => document.querySelector('#kiln-bake-notes').innerText"
                               ".includes('Baked with the camera fitted before, not fitted again')")
        page.wait_for_selector("#kiln-bake-dl", state="visible")   # shown by the same update, drawn after it
        assert "Bake will use this camera" in _text(page, "#kiln-bake-fit-info"), "the fit stays for the next Bake"
        page.screenshot(path=str(ARTIFACTS / "f2_baked_with_the_fit.png"), full_page=True)

        # the mask taken away: the fit no longer holds
        page.locator("#kiln-bake-mask button[aria-label='Clear']").click()
        page.wait_for_function("() => document.querySelector('#kiln-bake-fit-info').innerText"
                               ".includes('was dropped')")
        page.screenshot(path=str(ARTIFACTS / "f3_fit_dropped.png"), full_page=True)
        page.wait_for_selector("#kiln-bake-fit-view img", state="hidden")
    finally:
        ctx.close()


def test_two_photos_fit_side_by_side_and_bake_with_a_line_each(server, browser, tmp_path):
    """Issue 34 on the page: a second photo (with its mask) under "More photos of the object":
    the fit shows both silhouettes over their photos side by side, and the bake's notes give
    each photo's camera and share of the texels."""
    from fit_helpers import fit_scene

    front = fit_scene(tmp_path / "front")
    side = fit_scene(tmp_path / "side", yaw=-70.0, pitch=20.0)
    ctx, page = open_page(browser, server)
    try:
        page.get_by_role("tab", name="Bake a model").click()
        page.wait_for_selector("#kiln-bake-mesh input[type=file]", state="attached")
        page.locator("#kiln-bake-more").get_by_text("More photos of the object").click()
        page.wait_for_selector("#kiln-bake-photo-2 input[type=file]", state="attached")
        for box, path in (("mesh", front.mesh), ("photo", front.photo), ("mask", front.mask),
                          ("photo-2", side.photo), ("mask-2", side.mask)):
            page.set_input_files(f"#kiln-bake-{box} input[type=file]", str(path))
            page.wait_for_function("(a) => document.querySelector(a[0]).innerText.includes(a[1])",
                                   arg=[f"#kiln-bake-{box}", path.stem])
        page.click("#kiln-bake-fit-button")
        wait_bake_state(page, "done")
        # one picture: two 320 px silhouettes over their photos, 8 px apart
        page.wait_for_function("() => { const i = document.querySelector('#kiln-bake-fit-view img');"
                               " return i && i.complete && i.naturalWidth === 648; }")
        page.screenshot(path=str(ARTIFACTS / "f4_two_photos_fitted.jpg"), full_page=True)
        page.click("#kiln-bake-button")
        # the bake's own notes first (the bar still says the fit's "done" until the bake starts)
        page.wait_for_function("() => document.querySelector('#kiln-bake-notes').innerText"
                               ".includes('Baking with the camera fitted before')")
        wait_bake_state(page, "done")
        page.wait_for_function("() => document.querySelector('#kiln-bake-notes').innerText.includes('of texels')")
        notes = _text(page, "#kiln-bake-notes")
        assert "photo 1 (photo.png): camera fitted before" in notes, notes
        assert "photo 2 (photo.png): camera fitted" in notes, notes
        page.wait_for_selector("#kiln-bake-dl", state="visible")
        page.screenshot(path=str(ARTIFACTS / "f5_two_photos_baked.jpg"), full_page=True)
    finally:
        ctx.close()
