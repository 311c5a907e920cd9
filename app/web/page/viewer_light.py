"""A neutral light for the page's 3D viewer.

Gradio's ``Model3D`` draws with Babylon's viewer, which lights a model only by its default
environment: an image-based light shipped as a base64 ``.env`` inside the asset
``defaultEnvironment-<hash>.js``. That environment has a colour of its own (its irradiance
has more red and blue than green), so a white or cream model looks lavender in the preview
(a uniform grey-200 texture is drawn as about 200, 190, 208) although its texels are neutral.

``NeutralViewerLight`` serves that asset with every colour of the environment replaced by
its luminance (Rec. 709 weights): the same brightness and shading, no tint. Gradio has no
option for the viewer's environment, so the asset itself is what changes; when Gradio's
assets hold no such file, or it is not laid out as expected, the original is served and a
warning is logged.

The ``.env`` layout (Babylon's environment texture format, version 2): 8 magic bytes, a JSON
manifest ended by a NUL, then the images the manifest places (``position``/``length`` from
the end of the manifest): the specular mipmaps and, optionally, six irradiance faces. Its
``irradiance`` entry holds the diffuse light as a spherical polynomial, one [r, g, b] per
coefficient. The images are RGBD (a colour divided by a shared range in alpha), so equal
r, g and b decode to a grey.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
from pathlib import Path
from typing import Optional

log = logging.getLogger("kiln.app")

ENV_MAGIC = bytes([0x86, 0x16, 0x87, 0x96, 0xF6, 0xD6, 0x96, 0x36])
LUMA = (0.2126, 0.7152, 0.0722)
ASSET_GLOB = "defaultEnvironment-*.js"
_DATA_URL_RE = re.compile(r"data:application/octet-stream;base64,([A-Za-z0-9+/=]+)")


class EnvironmentFormatError(ValueError):
    """The asset is not the base64 ``.env`` module this module knows how to neutralise."""


def _luma(rgb: list) -> float:
    return float(sum(w * float(c) for w, c in zip(LUMA, rgb)))


def _grey_png(data: bytes) -> bytes:
    import numpy as np
    from PIL import Image

    rgba = np.asarray(Image.open(io.BytesIO(data)).convert("RGBA")).astype(np.float32)
    luma = np.clip(np.rint(rgba[..., :3] @ np.asarray(LUMA, np.float32)), 0, 255)
    rgba[..., :3] = luma[..., None]
    out = io.BytesIO()
    Image.fromarray(rgba.astype(np.uint8), "RGBA").save(out, format="PNG")
    return out.getvalue()


def read_environment(data: bytes) -> tuple[dict, bytes]:
    """(manifest, the image bytes after it) of a ``.env`` file."""
    if not data.startswith(ENV_MAGIC):
        raise EnvironmentFormatError("not a Babylon .env file (magic bytes differ)")
    end = data.find(b"\x00", len(ENV_MAGIC))
    if end < 0:
        raise EnvironmentFormatError("the .env manifest has no end")
    try:
        manifest = json.loads(data[len(ENV_MAGIC):end])
    except ValueError as e:
        raise EnvironmentFormatError(f"the .env manifest is not JSON: {e}") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("irradiance"), dict):
        raise EnvironmentFormatError("the .env manifest has no irradiance")
    return manifest, data[end + 1:]


def environment_images(manifest: dict) -> list[dict]:
    """The manifest's image entries (specular mipmaps, irradiance faces), each a dict with
    ``position`` and ``length``."""
    entries = list((manifest.get("specular") or {}).get("mipmaps") or [])
    entries += list((manifest["irradiance"].get("irradianceTexture") or {}).get("faces") or [])
    return entries


def neutral_environment(data: bytes) -> bytes:
    """``data`` (a ``.env`` file) with each irradiance coefficient and each image pixel
    replaced by its luminance."""
    manifest, body = read_environment(data)
    if manifest.get("imageType", "image/png") != "image/png":
        raise EnvironmentFormatError(f"the .env images are {manifest.get('imageType')}, not PNG")
    for key, value in manifest["irradiance"].items():
        if isinstance(value, list) and len(value) == 3:
            manifest["irradiance"][key] = [_luma(value)] * 3
    images = []
    position = 0
    # rewritten in their order in the file: the grey PNGs have other lengths
    for entry in sorted(environment_images(manifest), key=lambda e: e["position"]):
        start, length = int(entry["position"]), int(entry["length"])
        if start < 0 or start + length > len(body):
            raise EnvironmentFormatError("a .env image lies outside the file")
        grey = _grey_png(body[start:start + length])
        entry["position"], entry["length"] = position, len(grey)
        position += len(grey)
        images.append(grey)
    return ENV_MAGIC + json.dumps(manifest).encode() + b"\x00" + b"".join(images)


def neutral_environment_module(js: str) -> str:
    """The asset's JavaScript with its ``.env`` data URL replaced by the neutral one."""
    found = _DATA_URL_RE.search(js)
    if found is None:
        raise EnvironmentFormatError("no base64 .env data URL in the asset")
    neutral = base64.b64encode(neutral_environment(base64.b64decode(found.group(1)))).decode("ascii")
    return js[:found.start(1)] + neutral + js[found.end(1):]


def find_environment_asset() -> Optional[Path]:
    """Gradio's bundled default-environment asset, or None when this Gradio has none."""
    import gradio

    assets = Path(gradio.__file__).parent / "templates" / "frontend" / "assets"
    found = sorted(assets.glob(ASSET_GLOB))
    return found[0] if found else None


class NeutralViewerLight:
    """ASGI middleware: a GET of the default-environment asset (any route ending in its
    file name) is answered with the neutral version, worked out once on first use; every
    other request goes to ``app`` untouched."""

    def __init__(self, app, asset: Optional[Path] = None):
        self.app = app
        self.asset = asset if asset is not None else find_environment_asset()
        self._body: Optional[bytes] = None
        if self.asset is None:
            log.warning("3D viewer light: Gradio's assets have no %s; the preview keeps its tinted light",
                        ASSET_GLOB)

    def _neutral(self) -> Optional[bytes]:
        if self._body is None and self.asset is not None:
            try:
                self._body = neutral_environment_module(self.asset.read_text("utf-8")).encode("utf-8")
            except (OSError, EnvironmentFormatError, ValueError) as e:
                log.warning("3D viewer light: %s could not be made neutral (%s); serving it as it is",
                            self.asset.name, e)
                self.asset = None
        return self._body

    async def __call__(self, scope, receive, send):
        if (scope["type"] == "http" and scope.get("method") in ("GET", "HEAD") and self.asset is not None
                and scope.get("path", "").rsplit("/", 1)[-1] == self.asset.name):
            body = self._neutral()
            if body is not None:
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"text/javascript; charset=utf-8"),
                                        (b"content-length", str(len(body)).encode()),
                                        # a browser that cached Gradio's tinted original asks again
                                        (b"cache-control", b"no-cache")]})
                await send({"type": "http.response.body", "body": body if scope["method"] == "GET" else b""})
                return
        await self.app(scope, receive, send)
