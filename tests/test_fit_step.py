"""The bake tab's "Fit the camera to the photo" without a server (app/web/bake/fit_handlers.py): the
fit is checked at once and runs as a job through the supervisor's stand-in; when it is done the
tab shows the fitted silhouette over the photo and the fit's figures, and keeps the fit for the
tab, which its Bake then uses as it is (no refit); a fit below bake.fit_min_iou says photo
projection will be skipped and why; changing the photo, the mask or the model drops the fit.
Every answer is checked against the outputs the wiring declares for its handler."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

gr = pytest.importorskip("gradio", reason="the page's tests need gradio, which is not installed")

from app.web.bake import bake_handlers as baking  # noqa: E402
from app.web.bake import fit_handlers as fitting
from app.web.bake.bake_form import FitForm  # noqa: E402
from kiln.records import CameraFitReport  # noqa: E402
from test_bake_tab import A1, _ball, _is_update, answer, app, form, stream, wired  # noqa: E402,F401

__all__ = ["app", "wired"]   # the fixtures, shared with the bake tab's tests


def _photo(app, name: str = "photo.png", hole: bool = False) -> tuple[str, str]:
    rgb = np.full((120, 160, 3), 90, np.uint8)
    mask = np.zeros((120, 160), np.uint8)
    mask[30:90, 40:120] = 255
    if hole:
        mask[50:60, 60:70] = 0
    photo, m = app.tmp / name, app.tmp / f"mask-{name}"
    Image.fromarray(rgb).save(photo)
    Image.fromarray(mask).save(m)
    return str(photo), str(m)


def fit_form(mesh, splat=None, photo=None, mask=None, reuse=False, source="auto", camera=None, focal=0) -> FitForm:
    return FitForm(mesh, splat, photo, mask, reuse, source, camera, focal)


def _fit(app, values) -> dict:
    out = answer(app, fitting.on_fit, values)
    steps = stream(app, fitting.run_fit, values)
    assert steps and steps[-1] == {"progress": gr.skip()} and all(set(s) == {"progress"} for s in steps)
    return out


def _refused(app, values) -> str:
    with pytest.raises(gr.Error) as e:
        fitting.on_fit(app.page, app.ctx, A1, values)
    return e.value.message


def test_a_fit_needs_a_mesh_and_the_photo_and_no_camera_of_its_own(app):
    ball = _ball(app.tmp / "ball.ply")
    photo, mask = _photo(app)
    assert _refused(app, fit_form(None)) == "mesh: no file was given"
    assert "fitting the camera needs the photo and its mask" in _refused(app, fit_form(ball))
    assert "The photo's camera is given" in _refused(app, fit_form(ball, photo=photo, mask=mask, focal=300))
    assert "upload an image first" in _refused(app, fit_form(ball, reuse=True))
    assert app.sup.jobs() == [] and not app.ctx.active.busy(A1.session)
    out = answer(app, fitting.show_fit_refusal)
    assert 'data-state="refused"' in out["progress"] and "upload an image first" in out["progress"]


def test_a_fit_shows_its_picture_and_figures_and_the_bake_uses_it_without_refitting(app):
    from app.web.server.browser import browser_of

    ball = _ball(app.tmp / "ball.ply")
    photo, mask = _photo(app)
    out = _fit(app, fit_form(ball, photo=photo, mask=mask))
    assert "Starting…" in out["progress"] and _is_update(out["fit_view"], value=None, visible=False)
    assert _is_update(out["fit_button"], value="Fitting…", interactive=False)
    assert _is_update(out["bake_button"], interactive=False) and _is_update(out["cancel"], interactive=True)
    (job_id, checked), = app.sup.bakes.items()
    assert app.sup.statuses[job_id].kind == "fit" and checked.request.fit_camera and checked.request.camera is None
    shown = answer(app, fitting.show_fit_outcome)
    assert 'data-state="done"' in shown["progress"] and "camera fitted: press Bake" in shown["progress"]
    assert _is_update(shown["fit_view"], visible=True)
    assert app.ctx.owned.owners(shown["fit_view"]["value"]) == {browser_of(A1.session)}
    info = shown["fit_info"]
    assert "Camera fitted to the mask in 1.7 s: silhouette IoU **0.93**, covering 98 % of the mask" in info
    assert "Tie-break: none needed (the mesh was placed in the camera frame" in info
    assert "**Bake will use this camera** as it is (no refit)" in info
    assert _is_update(shown["fit_button"], interactive=True) and _is_update(shown["bake_button"], value="Bake")
    kept = app.ctx.fits.get(A1.session)
    assert kept is not None and kept.job_id == job_id and kept.report.iou == 0.93

    # Bake, even with "fit during the bake" ticked: the fitted camera, as fitted, no refit
    values = form(ball, photo=photo, mask=mask, fit=True)
    out = answer(app, baking.on_bake, values)
    assert out["notes"].startswith("- Baking with the camera fitted before (silhouette IoU 0.93")
    assert "not fitted again" in out["notes"] and "fit_view" not in out, "the fit's picture stays"
    stream(app, baking.run_bake, values)
    bake_id = [j for j in app.sup.bakes if j != job_id][-1]
    req = app.sup.bakes[bake_id].request
    assert req.camera_fitted and not req.fit_camera and req.camera == "camera.json"
    given = json.loads(Path(app.sup.bakes[bake_id].copies["camera.json"]).read_text())
    assert CameraFitReport.from_dict(given) == kept.report
    baked = answer(app, baking.show_bake_outcome)
    assert app.ctx.fits.get(A1.session) == kept, "kept for the next Bake"
    # the fit made no model: the history lists the bake alone, whose GLB is the mesh's first
    assert Path(baked["model"]).name == "ball-1.glb"
    assert baked["history"].count('<li class="kiln-job') == 1 and job_id not in baked["history"]


def test_below_the_iou_threshold_the_tab_says_the_photo_will_be_skipped_and_why(app):
    app.sup.fit_iou = 0.41
    ball = _ball(app.tmp / "ball.ply")
    photo, mask = _photo(app)
    _fit(app, fit_form(ball, photo=photo, mask=mask))
    info = answer(app, fitting.show_fit_outcome)["fit_info"]
    assert "**Photo projection will be skipped**: the silhouette IoU 0.41 is below 0.60 (bake.fit_min_iou)" in info
    assert "does not match the mask well enough" in info and "Bake will use this camera" not in info


def test_changing_the_photo_mask_or_model_drops_the_fit(app):
    ball = _ball(app.tmp / "ball.ply")
    photo, mask = _photo(app)
    _fit(app, fit_form(ball, photo=photo, mask=mask))
    answer(app, fitting.show_fit_outcome)
    out = answer(app, fitting.on_fit_inputs_changed)
    assert _is_update(out["fit_view"], value=None, visible=False) and "was dropped" in out["fit_info"]
    assert app.ctx.fits.get(A1.session) is None
    assert answer(app, fitting.on_fit_inputs_changed) == {"fit_info": gr.skip()}, "nothing more to drop"
    # a Bake now fits during the bake, as without a fit
    answer(app, baking.on_bake, form(ball, photo=photo, mask=mask))
    stream(app, baking.run_bake, form(ball, photo=photo, mask=mask))
    assert not list(app.sup.bakes.values())[-1].request.camera_fitted


def test_a_fit_for_another_mask_is_not_used_even_without_a_change_event(app):
    """The first tab's selection may change while the bake tab reuses it (no event reaches the
    bake tab): the Bake compares what the fit was made for and drops it."""
    ball = _ball(app.tmp / "ball.ply")
    photo, mask = _photo(app)
    _fit(app, fit_form(ball, photo=photo, mask=mask))
    answer(app, fitting.show_fit_outcome)
    _, other_mask = _photo(app, "photo.png", hole=True)    # same photo, the mask edited
    values = form(ball, photo=photo, mask=other_mask)
    out = answer(app, baking.on_bake, values)
    assert out["notes"].startswith("- The camera fitted before was dropped")
    assert _is_update(out["fit_view"], value=None, visible=False) and out["fit_info"] == ""
    stream(app, baking.run_bake, values)
    assert not list(app.sup.bakes.values())[-1].request.camera_fitted
    assert app.ctx.fits.get(A1.session) is None


def test_a_fit_cancelled_or_failed_keeps_no_camera(app):
    ball = _ball(app.tmp / "ball.ply")
    photo, mask = _photo(app)
    app.sup.fail_with = "stage 'fit' failed: ValueError: x"
    _fit(app, fit_form(ball, photo=photo, mask=mask))
    shown = answer(app, fitting.show_fit_outcome)
    assert 'data-state="failed"' in shown["progress"] and "fit_view" not in shown
    assert app.ctx.fits.get(A1.session) is None and _is_update(shown["fit_button"], interactive=True)


def test_every_fit_handler_is_wired(app):
    handlers = [f for name, f in vars(fitting).items() if inspect.isfunction(f) and f.__module__ == fitting.__name__
                and name.startswith(("on_", "show_", "run_"))]
    assert len(handlers) == 5
    assert [h.__name__ for h in handlers if h not in app.outputs] == []


def test_the_tie_break_is_said_in_words():
    from app.web.bake.fit_picture import tie_line

    photo = {"decided_by": "photo", "tied": 2, "photo_error": {"chosen": 0.031, "runner_up": 0.118},
             "photo_margin": 0.087, "silhouette": {"chosen": 0.97, "runner_up": 0.96}, "runner_up_turn_deg": 179.2}
    assert tie_line(photo) == ("2 views fit the silhouette alike; the photo's colours chose one (colour error "
                               "0.031 against 0.118, the other view 179° round)")
    alike = dict(photo, photo_margin=0.001)
    assert tie_line(alike).endswith("so the model may look the same from those sides")
    clear = {"decided_by": "silhouette", "tied": 1, "silhouette": {"chosen": 0.97, "runner_up": 0.71},
             "runner_up_turn_deg": 64.0}
    assert tie_line(clear) == ("none needed: the silhouette alone decided (score 0.970 against 0.710 for the next "
                               "view, 64° round)")
    assert tie_line(None).startswith("none needed (the mesh was placed in the camera frame")
