"""The script endpoints as data: the hidden components they read and write (``ApiSlots``),
one ``Endpoint`` row per endpoint (name, handler, parameters, answers, queue), and
``register``, which adds them to the page's Blocks. The handlers live in ``app.web.api.photo``,
``app.web.api.bake`` and ``app.web.api.fit``; docs/api.md describes each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr
from gradio.components.api_component import Api

from kiln.bakerequest import CAMERA_FRAMES, SOURCES, UV_MODES
from kiln.settings import Settings, allowed_values

from app.web.api.photo import JobAnswer, cancel, generate, result, select, status, upload_image
from app.web.api.bake import BakeAnswer, bake
from app.web.api.fit import FitAnswer, fit_camera
from app.web.server.context import AppContext
from app.web.server.requestinfo import event_fn


@dataclass(frozen=True, eq=False)
class ApiSlots:
    """The hidden components the endpoints read and write: what a script sends and gets.
    ``settings``: /generate's settings, in its order, and ``generate_mask`` its mask ("auto");
    ``bake_options``: /bake's after its files (``app.web.api.bake.BAKE_PARAMS``);
    ``export_options``: the files both write (formats, texture_format, units), after them;
    ``camera_fitted``: /bake's last (added after the others, so positions stay);
    ``fit_options``: /fit_camera's after its files; ``camera_fit``: the fitted camera's
    picture that /bake and /fit_camera answer (/fit_camera answers the camera in ``camera``)."""

    image: gr.File
    mask: gr.File
    use_alpha: Api
    points: Api
    box: Api
    settings: tuple
    generate_mask: Api
    job: Api
    info: Api
    glb: gr.File
    ply: gr.File
    files: gr.File
    mesh: gr.File
    splat: gr.File
    camera: gr.File
    bake_options: tuple
    export_options: tuple
    faces: Any
    more_photos: tuple
    more_fit_photos: tuple
    camera_fitted: Api
    fit_options: tuple
    camera_fit: gr.File
    scene_objects: tuple = ()


def _json_slot(value: Any, schema: dict, label: str) -> Api:
    # a value handed over as sent: kiln.settings checks it and names the setting, where
    # a typed component would coerce or refuse it in its own words first
    return Api(value, schema, label)


def api_slots(s: Settings) -> ApiSlots:
    """Make the endpoints' components (inside a Blocks context); defaults from ``s``."""
    return ApiSlots(
        image=gr.File(label="image", file_types=["image"], type="filepath"),
        mask=gr.File(label="mask", file_types=["image"], type="filepath"),
        use_alpha=_json_slot(True, {"type": "boolean"}, "use_alpha"),
        points=_json_slot([], {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}, "points"),
        box=_json_slot(None, {"type": "array", "items": {"type": "number"}}, "box"),
        settings=(
            _json_slot(s.bake.enabled, {"type": "boolean"}, "bake"),
            _json_slot(s.mesh.simplify_ratio, {"type": "number"}, "simplify_ratio"),
            _json_slot(s.bake.texture_size, {"type": "string", "description": "a power of two or auto"},
                       "texture_size"),
            _json_slot(s.views.count, {"type": "integer"}, "views"),
            _json_slot(s.bake.mode, {"type": "string", "enum": ["fast", "opt"]}, "bake_mode"),
            _json_slot(s.seed, {"type": "integer"}, "seed"),
            _json_slot(s.export.gaussians_ply, {"type": "boolean"}, "gaussians_ply"),
        ),
        generate_mask=_json_slot(None, {"type": "string", "enum": ["auto"], "description":
                                        "auto: find the object automatically instead of the session's mask"},
                                 "mask"),
        job=_json_slot(None, {"type": "string"}, "job"),
        info=_json_slot(None, {"type": "object"}, "info"),
        glb=gr.File(label="glb"),
        ply=gr.File(label="ply"),
        files=gr.File(label="files", file_count="multiple"),
        mesh=gr.File(label="mesh", type="filepath"),
        splat=gr.File(label="splat", type="filepath"),
        camera=gr.File(label="camera", type="filepath"),
        bake_options=(
            _json_slot(None, {"type": "number", "description": "focal length in pixels"}, "focal"),
            _json_slot(None, {"type": "array", "items": {"type": "number"}}, "principal"),
            _json_slot("opengl", {"type": "string", "enum": list(CAMERA_FRAMES)}, "camera_frame"),
            _json_slot(False, {"type": "boolean"}, "fit_camera"),
            _json_slot("auto", {"type": "string", "enum": list(SOURCES)}, "source"),
            _json_slot("auto", {"type": "string", "enum": list(UV_MODES)}, "uvs"),
            _json_slot(False, {"type": "boolean"}, "session_image"),
            _json_slot(None, {"type": "number"}, "simplify_ratio"),
            _json_slot(None, {"type": "string", "description": "a power of two"}, "texture_size"),
            _json_slot(None, {"type": "integer"}, "views"),
            _json_slot(None, {"type": "string", "enum": ["fast", "opt"]}, "bake_mode"),
            _json_slot(None, {"type": "integer"}, "seed"),
        ),
        export_options=(
            _json_slot(None, {"type": "array", "items": {"type": "string",
                                                         "enum": list(allowed_values("export.formats"))},
                              "description": "files besides the GLB, e.g. [\"obj\", \"stl\"]"}, "formats"),
            _json_slot(None, {"type": "string", "enum": list(allowed_values("export.texture_format"))},
                       "texture_format"),
            _json_slot(None, {"type": "string", "enum": list(allowed_values("export.units"))}, "units"),
        ),
        camera_fitted=_json_slot(False, {"type": "boolean", "description":
                                         "camera is a /fit_camera answer: used as fitted, not fitted again"},
                                 "camera_fitted"),
        fit_options=(
            _json_slot("auto", {"type": "string", "enum": list(SOURCES)}, "source"),
            _json_slot(False, {"type": "boolean"}, "session_image"),
        ),
        camera_fit=gr.File(label="camera_fit"),
        more_photos=(gr.File(label="more_images", file_count="multiple", type="filepath"),
                     gr.File(label="more_masks", file_count="multiple", type="filepath"),
                     gr.File(label="more_cameras", file_count="multiple", type="filepath")),
        more_fit_photos=(gr.File(label="more_images", file_count="multiple", type="filepath"),
                         gr.File(label="more_masks", file_count="multiple", type="filepath")),
        faces=_json_slot(None, {"type": "integer", "description": "an exact face count instead of the "
                                "simplify ratio (within 2 %; refused above the mesh's own)"}, "faces"),
        scene_objects=(_json_slot(False, {"type": "boolean", "description": "several objects of one photo: "
                                          "one GLB with a node per object"}, "scene"),
                       gr.File(label="more_meshes", file_count="multiple", type="filepath"),
                       gr.File(label="more_splats", file_count="multiple", type="filepath"),
                       gr.File(label="more_object_masks", file_count="multiple", type="filepath")),
    )


