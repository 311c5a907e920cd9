"""A scene bake job over its folder (``kiln bake --scene``): every object's files read (stage
"read"), the camera fitted to the first object when none was given, then the scene baked
(``pipeline.scene.scene_bake``): each object placed under the photo's camera, a depth test
across them, one GLB with a node per object."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

OnEvent = Callable[[str, float, str], None]   # (stage, fraction of that stage, message), as bakejob's

if TYPE_CHECKING:
    from kiln.records import Backends
    from kiln.settings import Settings
    from pipeline.raster.rasterize import RasterContext
    from pipeline.texture.model_bake import ModelBakeResult

# a mask copied into the job was checked against the person's own limit before the job; this
# only stops a file swapped in the folder since from decoding without bound
MAX_MASK_PIXELS = 400_000_000


def scene_folder(job_dir: Path, settings: "Settings", backends: "Backends", raster_ctx: "RasterContext",
                 on_event: OnEvent, out_dir: Path, name: str = "model",
                 picture: str = "camera_fit.png") -> "ModelBakeResult":
    """Bake the scene job in ``job_dir`` into ``<out_dir>/<name>.glb`` (and each object's own
    files beside it, ``<name>.<object>.*``); ``<out_dir>/<picture>`` shows every object placed
    over the photo (``pipeline.scene.scene_picture``) as soon as they are, before the bake."""
    from kiln.maskfile import load_mask
    from pipeline.scene.scene_bake import SceneInputs, SceneObject, bake_scene
    from pipeline.texture.model_inputs import place_model, read_model
    from pipeline.types import ImageInput
    from pipeline.validate import StageInputError

    from worker.jobs.jobstore import load_inputs, load_request

    on_event("read", 0.0, "reading the files")
    t0 = time.perf_counter()
    req = load_request(job_dir)
    folder = Path(job_dir) / "inputs"
    rgb, mask = load_inputs(job_dir)
    first = place_model(read_model(req, folder, ImageInput(rgb, mask)), req, raster_ctx, backends,
                        progress=lambda f, m: on_event("read", 0.5 * f, m))
    if first.camera is None:
        raise StageInputError("the scene's photo has no camera and none could be fitted")
    objects = [SceneObject(name=req.names.get("node", "object"), inputs=first)]
    for n, o in enumerate(req.objects, start=2):
        on_event("read", 0.5 + 0.5 * (n - 1) / (len(req.objects) + 1), f"object {n}: {o.names.get('node', '')}")
        own = ImageInput(rgb, load_mask(folder / o.mask, max_pixels=MAX_MASK_PIXELS).mask)
        sub = replace(req, mesh=o.mesh, splat=o.splat, source=o.source, uvs=o.uvs, camera=None, focal=None,
                      fit_camera=False, camera_fitted=False, more_photos=(), objects=(), scene=False,
                      names=dict(o.names))
        read = replace(read_model(sub, folder, own), camera=first.camera, camera_how=first.camera_how)
        objects.append(SceneObject(name=o.names.get("node", f"object-{n}"),
                                   inputs=place_model(read, sub, raster_ctx, backends)))
    # a camera fitted to the first object (now, or by a fit job before: the page's fit step)
    # holds that object as fitted; its IoU gates its photo, not the share inside its mask
    fitted_to = 0 if first.camera_how in ("fitted", "fitted before") and first.camera_fit is not None else None
    read_s = time.perf_counter() - t0
    on_event("read", 1.0, f"{len(objects)} objects")
    def draw(placed) -> None:   # the fit picture, before the texture is baked, as a single bake's
        from kiln.imageio import save_png
        from pipeline.scene.scene_picture import scene_picture

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        save_png(Path(out_dir) / picture, scene_picture(raster_ctx, placed.meshes, placed.masks, rgb, placed.camera))

    result = bake_scene(SceneInputs(objects=tuple(objects), camera=first.camera, camera_fitted_to=fitted_to),
                        settings, backends, out_dir, raster_ctx, on_event=on_event, name=name, on_placed=draw)
    result.timings = {"read": read_s, **result.timings}
    return result
