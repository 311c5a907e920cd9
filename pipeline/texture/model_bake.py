"""Bake a model someone else made: a mesh (GLB/OBJ/PLY/STL), optionally its Gaussian splat,
optionally the photo it came from with its mask and camera, into a textured GLB.

Per texel, in order (``pipeline.texture.bake.bake_texture``): the photo where its camera sees the
surface inside the mask; the splat rendered from views around the mesh; the mesh's own
vertex colours or texture; a fill from neighbouring texels. Positions stay in the mesh
file's frame, so the GLB lines up with the file it came from.

Stage names, as ``kiln.stages`` has them: render_views, mesh, uv, bake, export.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

from kiln.records import ModelStats, PhotoStats, PipelineStats
from kiln.settings import MeshSettings, Settings

from pipeline.io.frames import FrameFit
from pipeline.io.mesh_file import MeshFile
from pipeline.types import Gaussians, ImageInput, Mesh, SourceCamera
from pipeline.validate import StageInputError

if TYPE_CHECKING:
    from kiln.records import BakeStats

    from pipeline.backends import Backends
    from pipeline.types import Texture
    from pipeline.camera.camera_fit import CameraFit
    from pipeline.raster.rasterize import RasterContext

EventFn = Callable[[str, float, str], None]
# UVs may sit this far outside [0, 1] (float round-off in exporters) and still count as inside
UV_SLACK = 1e-3


@dataclass(frozen=True)
class PlacedPhoto:
    """One photo of a bake with its camera, placed: name (as the person gave it, for the
    report), photo (rgb + mask), camera (in the mesh's frame at the photo's size, or None),
    camera_fit (how well a fitted camera fits), camera_how ("file" | "focal" | "fitted" |
    "fitted before")."""

    name: str
    photo: ImageInput
    camera: Optional[SourceCamera]
    camera_fit: Optional["CameraFit"] = None
    camera_how: Optional[str] = None


@dataclass(frozen=True)
class ModelInputs:
    """What a model bake works from, read and checked (``pipeline.io``).

    model:  the mesh file; splat: its Gaussians already turned into the mesh's frame (or None),
    frame:  how the splat's frame was found; photo: rgb + mask at the camera's size (or None),
    camera: the photo's camera in the mesh's frame (or None); camera_fit: how well it fits
    when it was fitted to the mask (``pipeline.camera.camera_fit``), else None; keep_uvs: bake into
    the model's own UV layout (no simplification) rather than a new one. camera_how: how the
    camera was found ("file" | "focal" | "fitted" | "fitted before": a fit's camera given as
    fitted); warnings: what reading the files found that the person should hear.
    """

    model: MeshFile
    splat: Optional[Gaussians] = None
    frame: Optional[FrameFit] = None
    photo: Optional[ImageInput] = None
    camera: Optional[SourceCamera] = None
    camera_fit: Optional["CameraFit"] = None
    keep_uvs: bool = False
    camera_how: Optional[str] = None
    warnings: tuple[str, ...] = ()
    more_photos: tuple[PlacedPhoto, ...] = ()
    photo_name: str = "photo 1"

    @property
    def photos(self) -> tuple[PlacedPhoto, ...]:
        """Every photo, the first one first (none without a photo)."""
        first = () if self.photo is None else (PlacedPhoto(name=self.photo_name, photo=self.photo, camera=self.camera,
                                                           camera_fit=self.camera_fit,
                                                           camera_how=self.camera_how),)
        return first + self.more_photos


@dataclass(frozen=True)
class SilhouetteFit:
    """The mesh's silhouette from a camera against the photo's mask.

    inside:   share of the silhouette's pixels inside the mask (a wrong camera puts much of
              the mesh outside it; a right one keeps it in, even when the object's own parts
              are hidden in the photo)
    coverage: share of the mask the silhouette covers (a body model is tighter than clothes,
              a mask may include what the mesh lacks)
    iou:      intersection over union, for reference (it mixes the two and misleads alone)
    """

    inside: float
    coverage: float
    iou: float


@dataclass
class ModelBakeResult:
    """glb_path: the GLB written; timings: stage -> seconds; stats: what was measured, with
    ``stats.model`` saying how the files were read and placed and ``stats.files`` every file
    written; extra: the other formats' paths by output key."""

    glb_path: Path
    timings: dict
    stats: PipelineStats
    ply_path: Optional[Path] = None   # a model bake writes no Gaussians
    extra: dict = field(default_factory=dict)


