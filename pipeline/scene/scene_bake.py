"""Bake a scene: several objects from one photo, one camera, one GLB with a node per object.

Stages: "place" (each object kept where its pose fits the camera, else fitted under it with
the intrinsics held: ``placement``), "occlusion" (each object's depth from the camera, and the
photo's pixels it may take: ``occlusion``), "objects": each object's own bake
(``pipeline.texture.model_bake``: render_views, mesh, uv, bake, export, reported as shares of
this one stage) with its photo mask less what the others hide, and "join" (the objects' GLBs as
one, ``pipeline.io.scene_glb``); ``kiln.stages.SCENE_STEPS`` names them for the job's progress.
Everything is in the photo camera's frame (OpenGL axes, the camera at the origin).

The other formats a bake can write (``export.formats``: OBJ, STL, PLY) come one per object,
``<name>.<object>.<ext>``, in the same frame: the formats have no named nodes to hold several
objects apart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from kiln.formats import object_key
from kiln.records import OutputFile, SceneObjectStats
from kiln.settings import Settings
from kiln.stages import MODEL_STAGES

from pipeline.texture.model_bake import EventFn, ModelBakeResult, ModelInputs
from pipeline.types import ImageInput, Mesh, SourceCamera
from pipeline.validate import StageInputError

if TYPE_CHECKING:
    from pipeline.backends import Backends
    from pipeline.raster.rasterize import RasterContext
    from pipeline.scene.placement import Placement
    from pipeline.texture.model_bake import SilhouetteFit


@dataclass(frozen=True)
class SceneObject:
    """name: the object's node name (its mesh file's name without the extension); inputs: its
    files read (``ModelInputs``: mesh, splat in the mesh's frame, photo = the scene's photo with
    this object's own mask; its camera is ignored: the scene's is used)."""

    name: str
    inputs: ModelInputs


@dataclass(frozen=True)
class SceneInputs:
    """objects: two or more (or one) objects of one photo; camera: the photo's camera in the
    objects' files' frame (each file read as placed in it); camera_fitted_to: the index of the
    object the camera was fitted to when none was given (its fit in its ``inputs.camera_fit``),
    else None."""

    objects: tuple[SceneObject, ...]
    camera: SourceCamera
    camera_fitted_to: Optional[int] = None

    def check(self) -> None:
        """Refuse what cannot make a scene, before any work: no objects, names twice, photos or
        masks of different sizes, or not the camera's size."""
        if not self.objects:
            raise StageInputError("a scene needs at least one object")
        names = [o.name for o in self.objects]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise StageInputError(f"two objects are named {', '.join(twice)}: the scene's nodes need distinct names")
        size = (self.camera.height, self.camera.width)
        for o in self.objects:
            photo = o.inputs.photo
            if photo is None:
                raise StageInputError(f"object {o.name} has no photo and mask")
            if photo.mask.shape != size or photo.rgb.shape[:2] != size:
                raise StageInputError(f"object {o.name}'s mask is {photo.mask.shape[1]}x{photo.mask.shape[0]}, "
                                      f"the camera's photo {size[1]}x{size[0]}: every mask must be the photo's size")
        first = self.objects[0].inputs.photo
        assert first is not None
        if any(o.inputs.photo is not None and not np.shares_memory(o.inputs.photo.rgb, first.rgb)
               and not np.array_equal(o.inputs.photo.rgb, first.rgb) for o in self.objects[1:]):
            raise StageInputError("the objects of a scene come from one photo")


@dataclass(frozen=True)
class PlacedScene:
    """A scene's objects placed: camera: the photo's camera in its own frame (where everything
    now is); placements: how each object was placed; meshes: each object's mesh moved there;
    masks: each object's whole mask, in the objects' order."""

    camera: SourceCamera
    placements: tuple["Placement", ...]
    meshes: tuple[Mesh, ...]
    masks: tuple[np.ndarray, ...]


