"""The bake tab's fitted camera: the picture the worker draws as soon as it has fitted the
photo's camera (the model's silhouette over the photo, ``worker.jobs.bakejob.FIT_IMAGE``), shown
while the texture is still being baked, so a person sees a wrong fit at once and can cancel;
the fit's figures in words once the bake has ended; and, for the tab's "Fit the camera to
the photo" step, the figures of a fit made before baking and what the bake will do with it
(``fit_figures``)."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from app.web.state import browser_jobs as jobs

# a colour error this much lower than the runner-up's is a clear choice (errors are 0..1)
CLEAR_MARGIN = 0.01
# what the tab says when its fit is dropped
DROPPED = ("The camera fitted before was dropped: the photo, its mask or the model changed. Fit it again, "
           "or press Bake, which fits it during the bake.")


def fit_picture(ctx, session: str, job_id: str) -> Optional[str]:
    """The job's fitted-silhouette picture as a file only ``session``'s browser may fetch
    (``OwnedFiles.publish_canvas``), or None while there is none (not fitted, or not yet)."""
    from PIL import Image

    from worker.jobs.bakejob import FIT_IMAGE

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


def given_camera_summary(how: Optional[str], silhouette: Optional[Mapping[str, float]]) -> str:
    """The silhouette's figures for a camera that was given (a camera file, a focal length),
    as ``fit_summary`` says them for a fitted one: "" without them."""
    if how not in ("file", "focal") or not silhouette:
        return ""
    given = "the camera file given" if how == "file" else "the focal length given"
    return (f"Camera from {given}: silhouette IoU {silhouette.get('iou', 0):.2f}, "
            f"{100 * silhouette.get('inside', 0):.0f} % of it inside the mask, covering "
            f"{100 * silhouette.get('coverage', 0):.0f} % of the mask")


def projects_photo(iou: float, min_iou: float) -> bool:
    """Whether a bake projects the photo from a fitted camera of this IoU (``bake.fit_min_iou``)."""
    return iou >= min_iou


def fit_figures(report, min_iou: float) -> str:
    """A fit made before baking (a ``kiln.records.CameraFitReport``) as the bake tab says it:
    its figures (IoU, coverage, the time), the tie-break's result, and what pressing Bake will
    do with it: use it as it is, or skip the photo and say why when its IoU is below ``min_iou``."""
    case = ("the mesh was in the camera frame: focal length, centre and a small correction fitted"
            if report.case == "posed" else "the model had no pose: a search over the views round it, then refined")
    lines = [f"- Camera fitted to the mask in {report.seconds:.1f} s: silhouette IoU **{report.iou:.2f}**, covering "
             f"{100 * report.coverage:.0f} % of the mask ({100 * report.inside:.0f} % of the silhouette inside it).",
             f"- How: {case}.", f"- Tie-break: {tie_line(report.tie_break)}."]
    if projects_photo(report.iou, min_iou):
        lines.append(f"- **Bake will use this camera** as it is (no refit): the photo's pixels go on the texels it "
                     f"sees (silhouette IoU {report.iou:.2f}, at least {min_iou:.2f} needed, bake.fit_min_iou).")
    else:
        lines.append(f"- **Photo projection will be skipped**: the silhouette IoU {report.iou:.2f} is below "
                     f"{min_iou:.2f} (bake.fit_min_iou), so the model's outline does not match the mask well enough "
                     "for the photo's pixels to land on the right texels. Bake still uses this camera (no refit) "
                     "and colours the model from its splat and its own colours; check the photo, the mask and "
                     "the model, or give the camera instead.")
    return "\n".join(lines)


def tie_line(tie) -> str:
    """The tie-break's result (``CameraFitReport.tie_break``) in words."""
    if not tie:
        return "none needed (the mesh was placed in the camera frame: no views to choose between)"
    sil = tie.get("silhouette") or {}
    decided = str(tie.get("decided_by", ""))
    if decided == "photo":
        err = tie.get("photo_error") or {}
        line = (f"{tie.get('tied')} views fit the silhouette alike; the photo's colours chose one (colour error "
                f"{err.get('chosen', 0):.3f} against {err.get('runner_up', 0):.3f}, the other view "
                f"{tie.get('runner_up_turn_deg', 0):.0f}° round)")
        if tie.get("photo_margin", 0) < CLEAR_MARGIN:
            line += ": they look alike in colour too, so the model may look the same from those sides"
        return line
    if decided.startswith("silhouette (no colours"):
        return f"{tie.get('tied')} views fit the silhouette alike and the model has no colours to tell them apart"
    if sil.get("runner_up") is None:
        return "none needed (one view fits)"
    return (f"none needed: the silhouette alone decided (score {sil.get('chosen', 0):.3f} against "
            f"{sil.get('runner_up', 0):.3f} for the next view, {tie.get('runner_up_turn_deg', 0):.0f}° round)")


def stored_fit_note(report) -> str:
    """What a Bake that uses the tab's fit (a ``kiln.records.CameraFitReport``) says first."""
    return (f"Baking with the camera fitted before (silhouette IoU {report.iou:.2f}, covering "
            f"{100 * report.coverage:.0f} % of the mask): it is used as it is, not fitted again.")
