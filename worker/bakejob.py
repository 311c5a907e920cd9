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
    inputs = place_model(read, req, raster_ctx, backends, seed=settings.seed,
                         progress=lambda f, m: on_event("read", f, m))
    read_s = time.perf_counter() - t0
    result = bake_model(inputs, settings, backends, out_dir, raster_ctx, on_event=on_event, name=name)
    result.timings = {"read": read_s, **result.timings}
    return result
