"""A bake job's stages over its folder: the request's files read and placed (stage "read"),
then textured (``pipeline.texture.model_bake``). The worker runs it on a job's ``inputs/``;
``kiln bake --in-process`` on a folder laid out the same way."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from kiln.records import Backends
    from kiln.settings import Settings
    from pipeline.texture.model_bake import ModelBakeResult
    from pipeline.raster.rasterize import RasterContext

OnEvent = Callable[[str, float, str], None]   # (stage, fraction of that stage, message)

# what a bake whose camera was fitted leaves beside its GLB as soon as the fit is done (before
# the texture is baked): the silhouette over the photo (``pipeline.camera.fit_overlay``), which
# the page shows while the bake goes on, and the camera (``source_camera`` form), which a later
# bake can be given as its camera
FIT_IMAGE = "camera_fit.png"
FIT_CAMERA = "camera.json"


def bake_folder(job_dir: Path, settings: "Settings", backends: "Backends", raster_ctx: "RasterContext",
                on_event: OnEvent, out_dir: Path, name: str = "model") -> "ModelBakeResult":
    """Bake the job in ``job_dir`` (its ``inputs/bake.json``, the files it names, and
    ``inputs/image.png`` + ``mask.png`` when it has a photo) into ``<out_dir>/<name>.glb``."""
    from pipeline.texture.model_bake import bake_model
    from pipeline.texture.model_inputs import place_model, read_model
    from pipeline.types import ImageInput

    from worker.jobstore import load_inputs, load_request

    on_event("read", 0.0, "reading the files")
    t0 = time.perf_counter()
    req = load_request(job_dir)
    photo = ImageInput(*load_inputs(job_dir)) if req.photo else None
    read = read_model(req, Path(job_dir) / "inputs", photo)
    inputs = place_model(read, req, raster_ctx, backends, progress=lambda f, m: on_event("read", f, m))
    if inputs.camera_fit is not None and inputs.photo is not None:
        on_event("read", 0.95, "drawing the fitted silhouette over the photo")
        _write_fit(inputs, raster_ctx, Path(out_dir))
    read_s = time.perf_counter() - t0
    result = bake_model(inputs, settings, backends, out_dir, raster_ctx, on_event=on_event, name=name)
    result.timings = {"read": read_s, **result.timings}
    return result


def _write_fit(inputs, raster_ctx: "RasterContext", out_dir: Path) -> None:
    import json

    from kiln.atomic import atomic_write
    from kiln.imageio import save_png
    from pipeline.camera.fit_overlay import fit_overlay

    assert inputs.camera_fit is not None and inputs.photo is not None
    fit = inputs.camera_fit
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / FIT_CAMERA, json.dumps(fit.report(), indent=1).encode())
    picture = fit_overlay(raster_ctx, inputs.model.mesh, inputs.photo.rgb, inputs.photo.mask, fit.camera)
    save_png(out_dir / FIT_IMAGE, picture)


def copy_fit_files(outputs: Path, out: Path) -> list[Path]:
    """The fit's picture and camera from a job's ``outputs`` beside ``out`` (the GLB a person
    asked for) as ``<stem>.camera_fit.png`` and ``<stem>.camera.json``; the paths written
    (none when the camera was not fitted)."""
    from kiln.atomic import atomic_copy

    written = []
    for name in (FIT_IMAGE, FIT_CAMERA):
        src = Path(outputs) / name
        if src.is_file():
            written.append(atomic_copy(src, Path(out).with_name(f"{Path(out).stem}.{name}")))
    return written
