"""Typed records that cross the process boundary, and their JSON forms.

A worker and the supervisor exchange these over the worker's queues (pickled as the
dataclasses they are, ``worker.messages``) and through the job directory (as JSON in
``result.json`` and ``status.json``); the front ends read them from the supervisor. Each is
a frozen dataclass, and its ``to_dict`` / ``from_dict`` are the only code that writes and
reads its JSON form: a key is spelt once, a default is stated once, here.

* ``Capabilities``: what a worker's start-up probes found it can run (``Ready``).
* ``Backends``: the renderer, rasterizer and device a job's attempt uses (``Started``).
* ``BakeStats``, ``ModelStats``, ``PipelineStats``: what the bake, a model file's reading and
  the whole pipeline measured; ``OutputFile``: one file the export wrote.
* ``CameraFitReport``: the photo's camera fitted to its mask and how well it fits (a fit
  job's result, and the ``camera.json`` a fit writes).
* ``JobTimes``, ``WorkerReport``: a worker's report of an attempt that ended done
  (``result.json``).
* ``JobStats``: a job's stats as its status shows them (``JobStatus.stats``).

The JSON forms are the ones Kiln always wrote, so job directories written before these
records existed still load: flat where they were flat (the bake's stats beside the
pipeline's), a field that is None left out rather than written as null. Reading is
lenient where a file may come from another version of Kiln: a key this version does not
know is dropped, a key it misses takes the field's default.

Standard library only: the app process imports this (it must not import ``pipeline/``),
and a worker under another interpreter unpickles these before it adopts that
interpreter's ``sys.path``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

# The start-up probes whose answers a ``Capabilities`` holds, one bool field each
# (``worker.child.probe.PROBES`` runs them; a test keeps the two lists the same).
PROBED = ("cuda", "cpu", "moderngl", "gsplat", "nvdiffrast", "sam3d")


def _opt_str(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def _opt_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _opt_float(value: Any) -> Optional[float]:
    return None if value is None else float(value)


def _str_map(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (value or {}).items()}


def _float_map(value: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in (value or {}).items()}


def _without_none(data: dict[str, Any]) -> dict[str, Any]:
    """The JSON form leaves a missing value out instead of writing null."""
    return {k: v for k, v in data.items() if v is not None}


# --------------------------------------------------------------------------- capabilities


@dataclass(frozen=True)
class Capabilities:
    """What a worker's start-up probes found it can run (``worker.child.process``), sent to the
    supervisor in ``Ready``; ``pipeline.backends`` resolves ``auto`` settings against it.

    device: the GPU's name when the CUDA probe passed, else "cpu".
    cuda, cpu, moderngl, gsplat, nvdiffrast, sam3d: whether that probe passed (``PROBED``).
    reasons: probe name -> why it did not pass (or why it was skipped).
    probe_s: probe name -> seconds it took.
    torch_cuda: ``torch.version.cuda`` (None for a CPU build); toolkit: the CUDA toolkit the
        worker's JIT builds use, in words; torch_extensions_dir, torch_cuda_arch_list: where and
        for which GPUs they build; cuda_visible_devices: the worker's pinning (None: unset).
    python, python_prefix: the interpreter the worker runs under (``worker.python`` shows here).
    pipeline_error: why the worker could not import the stages, when it could not (jobs will
        fail with it).
    """

    device: str = "cpu"
    cuda: bool = False
    cpu: bool = False
    moderngl: bool = False
    gsplat: bool = False
    nvdiffrast: bool = False
    sam3d: bool = False
    reasons: Mapping[str, str] = field(default_factory=dict)
    probe_s: Mapping[str, float] = field(default_factory=dict)
    torch_cuda: Optional[str] = None
    toolkit: Optional[str] = None
    torch_extensions_dir: Optional[str] = None
    torch_cuda_arch_list: Optional[str] = None
    cuda_visible_devices: Optional[str] = None
    python: str = ""
    python_prefix: str = ""
    pipeline_error: Optional[str] = None

    def works(self, name: str) -> bool:
        """Whether probe ``name`` (one of ``PROBED``) passed."""
        if name not in PROBED:
            raise ValueError(f"no start-up probe is called {name!r}; the probes are {', '.join(PROBED)}")
        return bool(getattr(self, name))

    def working(self) -> tuple[str, ...]:
        """The probes that passed, in ``PROBED`` order."""
        return tuple(name for name in PROBED if self.works(name))

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, **{name: self.works(name) for name in PROBED},
                "reasons": dict(self.reasons), "probe_s": dict(self.probe_s),
                "torch_cuda": self.torch_cuda, "toolkit": self.toolkit,
                "torch_extensions_dir": self.torch_extensions_dir,
                "torch_cuda_arch_list": self.torch_cuda_arch_list,
                "cuda_visible_devices": self.cuda_visible_devices,
                "python": self.python, "python_prefix": self.python_prefix,
                **_without_none({"pipeline_error": self.pipeline_error})}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Capabilities:
        def ok(name: str) -> bool:
            return bool(data.get(name, False))

        return cls(device=str(data.get("device") or "cpu"), cuda=ok("cuda"), cpu=ok("cpu"),
                   moderngl=ok("moderngl"), gsplat=ok("gsplat"), nvdiffrast=ok("nvdiffrast"),
                   sam3d=ok("sam3d"),
                   reasons=_str_map(data.get("reasons")), probe_s=_float_map(data.get("probe_s")),
                   torch_cuda=_opt_str(data.get("torch_cuda")), toolkit=_opt_str(data.get("toolkit")),
                   torch_extensions_dir=_opt_str(data.get("torch_extensions_dir")),
                   torch_cuda_arch_list=_opt_str(data.get("torch_cuda_arch_list")),
                   cuda_visible_devices=_opt_str(data.get("cuda_visible_devices")),
                   python=str(data.get("python") or ""), python_prefix=str(data.get("python_prefix") or ""),
                   pipeline_error=_opt_str(data.get("pipeline_error")))


# --------------------------------------------------------------------------- the backend set


@dataclass(frozen=True)
class Backends:
    """Which implementation each stage of one attempt uses: resolved from the settings and
    the worker's capabilities by ``pipeline.backends.resolve_backends``, the one place that
    decides it.

    render: the Gaussian renderer, "cpu" | "gsplat".
    rasterize: the rasterizer, "moderngl" | "nvdiffrast".
    device: the torch device of the bake and the renderer ("cpu", "cuda", "cuda:1").
    chunk_scale: < 1 shrinks the memory-bound blocks (the worker's out-of-memory retry).
    """

    render: str = "cpu"
    rasterize: str = "moderngl"
    device: str = "cpu"
    chunk_scale: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"render": self.render, "rasterize": self.rasterize, "device": self.device,
                "chunk_scale": self.chunk_scale}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Backends:
        default = cls()
        return cls(render=str(data.get("render", default.render)),
                   rasterize=str(data.get("rasterize", default.rasterize)),
                   device=str(data.get("device", default.device)),
                   chunk_scale=float(data.get("chunk_scale", default.chunk_scale)))


# --------------------------------------------------------------------------- stats


@dataclass(frozen=True)
class BakeStats:
    """What ``pipeline.texture.bake.bake_texture`` measured.

    mode: "fast" | "opt". psnr_db: masked PSNR of the final 8-bit texture rendered from the
    views' cameras, over the pixels the mesh covers where the views are opaque; l1: mean
    absolute error on the same pixels (what opt minimises); pixels: how many (all three None
    for a bake without views: a model baked from its photo and its own colours).
    texels_seen_fraction: seen / chart texels; texels_chart_fraction: chart / all texels.
    timings: step -> seconds ("rasterize", "fast", "opt", "photo", "fallback", "mirror",
             "blend" (the photo's colours over the rest), "fill", "psnr"); the steps run only.
    fast_psnr_db, opt_texture_size, opt_steps (opt only): the same PSNR for the fast result opt
    starts from, the size opt solves at, and the steps it took (fewer than ``bake.steps`` when
    its loss stalled: ``pipeline.texture.bake._StallSchedule``).
    photo_projection: whether the photo was blended in; then photo_texels_fraction (chart
    texels with photo weight > 0.5) and photo_pixels_per_texel (median over those), and when
    the photo holds clearly more detail than the texture, texture_size_suggested and a warning.
    texels_from: share of chart texels each source coloured ("photo", "mirror": the mirror image
    of a point a photo sees, "views", "fallback": the mesh's own colours, "glance": a photo that
    sees the texel only at a grazing angle, "fill": along the surface).
    mirror: the mirror side's report (``pipeline.texture.mirror_fill.MirrorFill.report``: used,
    the plane with its score, the pairs seen on both sides and their agreement, the share of
    texels it filled, why not), or None when it was not tried (no photo, bake.mirror_fill off).
    photos: with several photos, one entry per photo projected, in order: {"texels": its share
    of the chart texels (those some photo sees where its share is the largest), "levelling": {"gain": [r, g, b],
    "offset": [r, g, b]}, the colour correction that levelled it with the others}.
    """

    mode: str
    texels_seen_fraction: float
    texels_chart_fraction: float
    psnr_db: Optional[float] = None
    l1: Optional[float] = None
    pixels: Optional[int] = None
    timings: Mapping[str, float] = field(default_factory=dict)
    fast_psnr_db: Optional[float] = None
    opt_texture_size: Optional[int] = None
    opt_steps: Optional[int] = None
    photo_projection: bool = False
    photo_texels_fraction: Optional[float] = None
    photo_pixels_per_texel: Optional[float] = None
    texture_size_suggested: Optional[int] = None
    warnings: tuple[str, ...] = ()
    texels_from: Mapping[str, float] = field(default_factory=dict)
    mirror: Optional[Mapping[str, Any]] = None
    photos: tuple[Mapping[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Flat, under the keys the pipeline's stats always had (``bake_*`` and the rest)."""
        return _without_none({
            "bake_mode": self.mode, "bake_psnr_db": self.psnr_db, "bake_l1": self.l1,
            "bake_pixels": self.pixels, "texels_seen_fraction": self.texels_seen_fraction,
            "texels_chart_fraction": self.texels_chart_fraction, "bake_timings": dict(self.timings),
            "bake_fast_psnr_db": self.fast_psnr_db, "bake_opt_texture_size": self.opt_texture_size,
            "bake_opt_steps": self.opt_steps, "photo_projection": self.photo_projection,
            "photo_texels_fraction": self.photo_texels_fraction,
            "photo_pixels_per_texel": self.photo_pixels_per_texel,
            "texture_size_suggested": self.texture_size_suggested,
            "warnings": list(self.warnings) or None, "texels_from": dict(self.texels_from) or None,
            "mirror": dict(self.mirror) if self.mirror is not None else None,
            "bake_photos": [dict(p) for p in self.photos] or None})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BakeStats:
        return cls(mode=str(data.get("bake_mode", "")), psnr_db=_opt_float(data.get("bake_psnr_db")),
                   l1=_opt_float(data.get("bake_l1")), pixels=_opt_int(data.get("bake_pixels")),
                   texels_seen_fraction=float(data.get("texels_seen_fraction", 0.0)),
                   texels_chart_fraction=float(data.get("texels_chart_fraction", 0.0)),
                   timings=_float_map(data.get("bake_timings")),
                   fast_psnr_db=_opt_float(data.get("bake_fast_psnr_db")),
                   opt_texture_size=_opt_int(data.get("bake_opt_texture_size")),
                   opt_steps=_opt_int(data.get("bake_opt_steps")),
                   photo_projection=bool(data.get("photo_projection", False)),
                   photo_texels_fraction=_opt_float(data.get("photo_texels_fraction")),
                   photo_pixels_per_texel=_opt_float(data.get("photo_pixels_per_texel")),
                   texture_size_suggested=_opt_int(data.get("texture_size_suggested")),
                   warnings=tuple(str(w) for w in data.get("warnings") or ()),
                   texels_from=_float_map(data.get("texels_from")),
                   mirror=dict(data["mirror"]) if isinstance(data.get("mirror"), Mapping) else None,
                   photos=tuple(dict(p) for p in data.get("bake_photos") or ()))


@dataclass(frozen=True)
class PhotoStats:
    """One photo of a model bake (``kiln bake --image A --image B``), as the report gives it.

    name: the photo as the person named it; camera: how its camera was found ("file" | "focal"
    | "fitted" | "fitted before"); source_camera: that camera (``SourceCamera.to_dict``);
    silhouette: the mesh's silhouette from it against its mask ({"inside", "coverage", "iou"});
    camera_fit: the fit's figures when it was fitted; projected: whether its pixels were used;
    skipped: why not; texels: its share of the chart texels; levelling: the colour correction
    that levelled it with the other photos ({"gain": [r, g, b], "offset": [r, g, b]})."""

    name: str
    camera: Optional[str] = None
    source_camera: Optional[Mapping[str, Any]] = None
    silhouette: Optional[Mapping[str, float]] = None
    camera_fit: Optional[Mapping[str, Any]] = None
    projected: bool = False
    skipped: Optional[str] = None
    texels: Optional[float] = None
    levelling: Optional[Mapping[str, Any]] = None

    def describe(self, n: int) -> str:
        """One line for a person (``kiln bake``'s summary, the bake tab's notes): photo ``n``'s
        camera, how well it fits, its share of the texels and its levelling, or why it was skipped."""
        head = f"photo {n} ({self.name}): camera {self.camera or 'none'}"
        if self.camera_fit:
            head += f" (fit IoU {float(self.camera_fit.get('silhouette_iou', 0.0)):.2f})"
        if self.silhouette:
            head += (f", silhouette {self.silhouette['inside']:.0%} inside its mask, "
                     f"covers {self.silhouette['coverage']:.0%}")
        if not self.projected:
            return f"{head}; skipped: {self.skipped}"
        head += f"; {self.texels or 0.0:.0%} of texels"
        lev = self.levelling or {}
        if lev.get("linked"):
            head += ", levelled by gain " + "/".join(f"{g:.2f}" for g in lev.get("gain", ()))
        return head

    def to_dict(self) -> dict[str, Any]:
        return _without_none({
            "name": self.name, "camera": self.camera,
            "source_camera": None if self.source_camera is None else dict(self.source_camera),
            "silhouette": None if self.silhouette is None else dict(self.silhouette),
            "camera_fit": None if self.camera_fit is None else dict(self.camera_fit),
            "projected": self.projected, "skipped": self.skipped, "texels": self.texels,
            "levelling": None if self.levelling is None else dict(self.levelling)})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PhotoStats:
        sil, fit, cam, lev = (data.get(k) for k in ("silhouette", "camera_fit", "source_camera", "levelling"))
        return cls(name=str(data.get("name", "")), camera=_opt_str(data.get("camera")),
                   source_camera=dict(cam) if cam is not None else None,
                   silhouette=_float_map(sil) if sil is not None else None,
                   camera_fit=dict(fit) if fit is not None else None,
                   projected=bool(data.get("projected", False)), skipped=_opt_str(data.get("skipped")),
                   texels=_opt_float(data.get("texels")), levelling=dict(lev) if lev is not None else None)


@dataclass(frozen=True)
class ModelStats:
    """What baking a model another tool made found out about its files (``kiln bake``).

    mesh_format: "glb" | "gltf" | "obj" | "ply" | "stl"; faces_in: the file's faces;
    mesh_notes: how it was read. frame: the splat's source frame that put it on the mesh
    (``pipeline.io.frames``), frame_surface_distance: its centres' median distance to the
    surface as a share of the mesh's size, frame_distances: that distance per candidate.
    camera: how the photo's camera was found, "file" | "focal" | "fitted" | "fitted before" (a fit's
    camera file given as fitted: ``BakeRequest.camera_fitted``) (None: no photo).
    silhouette: the mesh's silhouette from that camera against the mask, {"inside",
    "coverage", "iou"}. camera_fit: the fit's report when the camera was fitted.
    uvs: "kept" (the file's own layout) | "new"; uv_mirrored_fraction / uv_overlap_fraction:
    the kept layout's faults. simplify_ratio: the share of faces removed (new UVs only).
    warnings: what the person should hear (a photo that was not projected, and why).
    photos: every photo given (``PhotoStats``), in order, with its camera and how it was used;
    camera, silhouette and camera_fit above are the first photo's, as with one photo.
    """

    mesh_format: str = ""
    faces_in: int = 0
    mesh_notes: tuple[str, ...] = ()
    frame: Optional[str] = None
    frame_surface_distance: Optional[float] = None
    frame_distances: Mapping[str, float] = field(default_factory=dict)
    camera: Optional[str] = None
    silhouette: Optional[Mapping[str, float]] = None
    camera_fit: Optional[Mapping[str, Any]] = None
    uvs: str = "new"
    uv_mirrored_fraction: Optional[float] = None
    uv_overlap_fraction: Optional[float] = None
    simplify_ratio: Optional[float] = None
    warnings: tuple[str, ...] = ()
    photos: tuple[PhotoStats, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return _without_none({
            "photos": [p.to_dict() for p in self.photos] or None,
            "mesh_format": self.mesh_format, "faces_in": self.faces_in,
            "mesh_notes": list(self.mesh_notes), "frame": self.frame,
            "frame_surface_distance": self.frame_surface_distance,
            "frame_distances": dict(self.frame_distances) or None, "camera": self.camera,
            "silhouette": None if self.silhouette is None else dict(self.silhouette),
            "camera_fit": None if self.camera_fit is None else dict(self.camera_fit),
            "uvs": self.uvs, "uv_mirrored_fraction": self.uv_mirrored_fraction,
            "uv_overlap_fraction": self.uv_overlap_fraction, "simplify_ratio": self.simplify_ratio,
            "warnings": list(self.warnings)})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelStats:
        sil, fit = data.get("silhouette"), data.get("camera_fit")
        return cls(mesh_format=str(data.get("mesh_format", "")), faces_in=int(data.get("faces_in", 0)),
                   mesh_notes=tuple(str(n) for n in data.get("mesh_notes") or ()),
                   frame=_opt_str(data.get("frame")),
                   frame_surface_distance=_opt_float(data.get("frame_surface_distance")),
                   frame_distances=_float_map(data.get("frame_distances")),
                   camera=_opt_str(data.get("camera")),
                   silhouette=_float_map(sil) if sil is not None else None,
                   camera_fit=dict(fit) if fit is not None else None,
                   uvs=str(data.get("uvs", "new")),
                   uv_mirrored_fraction=_opt_float(data.get("uv_mirrored_fraction")),
                   uv_overlap_fraction=_opt_float(data.get("uv_overlap_fraction")),
                   simplify_ratio=_opt_float(data.get("simplify_ratio")),
                   warnings=tuple(str(w) for w in data.get("warnings") or ()),
                   photos=tuple(PhotoStats.from_dict(p) for p in data.get("photos") or ()))


@dataclass(frozen=True)
class OutputFile:
    """One file a job's export wrote (``pipeline.io.outputs.write_outputs``).

    key: its outputs key (``kiln.formats.OUTPUT_TAIL``: glb, obj, stl, mesh_ply); name: its
    file name in the job's outputs; bytes: its size; vertices, faces: what a reader of the
    file finds (the STL's and the PLY's vertices welded). texture_format: the texture's
    encoding (png, jpeg, webp), None without a texture. units, scale: the STL's units and
    the factor Kiln's coordinates were multiplied by. up: the file's up axis ("y" or "z").
    """

    key: str
    name: str
    bytes: int
    vertices: int = 0
    faces: int = 0
    texture_format: Optional[str] = None
    units: Optional[str] = None
    scale: Optional[float] = None
    up: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return _without_none({"key": self.key, "name": self.name, "bytes": self.bytes,
                              "vertices": self.vertices, "faces": self.faces,
                              "texture_format": self.texture_format, "units": self.units,
                              "scale": self.scale, "up": self.up})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OutputFile:
        return cls(key=str(data.get("key", "")), name=str(data.get("name", "")), bytes=int(data.get("bytes", 0)),
                   vertices=int(data.get("vertices", 0)), faces=int(data.get("faces", 0)),
                   texture_format=_opt_str(data.get("texture_format")), units=_opt_str(data.get("units")),
                   scale=_opt_float(data.get("scale")), up=_opt_str(data.get("up")))


@dataclass(frozen=True)
class SceneObjectStats:
    """One object of a scene bake (``kiln bake --scene``): name (its node in the GLB),
    placement (how it was placed under the photo's camera: {"how": "kept" | "fitted" |
    "camera fitted", "scale", "before": its silhouette figures as its file placed it, "fit":
    the fit's figures when fitted}), hidden_px (pixels of its mask another object lies in front
    of), edge_px (pixels of its mask left out as a band round the others), faces, texels_from
    (share of its texels from each source), silhouette (its baked mesh against its mask, as
    ``ModelStats.silhouette``), warnings, glb (its own GLB's name in the job's outputs)."""

    name: str
    placement: Mapping[str, Any] = field(default_factory=dict)
    hidden_px: int = 0
    edge_px: int = 0
    faces: int = 0
    texels_from: Mapping[str, float] = field(default_factory=dict)
    silhouette: Optional[Mapping[str, float]] = None
    warnings: tuple[str, ...] = ()
    glb: str = ""

    def describe(self) -> str:
        """One line for a person (``kiln bake --scene``'s summary, the bake tab's notes): how the
        object was placed, how it fits its mask, what hides it, where its texels came from."""
        pl = self.placement
        fit = pl.get("fit") or {}
        how = {"kept": "pose kept", "fitted": "pose fitted under the photo's camera",
               "camera fitted": "the camera fitted to it"}.get(str(pl.get("how", "")), str(pl.get("how", "")))
        parts = [f"{self.name}: {how}"]
        if pl.get("how") == "fitted":
            parts.append(f"scale {float(pl.get('scale', 1.0)):.3g}, fit IoU {float(fit.get('silhouette_iou', 0)):.2f}"
                         f" in {float(fit.get('fit_seconds', 0)):.1f} s (as its file placed it: IoU "
                         f"{float((pl.get('before') or {}).get('iou', 0)):.2f})")
        if self.silhouette:
            parts.append(f"silhouette IoU {self.silhouette.get('iou', 0):.2f}, covers "
                         f"{self.silhouette.get('coverage', 0):.0%} of its mask")
        if self.hidden_px:
            parts.append(f"{self.hidden_px} px of its mask hidden by other objects")
        parts.append("texels from " + ", ".join(f"{k} {v:.0%}" for k, v in self.texels_from.items() if v))
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return _without_none({"name": self.name, "placement": dict(self.placement), "hidden_px": self.hidden_px,
                              "edge_px": self.edge_px, "faces": self.faces, "texels_from": dict(self.texels_from),
                              "silhouette": None if self.silhouette is None else dict(self.silhouette),
                              "warnings": list(self.warnings), "glb": self.glb})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SceneObjectStats:
        sil = data.get("silhouette")
        return cls(name=str(data["name"]), placement=dict(data.get("placement") or {}),
                   hidden_px=int(data.get("hidden_px", 0)), edge_px=int(data.get("edge_px", 0)),
                   faces=int(data.get("faces", 0)),
                   texels_from={str(k): float(v) for k, v in (data.get("texels_from") or {}).items()},
                   silhouette=None if sil is None else {str(k): float(v) for k, v in sil.items()},
                   warnings=tuple(str(w) for w in data.get("warnings") or ()), glb=str(data.get("glb", "")))


@dataclass(frozen=True)
class PipelineStats:
    """What one run of ``pipeline.run.run_pipeline`` measured (``PipelineResult.stats``).

    backends: the backends it ran with. reconstruction_cached / views_cached: whether the
    reconstruction / the bake's views came from the cache (views_cached None without a bake).
    reconstruct_faces, gaussians: the reconstruction's size; faces, vertices: the mesh's after
    cleaning and simplifying. source_camera: the photo's camera as the reconstruction reported
    it (``pipeline.types.SourceCamera.to_dict``), None when the backend could not say.
    texture_size_auto: the size ``bake.texture_size: auto`` picked. bake: the bake's stats, None
    without one. glb_bytes: the GLB's size. reconstruction_cache_error / views_cache_error: why
    a result could not be stored in the cache (the job went on without). model: what baking a
    model file found (``kiln bake``), None for a job that reconstructed from a photo. files:
    every file the export wrote, the GLB first (empty in reports from before Kiln wrote more).
    scene: each object of a scene bake (``SceneObjectStats``), empty otherwise.
    """

    backends: Backends = field(default_factory=Backends)
    reconstruction_cached: bool = False
    reconstruct_faces: int = 0
    gaussians: int = 0
    source_camera: Optional[Mapping[str, Any]] = None
    views_cached: Optional[bool] = None
    faces: int = 0
    vertices: int = 0
    texture_size_auto: Optional[int] = None
    bake: Optional[BakeStats] = None
    glb_bytes: int = 0
    reconstruction_cache_error: Optional[str] = None
    views_cache_error: Optional[str] = None
    model: Optional[ModelStats] = None
    files: tuple[OutputFile, ...] = ()
    scene: tuple[SceneObjectStats, ...] = ()

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the person should hear about the result (the model's files', then the bake's);
        a scene's: every object's, each naming its object (the model and bake above are only
        the first object's)."""
        if self.scene:
            return tuple(f"{o.name}: {w}" for o in self.scene for w in o.warnings)
        return ((self.model.warnings if self.model is not None else ())
                + (self.bake.warnings if self.bake is not None else ()))

    def to_dict(self) -> dict[str, Any]:
        out = _without_none({
            "backends": self.backends.to_dict(), "reconstruction_cached": self.reconstruction_cached,
            "reconstruct_faces": self.reconstruct_faces, "gaussians": self.gaussians,
            "source_camera": None if self.source_camera is None else dict(self.source_camera),
            "views_cached": self.views_cached, "faces": self.faces, "vertices": self.vertices,
            "texture_size_auto": self.texture_size_auto, "glb_bytes": self.glb_bytes,
            "reconstruction_cache_error": self.reconstruction_cache_error,
            "views_cache_error": self.views_cache_error,
            "model": None if self.model is None else self.model.to_dict()})
        if self.files:
            out["files"] = [f.to_dict() for f in self.files]
        if self.scene:
            out["scene"] = [o.to_dict() for o in self.scene]
        if self.bake is not None:
            out.update(self.bake.to_dict())
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PipelineStats:
        cam = data.get("source_camera")
        return cls(backends=Backends.from_dict(data.get("backends") or {}),
                   reconstruction_cached=bool(data.get("reconstruction_cached", False)),
                   reconstruct_faces=int(data.get("reconstruct_faces", 0)),
                   gaussians=int(data.get("gaussians", 0)),
                   source_camera=dict(cam) if cam is not None else None,
                   views_cached=None if data.get("views_cached") is None else bool(data["views_cached"]),
                   faces=int(data.get("faces", 0)), vertices=int(data.get("vertices", 0)),
                   texture_size_auto=_opt_int(data.get("texture_size_auto")),
                   # a bake always reports its mode
                   bake=BakeStats.from_dict(data) if "bake_mode" in data else None,
                   glb_bytes=int(data.get("glb_bytes", 0)),
                   reconstruction_cache_error=_opt_str(data.get("reconstruction_cache_error")),
                   views_cache_error=_opt_str(data.get("views_cache_error")),
                   model=ModelStats.from_dict(data["model"]) if data.get("model") else None,
                   files=tuple(OutputFile.from_dict(f) for f in data.get("files") or () if isinstance(f, Mapping)),
                   scene=tuple(SceneObjectStats.from_dict(o) for o in data.get("scene") or () if isinstance(o, Mapping)))


@dataclass(frozen=True)
class CameraFitReport:
    """The photo's camera fitted to the object's mask (``pipeline.camera.camera_fit``) and
    how well it fits: what a fit job reports, and the JSON a fit writes as ``camera.json``
    (the form ``kiln bake --camera`` reads: ``source_camera`` with the figures beside it).

    source_camera: the camera (``pipeline.types.SourceCamera.to_dict``, at the photo's size,
    in the mesh's frame). iou, coverage, inside: the mesh's silhouette from it against the
    mask (intersection over union; share of the mask covered; share of the silhouette inside
    the mask). objective: the fit's own score (``camera_fit``'s area objective). seconds: what
    the fit took. case: "posed" (a mesh in the camera frame) | "canonical" (no pose; searched).
    tie_break: how views whose silhouettes tie were told apart, None when none tied.
    """

    source_camera: Mapping[str, Any]
    iou: float
    coverage: float
    inside: float
    objective: float
    seconds: float
    case: str
    tie_break: Optional[Mapping[str, Any]] = None

    def figures(self) -> dict[str, Any]:
        """The report without the camera (what a person reads)."""
        return {k: v for k, v in self.to_dict().items() if k != "source_camera"}

    def to_dict(self) -> dict[str, Any]:
        return _without_none({
            "source_camera": dict(self.source_camera), "silhouette_iou": self.iou,
            "silhouette_coverage": self.coverage, "silhouette_inside": self.inside,
            "fit_objective": self.objective, "fit_seconds": self.seconds, "fit_case": self.case,
            "tie_break": None if self.tie_break is None else dict(self.tie_break)})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CameraFitReport:
        """KeyError / TypeError / ValueError for JSON that is not a fit's report."""
        tie = data.get("tie_break")
        return cls(source_camera=dict(data["source_camera"]), iou=float(data["silhouette_iou"]),
                   coverage=float(data["silhouette_coverage"]), inside=float(data["silhouette_inside"]),
                   objective=float(data.get("fit_objective", 0.0)), seconds=float(data.get("fit_seconds", 0.0)),
                   case=str(data.get("fit_case", "")), tie_break=dict(tie) if tie else None)


@dataclass(frozen=True)
class JobTimes:
    """Where a job's time went, in seconds; None until known.

    pipeline_s: what ``run_pipeline`` took; worker_job_s: the whole attempt in its worker
    (inputs and checks too); both from the worker. queued_s: submit to first start; total_s:
    submit to end; both from the supervisor when the job ends. worker_peak_rss_mb: the worker's
    peak resident memory when the attempt ended (the job's own peak in a fresh worker).
    """

    pipeline_s: Optional[float] = None
    worker_job_s: Optional[float] = None
    queued_s: Optional[float] = None
    total_s: Optional[float] = None
    worker_peak_rss_mb: Optional[float] = None

    def to_dict(self) -> dict[str, Any]:
        return _without_none({"pipeline_s": self.pipeline_s, "worker_job_s": self.worker_job_s,
                              "queued_s": self.queued_s, "total_s": self.total_s,
                              "worker_peak_rss_mb": self.worker_peak_rss_mb})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobTimes:
        return cls(pipeline_s=_opt_float(data.get("pipeline_s")),
                   worker_job_s=_opt_float(data.get("worker_job_s")),
                   queued_s=_opt_float(data.get("queued_s")), total_s=_opt_float(data.get("total_s")),
                   worker_peak_rss_mb=_opt_float(data.get("worker_peak_rss_mb")))


@dataclass(frozen=True)
class WorkerReport:
    """What a worker reports about an attempt that ended done (``result.json``): one that
    wrote its GLB, or a fit job's, which writes the camera instead.

    timings: stage -> seconds (``PipelineResult.timings``); job: ``pipeline_s`` and
    ``worker_job_s``; stats: the pipeline's (a fit job's: its backends); check:
    ``pipeline.io.export.check_glb`` of the GLB ({} for a fit job); camera_fit: a fit job's
    camera and figures, None for the others.
    """

    timings: Mapping[str, float]
    job: JobTimes
    stats: PipelineStats
    check: Mapping[str, Any]
    camera_fit: Optional[CameraFitReport] = None

    def to_dict(self) -> dict[str, Any]:
        # backends and reconstruction_cached also at the top, where readers always found them
        out = {"timings": dict(self.timings), "job": self.job.to_dict(), "stats": self.stats.to_dict(),
               "check": dict(self.check), "backends": self.stats.backends.to_dict(),
               "reconstruction_cached": self.stats.reconstruction_cached}
        if self.camera_fit is not None:
            out["camera_fit"] = self.camera_fit.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkerReport:
        stats = dict(data.get("stats") or {})
        stats.setdefault("backends", data.get("backends") or {})
        fit = data.get("camera_fit")
        return cls(timings=_float_map(data.get("timings")), job=JobTimes.from_dict(data.get("job") or {}),
                   stats=PipelineStats.from_dict(stats), check=dict(data.get("check") or {}),
                   camera_fit=CameraFitReport.from_dict(fit) if fit else None)


@dataclass(frozen=True)
class JobStats:
    """A job's stats as its status shows them (``JobStatus.stats``).

    pipeline: the pipeline's stats from the attempt that succeeded (None unless the job is
    done); glb_check: the GLB's check (the worker's, else the supervisor's structural one);
    job: where the time went; earlier_attempts: why each retried attempt failed, in order;
    camera_fit: a done fit job's camera and figures.
    """

    pipeline: Optional[PipelineStats] = None
    glb_check: Optional[Mapping[str, Any]] = None
    job: JobTimes = field(default_factory=JobTimes)
    earlier_attempts: tuple[str, ...] = ()
    camera_fit: Optional[CameraFitReport] = None

    def to_dict(self) -> dict[str, Any]:
        """Flat: the pipeline's stats with 'glb_check', 'job', 'earlier_attempts' and
        'camera_fit' beside them, each only when it holds something."""
        out = self.pipeline.to_dict() if self.pipeline is not None else {}
        if self.camera_fit is not None:
            out["camera_fit"] = self.camera_fit.to_dict()
        if self.glb_check is not None:
            out["glb_check"] = dict(self.glb_check)
        times = self.job.to_dict()
        if times:
            out["job"] = times
        if self.earlier_attempts:
            out["earlier_attempts"] = list(self.earlier_attempts)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobStats:
        rest = {k: v for k, v in data.items() if k not in ("glb_check", "job", "earlier_attempts", "camera_fit")}
        check, fit = data.get("glb_check"), data.get("camera_fit")
        return cls(pipeline=PipelineStats.from_dict(rest) if rest else None,
                   glb_check=dict(check) if check is not None else None,
                   job=JobTimes.from_dict(data.get("job") or {}),
                   earlier_attempts=tuple(str(a) for a in data.get("earlier_attempts") or ()),
                   camera_fit=CameraFitReport.from_dict(fit) if fit else None)
