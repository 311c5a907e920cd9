"""The whole pipeline as one function: image + mask + settings -> GLB on disk.

Knows nothing about processes or the UI: progress goes out through a callback,
the caller (CLI in-process, or the worker) decides what to do with it.
Stage names, in order, are ``kiln.stages.STAGES``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from kiln.records import BakeStats, PipelineStats
from kiln.settings import Settings

from pipeline.backends import Backends, resolve_backends  # noqa: F401  (the worker imports them from here)
from pipeline.types import ImageInput, Reconstruction, Views

if TYPE_CHECKING:
    from pipeline.raster.rasterize import RasterContext

# on_event(stage, fraction in [0, 1] within the stage, message)
EventFn = Callable[[str, float, str], None]


@dataclass(frozen=True)
class PipelineResult:
    """What ``run_pipeline`` wrote and measured: the GLB (and the Gaussians' .ply, when
    asked for), stage -> seconds, the stats (``kiln.records.PipelineStats``; ``stats.files``:
    every model file written), and the other formats' paths by output key (``extra``)."""

    glb_path: Path
    ply_path: Optional[Path]
    timings: dict[str, float] = field(default_factory=dict)
    stats: PipelineStats = field(default_factory=PipelineStats)
    extra: dict[str, Path] = field(default_factory=dict)

    @property
    def reconstruction_cached(self) -> bool:
        return self.stats.reconstruction_cached


def _noop(stage: str, fraction: float, message: str) -> None:
    pass


def run_pipeline(image: ImageInput, settings: Settings, out_dir: Path,
                 on_event: EventFn | None = None,
                 backends: Backends | None = None,
                 cache_dir: Path | None = None,
                 name: str = "model",
                 raster_ctx: "RasterContext | None" = None) -> PipelineResult:
    """Run every stage and write ``<out_dir>/<name>.glb`` (and ``.ply`` on request, and the
    formats of ``export.formats`` beside it: ``pipeline.io.outputs``).

    ``raster_ctx``: the bake's rasterizer context (``pipeline.raster.rasterize.raster_context``
    for ``backends.rasterize``), made by the caller on this thread and kept across jobs; without
    one, a context is made for this run and released at its end.

    ``cache_dir``: when given, the reconstruction is looked up there under a key of
    the input hashes, the reconstruction settings and the code version, and
    stored after computing it; so are the bake views, under the reconstruction's
    key plus the view settings, the renderer and its code version.
    """
    from pipeline.texture import bake as bake_mod
    from pipeline.io import export as export_mod
    from pipeline.io.outputs import write_outputs
    from pipeline.meshing import mesh_ops
    from pipeline.meshing.thin_faces import thin_part_faces
    from pipeline.unwrap import uv
    from pipeline.raster.rasterize import raster_context

    emit = on_event or _noop
    backends = backends or resolve_backends(settings)
    image.validate()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    cache_errors: dict[str, str] = {}   # stage -> why its result could not be cached

    def stage(name_: str):
        emit(name_, 0.0, "started")
        return time.perf_counter()

    def done(name_: str, t0: float, message: str = "done"):
        timings[name_] = time.perf_counter() - t0
        emit(name_, 1.0, message)

    t0 = stage("reconstruct")
    recon, cached = reconstruct_cached(image, settings, cache_dir, emit, cache_errors)
    done("reconstruct", t0, "cache hit" if cached else "done")

    if settings.export.gaussians_ply:
        ply_path = export_mod.export_gaussians_ply(recon.gaussians, out_dir / f"{name}.ply")
    else:
        ply_path = None

    views, views_cached = None, None
    if settings.bake.enabled:
        t0 = stage("render_views")
        views, views_cached = _render_views_cached(image, recon, settings, backends, cache_dir, emit,
                                                   cache_errors)
        done("render_views", t0, "cache hit" if views_cached else "done")

    t0 = stage("mesh")
    m = settings.mesh
    mesh = mesh_ops.clean_mesh(recon.mesh, min_component_fraction=m.min_component_fraction,
                               fill_holes=m.fill_holes)
    ratio = mesh_ops.equivalent_ratio(mesh.num_faces, m.faces, m.simplify_ratio)
    keep = thin_part_faces(mesh, recon.source_camera, image.mask, ratio) \
        if m.keep_thin_parts and recon.source_camera is not None else None
    mesh = mesh_ops.simplify_mesh(mesh, ratio=m.simplify_ratio, keep=keep, faces=m.faces)
    simplified = mesh
    thin_note = ", thin parts simplified apart" if keep is not None and keep.any() else ""
    done("mesh", t0, f"{mesh.num_faces} faces{thin_note}")

    texture = None
    texture_size_auto: Optional[int] = None
    bake_stats: Optional[BakeStats] = None
    if settings.bake.enabled:
        t0 = stage("uv")
        if settings.bake.texture_size == "auto":
            texture_size_auto = _auto_texture_size(mesh, recon)
            settings = settings.override({"bake.texture_size": texture_size_auto})
        texture_size = int(settings.bake.texture_size)   # "auto" was just resolved
        # faces the photo sees get its pixel grid as their UVs (pipeline/unwrap/photo_chart.py)
        photo_cam = recon.source_camera if settings.bake.photo_projection else None
        mesh = uv.unwrap(mesh, texture_size=texture_size,
                         gutter=settings.bake.gutter, max_faces=m.max_faces_for_uv,
                         method=settings.bake.unwrap, source_camera=photo_cam)
        done("uv", t0)

        t0 = stage("bake")
        assert views is not None   # rendered above: the bake is on
        own = raster_ctx is None
        ctx = raster_context(backends.rasterize, backends.device) if raster_ctx is None else raster_ctx
        try:
            texture, bake_stats = bake_mod.bake_texture(
                mesh, views, settings.bake, ctx, device=backends.device, seed=settings.seed,
                progress=lambda f, m: emit("bake", f, m), chunk_scale=backends.chunk_scale,
                photo=image, source_camera=recon.source_camera)
        finally:
            if own:
                ctx.release()
        done("bake", t0)

    t0 = stage("export")
    files = write_outputs(mesh, texture, out_dir, name, settings.export)
    glb_path = out_dir / files[0].name
    done("export", t0, ", ".join(f.name for f in files))
    stats = PipelineStats(
        backends=backends, reconstruction_cached=cached, reconstruct_faces=recon.mesh.num_faces,
        gaussians=len(recon.gaussians),
        source_camera=recon.source_camera.to_dict() if recon.source_camera is not None else None,
        views_cached=views_cached, faces=simplified.num_faces, vertices=simplified.num_vertices,
        texture_size_auto=texture_size_auto, bake=bake_stats, glb_bytes=glb_path.stat().st_size,
        reconstruction_cache_error=cache_errors.get("reconstruct"),
        views_cache_error=cache_errors.get("render_views"), files=files)
    return PipelineResult(glb_path=glb_path, ply_path=ply_path, timings=timings, stats=stats,
                          extra={f.key: out_dir / f.name for f in files[1:]})


