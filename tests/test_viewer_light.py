"""The 3D viewer's light made neutral (app/web/page/viewer_light.py), without a browser: Gradio's
own default environment, rewritten, keeps its layout and brightness and loses its colour;
the middleware serves it in place of Gradio's asset and leaves every other request alone.
(tests/test_browser_page.py checks the viewer's pixels in Chromium.)"""

from __future__ import annotations

import asyncio
import base64
import io
import re

import numpy as np
import pytest

pytest.importorskip("gradio", reason="the viewer's environment is one of Gradio's assets")

from app.web.page import viewer_light as viewerlight  # noqa: E402


@pytest.fixture(scope="module")
def asset():
    found = viewerlight.find_environment_asset()
    if found is None:
        pytest.skip("this Gradio ships no defaultEnvironment asset (its 3D viewer changed)")
    return found


def _env_of(js: str) -> bytes:
    return base64.b64decode(re.search(r"base64,([A-Za-z0-9+/=]+)", js).group(1))


def _images(env: bytes) -> list[np.ndarray]:
    from PIL import Image

    manifest, body = viewerlight.read_environment(env)
    return [np.asarray(Image.open(io.BytesIO(body[e["position"]:e["position"] + e["length"]])).convert("RGBA"))
            for e in viewerlight.environment_images(manifest)]


def test_gradios_environment_is_tinted_and_the_rewrite_is_grey_with_the_same_light(asset):
    original = _env_of(asset.read_text("utf-8"))
    neutral_js = viewerlight.neutral_environment_module(asset.read_text("utf-8"))
    neutral = _env_of(neutral_js)
    before, _ = viewerlight.read_environment(original)
    after, _ = viewerlight.read_environment(neutral)
    # the problem: the diffuse light's constant term has more red and blue than green
    yy = before["irradiance"]["yy"]
    assert yy[2] - yy[1] > 0.05 and yy[0] - yy[1] > 0.03, yy
    # every coefficient grey, of the same luminance
    for key, rgb in before["irradiance"].items():
        if isinstance(rgb, list):
            assert after["irradiance"][key] == [pytest.approx(float(np.dot(viewerlight.LUMA, rgb)))] * 3, key
    # the same images (count, sizes, alpha = RGBD range), every pixel grey, luminance kept
    old, new = _images(original), _images(neutral)
    assert len(new) == len(old) >= 6
    for a, b in zip(old, new):
        assert a.shape == b.shape and np.array_equal(a[..., 3], b[..., 3])
        assert np.array_equal(b[..., 0], b[..., 1]) and np.array_equal(b[..., 1], b[..., 2])
        luma = a[..., :3].astype(float) @ np.asarray(viewerlight.LUMA)
        assert np.abs(b[..., 0] - luma).max() <= 0.51
    assert any(np.abs(a[..., 0].astype(int) - a[..., 2]).max() > 2 for a in old), "the original had colour"
    # the module around the data is the same
    assert neutral_js.replace(base64.b64encode(neutral).decode(), "X") == \
        asset.read_text("utf-8").replace(base64.b64encode(original).decode(), "X")


def test_what_is_not_an_environment_is_refused_by_name():
    with pytest.raises(viewerlight.EnvironmentFormatError, match="magic"):
        viewerlight.neutral_environment(b"not an env file")
    with pytest.raises(viewerlight.EnvironmentFormatError, match="data URL"):
        viewerlight.neutral_environment_module("export default 1;")
    manifest = b'{"version": 2, "irradiance": {"x": [1, 0, 0]}, "specular": {"mipmaps": [{"position": 0, "length": 99}]}}'
    with pytest.raises(viewerlight.EnvironmentFormatError, match="outside"):
        viewerlight.neutral_environment(viewerlight.ENV_MAGIC + manifest + b"\x00" + b"short")


def _call(mw, path: str, method: str = "GET"):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(mw({"type": "http", "method": method, "path": path, "headers": []}, receive, send))
    return sent


def test_the_middleware_serves_the_neutral_asset_and_passes_the_rest(asset):
    passed = []

    async def gradio(scope, receive, send):
        passed.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"gradio"})

    mw = viewerlight.NeutralViewerLight(gradio, asset)
    sent = _call(mw, f"/assets/{asset.name}")
    assert passed == [] and sent[0]["status"] == 200
    headers = dict(sent[0]["headers"])
    assert headers[b"content-type"].startswith(b"text/javascript")
    body = sent[1]["body"]
    assert int(headers[b"content-length"]) == len(body)
    assert body.decode() == viewerlight.neutral_environment_module(asset.read_text("utf-8"))
    assert _call(mw, f"/assets/{asset.name}", "HEAD")[1]["body"] == b""
    for other in ("/", "/assets/index.js", f"/assets/{asset.name}.map", "/gradio_api/file=x.glb"):
        assert _call(mw, other)[1]["body"] == b"gradio"
    assert passed == ["/", "/assets/index.js", f"/assets/{asset.name}.map", "/gradio_api/file=x.glb"]
    assert _call(mw, f"/assets/{asset.name}", "POST")[1]["body"] == b"gradio"


def test_an_asset_that_cannot_be_rewritten_is_served_as_it_is(tmp_path, caplog):
    odd = tmp_path / "defaultEnvironment-odd.js"
    odd.write_text("export default 'no data url here';")

    async def gradio(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"original"})

    mw = viewerlight.NeutralViewerLight(gradio, odd)
    with caplog.at_level("WARNING", logger="kiln.app"):
        assert _call(mw, f"/assets/{odd.name}")[1]["body"] == b"original"
    assert "could not be made neutral" in caplog.text
    assert _call(mw, f"/assets/{odd.name}")[1]["body"] == b"original"     # and not tried again