def silhouette_fit(raster_ctx: "RasterContext", mesh: Mesh, camera: SourceCamera,
                   mask: np.ndarray) -> SilhouetteFit:
    """Rasterize ``mesh`` from ``camera`` at the photo's size and compare with ``mask`` (H, W)."""
    from pipeline.raster.rasterize import rasterize_views

    if mask.shape != (camera.height, camera.width):
        raise StageInputError(f"the mask is {mask.shape[1]}x{mask.shape[0]} but the camera is for "
                              f"{camera.width}x{camera.height}")
    sil = np.asarray(rasterize_views(raster_ctx, mesh, camera.as_cameras()).tri_id[0]) >= 0
    both = float((sil & mask).sum())
    return SilhouetteFit(inside=both / max(float(sil.sum()), 1.0), coverage=both / max(float(mask.sum()), 1.0),
                         iou=both / max(float((sil | mask).sum()), 1.0))


def uv_problems(mesh: Mesh) -> tuple[Optional[str], dict]:
    """(why the mesh's own UVs cannot be baked into, or None; a report of them):
    ``uv_mirrored_fraction`` (faces wound against the majority in UV space) and
    ``uv_overlap_fraction`` (UV area covered more than once, from the summed face areas
    against their union at 1024^2)."""
    if mesh.uvs is None:
        return "the mesh has no UVs", {}
    lo, hi = float(mesh.uvs.min()), float(mesh.uvs.max())
    if lo < -UV_SLACK or hi > 1 + UV_SLACK:
        return (f"its UVs run from {lo:.3g} to {hi:.3g}, outside [0, 1] (a tiled or repeated "
                "texture); bake into new ones with --new-uvs"), {}
    uv = mesh.uvs.astype(np.float64)[mesh.faces]
    area = 0.5 * ((uv[:, 1, 0] - uv[:, 0, 0]) * (uv[:, 2, 1] - uv[:, 0, 1])
                  - (uv[:, 2, 0] - uv[:, 0, 0]) * (uv[:, 1, 1] - uv[:, 0, 1]))
    used = np.abs(area) > 1e-14
    if not used.any():
        return "its UV triangles all have zero area", {}
    major = np.sign(area[used].sum()) or 1.0
    mirrored = float((np.sign(area[used]) != major).mean())
    size = 1024
    union = _uv_union(mesh, size)
    overlap = max(0.0, 1.0 - union / max(float(np.abs(area).sum()), 1e-12))
    return None, {"uv_mirrored_fraction": round(mirrored, 4), "uv_overlap_fraction": round(overlap, 4)}


def _uv_union(mesh: Mesh, size: int) -> float:
    """Area of the union of the UV triangles (share of the unit square), by scan conversion."""
    import cv2

    assert mesh.uvs is not None   # checked by the caller
    canvas = np.zeros((size, size), np.uint8)
    pts = np.rint(np.clip(mesh.uvs.astype(np.float64), 0, 1)[mesh.faces] * (size - 1) * 16).astype(np.int32)
    cv2.fillPoly(canvas, list(pts), 1, lineType=cv2.LINE_8, shift=4)
    return float(canvas.sum()) / (size * size)


def has_own_colours(model: MeshFile) -> bool:
    """The mesh file brings colour: vertex colours, or a texture with UVs."""
    return model.mesh.vertex_colors is not None or (model.texture is not None and model.mesh.uvs is not None)


# how far (of 1) every vertex colour may lie from their mean for the mesh to count as one
# flat colour: 8-bit rounding and a tool's own dithering stay well inside it
FLAT_COLOUR_TOLERANCE = 2.0 / 255.0


def flat_colour(model: MeshFile) -> Optional[tuple[int, int, int]]:
    """The one colour (8-bit RGB) every vertex of the model has, or None when its vertex
    colours vary or it has none. Tools that draw a bare mesh give it one colour (SAM 3D
    Body writes its people in (166, 189, 219)): that is how the tool drew it, not what the
    object looks like, so it must not paint the sides a photo does not see."""
    colours = model.mesh.vertex_colors
    if colours is None or len(colours) == 0:
        return None
    c = colours[:, :3].astype(np.float64)    # [0, 1], as mesh_file reads them
    mean = c.mean(axis=0)
    if float(np.abs(c - mean).max()) > FLAT_COLOUR_TOLERANCE:
        return None
    r, g, b = (int(round(v * 255)) for v in mean)
    return r, g, b


