"""What ``kiln bake`` (and the page's "Bake a model" tab, and ``POST /api/bake``) is given,
checked completely before a job is queued: the mesh, splat and camera read by the
pipeline's own readers, the photo and its mask by ``kiln.maskfile``'s rule, and how they
go together. A bad file is refused in seconds with a message naming it; no worker starts.

``check_bake`` turns the person's ``BakeFiles`` (paths on their disk) into a
``CheckedBake``: the ``kiln.bakerequest.BakeRequest`` the job will carry (names inside the
job's ``inputs/``), the files to copy there, and the photo's pixels. ``check_fit`` does the
same for a fit job (the camera alone, fitted to the photo's mask), and ``fit_key`` names
what a fit depends on, so a front end knows when a fit it keeps no longer holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from kiln.bakerequest import CAMERA_FRAMES, SOURCES, UV_MODES, BakeRequest, PhotoRequest

from worker.jobs.inputs import InputProblem, read_photo

if TYPE_CHECKING:
    import numpy as np

    from kiln.settings import Settings

MESH_DIR = "mesh"          # inputs/mesh/<file> and the files it refers to
SPLAT_NAME = "splat.ply"
CAMERA_NAME = "camera.json"
# a scene's objects after the first (worker.jobs.sceneinputs): inputs/objects/<n>/ (n >= 2)
OBJECTS_DIR = "objects"
MORE_PHOTOS_DIR = "photos"  # inputs/photos/<n>/: the n-th photo's image, mask and camera (n >= 2)


@dataclass(frozen=True)
class PhotoFiles:
    """A photo after the first, as a person gives it, with what belongs to it (``kiln bake
    --image A ... --image B --mask MB --camera CB``): as ``BakeFiles``' fields of the same names."""

    image: Path
    mask: Optional[Path] = None
    camera: Optional[Path] = None
    focal: Optional[float] = None
    principal: Optional[tuple[float, float]] = None
    camera_frame: str = "opengl"
    fit_camera: bool = False
    camera_fitted: bool = False


@dataclass(frozen=True)
class BakeFiles:
    """A bake as a person asks for it: files on their disk and how to read them (the
    options of ``kiln bake``; see ``kiln.bakerequest.BakeRequest`` for each)."""

    mesh: Path
    splat: Optional[Path] = None
    image: Optional[Path] = None
    mask: Optional[Path] = None
    camera: Optional[Path] = None
    focal: Optional[float] = None
    principal: Optional[tuple[float, float]] = None
    camera_frame: str = "opengl"
    fit_camera: bool = False
    source: str = "auto"
    uvs: str = "auto"
    camera_fitted: bool = False
    more_photos: tuple[PhotoFiles, ...] = ()


@dataclass
class CheckedBake:
    """request: what the job carries; copies: name under the job's inputs/ -> file to copy;
    rgb (H, W, 3) uint8 and mask (H, W) bool: the photo (None without one); notes: how the
    files were read, for the person; input_bytes: what the copies and the photo take."""

    request: BakeRequest
    copies: dict[str, Path]
    rgb: Optional["np.ndarray"] = None
    mask: Optional["np.ndarray"] = None
    notes: list[str] = field(default_factory=list)
    input_bytes: int = 0


def _choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InputProblem(f"{what} must be one of {', '.join(allowed)}, got {value!r}")


