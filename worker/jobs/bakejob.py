"""A bake job's stages over its folder: the request's files read and placed (stage "read"),
then textured (``pipeline.texture.model_bake``). The worker runs it on a job's ``inputs/``;
``kiln bake --in-process`` on a folder laid out the same way. A fit job (``fit_folder``)
reads the same folder and only fits the photo's camera (stages "read", "fit")."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import numpy as np

    from kiln.records import Backends, CameraFitReport
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
# a fit job's outputs by key (``JobStatus.outputs``): the camera and its picture
FIT_OUTPUTS = {"camera": FIT_CAMERA, "camera_fit": FIT_IMAGE}


@dataclass(frozen=True)
class FitResult:
    """What a fit job made: ``report`` (the camera and its figures), written as ``camera``
    (``FIT_CAMERA``) and drawn as ``picture`` (``FIT_IMAGE``); ``timings``: stage -> seconds."""

    report: "CameraFitReport"
    camera: Path
    picture: Path
    timings: dict[str, float]


def bake_folder(job_dir: Path, settings: "Settings", backends: "Backends", raster_ctx: "RasterContext",
                on_event: OnEvent, out_dir: Path, name: str = "model") -> "ModelBakeResult":
    """Bake the job in ``job_dir`` (its ``inputs/bake.json``, the files it names, and
    ``inputs/image.png`` + ``mask.png`` when it has a photo) into ``<out_dir>/<name>.glb``."""
    from pipeline.texture.model_bake import bake_model
    from pipeline.texture.model_inputs import place_model, read_model
    from pipeline.types import ImageInput

    from worker.jobs.jobstore import load_inputs, load_request

    req = load_request(job_dir)
    if req.scene:   # several objects of one photo: one GLB with a node each
        from worker.jobs.scenejob import scene_folder

        return scene_folder(job_dir, settings, backends, raster_ctx, on_event, out_dir, name, picture=FIT_IMAGE)
    on_event("read", 0.0, "reading the files")
    t0 = time.perf_counter()
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


def fit_folder(job_dir: Path, backends: "Backends", raster_ctx: "RasterContext", on_event: OnEvent,
               out_dir: Path) -> FitResult:
    """Fit the photo's camera of the job in ``job_dir`` (laid out as a bake job, with a photo)
    and write its camera and picture into ``out_dir``; nothing is baked."""
    from kiln.records import CameraFitReport
    from pipeline.texture.model_inputs import place_model, read_model
    from pipeline.types import ImageInput
    from pipeline.validate import StageInputError

    from worker.jobs.jobstore import load_inputs, load_request

    on_event("read", 0.0, "reading the files")
    t0 = time.perf_counter()
    req = load_request(job_dir)
    if not req.photo:
        raise StageInputError("fitting the camera needs the photo and its mask")
    read = read_model(req, Path(job_dir) / "inputs", ImageInput(*load_inputs(job_dir)))
    if read.camera is not None:
        raise StageInputError("the camera is given already: a fit job fits one")
    on_event("fit", 0.0, "placing the model")
    t1 = time.perf_counter()
    inputs = place_model(read, req, raster_ctx, backends, progress=lambda f, m: on_event("fit", 0.95 * f, m))
    assert inputs.camera_fit is not None   # a photo without a camera is always fitted
    on_event("fit", 0.95, "drawing the fitted silhouette over the photo")
    _write_fit(inputs, raster_ctx, Path(out_dir))
    on_event("fit", 1.0, "fitted")
    return FitResult(report=CameraFitReport.from_dict(inputs.camera_fit.report()), camera=Path(out_dir) / FIT_CAMERA,
                     picture=Path(out_dir) / FIT_IMAGE, timings={"read": t1 - t0, "fit": time.perf_counter() - t1})


def _write_fit(inputs, raster_ctx: "RasterContext", out_dir: Path) -> None:
    """The fitted cameras and their picture: ``FIT_CAMERA`` for the first photo, ``camera.<n>.json``
    for photo n after it when it was fitted too; ``FIT_IMAGE`` shows every fitted photo's
    silhouette over that photo, side by side in the photos' order (one picture, so the page
    and the API show one thing whether one photo was given or four)."""
    import json

    from kiln.atomic import atomic_write
    from kiln.imageio import save_png
    from pipeline.camera.fit_overlay import fit_overlay

    assert inputs.camera_fit is not None and inputs.photo is not None
    out_dir.mkdir(parents=True, exist_ok=True)
    pictures = []
    for n, placed in enumerate(inputs.photos, start=1):
        fit = placed.camera_fit
        if fit is None:
            continue
        name = FIT_CAMERA if n == 1 else more_fit_camera(n)
        atomic_write(out_dir / name, json.dumps(fit.report(), indent=1).encode())
        pictures.append(fit_overlay(raster_ctx, inputs.model.mesh, placed.photo.rgb, placed.photo.mask, fit.camera))
    save_png(out_dir / FIT_IMAGE, side_by_side(pictures))


def more_fit_camera(n: int) -> str:
    """The fitted camera file of photo ``n`` (2, 3, ...) of a bake or fit job."""
    return f"camera.{n}.json"


def side_by_side(pictures: list) -> "np.ndarray":
    """(H, W, 3) uint8 pictures in one row at the first one's height, 8 white pixels apart."""
    import cv2
    import numpy as np

    h = pictures[0].shape[0]
    row = []
    for i, pic in enumerate(pictures):
        if pic.shape[0] != h:
            pic = cv2.resize(pic, (max(1, round(pic.shape[1] * h / pic.shape[0])), h), interpolation=cv2.INTER_AREA)
        if i:
            row.append(np.full((h, 8, 3), 255, np.uint8))
        row.append(pic)
    return np.concatenate(row, axis=1)


def copy_fit_files(outputs: Path, out: Path) -> list[Path]:
    """The fit's picture and camera from a job's ``outputs`` beside ``out`` (the GLB a person
    asked for) as ``<stem>.camera_fit.png`` and ``<stem>.camera.json``; the paths written
    (none when the camera was not fitted)."""
    from kiln.atomic import atomic_copy

    written = []
    more = sorted(p.name for p in Path(outputs).glob("camera.*.json"))   # photos 2, 3, ... fitted too
    for name in (FIT_IMAGE, FIT_CAMERA, *more):
        src = Path(outputs) / name
        if src.is_file():
            written.append(atomic_copy(src, Path(out).with_name(f"{Path(out).stem}.{name}")))
    return written
