"""An independent GLB renderer for benchmarks: three.js in headless Chromium.

Kiln bakes its textures with its own rasterizers (moderngl / nvdiffrast); judging a
texture with the same code that baked it would hide its mistakes. This module loads
the exported GLB with three.js's GLTFLoader in Debian's Chromium (driven by
Playwright, WebGL on SwiftShader), swaps every material for an unlit
``MeshBasicMaterial`` that keeps the baseColor texture (or vertex colours), turns all
colour management off so an 8-bit texel reaches the canvas unchanged, and renders
from cameras given in Kiln's convention (``pipeline/camera/cameras.py``: OpenCV axes, K in
pixels with the top-left pixel centre at (0.5, 0.5), perspective or orthographic).

    with GLBRenderer() as r:
        [(rgb, covered)] = r.render("model.glb", [CameraSpec(...)], background=(255, 0, 255))

three.js comes from npm into ``bench/glb_viewer/node_modules`` (version pinned in
``bench/glb_viewer/package.json``); ``ensure_three()`` installs it when missing.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

VIEWER_DIR = Path(__file__).resolve().parent / "glb_viewer"
CHROMIUM = "/usr/bin/chromium"
ORIGIN = "http://kiln-viewer.invalid"   # never resolved: every request is answered by a route
# SwiftShader gives headless Chromium a software WebGL (no GPU, no display needed)
LAUNCH_ARGS = ["--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
               "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run", "--force-color-profile=srgb"]
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".json": "application/json",
                 ".glb": "model/gltf-binary"}


class RendererUnavailable(RuntimeError):
    """Chromium, Playwright or three.js is missing here; the message says which and how to get it."""


@dataclass
class CameraSpec:
    """One view in Kiln's camera convention.

    viewmat: (4, 4) world -> camera, OpenCV axes (x right, y down, +z forward)
    K:       (3, 3) intrinsics in pixels; top-left pixel centre at (0.5, 0.5)
    width, height: image size in pixels
    projection: "perspective" (pixel = K (x/z, y/z, 1)) or "orthographic" (pixel = K (x, y, 1))
    near, far: camera-z clipping range, 0 < near < far
    """

    viewmat: np.ndarray
    K: np.ndarray
    width: int
    height: int
    projection: str = "perspective"
    near: float = 0.01
    far: float = 100.0


# --------------------------------------------------------------------------- camera math

# OpenCV camera axes (y down, +z forward) -> OpenGL's (y up, looking along -z)
CV_TO_GL = np.diag([1.0, -1.0, -1.0, 1.0])


def gl_view(viewmat: np.ndarray) -> np.ndarray:
    """(4, 4) OpenGL view matrix (world -> GL camera) for an OpenCV ``viewmat``."""
    return CV_TO_GL @ np.asarray(viewmat, np.float64)


def gl_projection(K: np.ndarray, width: int, height: int, near: float, far: float,
                  projection: str = "perspective") -> np.ndarray:
    """(4, 4) OpenGL projection so that a point lands on exactly the pixel K puts it on.

    NDC x = 2u/W - 1 and NDC y = 1 - 2v/H for pixel coordinates (u, v) with (0, 0) the
    top-left corner of the image, which is where K's convention puts the pixel edges.
    """
    K = np.asarray(K, np.float64)
    fx, s, cx = K[0]
    fy, cy = K[1, 1], K[1, 2]
    W, H, n, f = float(width), float(height), float(near), float(far)
    if not (0 < n < f):
        raise ValueError(f"need 0 < near < far, got near={near} far={far}")
    P = np.zeros((4, 4))
    if projection == "perspective":
        # u = (fx x + s y) / z + cx with x_cv = x_gl, y_cv = -y_gl, z_cv = -z_gl = clip w
        P[0] = [2 * fx / W, -2 * s / W, -(2 * cx / W - 1), 0]
        P[1] = [0, 2 * fy / H, 2 * cy / H - 1, 0]
        P[2] = [0, 0, -(f + n) / (f - n), -2 * f * n / (f - n)]
        P[3] = [0, 0, -1, 0]
    elif projection == "orthographic":
        P[0] = [2 * fx / W, -2 * s / W, 0, 2 * cx / W - 1]
        P[1] = [0, 2 * fy / H, 0, 1 - 2 * cy / H]
        P[2] = [0, 0, -2 / (f - n), -(f + n) / (f - n)]
        P[3] = [0, 0, 0, 1]
    else:
        raise ValueError(f"projection must be 'perspective' or 'orthographic', got {projection!r}")
    return P


def near_far(points: np.ndarray, viewmat: np.ndarray, margin: float = 0.05) -> tuple[float, float]:
    """A clipping range holding ``points`` (N, 3) world, e.g. a bounding box's corners."""
    z = np.asarray(points, np.float64) @ np.asarray(viewmat, np.float64)[2, :3] + viewmat[2, 3]
    span = max(float(z.max() - z.min()), 1e-3)
    near = max(float(z.min()) - margin * span, 1e-3 * span)
    far = max(float(z.max()) + margin * span, near + span)
    return near, far


