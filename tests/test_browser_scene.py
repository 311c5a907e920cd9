"""A scene on the page, in a real browser against a real server and worker (issue 39): the
"Bake a model" tab with a second object under "More objects of this photo" bakes one GLB of
both; the picture of the placed objects shows, the notes give a line per object, the viewer
and the download get the scene. Screenshots go to test-artifacts/browser/."""

from __future__ import annotations


import pytest

from browser_helpers import ARTIFACTS, assert_viewer_draws, open_page, require_browser, wait_bake_state

pytestmark = [pytest.mark.browser, pytest.mark.slow]

require_browser()


def test_two_objects_of_one_photo_bake_into_one_scene(server, browser, tmp_path):
    from scene_helpers import write_ball_before_board

    files = write_ball_before_board(tmp_path / "scene")
    ctx, page = open_page(browser, server)
    try:
        page.get_by_role("tab", name="Bake a model").click()
        page.wait_for_selector("#kiln-bake-mesh input[type=file]", state="attached")
        page.locator("#kiln-bake-objects").get_by_text("More objects of this photo").click()
        page.wait_for_selector("#kiln-bake-object-mesh-2 input[type=file]", state="attached")
        for box, key in (("mesh", "ball"), ("photo", "photo"), ("mask", "ball_mask"),
                         ("object-mesh-2", "board"), ("object-mask-2", "board_mask")):
            path = files[key]
            page.set_input_files(f"#kiln-bake-{box} input[type=file]", str(path))
            page.wait_for_function("(a) => document.querySelector(a[0]).innerText.includes(a[1])",
                                   arg=[f"#kiln-bake-{box}", path.stem])
        page.fill("#kiln-bake-focal input", "300")
        page.click("#kiln-bake-button")
        wait_bake_state(page, "done")
        page.wait_for_function("() => document.querySelector('#kiln-bake-notes').innerText.includes('board:')")
        notes = page.inner_text("#kiln-bake-notes")
        assert "ball: pose kept" in notes and "board: pose kept" in notes, notes
        assert "hidden by other objects" in notes, notes   # the ball hides part of the board
        # the placed objects over the photo (320 px wide, as the photo)
        page.wait_for_function("() => { const i = document.querySelector('#kiln-bake-fit-view img');"
                               " return i && i.complete && i.naturalWidth === 320; }")
        page.wait_for_selector("#kiln-bake-dl", state="visible")
        # the download is the scene: a node per object, named after its mesh file
        with page.expect_download() as dl:
            page.click("#kiln-bake-dl")
        dl.value.save_as(tmp_path / "scene.glb")
        import trimesh

        scene = trimesh.load(tmp_path / "scene.glb", force="scene")
        assert {"ball", "board"} <= set(scene.graph.nodes), scene.graph.nodes
        assert_viewer_draws(page, viewer="#kiln-bake-model")
        page.screenshot(path=str(ARTIFACTS / "s1_scene_baked.jpg"), full_page=True)
    finally:
        ctx.close()
