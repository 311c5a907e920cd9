"""``/bake``: texture a model the script already has (``kiln bake`` over HTTP), documented in
docs/api.md. The files are checked as ``kiln bake`` checks them (``worker.jobs.bakeinputs``) before
a job is queued; the job then runs on the same workers, with the same guarantees, and its
GLB is published to this client alone, like ``/generate``'s, with the picture of its fitted
camera when it fitted one (``BakeAnswer``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional

import gradio as gr

from app.web.state import history
from app.web.state import browser_jobs as jobs
from app.web.server import usertext
from app.web.api.photo import JobAnswer, stream_job
from app.web.bake.bake_form import bake_request, listed_objects, listed_photos
from app.web.server.context import AppContext
from app.web.server.requestinfo import Caller, refusal

class BakeAnswer(NamedTuple):
    """What /bake yields: /generate's answer (``JobAnswer``: status, glb, ply, files) and, once
    done, the picture of the fitted camera (the model's silhouette over the photo, PNG) when
    the bake fitted its camera or was given one fitted before, and for a scene the picture of
    its placed objects (each silhouette and mask in a colour of its own over the photo), fitted
    camera or not; None otherwise. Its status then
    has the fit's figures (``camera_fit``)."""

    info: dict
    glb: Optional[str] = None
    ply: Optional[str] = None
    files: Optional[list[str]] = None
    camera_fit: Optional[str] = None


def bake(ctx: AppContext, caller: Caller, mesh: str, splat: Optional[str] = None, image: Optional[str] = None,
         mask: Optional[str] = None, camera: Optional[str] = None, focal: Optional[float] = None,
         principal: Optional[list] = None, camera_frame: Optional[str] = None, fit_camera: Optional[bool] = None,
         source: Optional[str] = None, uvs: Optional[str] = None, session_image: Optional[bool] = None,
         simplify_ratio: Optional[float] = None, texture_size: Any = None, views: Optional[int] = None,
         bake_mode: Optional[str] = None, seed: Optional[int] = None, formats: Any = None,
         texture_format: Optional[str] = None, units: Optional[str] = None, camera_fitted: Optional[bool] = None,
         faces: Optional[int] = None, more_images: Any = None, more_masks: Any = None, more_cameras: Any = None,
         scene: Optional[bool] = None, more_meshes: Any = None, more_splats: Any = None,
         more_object_masks: Any = None, progress=gr.Progress()) -> Iterator[BakeAnswer]:
    """Bake a textured GLB from a mesh the script has (GLB/glTF, OBJ, PLY, STL), with its splat
    (3DGS PLY), its photo (image + mask, or the session's image and selection with
    session_image) and the photo's camera (camera: a source_camera JSON, or focal [+
    principal] with camera_frame; none: fitted to the mask). source: the splat's tool (auto,
    kiln, inria, sam3d, trellis); uvs: auto, keep or new. formats, texture_format, units: the
    files to write besides the GLB, as /generate takes them. camera_fitted: camera is the
    camera file /fit_camera answered: used as fitted, not fitted again, the photo gated by the
    fit's IoU (bake.fit_min_iou). faces: simplify to an exact face count (within 2 %) instead
    of simplify_ratio. more_images, more_masks, more_cameras: photos after the first (lists, the
    n-th mask and camera belonging to the n-th image; a missing or null mask: the image's
    transparency, camera: fitted). scene: several objects of the one photo baked into one GLB
    with a node per object (``kiln bake --scene``): mesh, splat and mask are the first object,
    more_meshes, more_splats, more_object_masks the others (lists, the n-th splat and mask
    belonging to the n-th mesh; every object needs its mask). Yields (status, glb, ply, files, camera_fit) as the job
    changes; the last has the GLB and the other formats, and the fitted camera's picture
    when the camera was fitted (a scene's picture of its placed objects always). Bad files are refused before a job is queued."""
    session = caller.session
    values = dict(simplify_ratio=simplify_ratio, texture_size=texture_size, views=views,
                  bake_mode=bake_mode, seed=seed, formats=formats, texture_format=texture_format, units=units,
                  faces=faces)
    if ctx.sup_error:
        raise refusal(usertext.public_text(ctx.sup_error))
    try:
        checked, settings = bake_request(ctx, session, mesh, splat, image, mask, camera, focal, principal,
                                         camera_frame, fit_camera, source, uvs, session_image, values,
                                         camera_fitted=camera_fitted,
                                         more_photos=listed_photos(more_images, more_masks, more_cameras),
                                         scene=bool(scene),
                                         objects=listed_objects(more_meshes, more_splats, more_object_masks))
    except usertext.UIError as e:
        raise refusal(usertext.public_text(str(e))) from None
    if not ctx.active.press(session):
        raise refusal("this session already has a job running; wait for it or call /cancel")
    try:
        info = history.JobInfo(checked.request.names.get("mesh", "model"))
        steps = jobs.follow_bake(ctx, session, checked, settings, info=info)
        for answer in stream_job(ctx, session, steps, progress):
            yield BakeAnswer(*answer, camera_fit=_picture(ctx, session, answer))
    finally:
        ctx.active.end_pending(session)


def _picture(ctx: AppContext, session: str, answer: JobAnswer) -> Optional[str]:
    """A done bake's fitted-camera picture, named after its GLB ('<mesh>-<n>.camera_fit.png')."""
    from app.web.api.fit import published_fit

    if answer.glb is None:
        return None
    st = next((j for j in jobs.browser_jobs(ctx, session) if j.id == answer.info["job"]), None)
    if st is None:
        return None
    # a scene draws its placed objects over the photo whether its camera was fitted or given
    scene = st.stats is not None and st.stats.pipeline is not None and bool(st.stats.pipeline.scene)
    if "camera_fit" not in answer.info and not scene:
        return None
    return published_fit(ctx, session, st, Path(answer.glb).stem)[1]