def own_colours(model: MeshFile, bake_mesh: Mesh, same_mesh: bool):
    """``pipeline.texture.bake.FallbackColours`` from the model's vertex colours or texture, or None
    when it has neither. ``same_mesh``: ``bake_mesh`` is the model's mesh (its own UVs): the
    texel's face and barycentrics index the model directly; otherwise (a simplified,
    re-unwrapped mesh) each texel takes the nearest model vertex's colour."""
    from scipy.spatial import cKDTree

    src = model.mesh
    texture = model.texture if src.vertex_colors is None else None
    # per vertex: the colour itself, or the uv to look it up at in the model's texture
    attr = src.vertex_colors if src.vertex_colors is not None else src.uvs
    if attr is None or (src.vertex_colors is None and texture is None):
        return None
    values = attr.astype(np.float64)
    tree = None if same_mesh else cKDTree(src.vertices.astype(np.float64))

    def colours(face_ids: np.ndarray, bary: np.ndarray, positions: np.ndarray):
        if tree is None:
            vals = np.einsum("nk,nkc->nc", bary.astype(np.float64), values[src.faces[face_ids]])
        else:
            _, idx = tree.query(positions.astype(np.float64), workers=-1)
            vals = values[idx]
        if texture is not None:
            vals = _sample(texture, vals)
        return np.clip(vals, 0.0, 1.0).astype(np.float32), np.ones(len(face_ids), bool)

    return colours


def _sample(image: np.ndarray, uv: np.ndarray) -> np.ndarray:
    """Bilinear colours (N, 3) in [0, 1] of an (H, W, 3) uint8 texture at Kiln uvs (v = 0 bottom)."""
    h, w = image.shape[:2]
    x = np.clip(uv[:, 0], 0, 1) * w - 0.5
    y = (1.0 - np.clip(uv[:, 1], 0, 1)) * h - 0.5
    x0, y0 = np.floor(x).astype(int), np.floor(y).astype(int)
    fx, fy = (x - x0)[:, None], (y - y0)[:, None]
    img = image.astype(np.float64) / 255.0

    def at(yy, xx):
        return img[np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)]

    return ((at(y0, x0) * (1 - fx) + at(y0, x0 + 1) * fx) * (1 - fy)
            + (at(y0 + 1, x0) * (1 - fx) + at(y0 + 1, x0 + 1) * fx) * fy)


