"""The stages in the caller's own process, for ``kiln run --in-process`` (debugging: a
native crash takes the caller with it, which is the point when reading a traceback).

It lives in worker/ so that front ends reach the pipeline only through this layer,
whether the stages run in a spawned worker or here.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Optional

import numpy as np

OnEvent = Callable[[str, float, str], None]   # (stage, fraction of that stage, message)


def run_in_process(rgb: np.ndarray, mask: np.ndarray, settings, out: Path,
                   on_event: Optional[OnEvent] = None, cache_dir: Optional[Path] = None) -> dict:
    """Run every stage here and leave the GLB at ``out`` (the .ply and the other formats, when
    asked for, beside it: ``kiln.formats.output_path``). Returns ``{"timings", "stats" (a
    ``kiln.records.PipelineStats``), "ply", "extra" (output key -> path)}``. Stage errors
    propagate unchanged."""
    from pipeline.run import run_pipeline
    from pipeline.types import ImageInput

    out = Path(out)
    res = run_pipeline(ImageInput(rgb, mask), settings, out.parent, on_event=on_event,
                       cache_dir=cache_dir, name=out.stem)
    if res.glb_path != out:   # an output without the .glb suffix
        shutil.move(res.glb_path, out)
    return {"timings": res.timings, "stats": res.stats, "ply": res.ply_path, "extra": dict(res.extra)}


def bake_in_process(bake, settings, out: Path, on_event: Optional[OnEvent] = None) -> dict:
    """``kiln bake --in-process``: a ``worker.jobs.bakeinputs.CheckedBake`` laid out in a temporary
    job folder as the job store would, baked here, the GLB left at ``out`` and the other
    formats beside it (and a fitted camera's picture and JSON, ``worker.jobs.bakejob.copy_fit_files``).
    Returns ``{"timings", "stats" (a ``kiln.records.PipelineStats``), "ply" (None), "extra"
    (output key -> path), "fit_files"}``."""
    import tempfile

    from kiln.atomic import atomic_copy
    from kiln.formats import copy_output, output_path
    from pipeline.backends import resolve_backends
    from pipeline.raster.rasterize import raster_context

    from worker.jobs.bakejob import bake_folder, copy_fit_files
    from worker.jobs.jobstore import JobStore

    with tempfile.TemporaryDirectory(prefix="kiln-bake-") as tmp:
        store = JobStore(Path(tmp))
        st = store.create_bake(bake.request, bake.copies, settings, "cli", bake.rgb, bake.mask)
        job_dir = store.job_dir(st.id)
        backends = resolve_backends(settings)
        with raster_context(backends.rasterize, backends.device) as rc:
            res = bake_folder(job_dir, settings, backends, rc, on_event or (lambda *a: None),
                              job_dir / "outputs")
        atomic_copy(res.glb_path, Path(out))
        extra = {}
        for key, path in res.extra.items():
            extra[key] = copy_output(key, path, output_path(out, key))
        fit_files = copy_fit_files(job_dir / "outputs", Path(out))
    return {"timings": res.timings, "stats": res.stats, "ply": None, "extra": extra, "fit_files": fit_files}