def check_bake(files: BakeFiles, settings: "Settings", simplify_asked: bool = False,
               photo_pixels: Optional[tuple["np.ndarray", "np.ndarray"]] = None) -> CheckedBake:
    """Read and check everything ``files`` names. ``simplify_asked``: a simplify ratio was set
    explicitly (kept UVs refuse it). ``photo_pixels``: the photo as (rgb (H, W, 3) uint8,
    mask (H, W) bool) already read and checked (the page's image and selection), instead of
    ``files.image``. Raises ``InputProblem``."""
    from pipeline.io.mesh_file import companions, mesh_format
    from pipeline.texture.model_inputs import read_model
    from pipeline.types import ImageInput
    from pipeline.validate import StageInputError

    _choice("--source", files.source, SOURCES)
    _choice("--camera-frame", files.camera_frame, CAMERA_FRAMES)
    _choice("the UV choice", files.uvs, UV_MODES)
    for flag, path in (("--mesh", files.mesh), ("--splat", files.splat), ("--image", files.image),
                       ("--mask", files.mask), ("--camera", files.camera)):
        if path is not None and not Path(path).is_file():
            raise InputProblem(f"{flag} {path}: no such file")
    if files.mask is not None and files.image is None:
        raise InputProblem("--mask is the mask of the photo: give the photo too (--image)")
    if files.principal is not None and files.focal is None:
        raise InputProblem("--principal goes with --focal")
    if files.camera is not None and files.focal is not None:
        raise InputProblem("give the camera as a file (--camera) or as a focal length (--focal), not both")
    if files.camera_fitted and files.camera is None:
        raise InputProblem("camera_fitted says the camera file is a fitted one: give that file (camera)")
    for n, more in enumerate(files.more_photos, start=2):
        _check_more(n, more)
    mesh = Path(files.mesh)
    try:
        mesh_format(mesh)
    except StageInputError as e:
        raise InputProblem(str(e)) from None

    photo = None
    notes: list[str] = []
    if photo_pixels is not None:
        if files.image is not None or files.mask is not None:
            raise InputProblem("give the photo as a file or use the page's image, not both")
        photo = ImageInput(rgb=photo_pixels[0], mask=photo_pixels[1])
    elif files.image is not None:
        got = read_photo(Path(files.image), files.mask, settings.app.max_pixels)
        photo = ImageInput(rgb=got.rgb, mask=got.mask)
        notes += got.notes
    here = BakeRequest(mesh=str(mesh.resolve()), splat=str(Path(files.splat).resolve()) if files.splat else None,
                       photo=photo is not None,
                       camera=str(Path(files.camera).resolve()) if files.camera else None,
                       focal=files.focal, principal=files.principal, camera_frame=files.camera_frame,
                       fit_camera=files.fit_camera, camera_fitted=files.camera_fitted, source=files.source,
                       uvs=files.uvs, more_photos=tuple(_photo_request(more, *(_resolved(p) for p in (more.image, more.mask, more.camera)))
                                                        for more in files.more_photos))
    more_read = []
    for n, more in enumerate(files.more_photos, start=2):
        got = read_photo(Path(more.image), more.mask, settings.app.max_pixels, flag=f"--mask (photo {n})")
        more_read.append(ImageInput(rgb=got.rgb, mask=got.mask))
        notes += [f"photo {n}: {note}" for note in got.notes]
    if files.more_photos and photo is None:
        raise InputProblem("more photos were given without the first one")
    try:
        read = read_model(here, Path("/"), photo, simplify_asked=simplify_asked, more_photos=more_read)
    except StageInputError as e:
        raise InputProblem(str(e)) from None
    notes += list(read.notes)
    asked = settings.mesh.faces
    if asked and asked > read.model.mesh.num_faces:   # before any slow work: the count is known now
        raise InputProblem(f"--faces {asked}: {mesh.name} has only {read.model.mesh.num_faces} faces; "
                           "simplifying removes faces, it cannot add them")
    if read.splat is None and photo is None and not _has_colour(read.model):
        raise InputProblem(f"nothing to take colour from: {mesh.name} has no colours or texture of its "
                           "own; give a splat (--splat) or the photo it was made from (--image)")

    extra, skipped = companions(mesh)
    notes += skipped
    copies = {f"{MESH_DIR}/{mesh.name}": mesh}
    copies.update({f"{MESH_DIR}/{rel.as_posix()}": mesh.parent / rel for rel in extra})
    names = {"mesh": mesh.name}
    if files.splat:
        copies[SPLAT_NAME] = Path(files.splat)
        names["splat"] = Path(files.splat).name
    if files.camera:
        copies[CAMERA_NAME] = Path(files.camera)
        names["camera"] = Path(files.camera).name
    if files.image:
        names["image"] = Path(files.image).name
    more_requests = []
    for n, more in enumerate(files.more_photos, start=2):
        folder = f"{MORE_PHOTOS_DIR}/{n}"
        named = {}
        for key, path in (("image", more.image), ("mask", more.mask), ("camera", more.camera)):
            if path is not None:
                # the copy keeps its suffix: the image is read again by its type in the worker
                named[key] = f"{folder}/{key}{Path(path).suffix.lower()}"
                copies[named[key]] = Path(path)
        more_requests.append(_photo_request(more, named["image"], named.get("mask"), named.get("camera")))
    request = BakeRequest(mesh=f"{MESH_DIR}/{mesh.name}", splat=SPLAT_NAME if files.splat else None,
                          photo=photo is not None, camera=CAMERA_NAME if files.camera else None,
                          focal=files.focal, principal=files.principal, camera_frame=files.camera_frame,
                          fit_camera=files.fit_camera, camera_fitted=files.camera_fitted, source=files.source,
                          uvs="keep" if read.keep_uvs else "new", names=names, more_photos=tuple(more_requests))
    size = sum(p.stat().st_size for p in copies.values())
    if photo is not None:
        size += 4 * photo.mask.size
    return CheckedBake(request=request, copies=copies, rgb=photo.rgb if photo else None,
                       mask=photo.mask if photo else None, notes=notes, input_bytes=size)


