"""From a ``kiln.bakerequest.BakeRequest`` to the ``ModelInputs`` a model bake works from.

Two steps, so that a front end can refuse bad files in seconds and the slow part runs in
the worker:

* ``read_model``: read and check every file (the mesh, the splat, the camera) and how they
  go together (a camera needs its photo, kept UVs need usable UVs, the mesh in front of the
  camera). Seconds even for a 227k-face mesh; ``worker.jobs.bakeinputs`` runs it before a job
  is queued, the worker again on the copies in the job's folder.
* ``place_model``: the "read" stage's slow half: the splat's source frame found from its
  centres against the mesh surface (``pipeline.io.frames``), and the photo's camera fitted
  to the mask when none was given (``pipeline.camera.camera_fit``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence, Union

import numpy as np

from kiln.bakerequest import BakeRequest, PhotoRequest

from pipeline.io.camera_file import at_photo_size, camera_from_focal, read_camera
from pipeline.io.mesh_file import MeshFile, read_mesh
from pipeline.io.splat_ply import SplatFile, read_splat
from pipeline.texture.model_bake import ModelInputs, PlacedPhoto, uv_problems
from pipeline.types import ImageInput, SourceCamera
from pipeline.validate import StageInputError

if TYPE_CHECKING:
    from pipeline.backends import Backends
    from pipeline.camera.camera_fit import CameraFit
    from pipeline.raster.rasterize import RasterContext

Progress = Callable[[float, str], None]
# share of the mesh's vertices that must lie in front of a given camera
MIN_IN_FRONT = 0.5
# a mesh whose vertices all lie in front of an OpenGL camera at the origin (z < 0) by this
# share is taken as placed in the photo's camera frame when the camera is fitted
POSED_SHARE = 0.99
# a further photo in a job's folder was checked against the person's own limit before the job;
# this only stops a file swapped in the folder since from decoding without bound
MAX_PHOTO_PIXELS = 400_000_000
# what gives a photo its camera: the request itself (its first photo) or one of its more_photos
CameraSpec = Union[BakeRequest, PhotoRequest]


@dataclass(frozen=True)
class ReadModel:
    """Every file of a bake, read and checked, nothing placed yet.

    model: the mesh file; splat: the splat file (its own frame) or None; photo: rgb + mask,
    or None; camera: the given camera at the photo's size (None: none given, or to be fitted);
    camera_how: "file" | "focal" | "fitted before" (a fit's report given with ``camera_fitted``) | None;
    keep_uvs: bake into the mesh's own UVs; notes: what a person should know about how the files
    were read; camera_fit: the fit a ``camera_fitted`` camera file reports, else None.
    """

    model: MeshFile
    splat: Optional[SplatFile]
    photo: Optional[ImageInput]
    camera: Optional[SourceCamera]
    camera_how: Optional[str]
    keep_uvs: bool
    notes: tuple[str, ...]
    camera_fit: Optional["CameraFit"] = None
    more_photos: tuple["ReadPhoto", ...] = ()


@dataclass(frozen=True)
class ReadPhoto:
    """A photo after the first, read and checked: name (as the person gave it), photo (rgb +
    mask), camera at its size (None: to be fitted), camera_how and camera_fit as ``ReadModel``'s,
    fit_camera: fitting was asked for."""

    name: str
    photo: ImageInput
    camera: Optional[SourceCamera]
    camera_how: Optional[str]
    camera_fit: Optional["CameraFit"] = None
    fit_camera: bool = False


def _name(req: BakeRequest, key: str, file: str) -> str:
    return req.names.get(key, file)


def read_model(req: BakeRequest, folder: Path, photo: Optional[ImageInput],
               simplify_asked: bool = False, more_photos: Optional[Sequence[ImageInput]] = None) -> ReadModel:
    """Read the files ``req`` names in ``folder``; ``photo`` is the job's photo and mask (None
    when it has none). ``simplify_asked``: the person set a simplify ratio (refused with
    kept UVs). ``more_photos``: the photos of ``req.more_photos`` already read (a front end
    that checked them); None reads them from ``folder``. StageInputError names the file and
    what is wrong."""
    folder = Path(folder)
    notes: list[str] = []
    try:
        model = read_mesh(folder / req.mesh)
    except StageInputError as e:
        raise StageInputError(_renamed(str(e), req.mesh, _name(req, "mesh", req.mesh))) from None
    m = model.mesh
    notes.append(f"mesh {_name(req, 'mesh', req.mesh)}: {model.format.upper()}, {m.num_faces} faces, "
                 f"{'UVs' if m.uvs is not None else 'no UVs'}"
                 + (", vertex colours" if m.vertex_colors is not None else "")
                 + (", a texture" if model.texture is not None else ""))
    notes += list(model.notes)
    splat = None
    if req.splat is not None:
        try:
            splat = read_splat(folder / req.splat)
        except StageInputError as e:
            raise StageInputError(_renamed(str(e), req.splat, _name(req, "splat", req.splat))) from None
        notes.append(f"splat {_name(req, 'splat', req.splat)}: {splat.note}")
    keep = _keep_uvs(req, model, simplify_asked)
    camera, how, fitted, said = _photo_camera(req, folder, photo, _name(req, "camera", req.camera or ""),
                                              m.vertices, bool(req.photo))
    notes += said
    more = _more_photos(req, folder, m.vertices, more_photos, notes)
    return ReadModel(model=model, splat=splat, photo=photo, camera=camera, camera_how=how,
                     keep_uvs=keep, notes=tuple(notes), camera_fit=fitted, more_photos=more)


def _photo_camera(spec: CameraSpec, folder: Path, photo: Optional[ImageInput], camera_name: str,
                  vertices: np.ndarray, has_photo: bool, label: str = ""
                  ) -> tuple[Optional[SourceCamera], Optional[str], Optional["CameraFit"], list[str]]:
    """(camera, how, the fit a fit's camera file reports, notes) for one photo and what
    ``spec`` gives for its camera; ``label`` names the photo in notes when there are several."""
    notes: list[str] = []
    camera, how = _given_camera(spec, folder, photo, camera_name)
    fitted = None
    if camera is not None:
        _check_in_front(vertices, camera, how, spec, label)
    # a fit's own camera.json (kiln bake --fit-camera, a fit job) is gated as a fit, by its IoU,
    # whether or not the caller said so: its mesh may rightly reach outside the mask
    if spec.camera_fitted or (spec.camera is not None and camera is not None and _is_fit_report(folder / spec.camera)):
        assert camera is not None and spec.camera is not None   # _given_camera refuses otherwise
        fitted = _fitted_before(folder / spec.camera, camera, camera_name)
        how = "fitted before"
        notes.append(f"{label}camera: fitted to the mask before (silhouette IoU {fitted.iou:.2f}, covers "
                     f"{100 * fitted.coverage:.0f} % of the mask); used as it is, not fitted again")
    elif has_photo and photo is not None and camera is not None:
        # the camera given is used as given; its silhouette is checked against the mask when baking
        notes.append(f"{label}camera: from the camera file {camera_name}" if how == "file"
                     else f"{label}camera: from the focal length given ({float(spec.focal or 0):g} px)")
    elif has_photo and photo is not None:
        notes.append(f"{label}camera: none given; it is fitted to the mask" if not spec.fit_camera
                     else f"{label}camera: fitted to the mask")
    return camera, how, fitted, notes


def _more_photos(req: BakeRequest, folder: Path, vertices: np.ndarray,
                 given: Optional[Sequence[ImageInput]], notes: list[str]) -> tuple["ReadPhoto", ...]:
    """The photos after the first, each read (unless ``given``, already read and checked by
    the front end) with its camera."""
    if given is not None and len(given) != len(req.more_photos):
        raise StageInputError(f"{len(given)} photos read for {len(req.more_photos)} more photos asked for")
    if req.more_photos and not req.photo:
        raise StageInputError("more photos were given but not the first one")
    out = []
    for i, spec in enumerate(req.more_photos):
        name = spec.name or Path(spec.image).name
        photo = given[i] if given is not None else read_photo_files(folder / spec.image,
                                                                    None if spec.mask is None else folder / spec.mask,
                                                                    name)
        label = f"photo {i + 2} ({name}): "
        camera, how, fitted, said = _photo_camera(spec, folder, photo, Path(spec.camera or "").name, vertices,
                                                  True, label)
        notes += said
        out.append(ReadPhoto(name=name, photo=photo, camera=camera, camera_how=how, camera_fit=fitted,
                             fit_camera=spec.fit_camera))
    return tuple(out)


def read_photo_files(image: Path, mask: Optional[Path], name: str,
                     max_pixels: int = MAX_PHOTO_PIXELS) -> ImageInput:
    """A further photo's copies in a job's folder, read by ``kiln.maskfile``'s rule (the mask
    file, else the photo's own transparency), as the front end read them before the job."""
    from kiln.imageio import ImageError, load_image
    from kiln.limits import mask_problem
    from kiln.maskfile import load_mask, read_alpha

    try:
        rgb, alpha = load_image(image, max_pixels=max_pixels)
        if mask is not None:
            got = load_mask(mask, max_pixels=max_pixels).mask
        elif alpha is not None:
            got = read_alpha(alpha).mask
        else:
            raise StageInputError(f"photo {name} has no mask and no transparency")
    except ImageError as e:
        raise StageInputError(f"photo {name}: {e}") from None
    if got.shape != rgb.shape[:2]:
        raise StageInputError(f"the mask of photo {name} is {got.shape[1]}x{got.shape[0]} but the photo is "
                              f"{rgb.shape[1]}x{rgb.shape[0]}")
    problem = mask_problem(got)
    if problem is not None:
        raise StageInputError(f"the mask of photo {name} {problem}")
    return ImageInput(rgb=np.ascontiguousarray(rgb), mask=np.ascontiguousarray(got))


def _is_fit_report(path: Path) -> bool:
    """Whether a camera file is a fit's report (it carries the fit's silhouette figures)."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and all(k in data for k in FIT_FIGURES)


FIT_FIGURES = ("silhouette_iou", "silhouette_coverage", "silhouette_inside")


def _fitted_before(path: Path, camera: SourceCamera, name: str) -> "CameraFit":
    """The fit a camera file made by a fit reports (``CameraFit.report``), with ``camera``
    (read from it at the photo's size)."""
    import json

    from pipeline.camera.camera_fit import CameraFit

    try:
        return CameraFit.from_report(json.loads(path.read_text()), camera)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        raise StageInputError(f"camera file {name} is not a fitted camera (a fit's camera.json, with "
                              "silhouette_iou, silhouette_coverage and silhouette_inside beside its "
                              "source_camera): give it as a plain camera instead") from None


def _renamed(message: str, file: str, name: str) -> str:
    """A reader's message names the copy in the job's folder; say the person's name for it."""
    return message.replace(file, name) if file != name else message


def _keep_uvs(req: BakeRequest, model: MeshFile, simplify_asked: bool) -> bool:
    problem, _ = uv_problems(model.mesh)
    if req.uvs == "new":
        return False
    if req.uvs == "keep":
        if problem is not None:
            raise StageInputError(f"--keep-uvs: cannot bake into the mesh's own UVs: {problem}")
        if simplify_asked:
            raise StageInputError("--keep-uvs bakes into the mesh's own layout, which simplifying "
                                  "would destroy; drop --simplify-ratio or use --new-uvs")
        return True
    return problem is None and not simplify_asked


def _given_camera(req: CameraSpec, folder: Path, photo: Optional[ImageInput], camera_name: str
                  ) -> tuple[Optional[SourceCamera], Optional[str]]:
    if not req.camera_given:
        return None, None
    if req.fit_camera:
        raise StageInputError("give a camera (--camera or --focal) or ask for it to be fitted "
                              "(--fit-camera), not both")
    if req.camera_fitted and req.camera is None:
        raise StageInputError("a fitted camera comes as a camera file (a fit's camera.json), not a focal length")
    if photo is None:
        raise StageInputError("a camera is only used to project the photo: give the photo too (--image)")
    h, w = photo.mask.shape
    if req.camera is not None:
        try:
            cam = read_camera(folder / req.camera)
        except StageInputError as e:
            raise StageInputError(_renamed(str(e), req.camera, camera_name)) from None
        return at_photo_size(cam, w, h), "file"
    assert req.focal is not None
    return camera_from_focal(req.focal, w, h, req.principal, req.camera_frame), "focal"


def _check_in_front(vertices: np.ndarray, camera: SourceCamera, how: Optional[str], req: CameraSpec,
                    label: str = "") -> None:
    """A camera that has the mesh behind it is the wrong camera (or the wrong frame)."""
    _, z = camera.project(vertices)
    share = float((z > 0).mean())
    if share < MIN_IN_FRONT:
        hint = (f" (is the mesh in the {'opencv' if req.camera_frame == 'opengl' else 'opengl'} frame? "
                "see --camera-frame)") if how == "focal" else " (is it the camera of this mesh?)"
        raise StageInputError(f"{label}the mesh lies behind the camera: only {100 * share:.0f} % of its vertices "
                              f"are in front of it{hint}")


def place_model(read: ReadModel, req: BakeRequest, raster_ctx: "RasterContext", backends: "Backends",
                progress: Optional[Progress] = None) -> ModelInputs:
    """The splat turned into the mesh's frame, the camera fitted when none was given."""
    from pipeline.io.frames import fit_frame, transform_gaussians

    say = progress or (lambda f, m: None)
    notes = list(read.notes)
    splat = frame = None
    if read.splat is not None:
        say(0.05, "finding the splat's frame")
        frame = fit_frame(read.model.mesh, read.splat.gaussians, req.source)
        splat = transform_gaussians(read.splat.gaussians, _rotation(frame.source))
        notes.append(frame.note)
    camera, how, fit = read.camera, read.camera_how, read.camera_fit
    render = None
    if read.photo is not None and camera is None:
        render = _tie_break_render(read, splat, raster_ctx, backends)
        vertices = read.model.mesh.vertices
        posed = float((vertices[:, 2] < 0).mean()) >= POSED_SHARE
        say(0.2, f"fitting the camera to the mask ({'mesh in the camera frame' if posed else 'canonical mesh'})")
        fit = _fit(read, read.photo, posed, render, raster_ctx)
        camera, how = fit.camera, "fitted"
        notes.append(f"camera fitted to the mask in {fit.seconds:.1f} s: silhouette IoU {fit.iou:.2f}, "
                     f"covers {100 * fit.coverage:.0f} % of the mask")
    more = []
    for i, extra in enumerate(read.more_photos):
        placed = PlacedPhoto(name=extra.name, photo=extra.photo, camera=extra.camera,
                             camera_fit=extra.camera_fit, camera_how=extra.camera_how)
        if extra.camera is None:
            render = render or _tie_break_render(read, splat, raster_ctx, backends)
            say(0.2 + 0.75 * (i + 1) / (len(read.more_photos) + 1),
                f"fitting photo {i + 2}'s camera ({extra.name}) to its mask")
            # only the first photo's camera can hold a posed mesh in its frame: the others
            # were taken from elsewhere round it, so their views are searched for all round
            got = _fit(read, extra.photo, False, render, raster_ctx)
            placed = PlacedPhoto(name=extra.name, photo=extra.photo, camera=got.camera, camera_fit=got,
                                 camera_how="fitted")
            notes.append(f"photo {i + 2} ({extra.name}): camera fitted to its mask in {got.seconds:.1f} s: "
                         f"silhouette IoU {got.iou:.2f}, covers {100 * got.coverage:.0f} % of the mask")
        more.append(placed)
    say(1.0, "; ".join(notes[-2:]) if notes else "read")
    return ModelInputs(model=read.model, splat=splat, frame=frame, photo=read.photo, camera=camera,
                       camera_fit=fit, keep_uvs=read.keep_uvs, camera_how=how, more_photos=tuple(more),
                       photo_name=req.names.get("image", "photo 1"))


def _tie_break_render(read: ReadModel, splat, raster_ctx: "RasterContext", backends: "Backends"):
    """The camera fit's tie-break colours: the splat's, else the mesh's own (texture or vertex colours)."""
    from pipeline.camera.fit_tiebreak import model_render

    return (_splat_render(splat, backends) if splat is not None
            else model_render(raster_ctx, read.model.mesh, read.model.texture))


def _fit(read: ReadModel, photo: ImageInput, posed: bool, render, raster_ctx: "RasterContext") -> "CameraFit":
    from pipeline.camera.camera_fit import fit_camera

    return fit_camera(raster_ctx, read.model.mesh, photo.mask, posed=posed, render=render, photo=photo.rgb)


def _rotation(source: str) -> np.ndarray:
    from pipeline.io.frames import SPLAT_TO_MESH

    return SPLAT_TO_MESH[source].rotation


def _splat_render(splat, backends: "Backends"):
    """The camera fit's tie-break renderer: the splat's colours from a camera."""
    from pipeline.views.render_views import render_gaussians

    def render(cam: SourceCamera):
        out = render_gaussians(splat, cam.as_cameras(), backend=backends.render, device=backends.device)
        return np.asarray(out.rgb[0], np.float32), np.asarray(out.alpha[0]) > 0.5

    return render

