"""Bake stage: coloured views of the object + the UV-mapped mesh -> a texture image.

Two modes (``BakeSettings.mode``):

* ``fast``: back-projection. Every texel inside a UV chart is placed on the
  surface (UV-space rasterization), projected into each view, kept where the
  view's depth map says it is visible, and coloured with a weighted average of
  the views (weight = cos(normal, direction to camera)^FAST_COS_POWER * alpha).
* ``opt``: the texture is optimised so that the mesh rendered with it matches
  the views: L1 between bilinearly sampled texture and view colour over every
  pixel the mesh covers and the view is opaque, plus a total-variation prior.
  It starts from the ``fast`` result. The sampling is fixed (4 bilinear taps a pixel),
  built once, so a step is the lookups and their transpose.

Where it runs: on the host (device "cpu", views as numpy arrays) every step is numpy or a
compiled loop (``back_projection_kernels``, ``opt/host.py``, the photo's
``pipeline.raster.image_sampling``) and torch is never imported; views a GPU renderer left
on its device are baked there by the torch twins (``_project_view``, the sparse products of
``_optimise``), which the tests hold to the host's numbers on the CPU.

Both then inpaint chart texels no view saw (OpenCV Telea) and dilate the
gutter: texels outside the charts (and not read by any view pixel) copy their
nearest chart texel, so bilinear and mip-mapped sampling near seams never
reads black.

Sampling convention (``types.py``): texel (row, col) of an S x S texture sits at
uv = ((col + 0.5) / S, 1 - (row + 0.5) / S); row 0 is v = 1. Sampling is
bilinear with the coordinate clamped to the outer texel centres, which equals
``torch.nn.functional.grid_sample(..., align_corners=False, padding_mode="border")``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from kiln.limits import MAX_RASTER_SIDE, MIN_TEXTURE_SIZE
from kiln.records import BakeStats
from kiln.settings import BakeSettings, allowed_range

from pipeline.backends import torch_device
from pipeline.camera.cameras import camera_centers
from pipeline.geometry import vertex_normals
from pipeline.types import Cameras, ImageInput, Mesh, Raster, SourceCamera, Texture, Views
from pipeline.validate import StageInputError, check_array, is_tensor
from pipeline.raster.image_sampling import sample_texture  # the bake's texture lookup (tests use it from here)
from pipeline.texture import unseen as unseen_side
from pipeline.texture.opt.schedule import STALL_TAIL, StallSchedule  # noqa: F401  (STALL_TAIL: tests)
from pipeline.texture.visibility import depth_tolerance

if TYPE_CHECKING:
    import torch

    from pipeline.raster.rasterize import RasterContext

ProgressFn = Callable[[float, str], None]

MODES = ("fast", "opt")
# texture sizes: the capability limits MIN_TEXTURE_SIZE..MAX_RASTER_SIDE (kiln.limits), not the
# setting's range (kiln.settings checks that); a power of two because opt halves it.
ALPHA_MIN = 0.9                # view pixels at least this opaque are bake targets and count in the PSNR
FAST_COS_POWER = 4.0           # sharpens the view weighting towards the most frontal view
FAST_MIN_WEIGHT = 1e-4         # a texel with less total weight than this counts as unseen
DEPTH_SLOPE_PIXELS = 1.0       # visibility: pixel footprints a slope may stretch (pipeline.texture.visibility)
INPAINT_RADIUS = 3
GLANCE_MIN = 0.5              # a grazing photo colour is taken where the photo sees the texel at least this clearly
PSNR_CAP_DB = 100.0            # identical images would give inf, which JSON cannot carry
FAST_CHUNK = 1 << 20           # texels per vectorised block in the fast bake
MAX_OPT_PIXELS = 8_000_000     # opt fits a seeded random subset of the target pixels beyond this
OPT_PIXELS_PER_TEXEL = 4.0     # opt solves for at most one texel per this many target pixels


# --------------------------------------------------------------------------- public API

# colours for texels no view and no photo saw: (face ids (N,), barycentrics (N, 3), surface
# points (N, 3)) -> (colours (N, 3) float32 in [0, 1], which of them are known (N,) bool)
FallbackColours = Callable[[np.ndarray, np.ndarray, np.ndarray], "tuple[np.ndarray, np.ndarray]"]


def bake_texture(mesh: Mesh, views: Optional[Views], settings: BakeSettings, raster_ctx: "RasterContext",
                 device: str, seed: int, progress: Optional[ProgressFn] = None,
                 chunk_scale: float = 1.0, photo: Optional[ImageInput] = None,
                 source_camera: Optional[SourceCamera] = None,
                 fallback: Optional[FallbackColours] = None,
                 photo_beyond_mask: bool = True,
                 more_photos: Sequence[tuple[ImageInput, SourceCamera]] = (),
                 level_photos: bool = True) -> tuple[Texture, BakeStats]:
    """Bake ``views`` (and the photo, and a fallback) onto ``mesh``'s UV layout.

    Per texel, in order: the photo where its camera sees the surface; the views (multi-view
    bake); ``fallback`` colours (e.g. a mesh's own vertex colours); a fill from neighbours.

    mesh:  validated Mesh with ``uvs`` (V, 2) float32 in [0, 1]
    raster_ctx: the rasterizer context to draw with, made by the caller on this thread
           (``pipeline.raster.rasterize.raster_context``); nvdiffrast draws on its own device
    views: rgb (C, H, W, 3) float32, alpha (C, H, W) float32, cameras of C views; numpy
           arrays, or torch tensors left on the render device (read there, not via the host);
           None: no multi-view source (then the photo or ``fallback`` must give colour)
    seed:  seeds the random pixel subset opt uses when there are more than
           MAX_OPT_PIXELS target pixels (nothing else is random)
    progress(fraction, message): monotonic fractions in [0, 1]
    chunk_scale: multiplies the block sizes and the opt pixel cap (< 1 after an out-of-memory retry)
    photo, source_camera: the original photo and its camera (``Reconstruction.source_camera``);
           with ``settings.photo_projection`` the texels that camera sees take the photo's
           own pixels, blended into the multi-view bake (``pipeline.texture.photo_projection``)
    fallback: colours for texels neither the views nor the photo saw (``FallbackColours``)
    photo_beyond_mask: False: texels whose projection falls outside the photo's mask never
           take the photo's colour (the mask may leave out what stands in front of the object)
    more_photos: further (photo, camera) pairs of the same object: each texel takes the photo
           that sees it best, the photos' colours levelled where they hand over
           (``pipeline.texture.multi_photo``; ``level_photos`` False skips the levelling)
    Returns (Texture, BakeStats). Texture.image (S, S, 3) uint8 with S =
    settings.texture_size, Texture.seen (S, S) bool. ``kiln.records.BakeStats`` says what each
    stat means: the masked PSNR (with views only) counts pixels the mesh covers with view
    alpha > ALPHA_MIN; opt's ``fast_psnr_db`` is measured before quantisation and inpainting;
    ``photo_pixels_per_texel`` is a median by area; ``texels_from`` the share of chart texels
    each source coloured.
    """
    _validate_inputs(mesh, views, settings)
    # on the host, numpy and compiled loops without torch (~2 s, ~500 MB); a device's views: torch
    dev = "cpu" if device == "cpu" and (views is None or not views.on_device) else torch_device(device, "bake")
    report = _Progress(progress)
    size = int(settings.texture_size)
    timings: dict[str, float] = {}
    stats: dict = {"bake_mode": settings.mode}

    t0 = time.perf_counter()
    report(0.0, "rasterizing UV space" + (" and views" if views is not None else ""))
    tex = _texels(raster_ctx, mesh, size)
    timings["rasterize"] = time.perf_counter() - t0
    image = np.zeros((size, size, 3), np.float32)
    seen = np.zeros((size, size), bool)
    use_photo = settings.photo_projection and photo is not None and source_camera is not None
    fit, notes = None, []
    if views is not None:
        fit = _bake_views(tex, mesh, views, settings, raster_ctx, dev, seed, report, chunk_scale,
                          image, seen, stats, timings, may_skip=use_photo or fallback is not None)
        if fit is None:
            notes.append("the rendered views showed the object nowhere opaque (a very thin shape at "
                         "the views' resolution): its colour comes from the photo alone")
    seen_views = seen[tex.chart].copy()
    proj, blend = None, None
    if use_photo:
        assert photo is not None and source_camera is not None
        t0 = time.perf_counter()
        report(0.85, "projecting the photo")
        if more_photos:
            proj, blend = _project_photos(tex, mesh, [(photo, source_camera), *more_photos], size, raster_ctx,
                                          photo_beyond_mask, level_photos, stats)
        else:
            proj = _project_photo(tex, mesh, photo, source_camera, size, raster_ctx, photo_beyond_mask)
        timings["photo"] = time.perf_counter() - t0

    # the fallback colours what neither the views nor the photo see
    from_fallback = np.zeros(len(tex.face_ids), bool)
    no_photo = np.ones(len(tex.face_ids), bool) if proj is None else proj.weight <= 0
    if fallback is not None and (~seen_views & no_photo).any():
        t0 = time.perf_counter()
        unseen = np.flatnonzero(~seen_views & no_photo)
        colours, known = fallback(tex.face_ids[unseen], tex.bary[unseen], tex.positions[unseen])
        chart_image = image[tex.chart]
        chart_image[unseen[known]] = colours[known]
        image[tex.chart] = chart_image
        from_fallback[unseen[known]] = True
        seen[tex.chart] = seen_views | from_fallback
        timings["fallback"] = time.perf_counter() - t0

    # the mirror side (pipeline.texture.unseen): under the photo, over the views and the fallback
    seen_photo, from_mirror = None, np.zeros(len(tex.face_ids), bool)
    if proj is not None:
        assert photo is not None and source_camera is not None
        t0 = time.perf_counter()
        seen_photo = unseen_side.photo_seen(mesh, tex.positions, proj.colors, proj.weight, photo, source_camera,
                                       raster_ctx, mask_hides=not photo_beyond_mask)
        if settings.mirror_fill == "auto":
            report(0.87, "looking for the mirror side")
            reader = _photo_reader(tex, mesh, [(photo, source_camera), *more_photos], blend, size, raster_ctx,
                                   photo_beyond_mask)
            from_mirror = _blend_mirror(image, seen, tex, mesh, seen_photo, stats, reader)
        timings["mirror"] = time.perf_counter() - t0

    photo_weight = np.zeros(len(tex.face_ids), np.float32)
    from_glance = np.zeros(len(tex.face_ids), bool)
    if proj is not None:
        t0 = time.perf_counter()
        stats.update(_blend_photo(image, seen, tex.chart, proj, size, have_views=views is not None))
        photo_weight = proj.weight
        from_glance = _blend_glance(image, seen, tex.chart, proj,
                                    None if seen_photo is None else seen_photo.trust)
        timings["blend"] = time.perf_counter() - t0
    stats["photo_projection"] = use_photo
    if notes:
        stats["warnings"] = notes + list(stats.get("warnings", ()))
    if not seen.any():
        raise StageInputError("nothing gave a colour to any texel: no view, no photo and no "
                              "colour of the mesh's own saw the surface")

    t0 = time.perf_counter()
    report(0.9, "filling unseen texels along the surface and dilating the gutter")
    _fill_on_surface(image, seen, tex, mesh, None if seen_photo is None else
                     np.where(photo_weight > 0, seen_photo.trust, 1.0))
    # every chart texel has a colour now: fill_texture only dilates the gutter (``seen`` stays
    # what the sources saw, for Texture.seen)
    final = fill_texture(image, seen | tex.chart, tex.chart)
    timings["fill"] = time.perf_counter() - t0
    stats["texels_from"] = _texel_sources(photo_weight, seen_views, from_fallback, from_mirror, from_glance)
    if fit is not None:
        t0 = time.perf_counter()
        stats.update(fit.measure(final))
        timings["psnr"] = time.perf_counter() - t0
    stats.update({
        "texels_seen_fraction": round(float(seen[tex.chart].mean()), 4),
        "texels_chart_fraction": round(float(tex.chart.mean()), 4),
        "bake_timings": {k: round(v, 3) for k, v in timings.items()},
    })
    out = BakeStats(
        mode=settings.mode, psnr_db=stats.get("bake_psnr_db"), l1=stats.get("bake_l1"),
        pixels=stats.get("bake_pixels"), texels_seen_fraction=stats["texels_seen_fraction"],
        texels_chart_fraction=stats["texels_chart_fraction"], timings=stats["bake_timings"],
        fast_psnr_db=stats.get("bake_fast_psnr_db"), opt_texture_size=stats.get("bake_opt_texture_size"),
        opt_steps=stats.get("bake_opt_steps"),
        photo_projection=use_photo, photo_texels_fraction=stats.get("photo_texels_fraction"),
        photo_pixels_per_texel=stats.get("photo_pixels_per_texel"),
        texture_size_suggested=stats.get("texture_size_suggested"),
        warnings=tuple(stats.get("warnings", ())), texels_from=stats["texels_from"], mirror=stats.get("mirror"),
        photos=tuple(stats.get("photos", ())))
    head = f"baked, PSNR {out.psnr_db:.1f} dB" if out.psnr_db is not None else "baked"
    report(1.0, "; ".join((head,) + out.warnings))
    return Texture(image=final, seen=seen), out


@dataclass
class _Texels:
    """The chart texels of a UV layout at one texture size.

    chart: (S, S) bool, texels some face covers; the rest are per chart texel (N of them):
    face_ids (N,) int32, bary (N, 3) float32, positions (N, 3) float32 surface points,
    normals (N, 3) float32 unit normals welded across UV seams."""

    chart: np.ndarray
    face_ids: np.ndarray
    bary: np.ndarray
    positions: np.ndarray
    normals: np.ndarray


def _texels(raster_ctx: "RasterContext", mesh: Mesh, size: int) -> _Texels:
    from pipeline.raster import rasterize as rz

    uv_raster = rz.rasterize_uv(raster_ctx, mesh, size)
    chart = np.asarray(uv_raster.tri_id[0]) >= 0                               # (S, S)
    if not chart.any():
        raise StageInputError(f"the mesh's UV layout covers no texel of a {size}x{size} texture; "
                              "its uvs are degenerate")
    face_ids = np.ascontiguousarray(np.asarray(uv_raster.tri_id[0])[chart], np.int32)
    bary = np.ascontiguousarray(np.asarray(uv_raster.bary[0])[chart], np.float32)
    # positions and normals (welded across UV seams, so view weights, and the photo's, do not
    # jump at a seam) interpolated at the chart texels only, in one pass
    corners = mesh.faces[face_ids]                                             # (N, 3)
    attrs = np.concatenate([mesh.vertices, vertex_normals(mesh.vertices, mesh.faces)], axis=1)
    both = np.einsum("nk,nkd->nd", bary, attrs[corners]).astype(np.float32)   # (N, 6)
    positions = np.ascontiguousarray(both[:, :3])
    normals = both[:, 3:]
    normals = (normals / np.maximum(np.linalg.norm(normals, axis=1, keepdims=True), 1e-12)).astype(np.float32)
    return _Texels(chart, face_ids, bary, positions, normals)


@dataclass
class _ViewFit:
    """The view pixels a bake fitted: their uvs (M, 2) and colours (M, 3) (numpy, or a tensor
    on the views' device), to measure the final texture against."""

    pixel_uv: np.ndarray
    target: "np.ndarray | torch.Tensor"

    def measure(self, final: np.ndarray) -> dict:
        rendered = sample_texture(final, self.pixel_uv)
        # host numbers: one way, not back
        target = self.target.cpu().numpy() if is_tensor(self.target) else np.asarray(self.target)  # type: ignore[union-attr]
        psnr = masked_psnr(rendered, target, np.ones(len(target), bool))
        return {"bake_psnr_db": round(psnr, 3), "bake_l1": round(float(np.abs(rendered - target).mean()), 5),
                "bake_pixels": int(len(target))}


def _bake_views(tex: _Texels, mesh: Mesh, views: Views, settings: BakeSettings, raster_ctx, dev, seed: int,
                report, chunk_scale: float, image: np.ndarray, seen: np.ndarray, stats: dict,
                timings: dict, may_skip: bool = False) -> Optional[_ViewFit]:
    """The multi-view bake (fast back-projection, then opt) into ``image`` and ``seen`` (S, S).
    Views that show the mesh nowhere opaque are an error, unless ``may_skip`` (another source
    colours it): then None, and nothing is baked from them."""
    from pipeline.raster import rasterize as rz

    assert mesh.uvs is not None   # _validate_mesh refuses a mesh without
    t0 = time.perf_counter()
    view_raster = rz.rasterize_views(raster_ctx, mesh, views.cameras)
    if views.on_device:
        import torch

        # views the renderer left on its device are read there: only the covered-pixel mask
        # (one byte a pixel) crosses to the host, to pick the pixels' uvs; the stack is not
        # moved whole (it can be gigabytes), only the picked colours and one view at a time
        target_t = torch.as_tensor(np.asarray(view_raster.tri_id) >= 0, device=views.alpha.device) \
            & (views.alpha > ALPHA_MIN)
        target_mask = target_t.cpu().numpy()  # type: ignore[attr-defined]  # a tensor: Views are typed as numpy
    else:
        target_mask = np.asarray(view_raster.tri_id >= 0) & (views.alpha > ALPHA_MIN)  # (C, H, W)
    if not target_mask.any():
        if may_skip:
            return None
        raise StageInputError("no view sees the mesh where the view is opaque "
                              f"(alpha > {ALPHA_MIN}); the views and the mesh do not line up")
    timings["rasterize"] += time.perf_counter() - t0
    report(0.1, "back-projecting views")

    t0 = time.perf_counter()
    fast_chunk = max(1 << 12, int(FAST_CHUNK * chunk_scale))
    max_opt_pixels = max(1, int(MAX_OPT_PIXELS * chunk_scale))
    colors, seen_chart = _fast_bake(tex.positions, tex.normals, view_raster, views, dev, fast_chunk)
    image[tex.chart] = colors
    seen[tex.chart] = seen_chart
    if not seen.any():
        raise StageInputError("no texel is visible in any view; the cameras do not see the mesh")
    timings["fast"] = time.perf_counter() - t0

    # the target pixels' uvs, interpolated there only
    corners = mesh.faces[np.asarray(view_raster.tri_id)[target_mask]]         # (M, 3)
    pixel_uv = np.einsum("mk,mkd->md", np.asarray(view_raster.bary)[target_mask],
                         mesh.uvs[corners]).astype(np.float32)                # (M, 2)
    # (M, 3); on the device a tensor (Views are typed as numpy, and hold tensors there)
    target = views.rgb[target_t].to(dev) if views.on_device else views.rgb[target_mask]  # type: ignore[attr-defined]
    if settings.mode == "opt":
        t0 = time.perf_counter()
        report(0.2, "optimising texture")
        init = _nearest_fill(image, seen)
        opt_uv, opt_target = pixel_uv, target
        if len(pixel_uv) > max_opt_pixels:
            # a seeded subset bounds memory (64 views at 2048^2 would be ~80M pixels)
            pick = np.sort(np.random.default_rng(int(seed)).permutation(len(pixel_uv))[:max_opt_pixels])
            opt_uv = pixel_uv[pick]
            opt_target = target[_on_device_of(target, pick)] if is_tensor(target) else target[pick]
        size = image.shape[0]
        opt_size = _opt_texture_size(size, int(tex.chart.sum()), len(opt_uv))
        step_report = lambda f, m: report(0.2 + 0.65 * f, m)   # noqa: E731
        if opt_size == size:
            result, touched, fast_psnr, opt_steps = _optimise(init, tex.chart, opt_uv, opt_target, settings,
                                                              dev, step_report)
        else:
            result, touched, fast_psnr, opt_steps = _optimise_coarse(
                init, opt_size, mesh, raster_ctx, opt_uv, opt_target, settings, dev,
                step_report)
        image[...] = result
        seen |= touched
        stats["bake_fast_psnr_db"] = round(fast_psnr, 3)
        stats["bake_opt_texture_size"] = opt_size
        stats["bake_opt_steps"] = opt_steps
        timings["opt"] = time.perf_counter() - t0
    return _ViewFit(pixel_uv, target)


def _texel_sources(photo_weight: np.ndarray, seen_views: np.ndarray, from_fallback: np.ndarray,
                   from_mirror: np.ndarray, from_glance: Optional[np.ndarray] = None) -> dict:
    """Share of chart texels each source coloured: the photo where its weight is over half, or
    any where no view saw the texel (then nothing else lies under the photo); the mirror where
    its weight is over half under that."""
    n = max(1, len(photo_weight))
    photo = (photo_weight > 0.5) | ((photo_weight > 0) & ~seen_views & ~from_mirror)
    mirror = from_mirror & ~photo
    views = seen_views & ~photo & ~mirror
    fallback = from_fallback & ~photo & ~views & ~mirror
    glance = np.zeros_like(photo) if from_glance is None else from_glance & ~(photo | views | fallback | mirror)
    fill = ~(photo | views | fallback | mirror | glance)
    return {k: round(float(v.sum()) / n, 4) for k, v in
            (("photo", photo), ("mirror", mirror), ("views", views), ("fallback", fallback), ("glance", glance),
             ("fill", fill))}


# --------------------------------------------------------------------------- the unseen side
# (the logic lives in pipeline.texture.unseen, mirror_fill, surface_fill and symmetry; these two
# only read and write the bake's image)

def _blend_mirror(image: np.ndarray, seen: np.ndarray, tex: "_Texels", mesh: Mesh, seen_photo, stats: dict,
                  resample=None) -> np.ndarray:
    """Blend the mirror's colours over what lies in ``image`` (S, S, 3) at the chart texels,
    by the mirror's weight (feathered), in place; updates ``seen``, adds ``stats["mirror"]``.
    Returns (N,) bool: the chart texels the mirror coloured (weight over half)."""
    mirror = unseen_side.mirror_for(mesh, tex.positions, tex.normals, seen_photo, resample=resample)
    stats["mirror"] = mirror.report()
    if not mirror.used:
        return np.zeros(len(tex.face_ids), bool)
    chart_image, chart_seen = image[tex.chart], seen[tex.chart]
    w = mirror.weight[:, None]
    base = np.where(chart_seen[:, None], chart_image, mirror.colors)
    image[tex.chart] = base * (1.0 - w) + mirror.colors * w
    seen[tex.chart] = chart_seen | (mirror.weight > 0)
    return mirror.weight > 0.5


def _fill_on_surface(image: np.ndarray, seen: np.ndarray, tex: "_Texels", mesh: Mesh,
                     trust: Optional[np.ndarray]) -> None:
    """Chart texels no source coloured take a fill along the surface (across UV seams, never
    from another chart's texture neighbours), in ``image`` in place (``seen`` is left as the
    sources' own); ``trust`` (N,) says how far each known colour may be spread (None: all the way)."""
    known = seen[tex.chart]
    if known.all() or not known.any():
        return
    v = mesh.vertices.astype(np.float64)
    f = mesh.faces
    area = 0.5 * float(np.linalg.norm(np.cross(v[f[:, 1]] - v[f[:, 0]], v[f[:, 2]] - v[f[:, 0]]), axis=1).sum())
    image[tex.chart] = unseen_side.fill_on_surface(tex.positions, tex.normals, image[tex.chart], known, trust,
                                              len(tex.face_ids), area)


def render_textured(mesh: Mesh, texture: Texture, cameras: Cameras, raster_ctx: "RasterContext"
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Render the textured mesh (bilinear texture lookup, no shading).

    Returns rgb (C, H, W, 3) float32 in [0, 1] (0 where uncovered) and
    covered (C, H, W) bool.
    """
    from pipeline.raster import rasterize as rz

    _validate_mesh(mesh)
    cameras.validate("cameras")
    check_array("texture.image", texture.image, dtype=np.uint8, shape=(None, None, 3))
    if texture.image.shape[0] != texture.image.shape[1]:
        raise StageInputError(f"texture.image must be square, got {texture.image.shape[:2]}")
    assert mesh.uvs is not None   # _validate_mesh refuses a mesh without
    hits = rz.rasterize_views(raster_ctx, mesh, cameras)
    covered = np.asarray(hits.tri_id) >= 0
    uv = np.asarray(rz.interpolate(hits, mesh, mesh.uvs), np.float32)
    rgb = np.zeros((*covered.shape, 3), np.float32)
    rgb[covered] = sample_texture(texture.image, uv[covered])
    return rgb, covered


def masked_psnr(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    """PSNR in dB (peak 1.0) between colour arrays a, b (..., 3) float over ``mask`` (...) bool.

    Capped at PSNR_CAP_DB for identical inputs. Raises ValueError on an empty mask.
    """
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    mask = np.asarray(mask, bool)
    if a.shape != b.shape or a.shape[:-1] != mask.shape:
        raise ValueError(f"masked_psnr shapes disagree: {a.shape}, {b.shape}, mask {mask.shape}")
    if not mask.any():
        raise ValueError("masked_psnr: the mask selects no pixel")
    mse = float(np.mean((a[mask] - b[mask]) ** 2))
    if mse <= 10.0 ** (-PSNR_CAP_DB / 10.0):
        return PSNR_CAP_DB
    return float(-10.0 * math.log10(mse))


def _on_device_of(like, a: np.ndarray):
    """The numpy array ``a`` as a tensor on the device of the tensor ``like``."""
    import torch

    return torch.as_tensor(a, device=like.device)


def fill_texture(image: np.ndarray, seen: np.ndarray, chart: np.ndarray) -> np.ndarray:
    """Turn a partly known texture into a complete uint8 image.

    image: (S, S, 3) float32 in [0, 1], trusted only where ``seen`` (S, S) bool.
    chart: (S, S) bool, texels inside UV charts.
    Chart texels not seen are inpainted (Telea) from their surroundings; every
    texel outside ``chart | seen`` copies the nearest texel of that set.
    Returns (S, S, 3) uint8.
    """
    import cv2

    keep = chart | seen
    # Telea reads the known ring around a hole; seed everything unseen with its
    # nearest seen colour first, so that ring never contains gutter black.
    prefilled = _nearest_fill(image, seen)
    out = np.clip(np.round(prefilled * 255.0), 0, 255).astype(np.uint8)
    holes = chart & ~seen
    if holes.any():
        out = np.asarray(cv2.inpaint(out, holes.astype(np.uint8), INPAINT_RADIUS, cv2.INPAINT_TELEA), np.uint8)
    if not keep.all():
        out = out[_nearest_index(keep)]
    return out


# --------------------------------------------------------------------------- fast mode

def _fast_bake(positions: np.ndarray, normals: np.ndarray, view_raster: Raster,
               views: Views, dev, chunk: int = FAST_CHUNK, engine: Optional[str] = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Visibility-weighted back-projection of N texels (positions, unit normals (N, 3)).
    Returns colours (N, 3) float32 and seen (N,) bool, in the texels' order.

    engine: "kernel" (numba, ``back_projection_kernels``; views on the host and a CPU
    device only) or "torch" (``_project_view``, any device); None: the kernel where it can run.
    Both give the same numbers to float32 round-off (``tests/test_bake.py``)."""
    if engine is None:
        engine = "kernel" if dev == "cpu" and not views.on_device else "torch"
    if engine == "kernel":
        acc_np = _back_project_kernel(positions, normals, view_raster, views)
        w_np = acc_np[:, 3]
        seen = w_np > FAST_MIN_WEIGHT
        colors_np = np.where(seen[:, None], acc_np[:, :3] / np.maximum(w_np, FAST_MIN_WEIGHT)[:, None], 0.0)
        return np.clip(colors_np, 0, 1).astype(np.float32), seen
    import torch

    p_all = torch.as_tensor(positions, device=dev)
    n_all = torch.nn.functional.normalize(torch.as_tensor(normals, device=dev), dim=1)
    cams = views.cameras
    viewmats = torch.as_tensor(cams.viewmats, device=dev)
    Ks = torch.as_tensor(cams.Ks, device=dev)
    centers = torch.as_tensor(camera_centers(cams), device=dev)
    acc = torch.zeros(len(positions), 4, device=dev)     # weighted premultiplied rgb, weighted alpha
    # one premultiplied view at a time: the whole stack can be gigabytes at high resolution
    for c in range(len(cams)):
        # premultiplied, so bilinear taps straddling the silhouette do not mix in background colour
        if views.on_device:
            alpha = views.alpha[c].to(dev)[..., None]
            rgba = torch.cat([views.rgb[c].to(dev) * alpha, alpha], -1)
        else:
            alpha = views.alpha[c][..., None]
            rgba = torch.as_tensor(np.concatenate([views.rgb[c] * alpha, alpha], -1), device=dev)
        rgba = rgba.permute(2, 0, 1).contiguous()                              # (4, H, W)
        depth = torch.as_tensor(np.asarray(view_raster.depth[c], np.float32), device=dev)
        for start in range(0, len(positions), chunk):
            end = start + chunk
            acc[start:end] += _project_view(p_all[start:end], n_all[start:end], viewmats[c], Ks[c],
                                            centers[c], depth, rgba)
    w = acc[:, 3]
    ok = w > FAST_MIN_WEIGHT
    colors = torch.where(ok[:, None], acc[:, :3] / w.clamp(min=FAST_MIN_WEIGHT)[:, None],
                         torch.zeros_like(acc[:, :3])).clamp(0, 1)
    return colors.cpu().numpy(), ok.cpu().numpy()


def _back_project_kernel(positions: np.ndarray, normals: np.ndarray, view_raster: Raster, views: Views
                         ) -> np.ndarray:
    """The views' weighted sums (N, 4) as ``_project_view`` adds them, by the numba kernel."""
    from pipeline.texture.back_projection_kernels import back_project
    from pipeline.texture.visibility import DEPTH_REL_TOL, MAX_SLOPE

    cams = views.cameras
    f32 = np.float32
    acc = np.zeros((len(positions), 4), f32)
    back_project(np.ascontiguousarray(positions, f32), np.ascontiguousarray(normals, f32),
                 np.ascontiguousarray(cams.viewmats, f32), np.ascontiguousarray(cams.Ks, f32),
                 np.ascontiguousarray(camera_centers(cams), f32),
                 np.ascontiguousarray(view_raster.depth, f32), np.ascontiguousarray(views.rgb, f32),
                 np.ascontiguousarray(views.alpha, f32), f32(DEPTH_REL_TOL), f32(MAX_SLOPE),
                 f32(DEPTH_SLOPE_PIXELS), f32(FAST_COS_POWER), acc)
    return acc


def _project_view(p, n, viewmat, K, center, depth, rgba):
    """One view's contribution to N texels: (N, 4) = weight * (premultiplied rgb, alpha).

    p, n: (N, 3) positions and unit normals; depth (H, W); rgba (4, H, W) premultiplied.
    """
    import torch

    height, width = depth.shape
    cam = p @ viewmat[:3, :3].T + viewmat[:3, 3]
    z = cam[:, 2]
    zs = torch.where(z > 1e-6, z, torch.ones_like(z))
    px = (cam[:, 0] * K[0, 0] + cam[:, 1] * K[0, 1]) / zs + K[0, 2]
    py = cam[:, 1] / zs * K[1, 1] + K[1, 2]
    to_cam = torch.nn.functional.normalize(center - p, dim=1)
    cos = (n * to_cam).sum(1)
    col = px.floor().long()
    row = py.floor().long()
    inside = (z > 1e-6) & (col >= 0) & (col < width) & (row >= 0) & (row < height) & (cos > 0)
    d = depth[row.clamp(0, height - 1), col.clamp(0, width - 1)]
    tol = depth_tolerance(z, cos, z / K[0, 0], DEPTH_SLOPE_PIXELS)
    visible = inside & (d > 0) & ((z - d).abs() <= tol)
    grid = torch.stack([2.0 * px / width - 1.0, 2.0 * py / height - 1.0], 1)
    sampled = torch.nn.functional.grid_sample(
        rgba[None], grid[None, None], mode="bilinear", padding_mode="zeros",
        align_corners=False)[0, :, 0].T                                       # (N, 4)
    weight = torch.where(visible, cos.clamp(min=0) ** FAST_COS_POWER, torch.zeros_like(cos))
    return sampled * weight[:, None]


# --------------------------------------------------------------------------- photo

def _project_photo(tex: "_Texels", mesh: Mesh, photo: ImageInput, camera: SourceCamera, size: int,
                   raster_ctx: "RasterContext", beyond_mask: bool):
    from pipeline.texture.photo_projection import project_photo

    return project_photo(mesh, tex.face_ids, tex.bary, tex.positions, tex.normals, photo, camera, size,
                         raster_ctx, beyond_mask=beyond_mask)


def _project_photos(tex: "_Texels", mesh: Mesh, photos: Sequence[tuple[ImageInput, SourceCamera]], size: int,
                    raster_ctx, beyond_mask: bool, level: bool, stats: dict):
    """Several photos as one projection (``pipeline.texture.multi_photo``); their figures go
    into ``stats["photos"]``."""
    from pipeline.texture.multi_photo import project_photos
    from pipeline.texture.photo_projection import project_photo

    def some(photo: ImageInput, camera: SourceCamera, idx: np.ndarray):   # the texels idx only
        return project_photo(mesh, tex.face_ids[idx], tex.bary[idx], tex.positions[idx], tex.normals[idx], photo,
                             camera, size, raster_ctx, beyond_mask=beyond_mask)

    proj, stats["photos"], blend = project_photos(photos, tex.positions, tex.normals, some, level=level)
    return proj, blend


def _photo_reader(tex: "_Texels", mesh: Mesh, photos: Sequence[tuple[ImageInput, SourceCamera]], blend,
                  size: int, raster_ctx, beyond_mask: bool):
    """A ``mirror_fill.Resample``: the photos' colours at surface points next to given chart
    texels, read from each photo as that texel's own colour was (same pyramid level, same
    depth test), and with several photos blended by that texel's shares and levelling
    (``blend``, a ``multi_photo.PhotoBlend``; None for one photo)."""
    from pipeline.texture.photo_projection import project_photo

    def read(texels: np.ndarray, points: np.ndarray, normals: np.ndarray):
        got = [project_photo(mesh, tex.face_ids[texels], tex.bary[texels], points, normals, photo, camera, size,
                             raster_ctx, beyond_mask=beyond_mask) for photo, camera in photos]
        if blend is None:
            return got[0].colors, got[0].weight > 0
        return blend.combine(texels, [g.colors for g in got], [g.weight for g in got])

    return read


def _blend_glance(image: np.ndarray, seen: np.ndarray, chart: np.ndarray, proj, trust: Optional[np.ndarray]
                  ) -> np.ndarray:
    """Chart texels no source coloured but a photo sees at a grazing angle (``proj.glance``)
    take that photo's colour, in ``image`` in place, where it may be trusted (``trust``: not
    next to a stretch of the mask's edge where something in front hid the object); updates
    ``seen``. Returns (N,) bool, the texels it coloured. Two photos from opposite sides both
    see a band around the object's waist only at grazing angles: without this, the fill
    interpolated across that band from its two edges."""
    n = int(chart.sum())
    if proj.glance is None or proj.glance_colors is None:
        return np.zeros(n, bool)
    w = proj.glance if trust is None else proj.glance * trust
    take = (w > GLANCE_MIN) & ~seen[chart]
    if take.any():
        chart_image = image[chart]
        chart_image[take] = proj.glance_colors[take]
        image[chart] = chart_image
        chart_seen = seen[chart]
        chart_seen[take] = True
        seen[chart] = chart_seen
    return take


def _blend_photo(image: np.ndarray, seen: np.ndarray, chart: np.ndarray, proj, size: int,
                 have_views: bool) -> dict:
    """Blend the photo's colours (``proj``: a ``PhotoProjection`` of the chart texels) into
    ``image`` (S, S, 3) in place, where its camera sees the surface: weight * photo +
    (1 - weight) * what lies under it. With views, texels no view saw blend with their
    nearest seen texel, as inpainting would give them, so they ramp like the rest instead of
    jumping to the photo's colour; without views the photo outranks any other colour wherever
    it has weight. Updates ``seen``. Returns stats."""
    from pipeline.texture.photo_projection import suggested_texture_size

    if have_views and seen.any():
        base = _nearest_fill(image, seen)[chart]
    else:
        base = np.where(seen[chart][:, None], image[chart], proj.colors)
    w = proj.weight[:, None]
    image[chart] = base * (1.0 - w) + proj.colors * w
    seen[chart] = seen[chart] | (proj.weight > 0)
    front = proj.weight > 0.5
    stats = {"photo_texels_fraction": round(float(front.mean()), 4),
             "photo_pixels_per_texel": round(float(np.median(proj.density[front])), 3)
             if front.any() else 0.0}
    better = suggested_texture_size(proj.density, proj.weight, size)
    if better is not None:
        stats["texture_size_suggested"] = better
        stats["warnings"] = [   # type: ignore[assignment]  # a JSON dict of mixed values
            f"the photo shows the object's front with about {stats['photo_pixels_per_texel']:.1f} "
            f"photo pixels per texel at texture size {size}: fine detail is averaged away; "
            f"texture size {min(better, allowed_range('bake.texture_size')[1])} (or auto) would keep it"]
    return stats


# --------------------------------------------------------------------------- opt mode

def _opt_texture_size(size: int, chart_texels: int, pixels: int) -> int:
    """The texture size whose chart texels the target pixels determine: at most one texel per
    OPT_PIXELS_PER_TEXEL pixels. Beyond that the fit is underdetermined and Adam's
    per-texel normalised steps random-walk the free texels into a salt-and-pepper speckle."""
    opt = size
    while opt > MIN_TEXTURE_SIZE and chart_texels * (opt / size) ** 2 * OPT_PIXELS_PER_TEXEL > pixels:
        opt //= 2
    return opt


def _optimise_coarse(init: np.ndarray, opt_size: int, mesh: Mesh, raster_ctx: "RasterContext",
                     pixel_uv: np.ndarray, target: np.ndarray,
                     settings: BakeSettings, dev, progress: ProgressFn
                     ) -> tuple[np.ndarray, np.ndarray, float, int]:
    """Optimise a correction at ``opt_size`` (what the views can determine) and add it,
    upsampled, to the full-resolution ``init`` (S, S, 3), which keeps the detail the
    back-projection found. Returns what ``_optimise`` returns, at full resolution."""
    import cv2

    from pipeline.raster import rasterize as rz
    from pipeline.texture.opt.host import bilinear_taps

    size = init.shape[0]
    chart_o = np.asarray(rz.rasterize_uv(raster_ctx, mesh, opt_size).tri_id[0]) >= 0
    if not chart_o.any():       # charts thinner than a coarse texel: nothing to correct at this scale
        chart_o = np.ones((opt_size, opt_size), bool)
    # fit the correction to what the full-resolution init still gets wrong
    pred_host = sample_texture(init, pixel_uv)
    fast_pred: "np.ndarray | torch.Tensor" = pred_host
    if is_tensor(target):       # views kept on the device: so is their target list
        fast_pred = _on_device_of(target, pred_host)
        residual = target - fast_pred
    else:
        residual = (target - fast_pred).astype(np.float32)
    zero = np.zeros((opt_size, opt_size, 3), np.float32)
    delta, _, _, steps = _optimise(zero, chart_o, pixel_uv, residual, settings, dev, progress,
                                   bounds=(-1.0, 1.0))
    # gutter texels take their chart's correction, so upsampling at chart edges reads no zeros
    up = cv2.resize(_nearest_fill(delta, chart_o), (size, size), interpolation=cv2.INTER_LINEAR)
    image = np.clip(init + up, 0.0, 1.0).astype(np.float32)
    fast_psnr = -10.0 * math.log10(max(float(((fast_pred - target) ** 2).mean()), 1e-10))
    idx, w = bilinear_taps(pixel_uv, size)
    touched = np.zeros(size * size, bool)
    touched[idx.reshape(-1)[w.reshape(-1) > 0]] = True
    return image, touched.reshape(size, size), fast_psnr, steps


def _optimise(init: np.ndarray, chart: np.ndarray, pixel_uv: np.ndarray, target: np.ndarray,
              settings: BakeSettings, dev, progress: ProgressFn, bounds: tuple = (0.0, 1.0)
              ) -> tuple[np.ndarray, np.ndarray, float, int]:
    """Adam on the texture against the compact list of target pixels.

    init (S, S, 3) float32, chart (S, S) bool, pixel_uv (M, 2), target (M, 3).
    Returns (texture (S, S, 3) float32, touched (S, S) bool: texels some pixel
    samples, PSNR of ``init`` on the targets, the steps taken: ``settings.steps``, or fewer
    when L1 stalled (``pipeline.texture.opt.schedule.StallSchedule``)).

    On the host (``dev`` "cpu", numpy targets) the compiled loop of ``pipeline.texture.opt.host``
    takes the same steps without torch; this torch loop runs on a device.
    """
    from pipeline.texture.opt import host

    if dev == "cpu" and not is_tensor(target):
        return host.optimise(init, chart, pixel_uv, target, settings, progress, bounds)
    import torch

    size = init.shape[0]
    n_texels = size * size
    idx_np, w_np = host.bilinear_taps(pixel_uv, size)
    idx, w = torch.as_tensor(idx_np, device=dev), torch.as_tensor(w_np, device=dev)
    # neighbouring pixels then read neighbouring texels: the sparse products stay cache friendly
    order = torch.argsort(idx[:, 0], stable=True)
    idx, w = idx[order], w[order]
    tgt = torch.as_tensor(target, device=dev)[order]
    m = len(idx)
    sample, sample_t = _sampling_matrices(idx, w, n_texels)

    tex = torch.as_tensor(init, device=dev).reshape(n_texels, 3).clone()
    init_pred = sample @ tex
    fast_psnr = -10.0 * math.log10(max(float(((init_pred - tgt) ** 2).mean()), 1e-10))

    # Adam is invariant to the loss scale, so drop the 1/(3M) of the mean: per-pixel
    # gradients of ~1 keep Adam's second moments far from float32 denormals
    tv_x, tv_y = _tv_pair_weights(chart, float(settings.tv_weight) * 3.0 * m, dev)

    # every per-step array is allocated once: fresh multi-megabyte blocks each step
    # cost page faults that, on small VMs, take longer than the arithmetic
    resid = torch.empty_like(tgt)
    grad = torch.empty_like(tex)
    tv_buf = torch.empty(n_texels * 3, device=dev) if tv_x is not None else None
    adam = _Adam(tex)
    schedule = StallSchedule.for_settings(int(settings.steps), settings.stop_when_stalled)
    step = 0
    while step < schedule.end:
        lr, check_now, report_now = schedule.plan(step, settings.lr)
        torch.addmm(tgt, sample, tex, beta=-1.0, out=resid)          # rendered - target
        l1 = float(resid.abs().mean()) if report_now or check_now else 0.0
        if check_now:
            schedule.observe(step, l1)
        torch.mm(sample_t, resid.sign_(), out=grad)
        if tv_x is not None:
            assert tv_buf is not None   # allocated with tv_x
            # anisotropic L1 TV on the flat (S*S*3) array: right neighbour 3 entries on, lower 3*S on
            flat, gflat = tex.view(-1), grad.view(-1)
            for shift, pair_w in ((3, tv_x), (3 * size, tv_y)):
                s_ = torch.sub(flat[shift:], flat[:-shift], out=tv_buf[:-shift]).sign_().mul_(pair_w)
                gflat[shift:] += s_
                gflat[:-shift] -= s_
        adam.step(grad, lr)
        tex.clamp_(*bounds)
        step += 1
        if report_now:
            progress(step / schedule.end, schedule.message(step, l1))

    touched = torch.zeros(n_texels, dtype=torch.bool, device=dev)
    touched[idx.reshape(-1)[w.reshape(-1) > 0]] = True
    result = tex.reshape(size, size, 3).cpu().numpy()
    return result, touched.reshape(size, size).cpu().numpy(), fast_psnr, step


def _tv_pair_weights(chart: np.ndarray, tv_weight: float, dev):
    """``pipeline.texture.opt.host.tv_pair_weights`` as tensors on ``dev`` (or (None, None))."""
    import torch

    from pipeline.texture.opt.host import tv_pair_weights

    tv_x, tv_y = tv_pair_weights(chart, tv_weight)
    if tv_x is None or tv_y is None:
        return None, None
    return torch.as_tensor(tv_x, device=dev), torch.as_tensor(tv_y, device=dev)


def _sampling_matrices(idx, w, n_texels: int):
    """Sparse CSR (M, T) matrix of the bilinear lookups and its transpose (T, M).

    idx, w: (M, 4). Rows of the forward matrix have exactly 4 distinct columns
    (bilinear_taps guarantees it), so its CSR arrays are the taps themselves.
    """
    import warnings

    import torch

    m = len(idx)
    dev = idx.device
    # 32-bit indices where they fit: half the memory, and what every sparse backend supports
    itype = torch.int32 if max(4 * m, n_texels) < 2**31 - 1 else torch.int64
    crow = torch.arange(0, 4 * m + 1, 4, device=dev, dtype=itype)
    cols = idx.reshape(-1).to(itype)
    vals = w.reshape(-1).contiguous()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        forward = torch.sparse_csr_tensor(crow, cols, vals, (m, n_texels), check_invariants=False)
    order = torch.argsort(cols, stable=True)
    counts = torch.bincount(cols, minlength=n_texels)
    trow = torch.zeros(n_texels + 1, dtype=itype, device=dev)
    trow[1:] = counts.cumsum(0)
    rows = torch.arange(m, device=dev, dtype=itype).repeat_interleave(4)
    backward = torch.sparse_csr_tensor(trow, rows[order], vals[order], (n_texels, m),
                                       check_invariants=False)
    return forward, backward


# --------------------------------------------------------------------------- helpers

def _nearest_index(known: np.ndarray):
    """Index arrays (rows, cols) mapping every texel to its nearest ``known`` texel, ``known``
    (S, S) bool with at least one True.

    OpenCV's labelled distance transform (its Voronoi labels number the known texels in raster
    order) runs 5-6x faster than scipy's exact one at 1024^2, which made this a fifth of the
    bake on a GPU; its chamfer metric picks a texel at most a few pixels farther than the
    nearest (0.4 px on average on a test layout), which a fill colour does not show."""
    import cv2

    _, labels = cv2.distanceTransformWithLabels((~known).astype(np.uint8), cv2.DIST_L2, 5,
                                                labelType=cv2.DIST_LABEL_PIXEL)
    rows, cols = np.nonzero(known)
    pick = labels - 1
    return rows[pick], cols[pick]


def _nearest_fill(image: np.ndarray, known: np.ndarray) -> np.ndarray:
    """(S, S, 3) copy of ``image`` where texels outside ``known`` take their nearest known colour."""
    if known.all():
        return image.copy()
    return image[_nearest_index(known)]


class _Adam:
    """Adam (Kingma & Ba) on one tensor, updated in place.

    Written out instead of ``torch.optim.Adam`` because constructing a torch
    optimizer imports torch._dynamo and with it Triton, whose bundled LLVM
    segfaults in a process where Mesa's llvmpipe (the moderngl rasterizer) is
    already loaded. The gradient is computed by hand anyway (sparse products).
    """

    def __init__(self, param, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        import torch

        self.param = param
        self.m = torch.zeros_like(param)
        self.v = torch.zeros_like(param)
        self.denom = torch.empty_like(param)
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.t = 0

    def step(self, grad, lr: float) -> None:
        import torch

        self.t += 1
        self.m.mul_(self.beta1).add_(grad, alpha=1 - self.beta1)
        self.v.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        bias1 = 1 - self.beta1 ** self.t
        bias2 = 1 - self.beta2 ** self.t
        torch.div(self.v, bias2, out=self.denom).sqrt_().add_(self.eps)
        self.param.addcdiv_(self.m, self.denom, value=-lr / bias1)


class _Progress:
    """Forwards monotonic (fraction, message) reports to an optional callback."""

    def __init__(self, fn: Optional[ProgressFn]):
        self.fn = fn
        self.last = 0.0

    def __call__(self, fraction: float, message: str) -> None:
        self.last = max(self.last, min(1.0, float(fraction)))
        if self.fn is not None:
            self.fn(self.last, message)


def _validate_mesh(mesh: Mesh) -> None:
    if not isinstance(mesh, Mesh):
        raise StageInputError(f"mesh must be a Mesh, got {type(mesh).__name__}")
    if mesh.uvs is None:
        raise StageInputError("mesh has no UVs; unwrap it (pipeline.unwrap.uv.unwrap) before baking")
    mesh.validate("mesh")
    if mesh.uvs.min() < -1e-4 or mesh.uvs.max() > 1 + 1e-4:
        raise StageInputError(f"mesh.uvs must lie in [0, 1], got range "
                              f"[{mesh.uvs.min():.4g}, {mesh.uvs.max():.4g}]")


def _validate_inputs(mesh: Mesh, views: Optional[Views], settings: BakeSettings) -> None:
    _validate_mesh(mesh)
    if settings.mode not in MODES:
        raise StageInputError(f"bake mode {settings.mode!r} is unknown; choose one of {', '.join(MODES)}")
    size = settings.texture_size
    if (isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < MIN_TEXTURE_SIZE
            or size > MAX_RASTER_SIDE or size & (size - 1)):
        raise StageInputError(f"texture size {size!r} must be a power of two between "
                              f"{MIN_TEXTURE_SIZE} and {MAX_RASTER_SIDE}")
    if settings.mode == "opt":
        if settings.steps < 0:
            raise StageInputError(f"bake steps must be >= 0, got {settings.steps}")
        if not (math.isfinite(settings.lr) and settings.lr > 0):
            raise StageInputError(f"bake lr must be a positive number, got {settings.lr}")
        if not (math.isfinite(settings.tv_weight) and settings.tv_weight >= 0):
            raise StageInputError(f"bake tv_weight must be >= 0, got {settings.tv_weight}")
    if views is None:
        return
    if not isinstance(views, Views):
        raise StageInputError(f"views must be Views, got {type(views).__name__}")
    views.validate("views")