def _auto_texture_size(mesh, recon: Reconstruction) -> int:
    """``bake.texture_size: auto``: from the photo's detail when the backend reported its
    camera, else Kiln's default size."""
    from pipeline.texture.photo_projection import texture_size_for_photo

    if recon.source_camera is None:
        return 1024
    return texture_size_for_photo(mesh, recon.source_camera)


def reconstruct_cached(image: ImageInput, settings: Settings, cache_dir: Path | None,
                       emit: EventFn, cache_errors: dict[str, str]) -> tuple[Reconstruction, bool]:
    """(reconstruction, whether it came from the cache): looked up in ``cache_dir`` (None: no
    cache) under the input's and the reconstruction settings' key, stored there after computing
    it; why it could not be stored goes to ``cache_errors["reconstruct"]``."""
    from pipeline import cache as cache_mod
    from pipeline.recon import reconstruct

    key = None
    if cache_dir is not None:
        key = cache_mod.reconstruction_key(image, settings)
        recon = cache_mod.load_reconstruction(Path(cache_dir), key)
        if recon is not None:
            return recon, True
    recon = reconstruct.reconstruct(image, settings.reconstruct, seed=settings.seed,
                                    progress=lambda f, m: emit("reconstruct", f, m))
    if cache_dir is not None and key is not None:
        try:
            cache_mod.save_reconstruction(Path(cache_dir), key, recon)
        except OSError as e:
            # a full or read-only cache costs the next job time; it must not fail this one
            cache_errors["reconstruct"] = f"{type(e).__name__}: {e}"
    return recon, False


def _render_views_cached(image: ImageInput, recon: Reconstruction, settings: Settings,
                         backends: Backends, cache_dir: Path | None, emit: EventFn,
                         cache_errors: dict[str, str]) -> tuple[Views, bool]:
    """(bake views, whether they came from the cache)."""
    from pipeline import cache as cache_mod
    from pipeline.views import render_views
    from pipeline.camera.cameras import photo_shows_front, sphere_cameras
    from pipeline.types import Cameras

    v = settings.views
    cams = sphere_cameras(v.count, v.radius, v.fov_deg, v.resolution)
    skip_front = len(cams) > 1 and settings.bake.photo_projection and recon.source_camera is not None \
        and photo_shows_front(recon.source_camera, cams)
    if skip_front:   # the photo gives what the first (front) view would, sharper: not rendered
        cams = Cameras(viewmats=cams.viewmats[1:], Ks=cams.Ks[1:], width=cams.width, height=cams.height)
    key = None
    if cache_dir is not None:
        key = cache_mod.views_key(cache_mod.reconstruction_key(image, settings), settings,
                                  backends.render, backends.device, skip_front=skip_front)
        views = cache_mod.load_views(Path(cache_dir), key, cams)
        if views is not None:
            return views, True
    # on a GPU the views stay there for the bake, which reads them on the same device
    views = render_views.render_gaussians(
        recon.gaussians, cams, backend=backends.render, device=backends.device,
        progress=lambda f, m: emit("render_views", f, m), chunk_scale=backends.chunk_scale,
        as_tensors=backends.device.startswith("cuda"))
    if cache_dir is not None and key is not None:
        # bake from what a later cache hit will load, so both runs give the same texture
        stored = cache_mod.quantise_views(views.to_numpy())
        if views.on_device:
            # the same float16 rounding (IEEE, to nearest even) done where the views are, so
            # the bake's copy need not travel back from the host
            views = Views(rgb=views.rgb.half().float(),  # type: ignore[attr-defined]  # tensors (on_device)
                          alpha=views.alpha.half().float(),  # type: ignore[attr-defined]
                          cameras=views.cameras)
        else:
            views = stored
        try:
            cache_mod.save_views(Path(cache_dir), key, stored)
        except OSError as e:
            cache_errors["render_views"] = f"{type(e).__name__}: {e}"
    return views, False