def bake_model(inputs: ModelInputs, settings: Settings, backends: "Backends", out_dir: Path,
               raster_ctx: "RasterContext", on_event: Optional[EventFn] = None,
               name: str = "model") -> ModelBakeResult:
    """Bake ``inputs`` into ``<out_dir>/<name>.glb`` with ``settings`` (bake, views, mesh)."""
    from pipeline.io.outputs import write_outputs
    from pipeline.meshing import mesh_ops
    from pipeline.unwrap import uv
    from pipeline.texture.bake import bake_texture

    emit: EventFn = on_event or _quiet
    if settings.bake.texture_size == "auto":   # no reconstruction to size it after: Kiln's default
        settings = settings.override({"bake.texture_size": 1024})
    timings: dict[str, float] = {}
    m: dict = {"faces_in": inputs.model.mesh.num_faces, "mesh_format": inputs.model.format,
               "mesh_notes": tuple(inputs.model.notes), "camera": inputs.camera_how,
               "warnings": list(inputs.warnings)}
    if inputs.frame is not None:
        m.update(frame=inputs.frame.source, frame_surface_distance=round(inputs.frame.distance, 5),
                 frame_distances={k: round(v, 5) for k, v in inputs.frame.distances.items()})

    def stage(stage_name: str, fn, message: str = "done"):
        emit(stage_name, 0.0, "started")
        t0 = time.perf_counter()
        out = fn()
        timings[stage_name] = time.perf_counter() - t0
        emit(stage_name, 1.0, message)
        return out

    used = _gated_photos(inputs, settings, raster_ctx, m)
    # the first photo that fits leads: the splat's views start from its side, and its thin
    # parts are kept apart when simplifying, as with one photo
    photo, camera = (used[0].photo, used[0].camera) if used else (None, None)
    if photo is None and inputs.splat is None and not has_own_colours(inputs.model):
        why = "; ".join(m["warnings"]) or "no photo, no splat"
        raise StageInputError(f"nothing to take colour from: {why}, and the mesh has no colours or "
                              "texture of its own; give a splat (--splat) or a photo that fits")
    views = None
    if inputs.splat is not None:
        views = stage("render_views", lambda: _splat_views(inputs, settings, backends, camera, emit))
    mesh = inputs.model.mesh
    if inputs.keep_uvs:
        m.update(uvs="kept", **uv_problems(mesh)[1])
    else:
        # at least enough simplification for the unwrap to take the mesh
        ratio = max(settings.mesh.simplify_ratio, 1.0 - settings.mesh.max_faces_for_uv / mesh.num_faces)
        if settings.mesh.faces:
            if settings.mesh.faces > settings.mesh.max_faces_for_uv:
                raise StageInputError(f"{settings.mesh.faces} faces asked, but the unwrap takes at most "
                                      f"{settings.mesh.max_faces_for_uv} (mesh.max_faces_for_uv)")
            m["faces_asked"] = settings.mesh.faces
        m["simplify_ratio"] = round(ratio, 4)
        mesh = stage("mesh", lambda: _simplified(mesh, settings.mesh, ratio, photo, camera),
                     f"{inputs.model.mesh.num_faces} faces in")
        b = settings.bake
        mesh = stage("uv", lambda: uv.unwrap(mesh, texture_size=int(b.texture_size), gutter=b.gutter,
                                             max_faces=settings.mesh.max_faces_for_uv, method=b.unwrap,
                                             source_camera=camera,
                                             more_cameras=[p.camera for p in used[1:] if p.camera is not None]))
    fallback = own_colours(inputs.model, mesh, same_mesh=inputs.keep_uvs)
    flat = flat_colour(inputs.model)
    if flat is not None and fallback is not None and (photo is not None or views is not None):
        # the photo's own colours, spread over the surface, say more about the unseen side
        # than the colour the mesh's tool drew it with
        fallback = None
        m["warnings"].append(f"the mesh's vertex colours are one flat colour {flat}, how its tool drew it "
                             "rather than the object's: not used; what the photo does not see is filled "
                             "from what it does")

    def bake() -> "tuple[Texture, BakeStats]":
        return bake_texture(mesh, views, settings.bake, raster_ctx, device=backends.device, seed=settings.seed,
                            progress=partial(emit, "bake"), chunk_scale=backends.chunk_scale,
                            photo=photo, source_camera=camera, fallback=fallback, photo_beyond_mask=False,
                            more_photos=[(p.photo, p.camera) for p in used[1:] if p.camera is not None])

    texture, bake_stats = stage("bake", bake)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = stage("export", lambda: write_outputs(mesh, texture, out, name, settings.export))
    glb = out / files[0].name
    m["warnings"] = tuple(m["warnings"])
    m["photos"] = _with_shares(m["photos"], used, bake_stats)
    stats = PipelineStats(backends=backends, faces=mesh.num_faces, vertices=mesh.num_vertices, bake=bake_stats,
                          glb_bytes=glb.stat().st_size,
                          source_camera=camera.to_dict() if camera is not None else None,
                          model=ModelStats(**m), files=files)
    return ModelBakeResult(glb_path=glb, timings=timings, stats=stats,
                           extra={f.key: out / f.name for f in files[1:]})


def _with_shares(reports: "list[PhotoStats]", used: list[PlacedPhoto], bake_stats: "BakeStats"
                 ) -> "tuple[PhotoStats, ...]":
    """Each projected photo's report with its share of the surface's texels and its levelling
    (``BakeStats.photos``, in the order of the photos used)."""
    from dataclasses import replace

    # one photo projected: the bake took the single-photo path, whose share is the photo's
    single = [{"texels": bake_stats.texels_from.get("photo")}] if len(used) == 1 else []
    figures = iter(bake_stats.photos or single)
    out = []
    for r in reports:
        got = next(figures, None) if r.projected else None
        if got is not None:
            r = replace(r, texels=got.get("texels"), levelling=got.get("levelling"))
        out.append(r)
    return tuple(out)


def _quiet(stage: str, fraction: float, message: str) -> None:
    pass