def _check_more(n: int, more: PhotoFiles) -> None:
    """A further photo's own options go together (as the first photo's do in ``check_bake``)."""
    _choice(f"--camera-frame (photo {n})", more.camera_frame, CAMERA_FRAMES)
    for flag, path in (("--image", more.image), ("--mask", more.mask), ("--camera", more.camera)):
        if path is not None and not Path(path).is_file():
            raise InputProblem(f"{flag} {path} (photo {n}): no such file")
    if more.principal is not None and more.focal is None:
        raise InputProblem(f"--principal goes with --focal (photo {n}, {Path(more.image).name})")
    if more.camera is not None and more.focal is not None:
        raise InputProblem(f"photo {n} ({Path(more.image).name}): give the camera as a file (--camera) or as a "
                           "focal length (--focal), not both")
    if more.camera_fitted and more.camera is None:
        raise InputProblem(f"photo {n}: camera_fitted says the camera file is a fitted one: give that file")


def _resolved(path: Optional[Path]) -> Optional[Path]:
    return None if path is None else Path(path).resolve()


def _photo_request(more: PhotoFiles, image, mask, camera) -> PhotoRequest:
    return PhotoRequest(image=str(image), mask=None if mask is None else str(mask),
                        camera=None if camera is None else str(camera), focal=more.focal,
                        principal=more.principal, camera_frame=more.camera_frame, fit_camera=more.fit_camera,
                        camera_fitted=more.camera_fitted, name=Path(more.image).name)


def check_fit(files: BakeFiles, settings: "Settings",
              photo_pixels: Optional[tuple["np.ndarray", "np.ndarray"]] = None) -> CheckedBake:
    """A fit job's files read and checked as ``check_bake`` checks a bake's: the mesh, its
    splat (whose colours break front/back ties) and the photo with its mask, which a fit
    needs. A camera given in ``files`` is refused (the fit finds one); the UV choice is a
    bake's and left out. Raises ``InputProblem``."""
    if files.image is None and photo_pixels is None:
        raise InputProblem("fitting the camera needs the photo (--image) and its mask: the camera is "
                           "found from the object's outline in it")
    if files.camera is not None or files.focal is not None:
        raise InputProblem("the photo's camera is given already (a camera file or a focal length); "
                           "leave it out to fit one")
    if any(more.camera is not None or more.focal is not None for more in files.more_photos):
        raise InputProblem("a later photo's camera is given already; leave it out to fit one")
    # every photo is fitted (each of the later ones on its own, all round)
    plain = BakeFiles(mesh=files.mesh, splat=files.splat, image=files.image, mask=files.mask, fit_camera=True,
                      source=files.source, uvs="new", more_photos=files.more_photos)
    return check_bake(plain, settings, photo_pixels=photo_pixels)


def fit_key(checked: CheckedBake) -> str:
    """What a fitted camera depends on: the mesh (with the files it refers to), the splat and
    its source frame (its colours decide front from back), the photo and its mask. Two
    checked requests with the same key fit the same camera; the camera and the other
    options do not count, nor a scene's other objects (the camera is fitted to the first:
    ``worker.jobs.sceneinputs``), so the bake tab's fit holds for the scene it is baked with."""
    from kiln.digest import files_digest, input_digest

    req = checked.request
    parts = [b"fit-key", req.source.encode()]
    if checked.rgb is not None and checked.mask is not None:
        parts.append(input_digest(checked.rgb, checked.mask).encode())
    names = sorted(n for n in checked.copies if n != CAMERA_NAME and not n.startswith(f"{OBJECTS_DIR}/"))
    parts += [n.encode() for n in names]
    return files_digest(parts, [checked.copies[n] for n in names])


def bake_settings(settings: "Settings", simplify_asked: bool) -> "Settings":
    """A bake job's settings: a model someone made keeps its faces unless a simplify ratio was
    asked for (the unwrap's own face limit still simplifies what it cannot take)."""
    return settings if simplify_asked else settings.override({"mesh.simplify_ratio": 0.0})


def _has_colour(model) -> bool:
    from pipeline.texture.model_bake import has_own_colours

    return has_own_colours(model)
