"""The bake tab's fitted camera: the picture the worker draws as soon as it has fitted the
photo's camera (the model's silhouette over the photo, ``worker.bakejob.FIT_IMAGE``), shown
while the texture is still being baked, so a person sees a wrong fit at once and can cancel;
and the fit's figures in words once the bake has ended."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from app.web import jobs

# a colour error this much lower than the runner-up's is a clear choice (errors are 0..1)
CLEAR_MARGIN = 0.01


def fit_picture(ctx, session: str, job_id: str) -> Optional[str]:
    """The job's fitted-silhouette picture as a file only ``session``'s browser may fetch
    (``OwnedFiles.publish_canvas``), or None while there is none (not fitted, or not yet)."""
    from PIL import Image

    from worker.bakejob import FIT_IMAGE

    path = jobs.job_output(ctx, job_id, FIT_IMAGE)
    if path is None or not path.is_file():
        return None
    try:
        with Image.open(path) as img:
            pixels = np.asarray(img.convert("RGB"))
    except OSError:      # written atomically, so only a file that went away
        return None
    return ctx.owned.publish_canvas(session, pixels)


def fit_summary(fit: Optional[Mapping[str, Any]]) -> str:
    """The fit's report (``CameraFit.report`` less the camera) as one line for the notes."""
    if not fit:
        return ""
    line = (f"Camera fitted to the mask in {fit.get('fit_seconds', 0):.1f} s: silhouette IoU "
            f"{fit.get('silhouette_iou', 0):.2f}, covering {100 * fit.get('silhouette_coverage', 0):.0f} % "
            f"of the mask")
    tie = fit.get("tie_break") or {}
    if tie.get("decided_by") == "photo":
        err = tie.get("photo_error", {})
        errors = f"colour error {err.get('chosen', 0):.3f} against {err.get('runner_up', 0):.3f}"
        if tie.get("photo_margin", 0) < CLEAR_MARGIN:
            line += (f"; {tie.get('tied')} views fit the silhouette alike and look alike in colour too "
                     f"({errors}): the model may look the same from those sides")
        else:
            line += f"; of {tie.get('tied')} views whose silhouettes tie, the photo's colours chose one ({errors})"
    elif tie.get("decided_by", "").startswith("silhouette (no colours"):
        line += f"; {tie.get('tied')} views fit the silhouette alike and the model has no colours to tell them apart"
    return line
