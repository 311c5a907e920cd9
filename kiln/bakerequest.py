"""What a bake job bakes (``kiln bake``, the page's "Bake a model" tab, ``POST /api/bake``):
the typed record a front end writes into the job's folder and the worker reads back.

Files are named relative to the job's ``inputs/`` folder, where the front end copied them
(with the companions a mesh file refers to: an OBJ's MTL and textures, a glTF's buffers);
the photo and its mask, when there is one, are ``inputs/image.png`` and ``inputs/mask.png``
as for any job. Further photos (``kiln bake --image A ... --image B ...``) are ``PhotoRequest``s
in ``more_photos``: copies of the person's files under ``inputs/photos/<n>/``, read again in the
worker by ``kiln.maskfile``'s rule (the same rule the front end checked them by). A job folder
written before there were several photos has no ``more_photos`` and reads as one photo. Values are checked where they enter (``worker.jobs.bakeinputs``), then trusted.

Standard library only: the app process and the worker both read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

# the splat's source frame (``pipeline.io.frames.SOURCES`` holds the same names with their transforms)
SOURCES = ("auto", "kiln", "inria", "sam3d", "trellis")
# a mesh already placed in its photo's camera frame, for --focal
CAMERA_FRAMES = ("opengl", "opencv")
# bake into the mesh's own UVs, new ones, or the mesh's own when it has usable ones
UV_MODES = ("auto", "keep", "new")


@dataclass(frozen=True)
class PhotoRequest:
    """One more photo of a bake (the second and later ``--image``), with what belongs to it.

    image: the photo file's name under ``inputs/``; mask: its mask file's name, or None (the
    photo's own transparency); camera, focal, principal, camera_frame, fit_camera,
    camera_fitted: as ``BakeRequest``'s, for this photo; name: the photo as the person named it."""

    image: str
    mask: Optional[str] = None
    camera: Optional[str] = None
    focal: Optional[float] = None
    principal: Optional[tuple[float, float]] = None
    camera_frame: str = "opengl"
    fit_camera: bool = False
    camera_fitted: bool = False
    name: str = ""

    @property
    def camera_given(self) -> bool:
        return self.camera is not None or self.focal is not None

    def to_dict(self) -> dict[str, Any]:
        return {"image": self.image, "mask": self.mask, "camera": self.camera, "focal": self.focal,
                "principal": list(self.principal) if self.principal else None,
                "camera_frame": self.camera_frame, "fit_camera": self.fit_camera,
                "camera_fitted": self.camera_fitted, "name": self.name}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PhotoRequest:
        pp = data.get("principal")
        return cls(image=str(data["image"]), mask=None if data.get("mask") is None else str(data["mask"]),
                   camera=None if data.get("camera") is None else str(data["camera"]),
                   focal=None if data.get("focal") is None else float(data["focal"]),
                   principal=(float(pp[0]), float(pp[1])) if pp else None,
                   camera_frame=str(data.get("camera_frame", "opengl")),
                   fit_camera=bool(data.get("fit_camera", False)),
                   camera_fitted=bool(data.get("camera_fitted", False)), name=str(data.get("name", "")))


@dataclass(frozen=True)
class SceneObjectRequest:
    """One object of a scene bake after the first (``kiln bake --scene --mesh A --mask MA
    --mesh B --mask MB``): mesh, splat (or None), mask: the files' names under ``inputs/``
    (``inputs/objects/<n>/``); source: its splat's frame; uvs: as ``BakeRequest.uvs``; names:
    the files' names as the person gave them. The photo and its camera are the scene's."""

    mesh: str
    mask: str
    splat: Optional[str] = None
    source: str = "auto"
    uvs: str = "new"
    names: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"mesh": self.mesh, "mask": self.mask, "splat": self.splat, "source": self.source,
                "uvs": self.uvs, "names": dict(self.names)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SceneObjectRequest:
        return cls(mesh=str(data["mesh"]), mask=str(data["mask"]),
                   splat=None if data.get("splat") is None else str(data["splat"]),
                   source=str(data.get("source", "auto")), uvs=str(data.get("uvs", "new")),
                   names={str(k): str(v) for k, v in (data.get("names") or {}).items()})


@dataclass(frozen=True)
class BakeRequest:
    """mesh: the mesh file's name; splat: the splat PLY's name, or None.
    photo: whether the job has a photo and its mask (``inputs/image.png``, ``inputs/mask.png``).
    camera: a camera JSON's name (``source_camera`` form), or None; focal: the photo's focal
    length in pixels for a mesh placed in the camera's frame, with principal (cx, cy) (None:
    the image centre) and camera_frame ("opengl" as SAM 3D writes, or "opencv").
    fit_camera: fit the camera to the mask (also done when a photo comes without a camera).
    camera_fitted: the camera file is a fit's report (``kiln.records.CameraFitReport``: a fit
    job's ``camera.json``) made for this photo and mask: the bake uses that camera as fitted,
    without fitting again, and gates the photo by the fit's IoU (``bake.fit_min_iou``) as it
    does a camera fitted during the bake.
    source: the splat's source frame, or "auto" to find it. uvs: "keep" | "new" | "auto".
    names: the files' names as the person gave them (for messages and history).
    more_photos: the photos after the first (``PhotoRequest``), each with its own mask and
    camera; the first photo is the one above (``photo``, ``camera``, ...).
    scene: a scene bake (``kiln bake --scene``): the mesh above is its first object (its mask
    ``inputs/mask.png``), ``objects`` the others (``SceneObjectRequest``), all under the one
    photo and camera; one GLB with a node per object (``pipeline.scene``)."""

    mesh: str
    splat: Optional[str] = None
    photo: bool = False
    camera: Optional[str] = None
    focal: Optional[float] = None
    principal: Optional[tuple[float, float]] = None
    camera_frame: str = "opengl"
    fit_camera: bool = False
    camera_fitted: bool = False
    source: str = "auto"
    uvs: str = "auto"
    names: Mapping[str, str] = field(default_factory=dict)
    more_photos: tuple[PhotoRequest, ...] = ()
    scene: bool = False
    objects: tuple[SceneObjectRequest, ...] = ()

    @property
    def camera_given(self) -> bool:
        return self.camera is not None or self.focal is not None

    @property
    def fits_camera(self) -> bool:
        """The worker fits the camera: asked to, or a photo came without one."""
        return self.photo and (self.fit_camera or not self.camera_given)

    def to_dict(self) -> dict[str, Any]:
        return {"mesh": self.mesh, "splat": self.splat, "photo": self.photo, "camera": self.camera,
                "focal": self.focal, "principal": list(self.principal) if self.principal else None,
                "camera_frame": self.camera_frame, "fit_camera": self.fit_camera,
                "camera_fitted": self.camera_fitted,
                "source": self.source, "uvs": self.uvs, "names": dict(self.names),
                "more_photos": [p.to_dict() for p in self.more_photos], "scene": self.scene,
                "objects": [o.to_dict() for o in self.objects]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BakeRequest:
        pp = data.get("principal")
        return cls(mesh=str(data["mesh"]), splat=data.get("splat"), photo=bool(data.get("photo", False)),
                   camera=data.get("camera"),
                   focal=None if data.get("focal") is None else float(data["focal"]),
                   principal=(float(pp[0]), float(pp[1])) if pp else None,
                   camera_frame=str(data.get("camera_frame", "opengl")),
                   fit_camera=bool(data.get("fit_camera", False)),
                   camera_fitted=bool(data.get("camera_fitted", False)), source=str(data.get("source", "auto")),
                   uvs=str(data.get("uvs", "auto")),
                   names={str(k): str(v) for k, v in (data.get("names") or {}).items()},
                   more_photos=tuple(PhotoRequest.from_dict(p) for p in data.get("more_photos") or ()),
                   scene=bool(data.get("scene", False)),
                   objects=tuple(SceneObjectRequest.from_dict(o) for o in data.get("objects") or ()))
