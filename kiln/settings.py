"""Typed settings: one dataclass per section of ``configs/default.yaml``.

The YAML file holds the defaults and a comment per key; the allowed range of
each key lives here, in the field's metadata, so a value from YAML, a CLI flag
or the web UI is checked by the same rule and rejected with the key's dotted
name and its allowed range.

Pure Python on purpose: the app, the CLI and the worker all import it, and it
must never pull in torch.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from kiln.formats import FORMATS, PRIMARY, TEXTURE_FORMATS, UNITS
from kiln.limits import MAX_FACES, MAX_INPUT_PIXELS, MIN_EXACT_FACES

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "default.yaml"


class SettingsError(ValueError):
    """A setting is unknown, mistyped or out of range. The message names the key."""


def _num(lo: float, hi: float, help: str = "") -> dict:
    return {"range": (lo, hi), "help": help}


def _choice(*options: str, help: str = "") -> dict:
    return {"choices": options, "help": help}


def _subset(*options: str, always: str = "", help: str = "") -> dict:
    """Some of ``options``, from a YAML list or a comma-separated text (``_coerce_subset``);
    ``always`` is added when missing."""
    return {"subset": options, "always": always, "help": help}


def _networks(help: str = "") -> dict:
    """A list of IP addresses and CIDR networks (``_coerce_networks``)."""
    return {"networks": True, "help": help}


@dataclass(frozen=True)
class ReconstructSettings:
    backend: str = field(default="builtin", metadata=_choice("builtin", "sam3d"))
    resolution: int = field(default=160, metadata=_num(64, 384))
    thickness: float = field(default=0.6, metadata=_num(0.1, 2.0))
    num_gaussians: int = field(default=40000, metadata=_num(1000, 500000))
    max_image_side: int = field(default=1024, metadata=_num(256, 4096))
    sam3d_config: str = field(default="", metadata={})


@dataclass(frozen=True)
class ViewSettings:
    count: int = field(default=16, metadata=_num(1, 64))
    resolution: int = field(default=512, metadata=_num(64, 2048))
    radius: float = field(default=2.4, metadata=_num(1.2, 10.0))
    fov_deg: float = field(default=40.0, metadata=_num(10.0, 90.0))
    backend: str = field(default="auto", metadata=_choice("auto", "gsplat", "cpu"))


@dataclass(frozen=True)
class MeshSettings:
    simplify_ratio: float = field(default=0.95, metadata=_num(0.0, 0.999))
    # an exact face count instead of the ratio (0: simplify by the ratio); within 2 %
    # (pipeline/meshing/mesh_ops.py: simplify_mesh), refused above the mesh's own count
    faces: int = field(default=0, metadata={**_num(MIN_EXACT_FACES, MAX_FACES), "or_zero": True})
    fill_holes: bool = False
    # simplify the faces over parts of the photo's mask too thin for the simplified mesh on
    # their own, so a stem the reconstruction kept is not folded away (pipeline/meshing/thin_faces.py)
    keep_thin_parts: bool = True
    min_component_fraction: float = field(default=0.01, metadata=_num(0.0, 0.5))
    max_faces_for_uv: int = field(default=200000, metadata=_num(1000, 2000000))


@dataclass(frozen=True)
class BakeSettings:
    enabled: bool = True
    mode: str = field(default="opt", metadata=_choice("fast", "opt"))
    # "auto": sized after the mesh step so the photo's front gets about a texel per photo pixel
    texture_size: int | str = field(default=1024, metadata={**_num(256, 4096), "power_of_two": True,
                                                             "auto": True})
    steps: int = field(default=120, metadata=_num(1, 5000))
    # opt ends once its L1 stalls; false runs every step (comparisons, a test's long job)
    stop_when_stalled: bool = True
    lr: float = field(default=0.03, metadata=_num(1e-4, 1.0))
    tv_weight: float = field(default=0.02, metadata=_num(0.0, 10.0))
    gutter: int = field(default=4, metadata=_num(1, 32))
    photo_projection: bool = True
    unwrap: str = field(default="kiln", metadata=_choice("kiln", "xatlas"))
    # kiln bake: the photo is projected only when this share of the mesh's silhouette, seen
    # from the photo's camera, lies inside the mask (a wrong camera puts much of it outside)
    photo_min_inside: float = field(default=0.9, metadata=_num(0.0, 1.0))
    # ... and a camera fitted to the mask (kiln bake --fit-camera) when its silhouette IoU is at
    # least this (an occluded object's right camera puts part of the mesh outside the mask)
    fit_min_iou: float = field(default=0.6, metadata=_num(0.0, 1.0))
    # texels no photo sees take the colour of their mirror image where a photo sees it: auto
    # when the mesh is mirror-symmetric and the photos confirm the picture is too; off never
    mirror_fill: str = field(default="auto", metadata=_choice("auto", "off"))


@dataclass(frozen=True)
class RasterizeSettings:
    backend: str = field(default="auto", metadata=_choice("auto", "nvdiffrast", "moderngl"))


@dataclass(frozen=True)
class ExportSettings:
    gaussians_ply: bool = False
    # the files written beside the GLB (kiln.formats); the GLB itself always is
    formats: tuple[str, ...] = field(default=(PRIMARY,), metadata=_subset(*FORMATS, always=PRIMARY))
    texture_format: str = field(default="png", metadata=_choice(*TEXTURE_FORMATS))
    # what one unit of Kiln's model is in the STL (Kiln's coordinates are taken as metres)
    units: str = field(default="m", metadata=_choice(*UNITS))


@dataclass(frozen=True)
class WorkerSettings:
    count: int = field(default=0, metadata=_num(0, 16))
    device: str = field(default="auto", metadata=_choice("auto", "cpu", "cuda"))
    stage_timeout_s: float = field(default=600.0, metadata=_num(5, 7200))
    # a busy worker with no CPU time gained and no message for this long is frozen
    # (stopped, deadlocked); a long native call burns CPU and is never taken for one
    stall_timeout_s: float = field(default=30.0, metadata=_num(0, 3600))
    heartbeat_s: float = field(default=2.0, metadata=_num(0.1, 60))
    probe_timeout_s: float = field(default=300.0, metadata=_num(5, 1800))
    retry_with_fallback: bool = True
    # jobs a previous server left queued or running (kill -9, OOM killer, reboot) are queued
    # again at start; one that was running counts as a crash of its input (worker.pool.resume)
    resume_interrupted: bool = True
    max_queue: int = field(default=16, metadata=_num(1, 1000))
    # python executable the workers run under (e.g. SAM 3D Objects' env); "" = Kiln's own
    python: str = ""
    # where the workers run: local processes, or a Ray cluster (docs/cluster.md)
    engine: str = field(default="local", metadata=_choice("local", "ray"))
    # engine ray: the cluster to join ("auto": the one started on this machine)
    ray_address: str = "auto"
    # engine ray: a worker holds one unit of this Ray resource (GPU, CPU or a custom one)
    ray_resource: str = "GPU"
    # engine ray: how a job's inputs and outputs reach the node: Ray's object store, or a
    # filesystem every node mounts at the same path (jobs_dir and cache_dir on it)
    ray_transfer: str = field(default="object_store", metadata=_choice("object_store", "shared"))
    # engine ray: the folder on each node for workers' logs and jobs' copies ("": its temp dir)
    ray_scratch: str = ""


@dataclass(frozen=True)
class AppSettings:
    host: str = "127.0.0.1"
    port: int = field(default=7860, metadata=_num(1, 65535))
    # 0: derived from max_pixels, so any 8-bit RGBA image of max_pixels fits (kiln.imageio.upload_limit_bytes)
    max_upload_mb: float = field(default=0.0, metadata=_num(0, 4096))
    max_pixels: int = field(default=40_000_000, metadata=_num(65536, MAX_INPUT_PIXELS))
    sam2_checkpoint: str = ""
    sam2_config: str = ""
    # how --mask auto, the API's mask "auto" and the page's "Find the object" find the object:
    # auto = the order app.segment.automask.ORDER gives, or one method alone
    auto_mask: str = field(default="auto", metadata=_choice("auto", "sam2", "rembg", "border-model"))
    jobs_dir: str = "var/jobs"
    cache_dir: str = "var/cache"
    # per-tab images on disk (app/web/state/sessions.py); a client is a network address
    session_ttl_h: float = field(default=6.0, metadata=_num(0.1, 168))
    max_sessions: int = field(default=200, metadata=_num(1, 100000))
    max_sessions_per_client: int = field(default=8, metadata=_num(1, 10000))
    max_session_mb: float = field(default=2048.0, metadata=_num(16, 1_000_000))
    max_session_mb_per_client: float = field(default=256.0, metadata=_num(4, 1_000_000))
    upload_mb_per_client_hour: float = field(default=500.0, metadata=_num(1, 1_000_000))
    # a job the page started is cancelled once no page of its browser followed it this long
    orphan_grace_s: float = field(default=120.0, metadata=_num(1, 86400))
    # reverse proxies whose X-Forwarded-For names the client (app/web/server/proxies.py); () = none
    trusted_proxies: tuple[str, ...] = field(default=(), metadata=_networks())
    # disk budgets (worker/upkeep/budget.py): the reconstruction cache, least recently used first;
    # finished jobs, oldest first, by size (with tabs' photos and Gradio's files counted) and by age
    cache_max_mb: float = field(default=2048.0, metadata=_num(1, 10_000_000))
    jobs_max_mb: float = field(default=2048.0, metadata=_num(1, 10_000_000))
    keep_jobs_days: float = field(default=14.0, metadata=_num(0.001, 3650))
    # who may read /healthz and /metrics besides this machine (app/web/server/ops.py); () = loopback only
    ops_networks: tuple[str, ...] = field(default=(), metadata=_networks())
    # one JSON line per job event (worker/upkeep/joblog.py), rotated; "" = none
    job_log: str = ""    # "" = <the job store's parent>/logs/jobs.jsonl; "off" = none
    job_log_mb: float = field(default=16.0, metadata=_num(1, 10_000))
    job_log_files: int = field(default=5, metadata=_num(1, 100))


@dataclass(frozen=True)
class Settings:
    seed: int = field(default=0, metadata=_num(0, 2**31 - 1))
    reconstruct: ReconstructSettings = field(default_factory=ReconstructSettings)
    views: ViewSettings = field(default_factory=ViewSettings)
    mesh: MeshSettings = field(default_factory=MeshSettings)
    bake: BakeSettings = field(default_factory=BakeSettings)
    rasterize: RasterizeSettings = field(default_factory=RasterizeSettings)
    export: ExportSettings = field(default_factory=ExportSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    app: AppSettings = field(default_factory=AppSettings)

    # -- conversions -------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain JSON values: a tuple setting (``app.trusted_proxies``) as a list, so the dict
        equals what settings.json reads back."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def override(self, changes: Mapping[str, Any]) -> "Settings":
        """Return a copy with dotted-key changes applied, e.g. {"bake.mode": "fast"}."""
        data = self.to_dict()
        for dotted, value in changes.items():
            if value is None:
                continue
            node = data
            parts = dotted.split(".")
            for p in parts[:-1]:
                if p not in node or not isinstance(node[p], dict):
                    raise SettingsError(f"unknown setting '{dotted}'")
                node = node[p]
            if parts[-1] not in node:
                raise SettingsError(f"unknown setting '{dotted}'")
            node[parts[-1]] = value
        return from_dict(data)


# The settings a person chooses per job, by the one name the page's form (in this order), the
# API's /generate and `kiln run`'s flags (``--bake``, ``--simplify-ratio``, ...) give them.
JOB_SETTINGS = {"bake": "bake.enabled", "simplify_ratio": "mesh.simplify_ratio",
                "texture_size": "bake.texture_size", "views": "views.count", "bake_mode": "bake.mode",
                "seed": "seed", "gaussians_ply": "export.gaussians_ply", "formats": "export.formats",
                "texture_format": "export.texture_format", "units": "export.units", "faces": "mesh.faces"}


def setting_value(settings: Settings, dotted: str) -> Any:
    """The value of the setting ``dotted`` ("bake.mode") in ``settings``."""
    node: Any = settings
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


RAY_FLAG_HELP = ("run the workers on the Ray cluster at ADDRESS (auto, HOST:6379 or ray://HOST:10001): "
                 "sets worker.engine=ray and worker.ray_address; needs pip install 'kiln3d[ray]' "
                 "(docs/cluster.md)")


def ray_overrides(address: str | None) -> dict[str, str]:
    """The settings ``--ray ADDRESS`` (kiln run, kiln serve) stands for; {} without it."""
    return {"worker.engine": "ray", "worker.ray_address": address} if address else {}


def parse_set(items) -> dict[str, str]:
    """``--set KEY=VALUE`` arguments (any iterable of strings, or None) as an overrides dict
    for ``load``; values stay text, ``load`` converts and checks them by the key's type."""
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise SettingsError(f"--set expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _listed(key: str, value: Any, what: str) -> list:
    """The items of a YAML list or of a comma-separated text (``--set KEY=a,b``); anything
    else is refused as not a list of ``what``."""
    if isinstance(value, str):
        return [v for v in (part.strip() for part in value.split(",")) if v]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise SettingsError(f"setting '{key}' must be a list of {what}, got {value!r}")


def _coerce_networks(key: str, value: Any) -> tuple[str, ...]:
    """IP addresses and CIDR networks, from a YAML list or a comma-separated text (``--set``),
    each written as ``ipaddress`` writes a network (``10.0.0.7`` -> ``10.0.0.7/32``). A
    network with host bits set (``10.0.0.7/8``) is refused rather than widened: it is more
    likely a typo than a wish to trust 16 million addresses. Hostnames are refused too: a
    trust rule must not change with DNS."""
    items = _listed(key, value, "IP addresses or CIDR networks")
    out = []
    for item in items:
        if not isinstance(item, str):
            raise SettingsError(f"setting '{key}': {item!r} is not an IP address or CIDR network")
        try:
            out.append(str(ipaddress.ip_network(item.strip(), strict=True)))
        except ValueError as e:
            why = f" ({e}: did you mean {ipaddress.ip_network(item.strip(), strict=False)}?)" \
                if "host bits" in str(e) else " (write e.g. 10.0.0.7 or 10.0.0.0/24; hostnames are not looked up)"
            raise SettingsError(f"setting '{key}': {item!r} is not an IP address or CIDR network{why}") from None
    return tuple(out)


def _coerce_subset(key: str, options: tuple[str, ...], always: str, value: Any) -> tuple[str, ...]:
    """Some of ``options`` from a YAML list or a comma-separated text ("obj, stl"), in
    ``options``' order, each once, with ``always`` among them; anything else is refused
    naming the value and what is allowed."""
    items = _listed(key, value, ", ".join(options))
    chosen = set()
    for item in items:
        name = item.strip().lower().lstrip(".") if isinstance(item, str) else item
        if name not in options:
            raise SettingsError(f"setting '{key}': {item!r} is not one of {', '.join(options)}; "
                                f"give one or more separated by commas, e.g. {','.join(options[:2])}")
        chosen.add(name)
    if always:
        chosen.add(always)
    return tuple(o for o in options if o in chosen)


def _coerce(key: str, f: dataclasses.Field, value: Any) -> Any:
    if f.metadata.get("networks"):
        return _coerce_networks(key, value)
    if "subset" in f.metadata:
        return _coerce_subset(key, f.metadata["subset"], f.metadata["always"], value)
    typ = f.type if isinstance(f.type, str) else f.type.__name__
    if f.metadata.get("auto"):
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        typ = typ.replace(" | str", "")
    if typ == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        raise SettingsError(f"setting '{key}' must be true or false, got {value!r}")
    if typ == "int":
        integer = "an integer or auto" if f.metadata.get("auto") else "an integer"
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise SettingsError(f"setting '{key}' must be {integer}, got {value!r}")
        try:
            num = float(value)
        except ValueError:
            raise SettingsError(f"setting '{key}' must be {integer}, got {value!r}") from None
        except OverflowError:   # an integer beyond any float is beyond every range too
            raise SettingsError(f"setting '{key}' = {value!r} is out of range") from None
        if not math.isfinite(num) or num != int(num):
            raise SettingsError(f"setting '{key}' must be {integer}, got {value!r}")
        return int(num)
    if typ == "float":
        if isinstance(value, bool):
            raise SettingsError(f"setting '{key}' must be a number, got {value!r}")
        try:
            num = float(value)
        except (TypeError, ValueError):
            raise SettingsError(f"setting '{key}' must be a number, got {value!r}") from None
        except OverflowError:
            raise SettingsError(f"setting '{key}' = {value!r} is out of range") from None
        if not math.isfinite(num):
            raise SettingsError(f"setting '{key}' must be a finite number, got {value!r}")
        return num
    if typ == "str":
        if not isinstance(value, str):
            raise SettingsError(f"setting '{key}' must be text, got {value!r}")
        return value
    raise AssertionError(f"unhandled settings type {typ}")


def _check(key: str, f: dataclasses.Field, value: Any) -> None:
    meta = f.metadata
    if meta.get("auto") and value == "auto":
        return
    if meta.get("or_zero") and value == 0:   # 0: off (e.g. mesh.faces: simplify by the ratio)
        return
    if "range" in meta:
        lo, hi = meta["range"]
        if not (lo <= value <= hi):
            off = "0 (off) or " if meta.get("or_zero") else ""
            raise SettingsError(f"setting '{key}' = {value!r} is out of range; allowed {off}{lo} to {hi}")
    if meta.get("power_of_two") and (value & (value - 1)) != 0:
        raise SettingsError(f"setting '{key}' = {value!r} must be a power of two between "
                            f"{meta['range'][0]} and {meta['range'][1]}")
    if "choices" in meta and value not in meta["choices"]:
        raise SettingsError(f"setting '{key}' = {value!r} is not allowed; choose one of "
                            + ", ".join(meta["choices"]))


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise SettingsError(f"section '{prefix.rstrip('.') or 'top level'}' must be a mapping")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        where = f" in section '{prefix.rstrip('.')}'" if prefix else ""
        raise SettingsError(f"unknown setting '{prefix}{unknown[0]}'{where}; known keys: "
                            + ", ".join(sorted(known)))
    kwargs = {}
    for name, f in known.items():
        if name not in data:
            continue
        key = prefix + name
        value = data[name]
        section = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if isinstance(section, type) and dataclasses.is_dataclass(section):
            kwargs[name] = _build(section, value or {}, key + ".")
            continue
        value = _coerce(key, f, value)
        _check(key, f, value)
        kwargs[name] = value
    return cls(**kwargs)


def from_dict(data: Mapping[str, Any]) -> Settings:
    return _build(Settings, data or {}, "")


def load(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Load settings from YAML (the packaged default when ``path`` is None) and apply overrides."""
    import yaml

    path = Path(path) if path else DEFAULT_CONFIG
    try:
        text = path.read_text()
    except OSError as e:
        raise SettingsError(f"cannot read settings file {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise SettingsError(f"settings file {path} is not UTF-8 text (byte {e.start}); "
                            "settings are YAML") from None
    # libyaml's parser when PyYAML has it: the pure-Python one takes seconds per thousand
    # unclosed '[' (a 20 kB file ran past 10 s), libyaml refuses nesting beyond 1000 at once
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(text, Loader=loader) or {}
    except yaml.YAMLError as e:
        raise SettingsError(f"settings file {path} is not valid YAML: {e}") from None
    except RecursionError:
        raise SettingsError(f"settings file {path} is nested too deeply to be Kiln's settings") from None
    settings = from_dict(data)
    return settings.override(overrides or {})


def field_metadata(key: str) -> Mapping[str, Any]:
    """The metadata (``range``, ``choices``, ``power_of_two``, ``auto``) of the leaf setting
    ``key`` (dotted, e.g. "mesh.simplify_ratio"): what front ends build their widgets from,
    so a slider's limits are the ones ``load`` and ``override`` enforce."""
    cls, parts = Settings, key.split(".")
    for i, name in enumerate(parts):
        known = {f.name: f for f in fields(cls)}
        if name not in known:
            raise SettingsError(f"unknown setting '{key}'")
        f = known[name]
        nested = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(nested):
            cls = nested
            continue
        if i != len(parts) - 1:
            raise SettingsError(f"unknown setting '{key}'")
        return f.metadata
    raise SettingsError(f"setting '{key}' is a section, not a value")


def allowed_range(key: str) -> tuple[Any, Any]:
    """(lo, hi) of a numeric setting, both allowed."""
    meta = field_metadata(key)
    if "range" not in meta:
        raise SettingsError(f"setting '{key}' has no numeric range")
    return meta["range"]


def allowed_values(key: str) -> tuple:
    """Every value a setting may take: its choices, or for a power-of-two setting the powers
    of two in its range (``auto`` not included)."""
    meta = field_metadata(key)
    if "choices" in meta:
        return tuple(meta["choices"])
    if "subset" in meta:
        return tuple(meta["subset"])
    if meta.get("power_of_two"):
        lo, hi = meta["range"]
        return tuple(1 << k for k in range(int(hi).bit_length()) if lo <= 1 << k <= hi)
    raise SettingsError(f"setting '{key}' has no finite set of values")


def describe() -> list[tuple[str, Any, str]]:
    """(dotted key, default, allowed) for every leaf setting; used by --help texts."""
    out = []

    def walk(cls, prefix):
        for f in fields(cls):
            if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
                walk(f.default_factory, prefix + f.name + ".")
                continue
            meta = f.metadata
            if "range" in meta:
                allowed = f"{meta['range'][0]}..{meta['range'][1]}" + (" or auto" if meta.get("auto") else "")
            elif "choices" in meta:
                allowed = "|".join(meta["choices"])
            elif meta.get("networks"):
                allowed = "list of IP addresses / CIDR networks"
            elif "subset" in meta:
                allowed = "list of " + ",".join(meta["subset"])
            else:
                allowed = f.type if isinstance(f.type, str) else f.type.__name__
            out.append((prefix + f.name, f.default, allowed))

    walk(Settings, "")
    return out
