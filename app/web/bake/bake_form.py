"""A bake's parameters (the page's "Bake a model" tab, ``/bake``) as a checked job request:
the files read and checked as ``kiln bake`` checks them (``worker.jobs.bakeinputs``), the settings
checked by ``kiln.settings``, before any job is queued."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from app.web.server import usertext
from app.web.api.photo import api_settings
from app.web.server.context import AppContext


# a photo after the first as the page and the API hand it over: (image, mask, camera) files
MorePhoto = tuple[Optional[str], Optional[str], Optional[str]]
# the page's slots for photos after the first (the API takes any number)
MORE_PHOTOS = 3
# the page's slots for a scene's objects after the first (the API takes any number)
MORE_OBJECTS = 2


@dataclass(frozen=True)
class FitForm:
    """"Fit the camera to the photo"'s inputs on the bake tab, each field named as its component
    in ``app.web.page.layout.BakeTab`` (which lists them in this order)."""

    mesh: Optional[str]
    splat: Optional[str]
    photo: Optional[str]
    mask: Optional[str]
    reuse: bool
    source: str
    camera: Optional[str]
    focal: Any
    # the photos after the first ("More photos of the object"), each with its mask and camera
    photo_2: Optional[str] = None
    mask_2: Optional[str] = None
    camera_2: Optional[str] = None
    photo_3: Optional[str] = None
    mask_3: Optional[str] = None
    camera_3: Optional[str] = None
    photo_4: Optional[str] = None
    mask_4: Optional[str] = None
    camera_4: Optional[str] = None

    def more_photos(self) -> tuple[MorePhoto, ...]:
        """Photos 2-4 as (image, mask, camera), in order."""
        return tuple((getattr(self, f"photo_{n}"), getattr(self, f"mask_{n}"), getattr(self, f"camera_{n}"))
                     for n in range(2, 2 + MORE_PHOTOS))


@dataclass(frozen=True)
class BakeForm(FitForm):
    """Bake's inputs on the bake tab: the fit's and the rest, named and ordered as ``FitForm``'s."""

    frame: str = "opengl"
    fit: bool = False
    uvs: str = "auto"
    texture: Any = 1024
    simplify: Any = 0.0
    formats: Any = None
    texture_format: Any = None
    units: Any = None
    faces: Any = None
    # a scene's objects after the first ("More objects of this photo"): a mesh, its splat, its mask
    object_mesh_2: Optional[str] = None
    object_splat_2: Optional[str] = None
    object_mask_2: Optional[str] = None
    object_mesh_3: Optional[str] = None
    object_splat_3: Optional[str] = None
    object_mask_3: Optional[str] = None

    def objects(self) -> tuple[tuple[str, Optional[str], Optional[str]], ...]:
        """Objects 2-3 given, as (mesh, splat, mask); UIError for a splat or mask without its mesh."""
        out = []
        for n in range(2, 2 + MORE_OBJECTS):
            mesh, splat, mask = (getattr(self, f"object_{what}_{n}") for what in ("mesh", "splat", "mask"))
            if mesh:
                out.append((mesh, splat, mask))
            elif splat or mask:
                raise usertext.UIError(f"object {n}: a splat or mask was given without its mesh")
        return tuple(out)

    def settings_values(self) -> dict:
        """The bake's settings as ``bake_request`` takes them; a simplify ratio of 0 is none."""
        return {"texture_size": self.texture, "simplify_ratio": self.simplify if self.simplify else None,
                "formats": list(self.formats) if self.formats is not None else None,
                "texture_format": self.texture_format or None, "units": self.units or None,
                "faces": self.faces or None}


def bake_request(ctx: AppContext, session: str, mesh: Optional[str], splat: Optional[str], image: Optional[str],
                 mask: Optional[str], camera: Optional[str], focal: Any, principal: Any, camera_frame: Any,
                 fit_camera: Any, source: Any, uvs: Any, session_image: Any, settings_values: dict,
                 camera_fitted: Any = False, more_photos: Sequence[MorePhoto] = (), scene: Any = False,
                 objects: Sequence[tuple] = ()):
    """(``worker.jobs.bakeinputs.CheckedBake``, its settings) from a bake's parameters, checked;
    UIError naming the parameter or file that is wrong. ``session_image``: the session's
    image and selection are the photo (the page's first tab, or ``/upload_image``).
    ``camera_fitted``: ``camera`` is a fit's camera.json (the tab's fit, ``/fit_camera``),
    used as fitted. ``more_photos``: the photos after the first, each (image, mask, camera) as
    files (mask and camera may be None: its transparency, a fitted camera). ``scene``: a scene
    of several objects of the one photo (``kiln bake --scene``): the mesh, splat and mask above
    are the first object, ``objects`` the others ((mesh, splat or None, mask) files each)."""
    from worker.jobs.bakeinputs import BakeFiles, bake_settings, check_bake
    from worker.jobs.inputs import InputProblem

    if not mesh:
        raise usertext.UIError("mesh: no file was given")
    simplify_asked = settings_values.get("simplify_ratio") is not None or bool(settings_values.get("faces"))
    settings = bake_settings(api_settings(ctx.settings, settings_values), simplify_asked)
    try:
        files = BakeFiles(
            mesh=Path(mesh), splat=_path(splat), image=_path(image), mask=_path(mask), camera=_path(camera),
            focal=float(focal) if focal not in (None, "", 0) else None,
            principal=(float(principal[0]), float(principal[1])) if principal else None,
            camera_frame=str(camera_frame or "opengl"), fit_camera=bool(fit_camera),
            source=str(source or "auto"), uvs=str(uvs or "auto"), camera_fitted=bool(camera_fitted),
            more_photos=photo_files(more_photos))
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        # any JSON may arrive: {"a": 1} as principal (KeyError), 10**400 as focal (OverflowError)
        raise usertext.UIError("focal is a number of pixels and principal [cx, cy]") from None
    pixels = _session_photo(ctx, session) if session_image else None
    try:
        if scene or objects:
            from worker.jobs.sceneinputs import SceneObjectFiles, check_scene

            more = tuple(SceneObjectFiles(mesh=Path(m), splat=_path(s), mask=_path(k)) for m, s, k in objects)
            return check_scene(files, more, settings, simplify_asked, photo_pixels=pixels), settings
        return check_bake(files, settings, simplify_asked, photo_pixels=pixels), settings
    except InputProblem as e:
        raise usertext.UIError(as_parameters(str(e))) from None


