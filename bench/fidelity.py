"""Fidelity benchmark: does the GLB look like the photo it came from?

For each input (bench/fidelity_inputs.py: Kiln's generated examples, three photos that
ship with scikit-image with masks made here, a line drawing, a sign with text, a fine
brick/checker texture) the whole pipeline runs in-process at default settings, once with
``bake.photo_projection=true`` and once with ``false`` (the Gaussian-view-only bake),
each with a fresh reconstruction cache so both runs time the same work (wall and process
CPU seconds; which mode runs first alternates between inputs). The GLB is then
rendered by a renderer that did not bake it (three.js in headless Chromium,
bench/glb_render.py: unlit, no colour management, cameras exactly as Kiln defines them):

* front: from the photo's own camera (``PipelineResult.stats.source_camera``; for a
  reconstruction that does not report one, the built-in backend's orthographic camera
  rebuilt from ``Reconstruction.meta["world_to_pixels"]``) at the photo's size, against
  the photo: PSNR over mask & rendered coverage, SSIM (see ``front_metrics``), and the
  silhouette IoU of the render's coverage against the mask;
* left45, left, back, top: perspective cameras framed to the object, against the
  reconstruction's own Gaussians rendered from the same cameras by Kiln's CPU Gaussian
  renderer (there is no photo of those sides; this reference is what the Gaussian-view
  bake is fitted to, so it favours ``off``): masked PSNR. For ``globe``, whose every side
  is known, the reference is instead the true object (``FidelityInput.truth_glb``)
  rendered by the same three.js renderer from the same cameras: neutral between the bakes.

Prints a table, writes ``var/fidelity/results.json``, one side-by-side PNG per input and
mode (photo | front render | |diff| x4 over the object, red = rendered outside the mask,
blue = mask not covered; then the other angles, GLB over Gaussians), and the full-size
front renders under ``var/fidelity/renders/``.

    .venv/bin/python bench/fidelity.py [--inputs toy sign ...] [--no-off] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# ROOT first: bench/ holds a pipeline.py that must not shadow the pipeline package
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from worker.child.env import passive_openmp  # noqa: E402

# the stages run in this process: its OpenMP threads sleep as a worker's do, before torch loads
# (on a busy machine spinning threads made lineart's run 375 s instead of 44 s)
passive_openmp(os.environ)

import fidelity_inputs  # noqa: E402
import glb_render  # noqa: E402

OUT_DIR = ROOT / "var" / "fidelity"
BACKGROUND = (255, 0, 255)       # render clear colour; coverage comes from a separate pass
SIDE_SIZE = 512
SIDE_FOV_DEG = 40.0
# direction from the object's centre to each extra camera (world y up, front +z)
SIDE_VIEWS = {"left45": (-1.0, 0.0, 1.0), "left": (-1.0, 0.0, 0.0), "back": (0.0, 0.0, -1.0),
              "top": (0.0, 1.0, 0.25)}
GAUSSIAN_ALPHA_MIN = 0.9         # reference pixels where the Gaussians are (nearly) opaque
TARGET_PSNR, TARGET_SSIM, TARGET_SLOWDOWN = 30.0, 0.90, 1.20


# --------------------------------------------------------------------------- cameras

def builtin_source_camera(meta: dict, photo_hw: tuple[int, int]) -> dict:
    """The built-in backend's orthographic photo camera, from its ``world_to_pixels`` meta:
    world (x, y, z) * extent + center = (column, -row, depth) in pixels of the image the
    backend saw, which is the photo scaled by ``image_scale``."""
    w2p = meta["world_to_pixels"]
    s = float(meta.get("image_scale", 1.0))
    e, (c0, c1, _) = float(w2p["extent"]), w2p["center"]
    viewmat = np.array([[1, 0, 0, 0], [0, -1, 0, 0], [0, 0, -1, 2.0], [0, 0, 0, 1]], np.float64)
    K = np.array([[e / s, 0, c0 / s], [0, e / s, -c1 / s], [0, 0, 1]], np.float64)
    return {"projection": "orthographic", "width": photo_hw[1], "height": photo_hw[0],
            "viewmat": viewmat.tolist(), "K": K.tolist()}


def bbox_corners(vertices: np.ndarray) -> np.ndarray:
    lo, hi = vertices.min(0), vertices.max(0)
    return np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])


def front_camera(src: dict, vertices: np.ndarray) -> glb_render.CameraSpec:
    viewmat = np.asarray(src["viewmat"], np.float64)
    near, far = glb_render.near_far(bbox_corners(vertices), viewmat)
    return glb_render.CameraSpec(viewmat=viewmat, K=np.asarray(src["K"], np.float64),
                                 width=int(src["width"]), height=int(src["height"]),
                                 projection=src["projection"], near=near, far=far)


def side_cameras(vertices: np.ndarray) -> dict[str, glb_render.CameraSpec]:
    """Perspective cameras around the object's bounding sphere, which fills the view."""
    from pipeline.camera.cameras import intrinsics, look_at

    lo, hi = vertices.min(0).astype(np.float64), vertices.max(0).astype(np.float64)
    centre, radius = (lo + hi) / 2, float(np.linalg.norm(hi - lo)) / 2
    dist = radius / math.sin(math.radians(SIDE_FOV_DEG) / 2) * 1.05
    K = intrinsics(SIDE_FOV_DEG, SIDE_SIZE, SIDE_SIZE).astype(np.float64)
    out = {}
    for name, d in SIDE_VIEWS.items():
        d = np.asarray(d) / np.linalg.norm(d)
        vm = look_at(centre + d * dist, centre).astype(np.float64)
        near, far = glb_render.near_far(bbox_corners(vertices), vm)
        out[name] = glb_render.CameraSpec(viewmat=vm, K=K, width=SIDE_SIZE, height=SIDE_SIZE,
                                          projection="perspective", near=near, far=far)
    return out