def place_scene(scene: SceneInputs, settings: Settings, raster_ctx: "RasterContext",
                emit: EventFn) -> PlacedScene:
    """Stage "place": each object kept where its pose fits the camera, else fitted under it."""
    from pipeline.scene.placement import in_camera_frame, moved_mesh, place

    emit("place", 0.0, "placing the objects under the photo's camera")
    placements: list["Placement"] = []
    masks = []
    for i, o in enumerate(scene.objects):
        photo = o.inputs.photo
        assert photo is not None
        fitted = o.inputs.camera_fit if i == scene.camera_fitted_to else None
        placements.append(place(raster_ctx, o.inputs.model.mesh, photo.mask, scene.camera,
                                settings.bake.photo_min_inside, settings.bake.fit_min_iou, fitted_to_it=fitted))
        masks.append(photo.mask)
        emit("place", (i + 1) / len(scene.objects), f"{o.name}: {placements[-1].how}")
    camera, _ = in_camera_frame(scene.camera)
    meshes = tuple(moved_mesh(o.inputs.model.mesh, p.transform) for o, p in zip(scene.objects, placements))
    return PlacedScene(camera=camera, placements=tuple(placements), meshes=meshes, masks=tuple(masks))


def bake_scene(scene: SceneInputs, settings: Settings, backends: "Backends", out_dir: Path,
               raster_ctx: "RasterContext", on_event: Optional[EventFn] = None,
               name: str = "scene", on_placed: Optional[Callable[[PlacedScene], None]] = None) -> ModelBakeResult:
    """Bake every object of ``scene`` and join them into ``<out_dir>/<name>.glb``; each object's
    own files are ``<out_dir>/<name>.<object>.*``. ``stats.scene`` gives each object's placement,
    occlusion and bake; the stats' other figures are the first object's. ``on_placed``: called
    once every object is placed, before anything is baked (a front end draws the fit then)."""
    from pipeline.io.scene_glb import join_scene
    from pipeline.scene.occlusion import depth_maps, visible_masks
    from pipeline.texture.model_bake import bake_model, silhouette_fit

    scene.check()
    emit: EventFn = on_event or (lambda *a: None)
    timings: dict[str, float] = {}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    placed = place_scene(scene, settings, raster_ctx, emit)
    timings["place"] = time.perf_counter() - t0
    if on_placed is not None:
        on_placed(placed)
    camera, placements, meshes, masks = placed.camera, placed.placements, placed.meshes, list(placed.masks)
    t0 = time.perf_counter()
    emit("occlusion", 0.0, "the depth test across the objects")
    seen = visible_masks(depth_maps(raster_ctx, meshes, camera), masks)
    timings["occlusion"] = time.perf_counter() - t0
    emit("occlusion", 1.0, "hidden pixels per object: " + ", ".join(
        f"{o.name} {n}" for o, n in zip(scene.objects, seen.hidden_px)))
    # placing gated each object against its whole mask (kept: its silhouette inside it by
    # photo_min_inside and IoU fit_min_iou; fitted: by the fit's IoU, as the bake gates a fit); the
    # bake's own gate would measure against the mask less what the others hide and edge bands
    own = settings.override({"bake.photo_min_inside": 0.0})
    results: list[ModelBakeResult] = []
    for i, (o, p, mesh) in enumerate(zip(scene.objects, placements, meshes)):
        inputs = _placed_inputs(o.inputs, p, mesh, camera, seen.masks[i])
        res = bake_model(inputs, own, backends, out, raster_ctx, name=f"{name}.{o.name}",
                         on_event=_named(emit, o.name, i, len(scene.objects)))
        for k, v in res.timings.items():
            timings[k] = timings.get(k, 0.0) + v
        results.append(res)
    t0 = time.perf_counter()
    emit("join", 0.0, "one GLB, a node per object")
    glb = join_scene([(o.name, r.glb_path) for o, r in zip(scene.objects, results)], out / f"{name}.glb")
    timings["join"] = time.perf_counter() - t0
    emit("join", 1.0, f"{len(results)} objects")
    sils = [silhouette_fit(raster_ctx, m, camera, mask) for m, mask in zip(meshes, masks)]
    objects = tuple(_object_stats(o.name, p, r, seen.hidden_px[i], seen.edge_px[i], sils[i])
                    for i, (o, p, r) in enumerate(zip(scene.objects, placements, results)))
    first = results[0].stats
    stats = replace(first, faces=sum(r.stats.faces for r in results), vertices=sum(r.stats.vertices for r in results),
                    glb_bytes=glb.stat().st_size, source_camera=camera.to_dict(), scene=objects,
                    files=_scene_files(glb, scene.objects, results))
    extra = {object_key(key, o.name): path for o, r in zip(scene.objects, results) for key, path in r.extra.items()}
    return ModelBakeResult(glb_path=glb, timings=timings, stats=stats, extra=extra)