def _gated_photos(inputs: ModelInputs, settings: Settings, raster_ctx, stats: dict) -> list[PlacedPhoto]:
    # stats: the ModelStats fields so far; this adds "silhouette", "camera_fit" (the first
    # photo's, as with one photo), "photos" (each photo's) and warnings
    """The photos that may be projected, in order: each one's mesh silhouette from its camera
    lies inside its mask by at least ``bake.photo_min_inside``, or its fitted camera's IoU is at
    least ``bake.fit_min_iou``; the others are skipped, saying why."""
    photos = inputs.photos
    used, reports = [], []
    for i, placed in enumerate(photos):
        label = "the photo" if len(photos) == 1 else f"photo {i + 1} ({placed.name})"
        report, why = _gate(inputs.model.mesh, placed, settings, raster_ctx, label)
        if i == 0:
            stats.update({k: report[k] for k in ("silhouette", "camera_fit") if report.get(k) is not None})
        if why is None:
            used.append(placed)
        else:
            stats["warnings"].append(why)
        reports.append(PhotoStats(name=placed.name, camera=placed.camera_how,
                                  source_camera=placed.camera.to_dict() if placed.camera is not None else None,
                                  silhouette=report.get("silhouette"), camera_fit=report.get("camera_fit"),
                                  projected=why is None, skipped=why))
    stats["photos"] = reports
    return used


def _gate(mesh: Mesh, placed: PlacedPhoto, settings: Settings, raster_ctx, label: str
          ) -> tuple[dict, Optional[str]]:
    """({"silhouette", "camera_fit"} figures, why ``placed`` is not projected or None)."""
    if placed.camera is None:
        return {}, f"{label} was not projected: it has no camera"
    fit = silhouette_fit(raster_ctx, mesh, placed.camera, placed.photo.mask)
    report: dict = {"silhouette": {"inside": round(fit.inside, 4), "coverage": round(fit.coverage, 4),
                                   "iou": round(fit.iou, 4)}}
    if placed.camera_fit is not None:
        # a fitted camera: its IoU says how well it fits (the mesh may reach behind occluders)
        report["camera_fit"] = {k: v for k, v in placed.camera_fit.report().items() if k != "source_camera"}
        need = settings.bake.fit_min_iou
        if placed.camera_fit.iou < need:
            return report, (f"{label} was not projected: the fitted camera's silhouette IoU is "
                            f"{placed.camera_fit.iou:.2f} (at least {need:.2f} is needed, bake.fit_min_iou)")
        return report, None
    need = settings.bake.photo_min_inside
    if fit.inside < need:
        return report, (f"{label} was not projected: only {100 * fit.inside:.0f} % of the mesh's silhouette "
                        f"from the camera lies inside the mask (at least {100 * need:.0f} % is needed, "
                        "bake.photo_min_inside); the camera does not fit the photo")
    return report, None


def _splat_views(inputs: ModelInputs, settings: Settings, backends: "Backends",
                 camera: Optional[SourceCamera], emit: EventFn):
    from pipeline.camera.cameras import camera_centers, framed_cameras
    from pipeline.views.render_views import render_gaussians

    v = settings.views
    pts = inputs.model.mesh.vertices
    front = None
    if camera is not None:   # the first view looks from the photo's side
        front = camera_centers(camera.as_cameras())[0] - (pts.min(0) + pts.max(0)) / 2.0
    cams = framed_cameras(pts, v.count, v.fov_deg, v.resolution, front=front)
    assert inputs.splat is not None
    return render_gaussians(inputs.splat, cams, backend=backends.render, device=backends.device,
                            progress=lambda f, m="": emit("render_views", f, m),
                            chunk_scale=backends.chunk_scale)


def _simplified(mesh: Mesh, m: MeshSettings, ratio: float, photo: Optional[ImageInput],
                camera: Optional[SourceCamera]) -> Mesh:
    """The mesh cleaned and simplified, the photo's thin parts simplified apart when it fits."""
    from pipeline.meshing import mesh_ops
    from pipeline.meshing.thin_faces import thin_part_faces

    clean = mesh_ops.clean_mesh(mesh, min_component_fraction=m.min_component_fraction,
                                fill_holes=m.fill_holes)
    ratio_now = mesh_ops.equivalent_ratio(clean.num_faces, m.faces, ratio)
    keep = thin_part_faces(clean, camera, photo.mask, ratio_now) \
        if m.keep_thin_parts and photo is not None and camera is not None else None
    return mesh_ops.simplify_mesh(clean, ratio=ratio, keep=keep, faces=m.faces)
