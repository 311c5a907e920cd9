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
    """Run every stage here and leave the GLB at ``out`` (the .ply, when asked for, beside
    it). Returns ``{"timings", "stats" (a ``kiln.records.PipelineStats``), "ply"}``. Stage errors
    propagate unchanged."""
    from pipeline.run import run_pipeline
    from pipeline.types import ImageInput

    out = Path(out)
    res = run_pipeline(ImageInput(rgb, mask), settings, out.parent, on_event=on_event,
                       cache_dir=cache_dir, name=out.stem)
    if res.glb_path != out:   # an output without the .glb suffix
        shutil.move(res.glb_path, out)
    return {"timings": res.timings, "stats": res.stats, "ply": res.ply_path}