def _scene_files(glb: Path, objects: Sequence[SceneObject], results: Sequence[ModelBakeResult]
                 ) -> tuple[OutputFile, ...]:
    """``stats.files`` of a scene: the joined GLB first (the objects' vertices and faces
    together), then each object's other formats under its key (``object_key``), as ``extra``
    names them; not the objects' own GLBs, which the scene's GLB holds."""
    own = [r.stats.files[0] for r in results if r.stats.files]
    formats = {f.texture_format for f in own}
    joined = OutputFile(key="glb", name=glb.name, bytes=glb.stat().st_size, vertices=sum(f.vertices for f in own),
                        faces=sum(f.faces for f in own), texture_format=formats.pop() if len(formats) == 1 else None,
                        up="y")
    return (joined,) + tuple(replace(f, key=object_key(f.key, o.name))
                             for o, r in zip(objects, results) for f in r.stats.files[1:])


def _named(emit: EventFn, who: str, i: int, n: int) -> EventFn:
    """``emit`` for the bake of object ``i`` of ``n``: its own stages (``MODEL_STAGES``) as
    shares of the scene's one stage "objects" (``kiln.stages.SCENE_STEPS``: a job's progress
    is stage by stage, and the objects run the same stages one after the other), each message
    naming the object and its stage."""
    def named(stage: str, fraction: float, message: str) -> None:
        step = MODEL_STAGES.index(stage) if stage in MODEL_STAGES else 0
        share = (step + min(max(float(fraction), 0.0), 1.0)) / len(MODEL_STAGES)
        emit("objects", (i + share) / n, f"{who}, {stage.replace('_', ' ')}: {message}")

    return named


def _placed_inputs(inputs: ModelInputs, p: "Placement", mesh, camera: SourceCamera, mask: np.ndarray) -> ModelInputs:
    """One object's bake inputs in the scene's frame: its moved mesh and splat, the scene's
    camera, the photo with its own mask less what the others hide."""
    from pipeline.scene.placement import moved_splat

    photo = inputs.photo
    assert photo is not None
    fit = None if p.fit is None else replace(p.fit, camera=camera)
    how = "fitted" if p.how != "kept" else (inputs.camera_how or "file")
    return replace(inputs, model=replace(inputs.model, mesh=mesh),
                   splat=None if inputs.splat is None else moved_splat(inputs.splat, p.transform, p.scale),
                   photo=ImageInput(photo.rgb, mask), camera=camera, camera_fit=fit, camera_how=how,
                   more_photos=())


def _object_stats(name: str, p: "Placement", r: ModelBakeResult, hidden: int, edge: int,
                  sil: "SilhouetteFit") -> SceneObjectStats:
    """``sil``: the placed model (as the file has it, not simplified) against its whole mask."""
    bake = r.stats.bake
    return SceneObjectStats(name=name, placement=p.report(), hidden_px=hidden, edge_px=edge,
                            faces=r.stats.faces, texels_from=dict(bake.texels_from) if bake is not None else {},
                            silhouette={"inside": round(sil.inside, 4), "coverage": round(sil.coverage, 4),
                                        "iou": round(sil.iou, 4)},
                            warnings=r.stats.warnings, glb=r.glb_path.name)
