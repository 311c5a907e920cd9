"""Several objects of one photo reconstructed into one scene (the page's "Photo to 3D" tab with
more than one selection): each mask reconstructed on its own by a backend that lays objects
out (SAM 3D Objects: a pose per object in the photo camera's frame, and a point map of the whole
photo from which the intrinsics follow), each object put back where that layout says, then the
scene baked as ``kiln bake --scene`` bakes it (``pipeline.scene.scene_bake``).

Why only such a backend: the built-in reconstruction inflates a silhouette and has no depth of
its own, so the distance between two of its objects would be made up. A scene is refused here
unless every object comes back with a pose and a camera (``Reconstruction.source_camera``), and
the reason names the object that has none: no layout is invented.

Frames. ``pipeline.recon.sam3d.convert_outputs`` normalises each object (centred, longest side
1) and gives its camera as a rigid viewmat ``V`` in those units: the true camera-space point of
a normalised vertex is ``p_cv = (s / k) * V p`` (s: the pose's mean scale, k: the
normalisation's; ``meta["normalisation"]``). Every object is moved by that similarity into one
world, the photo camera's OpenCV frame in SAM 3D's own units, where the scene's camera is the
identity with the intrinsics fitted to the point map. Placing then keeps each object whose
silhouette fits its mask (``pipeline.scene.placement``) and fits the others under that camera.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import numpy as np

from kiln.settings import Settings
from kiln.stages import scene_problem

from pipeline.types import Gaussians, ImageInput, Mesh, Reconstruction, SourceCamera
from pipeline.validate import StageInputError

if TYPE_CHECKING:
    from pipeline.backends import Backends
    from pipeline.raster.rasterize import RasterContext
    from pipeline.scene.scene_bake import PlacedScene
    from pipeline.texture.model_bake import ModelBakeResult

EventFn = Callable[[str, float, str], None]
@dataclass(frozen=True)
class LaidOut:
    """One object in the scene's world (the photo camera's OpenCV frame, the backend's units):
    mesh and splat moved there; transform: (4, 4) the normalised frame -> that world; camera:
    the camera the object's reconstruction gave, intrinsics in the photo's pixels."""

    mesh: Mesh
    splat: Gaussians
    transform: np.ndarray
    camera: SourceCamera


def laid_out(recon: Reconstruction, name: str) -> LaidOut:
    """``recon`` (a layout backend's, ``pipeline.recon.sam3d``) moved into the photo camera's
    frame by its pose. StageInputError naming ``name`` when it has no pose or camera."""
    from pipeline.scene.placement import moved_mesh, moved_splat

    cam = recon.source_camera
    norm = recon.meta.get("normalisation") or {}
    if cam is None:
        why = (recon.meta.get("source_camera") or {}).get("why", "the reconstruction gave no camera")
        raise StageInputError(f"{name} has no place in the photo ({why}); a scene needs each object's pose")
    try:
        k = float(norm["scale"])
        s = float(np.mean(norm["pose_scale"]))
    except (KeyError, TypeError, ValueError):
        raise StageInputError(f"{name}: the reconstruction did not say how it normalised the object "
                              "(meta 'normalisation'), so its size in the photo is unknown") from None
    if not (k > 0 and s > 0 and np.isfinite([k, s]).all()):
        raise StageInputError(f"{name}: pose scale {s:.4g} / normalisation {k:.4g} are not positive")
    transform = cam.viewmat.astype(np.float64).copy()
    transform[:3, :] *= s / k   # a similarity: the rigid viewmat scaled to the pose's units
    return LaidOut(mesh=moved_mesh(recon.mesh, transform), splat=moved_splat(recon.gaussians, transform, s / k),
                   transform=transform, camera=cam)


def scene_camera(objects: Sequence[LaidOut]) -> SourceCamera:
    """The scene's camera in the world ``laid_out`` puts objects in: the identity (that world is
    the camera's frame) with the intrinsics of the first object's (each was fitted to the same
    photo's point map; they agree up to the fit's error)."""
    first = objects[0].camera
    return SourceCamera(viewmat=np.eye(4, dtype=np.float32), K=first.K.astype(np.float32), width=first.width,
                        height=first.height, projection=first.projection).validate("scene camera")


@dataclass
class PhotoSceneResult:
    """What ``bake_photo_scene`` made: the scene bake's result and each object's reconstruction
    meta (``reconstructions``), in the objects' order."""

    bake: "ModelBakeResult"
    reconstructions: list[dict] = field(default_factory=list)


def bake_photo_scene(rgb: np.ndarray, masks: Sequence[np.ndarray], settings: Settings, backends: "Backends",
                     out_dir: Path, raster_ctx: "RasterContext", on_event: Optional[EventFn] = None,
                     name: str = "model", reconstruct: Optional[Callable[..., Reconstruction]] = None,
                     on_placed: Optional[Callable[["PlacedScene"], None]] = None,
                     cache_dir: Optional[Path] = None) -> PhotoSceneResult:
    """Reconstruct each of ``masks`` (each (H, W) bool, the photo ``rgb`` (H, W, 3) uint8's size)
    with ``settings.reconstruct``, lay them out by their poses and bake them into one GLB,
    ``<out_dir>/<name>.glb``, a node per object ("object-1", ...). ``reconstruct``: the stage,
    called as ``reconstruct(image, i)`` for the i-th object (by default
    ``pipeline.run.reconstruct_cached``: each object's reconstruction looked up in and stored to
    ``cache_dir`` as a single job's is, so changing only the bake's settings does not reconstruct
    again). Refused before any reconstruction when the backend gives no layout (``scene_problem``)."""
    from pipeline.io.mesh_file import MeshFile
    from pipeline.scene.scene_bake import SceneInputs, SceneObject, bake_scene
    from pipeline.texture.model_bake import ModelInputs

    problem = scene_problem(settings.reconstruct.backend)
    if problem:
        raise StageInputError(problem)
    if not masks:
        raise StageInputError("a scene needs at least one object's mask")
    for i, m in enumerate(masks, start=1):
        if m.shape != rgb.shape[:2]:
            raise StageInputError(f"object {i}'s mask is {m.shape[1]}x{m.shape[0]}, the photo "
                                  f"{rgb.shape[1]}x{rgb.shape[0]}: every mask must be the photo's size")
    emit: EventFn = on_event or (lambda *a: None)
    cached: list[bool] = []
    cache_errors: dict[str, str] = {}
    if reconstruct is None:
        from pipeline.run import reconstruct_cached

        def reconstruct(image: ImageInput, i: int) -> Reconstruction:
            recon, hit = reconstruct_cached(image, settings, cache_dir,
                                            lambda stage, f, m: emit(stage, (i + f) / len(masks), m), cache_errors)
            cached.append(hit)
            return recon
    laid: list[LaidOut] = []
    metas: list[dict] = []
    for i, m in enumerate(masks):
        emit("reconstruct", i / len(masks), f"object {i + 1} of {len(masks)}")
        recon = reconstruct(ImageInput(rgb=rgb, mask=m), i)
        laid.append(laid_out(recon, f"object {i + 1}"))
        metas.append(dict(recon.meta))
    camera = scene_camera(laid)
    objects = tuple(
        SceneObject(name=f"object-{i + 1}",
                    inputs=ModelInputs(model=MeshFile(mesh=o.mesh, texture=None, format="ply"), splat=o.splat,
                                       photo=ImageInput(rgb=rgb, mask=m), camera=camera, camera_how="layout"))
        for i, (o, m) in enumerate(zip(laid, masks)))
    result = bake_scene(SceneInputs(objects=objects, camera=camera), settings, backends, out_dir, raster_ctx,
                        on_event=on_event, name=name, on_placed=on_placed)
    result.stats = replace(result.stats, reconstruction_cached=bool(cached) and all(cached),
                           reconstruction_cache_error=cache_errors.get("reconstruct"))
    return PhotoSceneResult(bake=result, reconstructions=metas)
