"""What ``kiln bake --scene`` is given, checked before any work: several objects (a mesh, its
splat, its mask each) of one photo under one camera.

Refused with the reason: a scene without its photo, more photos than one, an object without
its own mask (the masks must be as many as the meshes), a mask of another size than the photo
(so masks of different sizes), an empty mask, a file that cannot be read. The first object
goes through ``check_bake`` like a single bake (its mask is the job's ``inputs/mask.png``);
the others are read by the same readers and copied under ``inputs/objects/<n>/``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from kiln.bakerequest import SceneObjectRequest

from worker.jobs.bakeinputs import MESH_DIR, OBJECTS_DIR, SPLAT_NAME, BakeFiles, CheckedBake, check_bake
from worker.jobs.inputs import InputProblem

if TYPE_CHECKING:
    import numpy as np

    from kiln.settings import Settings


@dataclass(frozen=True)
class SceneObjectFiles:
    """One object of a scene after the first, as the person gives it: its mesh, its mask in
    the scene's photo, its splat (or None)."""

    mesh: Path
    mask: Optional[Path]
    splat: Optional[Path] = None


def node_names(meshes: list[Path]) -> list[str]:
    """Each object's node name: its mesh file's name without the extension; a name given
    twice gets -2, -3, ... after it."""
    out: list[str] = []
    for mesh in meshes:
        stem = Path(mesh).name.split(".")[0] or "object"
        name, n = stem, 2
        while name in out:
            name, n = f"{stem}-{n}", n + 1
        out.append(name)
    return out


def check_scene(first: BakeFiles, objects: tuple[SceneObjectFiles, ...], settings: "Settings",
                simplify_asked: bool = False,
                photo_pixels: Optional[tuple["np.ndarray", "np.ndarray"]] = None) -> CheckedBake:
    """``first``: the scene's photo, its camera and the first object (mesh, splat, mask);
    ``objects``: the others. ``photo_pixels``: the photo and the first object's mask already
    read (the page's image and selection) instead of ``first.image`` and ``first.mask``.
    Raises ``InputProblem`` before any slow work."""
    from kiln.imageio import ImageError
    from kiln.limits import mask_problem
    from kiln.maskfile import load_mask
    from pipeline.texture.model_inputs import read_model
    from pipeline.types import ImageInput
    from pipeline.validate import StageInputError

    if first.image is None and photo_pixels is None:
        raise InputProblem("a scene is baked from one photo: give it (--image P)")
    if first.more_photos:
        raise InputProblem("a scene takes one photo (one --image): its objects share it and its camera")
    meshes = [first.mesh] + [o.mesh for o in objects]
    masks = [first.mask if photo_pixels is None else Path("selection")] + [o.mask for o in objects]
    given = sum(m is not None for m in masks)
    if given != len(meshes):
        raise InputProblem(f"a scene needs one mask for each mesh (--mesh M --mask K ...): {len(meshes)} "
                           f"meshes, {given} masks" + ("" if given > len(meshes) else
                                                       f"; {Path(meshes[masks.index(None)]).name} has none"))
    for n, o in enumerate(objects, start=2):
        for flag, path in (("--mesh", o.mesh), ("--splat", o.splat), ("--mask", o.mask)):
            if path is not None and not Path(path).is_file():
                raise InputProblem(f"{flag} {path} (object {n}): no such file")
    checked = check_bake(first, settings, simplify_asked=simplify_asked, photo_pixels=photo_pixels)
    assert checked.rgb is not None and checked.mask is not None
    h, w = checked.rgb.shape[:2]
    names = node_names(meshes)
    requests = []
    for n, (o, name) in enumerate(zip(objects, names[1:]), start=2):
        assert o.mask is not None
        try:
            mask = load_mask(o.mask, max_pixels=settings.app.max_pixels).mask
        except ImageError as e:
            raise InputProblem(f"mask {o.mask} (object {n}): {e}") from None
        if mask.shape != (h, w):
            raise InputProblem(f"mask {o.mask} (object {n}) is {mask.shape[1]}x{mask.shape[0]} but the photo "
                               f"{first.image or 'image'} is {w}x{h}: every mask of a scene must be the photo's size")
        problem = mask_problem(mask)
        if problem is not None:
            raise InputProblem(f"mask {o.mask} (object {n}) {problem}")
        folder = f"{OBJECTS_DIR}/{n}"
        req = replace(checked.request, mesh=str(Path(o.mesh).resolve()),
                      splat=str(Path(o.splat).resolve()) if o.splat else None, camera=None, focal=None,
                      fit_camera=False, camera_fitted=False, uvs=first.uvs, more_photos=(), names={})
        try:   # its own files read as the first object's are (the camera is the scene's)
            read = read_model(req, Path("/"), ImageInput(checked.rgb, mask), simplify_asked=simplify_asked)
        except StageInputError as e:
            raise InputProblem(f"object {n}: {e}") from None
        checked.notes.extend(f"object {n} ({name}): {note}" for note in read.notes)
        mesh_name = f"{folder}/{MESH_DIR}/{Path(o.mesh).name}"
        _copy_mesh(checked, Path(o.mesh), mesh_name)
        copies = {f"{folder}/mask{Path(o.mask).suffix.lower()}": Path(o.mask)}
        if o.splat:
            copies[f"{folder}/{SPLAT_NAME}"] = Path(o.splat)
        checked.copies.update(copies)
        checked.input_bytes += sum(p.stat().st_size for p in copies.values())
        names_given = {"mesh": Path(o.mesh).name, "mask": Path(o.mask).name, "node": name}
        if o.splat:
            names_given["splat"] = Path(o.splat).name
        requests.append(SceneObjectRequest(mesh=mesh_name, mask=f"{folder}/mask{Path(o.mask).suffix.lower()}",
                                           splat=f"{folder}/{SPLAT_NAME}" if o.splat else None, source=first.source,
                                           uvs="keep" if read.keep_uvs else "new", names=names_given))
    names0 = {**checked.request.names, "node": names[0]}
    checked.request = replace(checked.request, scene=True, objects=tuple(requests), names=names0)
    return checked


def _copy_mesh(checked: CheckedBake, mesh: Path, name: str) -> None:
    """The mesh and the files it refers to (an OBJ's MTL, a glTF's buffers) under ``name``'s folder."""
    from pipeline.io.mesh_file import companions

    extra, skipped = companions(mesh)
    checked.notes.extend(skipped)
    folder = name.rsplit("/", 1)[0]
    checked.copies[name] = mesh
    checked.copies.update({f"{folder}/{rel.as_posix()}": mesh.parent / rel for rel in extra})
    checked.input_bytes += sum((mesh.parent / rel).stat().st_size for rel in extra) + mesh.stat().st_size