# --------------------------------------------------------------------------- availability

def pinned_three_version() -> str:
    return json.loads((VIEWER_DIR / "package.json").read_text())["dependencies"]["three"]



def machine(root: Path, watched: Sequence[str] = ("pipeline", "kiln")) -> dict:
    """What a bench's figures were measured on, for its table: Python, CPUs and their load,
    the commit and whether ``watched`` folders had changes, the date, the three.js this
    renderer pins. One home for every bench that renders with it (fidelity, allround)."""
    import platform
    import time

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""
    info = {"python": platform.python_version(), "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
            "commit": git("rev-parse", "--short", "HEAD"), "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--", *watched)),
            "date": time.strftime("%Y-%m-%d %H:%M"), "three": pinned_three_version()}
    try:
        info["cpu"] = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu"] = platform.processor()
    return info

def installed_three_version() -> str | None:
    pkg = VIEWER_DIR / "node_modules" / "three" / "package.json"
    if not pkg.is_file():
        return None
    return json.loads(pkg.read_text()).get("version")


def ensure_three(install: bool = True) -> None:
    """Make sure the pinned three.js sits in bench/glb_viewer/node_modules (npm ci when not)."""
    want = pinned_three_version()
    if installed_three_version() == want:
        return
    npm = shutil.which("npm")
    if not install or npm is None:
        raise RendererUnavailable(f"three.js {want} is not installed in {VIEWER_DIR / 'node_modules'}"
                                  + ("" if npm else " and npm is not on PATH (apt-get install npm)")
                                  + f"; run: npm ci --prefix {VIEWER_DIR}")
    lock = VIEWER_DIR / "package-lock.json"
    cmd = [npm, "ci" if lock.is_file() else "install", "--no-audit", "--no-fund"]
    try:
        proc = subprocess.run(cmd, cwd=VIEWER_DIR, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise RendererUnavailable(f"{' '.join(cmd)} in {VIEWER_DIR} took over 300 s") from None
    if proc.returncode != 0 or installed_three_version() != want:
        raise RendererUnavailable(f"{' '.join(cmd)} in {VIEWER_DIR} failed ({proc.returncode}): "
                                  f"{(proc.stderr or proc.stdout).strip()[-800:]}")


def check_available(install: bool = True) -> None:
    """Raise RendererUnavailable naming what is missing (Chromium, Playwright, three.js)."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        raise RendererUnavailable(f"{CHROMIUM} not found (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        raise RendererUnavailable("playwright is not installed (pip install playwright)") from None
    ensure_three(install=install)


# --------------------------------------------------------------------------- renderer

def _decode_png(data_url: str) -> np.ndarray:
    from PIL import Image

    raw = base64.b64decode(data_url.split(",", 1)[1])
    return np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))


class GLBRenderer:
    """One headless Chromium page running ``bench/glb_viewer``; reuse it for many GLBs."""

    def __init__(self, install: bool = True, timeout_s: float = 120.0):
        self.install = install
        self.timeout_ms = timeout_s * 1000.0
        self._pw = self._browser = self._page = None
        self._glbs: dict[str, bytes] = {}
        self._console: list[str] = []

    def __enter__(self) -> "GLBRenderer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        check_available(install=self.install)
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        try:
            self._browser = self._pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                     args=LAUNCH_ARGS)
            ctx = self._browser.new_context(device_scale_factor=1)
            self._page = ctx.new_page()
            self._page.set_default_timeout(self.timeout_ms)
            self._page.on("console", lambda m: self._console.append(f"{m.type}: {m.text}"))
            self._page.on("pageerror", lambda e: self._console.append(f"pageerror: {e}"))
            self._page.route(f"{ORIGIN}/**", self._serve)
            self._page.goto(f"{ORIGIN}/index.html")
            self._page.wait_for_function("window.kilnReady === true")
        except Exception as e:
            self.close()
            raise RendererUnavailable(f"the three.js viewer did not start in Chromium: {e}; "
                                      f"console: {self._console[-5:]}") from e

    def close(self) -> None:
        for closer in (self._browser, self._pw):
            if closer is not None:
                try:
                    closer.close() if closer is self._browser else closer.stop()
                except Exception:
                    pass
        self._pw = self._browser = self._page = None

    def _serve(self, route) -> None:
        path = route.request.url[len(ORIGIN):].split("?", 1)[0].lstrip("/")
        if path.startswith("glb/") and path[4:] in self._glbs:
            route.fulfill(status=200, body=self._glbs[path[4:]], content_type=CONTENT_TYPES[".glb"])
            return
        f = (VIEWER_DIR / path).resolve()
        if VIEWER_DIR.resolve() not in f.parents or not f.is_file():
            route.fulfill(status=404, body=f"not found: {path}")
            return
        route.fulfill(status=200, body=f.read_bytes(),
                      content_type=CONTENT_TYPES.get(f.suffix, "application/octet-stream"))

    def render(self, glb: str | Path | bytes, cameras: Sequence[CameraSpec],
               background: tuple[int, int, int] = (255, 0, 255),
               mipmaps: bool = True) -> list[tuple[np.ndarray, np.ndarray]]:
        """Render ``glb`` from each camera.

        ``mipmaps``: sample textures as GLTFLoader sets them up (trilinear mipmaps, what a
        user's viewer shows); False = plain bilinear without mipmaps (a diagnostic).

        Returns per camera (rgb (H, W, 3) uint8 with ``background`` where nothing is drawn,
        covered (H, W) bool: the object's exact coverage from a second, white-on-black pass).
        """
        if self._page is None:
            raise RuntimeError("GLBRenderer is not started; use it as a context manager")
        data = glb if isinstance(glb, bytes) else Path(glb).read_bytes()
        key = f"m{len(self._glbs)}.glb"
        self._glbs = {key: data}   # only the current model is kept in memory
        specs = []
        for c in cameras:
            P = gl_projection(c.K, c.width, c.height, c.near, c.far, c.projection)
            V = gl_view(c.viewmat)
            specs.append({"width": int(c.width), "height": int(c.height),
                          "projection": P.ravel().tolist(), "view": V.ravel().tolist()})
        req = {"glb": f"{ORIGIN}/glb/{key}", "background": [int(v) for v in background],
               "cameras": specs, "mipmaps": bool(mipmaps)}
        try:
            res = self._page.evaluate("(req) => window.kilnRender(req)", req)
        except Exception as e:
            raise RuntimeError(f"three.js failed to render the GLB: {e}; console: "
                               f"{self._console[-5:]}") from e
        out = []
        for c, r in zip(cameras, res):
            rgb = _decode_png(r["rgb"])
            covered = _decode_png(r["mask"])[..., 0] > 127
            if rgb.shape[:2] != (c.height, c.width):
                raise RuntimeError(f"the canvas came back {rgb.shape[1]}x{rgb.shape[0]}, "
                                   f"asked for {c.width}x{c.height}")
            out.append((rgb, covered))
        return out