def gaussian_reference(recon, cams: dict[str, glb_render.CameraSpec]):
    """Kiln's CPU Gaussian renderer from the side cameras: (rgb (C,H,W,3) float, alpha (C,H,W))."""
    from pipeline.views.render_views import render_gaussians
    from pipeline.types import Cameras

    specs = list(cams.values())
    cameras = Cameras(viewmats=np.stack([c.viewmat for c in specs]).astype(np.float32),
                      Ks=np.stack([c.K for c in specs]).astype(np.float32),
                      width=SIDE_SIZE, height=SIDE_SIZE)
    views = render_gaussians(recon.gaussians, cameras, backend="cpu")
    return views.rgb, views.alpha


# --------------------------------------------------------------------------- metrics

def psnr(a: np.ndarray, b: np.ndarray, where: np.ndarray) -> float:
    """PSNR in dB of two uint8-range images over the pixels ``where`` (all channels)."""
    if not where.any():
        return float("nan")
    d = a.astype(np.float64)[where] - b.astype(np.float64)[where]
    mse = float(np.mean(d * d))
    return float("inf") if mse == 0 else 10.0 * math.log10(255.0 ** 2 / mse)


def front_metrics(photo: np.ndarray, mask: np.ndarray, render: np.ndarray,
                  covered: np.ndarray) -> dict:
    """PSNR over mask & coverage; SSIM on the mask's bounding box with everything outside
    mask & coverage set to the same grey in both images, the SSIM map averaged over
    mask & coverage; IoU of coverage and mask."""
    from skimage.metrics import structural_similarity

    both = mask & covered
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    box = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
    a, b, m = photo[box].copy(), render[box].copy(), both[box]
    a[~m] = 128
    b[~m] = 128
    smap = structural_similarity(a, b, channel_axis=2, data_range=255, gaussian_weights=True,
                                 sigma=1.5, use_sample_covariance=False, full=True)[1]
    ssim = float(smap.mean(axis=2)[m].mean()) if m.any() else float("nan")
    union = int((mask | covered).sum())
    return {"psnr": psnr(photo, render, both), "ssim": ssim,
            "iou": int(both.sum()) / union if union else float("nan"),
            "mask_px": int(mask.sum()), "covered_px": int(covered.sum())}


# --------------------------------------------------------------------------- pictures

def diff_image(photo, mask, render, covered) -> np.ndarray:
    both = mask & covered
    d = np.clip(np.abs(render.astype(int) - photo.astype(int)) * 4, 0, 255).astype(np.uint8)
    out = np.zeros_like(photo)
    out[both] = d[both]
    out[covered & ~mask] = (255, 0, 0)
    out[mask & ~covered] = (0, 0, 255)
    return out