def listed_objects(meshes: Any, splats: Any = None, masks: Any = None) -> tuple:
    """A scene's objects after the first as /bake takes them: three lists paired by position
    ((mesh, splat or None, mask) each); UIError when they are not lists of files, or a splat or
    mask has no mesh."""
    listed = _paired_lists("object", ("more_meshes", meshes), ("more_splats", splats), ("more_object_masks", masks))
    if any(m is None for m, _, _ in listed):
        raise usertext.UIError("more_meshes: every entry is a mesh file")
    return listed


def fit_request(ctx: AppContext, session: str, mesh: Optional[str], splat: Optional[str], image: Optional[str],
                mask: Optional[str], source: Any, session_image: Any, more_photos: Sequence[MorePhoto] = ()):
    """(``worker.jobs.bakeinputs.CheckedBake`` of a fit job, its settings) from the fit's
    parameters (the bake's, less the camera and what only a bake uses), checked as a bake's
    are; UIError naming what is wrong."""
    from worker.jobs.bakeinputs import BakeFiles, bake_settings, check_fit

    from worker.jobs.inputs import InputProblem

    if not mesh:
        raise usertext.UIError("mesh: no file was given")
    settings = bake_settings(ctx.settings, False)
    files = BakeFiles(mesh=Path(mesh), splat=_path(splat), image=_path(image), mask=_path(mask),
                      source=str(source or "auto"), more_photos=photo_files(more_photos))
    if image is None and not session_image:
        raise usertext.UIError("fitting the camera needs the photo and its mask: give the photo (image) "
                               "or use the session's image and selection")
    pixels = _session_photo(ctx, session) if session_image else None
    try:
        return check_fit(files, settings, photo_pixels=pixels), settings
    except InputProblem as e:
        raise usertext.UIError(as_parameters(str(e))) from None


def _session_photo(ctx: AppContext, session: str):
    """The session's image and selection at full size (UIError: no image, or no usable selection)."""
    from app.web.photo import form

    st = ctx.sessions.get(session)
    with ctx.decodes:
        return form.job_inputs(st)


def photo_files(more: Sequence[MorePhoto]) -> tuple:
    """The photos after the first as ``worker.jobs.bakeinputs.PhotoFiles``, numbered from 2 in
    what the person reads: an entry with no photo is left out, a mask or camera without its
    photo is refused (UIError) rather than dropped silently."""
    from worker.jobs.bakeinputs import PhotoFiles

    out = []
    for n, (image, mask, camera) in enumerate(more, start=2):
        if not image:
            if mask or camera:
                raise usertext.UIError(f"photo {n}: a mask or camera was given without its photo")
            continue
        out.append(PhotoFiles(image=Path(image), mask=_path(mask), camera=_path(camera)))
    return tuple(out)


def listed_photos(images: Any, masks: Any = None, cameras: Any = None) -> tuple:
    """The photos after the first as /bake and /fit_camera take them: three lists paired by
    position ((image, mask, camera) each); UIError when they are not lists of files or a mask
    or camera has no image."""
    return _paired_lists("photo", ("more_images", images), ("more_masks", masks), ("more_cameras", cameras))


def _paired_lists(what: str, lead: tuple[str, Any], *rest: tuple[str, Any]) -> tuple:
    """API lists of files paired by position with the ``lead`` list ((name, value) each): the
    n-th of each belongs to the n-th of the lead; the shorter ones are padded with None. A
    single file stands for a list of one; UIError for anything else, or a list longer than the
    lead's."""
    def files(value: Any, name: str) -> list:
        if value in (None, "", []):
            return []
        if isinstance(value, (str, dict)):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise usertext.UIError(f"{name}: a list of files, one per {what} after the first")
        return [None if v in (None, "") else str(v.get("path") if isinstance(v, dict) else v) for v in value]

    lead_name, lead_files = lead[0], files(lead[1], lead[0])
    columns = [lead_files]
    for name, value in rest:
        got = files(value, name)
        if len(got) > len(lead_files):
            raise usertext.UIError(f"{name}: {len(got)} given for {len(lead_files)} {lead_name}; the n-th "
                                   f"belongs to the n-th {'image' if what == 'photo' else 'mesh'}")
        columns.append(got + [None] * (len(lead_files) - len(got)))
    return tuple(zip(*columns))


def _path(value) -> Optional[Path]:
    return Path(value) if value else None


# the command line's flags as the page's and the API's parameters, in the checks' messages
_FLAG_RE = re.compile(r"--(keep-uvs|new-uvs|[a-z][a-z-]*)")
_FLAG_AS = {"keep-uvs": 'uvs "keep"', "new-uvs": 'uvs "new"', "simplify-ratio": "simplify_ratio"}


def as_parameters(text: str) -> str:
    """A ``kiln bake`` check's message with its flags named as parameters ("pass it as --splat"
    -> "pass it as splat")."""
    return _FLAG_RE.sub(lambda m: _FLAG_AS.get(m.group(1), m.group(1).replace("-", "_")), text)