@dataclass(frozen=True)
class Endpoint:
    """One script endpoint: its name ("/generate" to gradio_client), its handler, the
    ``ApiSlots`` it reads (in the handler's parameter order) and writes, and how it queues:
    "api" in Gradio's queue four at a time, "job" waiting on its job (the supervisor's
    queue bounds the jobs, not a slot), "now" at once without the queue."""

    name: str
    handler: Callable
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    queue: str = "api"


ENDPOINT_TABLE = (
    Endpoint("upload_image", upload_image, ("image", "mask", "use_alpha"), ("info",)),
    Endpoint("select", select, ("points", "box"), ("info",)),
    Endpoint("generate", generate, ("settings", "generate_mask", "export_options", "faces"), JobAnswer._fields,
             queue="job"),
    Endpoint("bake", bake, ("mesh", "splat", "image", "mask", "camera", "bake_options", "export_options",
                            "camera_fitted", "faces", "more_photos", "scene_objects"), BakeAnswer._fields,
             queue="job"),
    Endpoint("fit_camera", fit_camera, ("mesh", "splat", "image", "mask", "fit_options", "more_fit_photos"),
             FitAnswer._fields,
             queue="job"),
    Endpoint("status", status, (), ("info",), queue="now"),
    Endpoint("result", result, ("job",), JobAnswer._fields),
    Endpoint("cancel", cancel, (), ("info",), queue="now"),
)
# the endpoints, as gradio_client names them ("/generate")
ENDPOINTS = tuple(e.name for e in ENDPOINT_TABLE)


def _components(slots: ApiSlots, names: tuple[str, ...]) -> list:
    out = []
    for name in names:
        value = getattr(slots, name)
        out += list(value) if isinstance(value, tuple) else [value]
    return out


def queue_options(ctx: AppContext, queue: str) -> dict:
    if queue == "now":
        return {"queue": False}
    if queue == "job":
        return {"concurrency_id": "api-generate", "concurrency_limit": ctx.workers + ctx.settings.worker.max_queue}
    return {"concurrency_id": "api", "concurrency_limit": 4}


def register(demo: gr.Blocks, ctx: AppContext) -> None:
    """Add the script endpoints (``ENDPOINT_TABLE``) to ``demo``, after the page's events are
    defined, and hide the page's own events from the API listing."""
    page_fns = list(demo.fns.values())
    with demo:
        with gr.Column(visible=False):
            slots = api_slots(ctx.settings)
            trigger = gr.Button("api", visible=False)
            for ep in ENDPOINT_TABLE:
                trigger.click(event_fn(ep.handler, ctx), _components(slots, ep.inputs) or None,
                              _components(slots, ep.outputs), api_name=ep.name, **queue_options(ctx, ep.queue))
    for fn in page_fns:
        fn.api_visibility = "private"