def _fit(img: np.ndarray, h: int) -> np.ndarray:
    from PIL import Image

    w = max(1, round(img.shape[1] * h / img.shape[0]))
    return np.asarray(Image.fromarray(img).resize((w, h), Image.LANCZOS))


def _row(tiles: list[np.ndarray], h: int, gap: int = 6) -> np.ndarray:
    parts = []
    for t in tiles:
        parts += [_fit(t, h), np.full((h, gap, 3), 40, np.uint8)]
    return np.concatenate(parts[:-1], axis=1)


def sheet(photo, mask, front, covered, sides: dict, refs: dict, h: int = 360) -> np.ndarray:
    rows = [_row([photo, front, diff_image(photo, mask, front, covered)], h),
            _row(list(sides.values()), h * 2 // 3),
            _row(list(refs.values()), h * 2 // 3)]
    width = max(r.shape[1] for r in rows)
    padded = [np.pad(r, ((0, 6), (0, width - r.shape[1]), (0, 0)), constant_values=40) for r in rows]
    return np.concatenate(padded, axis=0)


# --------------------------------------------------------------------------- runs

@dataclass
class RunResult:
    input: str
    mode: str                      # "on" | "off": bake.photo_projection
    pipeline_s: float              # wall seconds of run_pipeline
    cpu_s: float                   # CPU seconds of this process (all threads) during it
    camera_from: str               # "stats" (the reconstruction's own) | "meta" (rebuilt here)
    front: dict
    sides: dict                    # view -> masked PSNR vs the side reference
    side_ref: str = "gaussians"    # "gaussians" | "truth" (the object itself, rendered by three.js)
    stats: dict = field(default_factory=dict)


def warm_up(settings) -> None:
    """One tiny pipeline run so the first timed run does not pay for imports and the GL context."""
    import tempfile

    from kiln.examples import draw_object
    from pipeline.run import run_pipeline
    from pipeline.types import ImageInput

    rgb, mask = draw_object(128, "pebble")
    small = settings.override({"reconstruct.resolution": 64, "reconstruct.num_gaussians": 2000,
                               "views.count": 2, "views.resolution": 64, "bake.texture_size": 256,
                               "bake.steps": 2})
    with tempfile.TemporaryDirectory() as d:
        run_pipeline(ImageInput(rgb=rgb, mask=mask), small, Path(d))


def run_one(inp, mode: str, settings, out: Path, renderer, refs_cache: dict,
            mipmaps: bool = True) -> RunResult:
    from PIL import Image

    from pipeline import cache as cache_mod
    from pipeline.run import run_pipeline
    from pipeline.types import ImageInput

    s = settings.override({"bake.photo_projection": mode == "on"})
    image = ImageInput(rgb=inp.rgb, mask=inp.mask)
    cache_dir = out / "cache" / f"{inp.name}-{mode}"
    shutil.rmtree(cache_dir, ignore_errors=True)     # both modes reconstruct: same work timed
    t0, c0 = time.perf_counter(), time.process_time()
    res = run_pipeline(image, s, out / "models", cache_dir=cache_dir, name=f"{inp.name}-{mode}")
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    recon = cache_mod.load_reconstruction(cache_dir, cache_mod.reconstruction_key(image, s))
    if recon is None:
        raise RuntimeError(f"{inp.name}: the reconstruction was not cached in {cache_dir}")

    src, camera_from = res.stats.source_camera, "stats"
    if src is None:
        if "world_to_pixels" not in recon.meta:
            raise RuntimeError(f"{inp.name}: the reconstruction reports no source camera and is "
                               "not the built-in backend's; cannot place the front camera")
        src, camera_from = builtin_source_camera(recon.meta, inp.rgb.shape[:2]), "meta"
    if (int(src["height"]), int(src["width"])) != inp.rgb.shape[:2]:
        raise RuntimeError(f"{inp.name}: source camera is {src['width']}x{src['height']}, "
                           f"the photo {inp.rgb.shape[1]}x{inp.rgb.shape[0]}")
    verts = recon.mesh.vertices
    front_cam = front_camera(src, verts)
    sides = side_cameras(verts)
    renders = renderer.render(res.glb_path, [front_cam, *sides.values()], background=BACKGROUND,
                              mipmaps=mipmaps)
    front_rgb, front_cov = renders[0]
    fm = front_metrics(inp.rgb, inp.mask, front_rgb, front_cov)

    if inp.name not in refs_cache:   # the same reference in both modes (same input, settings, seed)
        if inp.truth_glb is not None:
            truth = renderer.render(inp.truth_glb, list(sides.values()), background=BACKGROUND,
                                    mipmaps=mipmaps)
            refs_cache[inp.name] = (np.stack([t[0] / 255.0 for t in truth]),
                                    np.stack([t[1].astype(np.float32) for t in truth]))
        else:
            refs_cache[inp.name] = gaussian_reference(recon, sides)
    ref_rgb, ref_alpha = refs_cache[inp.name]
    side_psnr, side_imgs, ref_imgs = {}, {}, {}
    for i, name in enumerate(sides):
        rgb, cov = renders[1 + i]
        ref = np.clip(ref_rgb[i] * 255.0, 0, 255)
        side_psnr[name] = psnr(rgb, ref, cov & (ref_alpha[i] > GAUSSIAN_ALPHA_MIN))
        side_imgs[name] = rgb
        ref_bg = np.where(ref_alpha[i][..., None] > 0.5, ref, BACKGROUND).astype(np.uint8)
        ref_imgs[name] = ref_bg

    (out / "renders").mkdir(parents=True, exist_ok=True)
    Image.fromarray(front_rgb).save(out / "renders" / f"{inp.name}-{mode}-front.png")
    Image.fromarray(sheet(inp.rgb, inp.mask, front_rgb, front_cov, side_imgs, ref_imgs)).save(
        out / f"{inp.name}-{mode}.png")
    flat = res.stats.to_dict()   # the stats under their report names
    keep = {k: flat[k] for k in ("faces", "bake_psnr_db", "texture_size", "glb_bytes") if k in flat}
    keep["timings"] = {k: round(v, 3) for k, v in res.timings.items()}
    keep.update({k: v for k, v in flat.items() if k.startswith("photo")})
    return RunResult(inp.name, mode, secs, cpu, camera_from, fm, side_psnr,
                     "truth" if inp.truth_glb is not None else "gaussians", keep)


# --------------------------------------------------------------------------- report

def fmt(v: float, nd: int = 2) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


def table(results: list[RunResult]) -> str:
    head = ("| input | photo proj. | front PSNR dB | front SSIM | IoU | "
            + " | ".join(f"{v} PSNR dB" for v in SIDE_VIEWS) + " | side ref. | pipeline s (CPU s) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        lines.append(f"| {r.input} | {r.mode} | {fmt(r.front['psnr'])} | {fmt(r.front['ssim'], 3)} | "
                     f"{fmt(r.front['iou'], 3)} | "
                     + " | ".join(fmt(r.sides[v]) for v in SIDE_VIEWS)
                     + f" | {r.side_ref} | {r.pipeline_s:.1f} ({r.cpu_s:.1f}) |")
    return "\n".join(lines)


def verdict(results: list[RunResult]) -> list[str]:
    on = {r.input: r for r in results if r.mode == "on"}
    off = {r.input: r for r in results if r.mode == "off"}
    out = []
    for name, r in on.items():
        ok = r.front["psnr"] >= TARGET_PSNR and r.front["ssim"] >= TARGET_SSIM
        out.append(f"{name}: front {'meets' if ok else 'MISSES'} PSNR >= {TARGET_PSNR:g} dB and "
                   f"SSIM >= {TARGET_SSIM:g} ({fmt(r.front['psnr'])} dB, {fmt(r.front['ssim'], 3)})")
        if name in off:
            worse = [v for v in SIDE_VIEWS if r.sides[v] < off[name].sides[v] - 0.1]
            ref = "the true object" if r.side_ref == "truth" else "the Gaussians (favours off)"
            out.append(f"{name}: side views vs {ref} " + ("no worse than the off bake" if not worse else
                       "WORSE than the off bake in " + ", ".join(
                           f"{v} ({fmt(r.sides[v])} vs {fmt(off[name].sides[v])} dB)" for v in worse)))
    both = [n for n in on if n in off]
    if both:
        for what, key in (("wall", "pipeline_s"), ("CPU", "cpu_s")):
            t_on = sum(getattr(on[n], key) for n in both)
            t_off = sum(getattr(off[n], key) for n in both)
            ratio = t_on / t_off
            out.append(f"pipeline {what} time, all inputs: on {t_on:.1f} s, off {t_off:.1f} s, ratio "
                       f"{ratio:.2f} ({'within' if ratio <= TARGET_SLOWDOWN else 'OVER'} the "
                       f"{TARGET_SLOWDOWN:.2f} limit)")
    return out


def machine() -> dict:
    return glb_render.machine(ROOT, ("pipeline", "kiln"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Render each input's GLB with three.js (headless Chromium) from the photo's camera "
                    "and 3 other angles; print PSNR/SSIM/IoU against the photo, side-view PSNR against "
                    "the Gaussians, and pipeline time, with bake.photo_projection on and off.",
        epilog="Outputs: var/fidelity/{results.json, INPUT-MODE.png, renders/, inputs/, models/}.")
    ap.add_argument("--inputs", nargs="+", default=list(fidelity_inputs.NAMES),
                    metavar="NAME", help="inputs to run (default all): " + ", ".join(fidelity_inputs.NAMES))
    ap.add_argument("--no-off", action="store_true",
                    help="skip the bake.photo_projection=false run (no side-view or time comparison)")
    ap.add_argument("--only-off", action="store_true", help="run only bake.photo_projection=false")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="settings override for every run, e.g. --set bake.texture_size=2048")
    ap.add_argument("--out", type=Path, default=OUT_DIR, help=f"output folder (default {OUT_DIR})")
    ap.add_argument("--no-warmup", action="store_true", help="skip the small untimed warm-up run")
    ap.add_argument("--no-mipmaps", action="store_true",
                    help="sample textures bilinearly without mipmaps (diagnostic; default: trilinear "
                         "mipmaps as GLTFLoader sets them up, what a user's viewer shows)")
    args = ap.parse_args(argv)

    unknown = [n for n in args.inputs if n not in fidelity_inputs.NAMES]
    if unknown:
        ap.error(f"unknown input(s) {', '.join(unknown)}; choose from {', '.join(fidelity_inputs.NAMES)}")
    if args.no_off and args.only_off:
        ap.error("--no-off and --only-off exclude each other")
    from kiln.settings import SettingsError, load

    overrides = {}
    for kv in args.set:
        if "=" not in kv:
            ap.error(f"--set needs KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        overrides[k.strip()] = v.strip()
    try:
        settings = load(None, overrides)
    except SettingsError as e:
        ap.error(str(e))
    modes = ["off"] if args.only_off else ["on"] if args.no_off else ["on", "off"]

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    try:
        renderer = glb_render.GLBRenderer().__enter__()   # fail before any slow work
    except glb_render.RendererUnavailable as e:
        print(f"fidelity: {e}", file=sys.stderr)
        return 2
    info = machine()
    print(f"machine: {info['cpu']}, {info['cpus']} cores, load {info['loadavg'][0]:.1f}; "
          f"commit {info['commit']}{' (pipeline/kiln modified)' if info['dirty'] else ''}", flush=True)
    results: list[RunResult] = []
    try:
        inputs = fidelity_inputs.write(out / "inputs", args.inputs, settings, renderer)
        if not args.no_warmup:
            warm_up(settings)
        refs: dict = {}
        for i, inp in enumerate(inputs):
            # alternate which mode runs first, so neither gets a systematic first-run edge
            for mode in (modes if i % 2 == 0 else modes[::-1]):
                r = run_one(inp, mode, settings, out, renderer, refs, mipmaps=not args.no_mipmaps)
                results.append(r)
                print(f"{inp.name:10s} {mode:3s} front {fmt(r.front['psnr'])} dB  SSIM "
                      f"{fmt(r.front['ssim'], 3)}  IoU {fmt(r.front['iou'], 3)}  sides "
                      + " ".join(f"{k} {fmt(v)}" for k, v in r.sides.items())
                      + f"  {r.pipeline_s:.1f} s ({r.cpu_s:.1f} CPU s)  camera from {r.camera_from}",
                      flush=True)
    finally:
        renderer.close()
    info["loadavg_end"] = os.getloadavg()
    order = {n: i for i, n in enumerate(args.inputs)}
    results.sort(key=lambda r: (order[r.input], r.mode != "on"))
    print()
    print(table(results))
    print()
    for line in verdict(results):
        print(line)
    (out / "results.json").write_text(json.dumps(
        {"machine": info, "settings_overrides": overrides, "mipmaps": not args.no_mipmaps,
         "results": [r.__dict__ for r in results]}, indent=1, default=float))
    print(f"\nwrote {out / 'results.json'} and side-by-side PNGs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
