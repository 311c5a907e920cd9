"""Stage cache: one ``.npz`` per (input, reconstruction settings, code version), and one
per set of bake views rendered from it (see "views" below).

Reconstruction is the slow, seed-dependent stage; everything after it (simplify,
unwrap, bake, export) is cheap to redo. Keying the cache on exactly what the
reconstruction depends on lets a person toggle baking or move the simplify slider
without paying for reconstruction again, while a change to the image, the mask,
any ``reconstruct.*`` setting, the seed or the reconstruction code itself misses.

Files are written to a temporary name and moved into place with ``os.replace``,
so a reader (another worker, or this one after a crash) sees either no entry or a
complete one. Entries that fail to load or validate are deleted and recomputed.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import logging
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from kiln.atomic import atomic_write
from kiln.digest import input_digest
from kiln.settings import Settings

from pipeline.types import Cameras, Gaussians, ImageInput, Mesh, Reconstruction, SourceCamera, Views

log = logging.getLogger(__name__)

# Bump when the file layout below changes.
CACHE_FORMAT = 2   # 2: the source camera
_PIPELINE_DIR = Path(__file__).resolve().parent
# Libraries whose numerics shape a reconstruction; a new version may change the result.
_LIBRARIES = ("numpy", "scipy", "scikit-image", "trimesh", "torch")


def _local_imports(source: str) -> set[str]:
    """Dotted names under ``pipeline`` ("recon.builtin", "types") of the modules imported
    anywhere in ``source`` (lazy imports too; the pipeline imports its own modules absolutely).
    ``from pipeline.x import y`` names both ``x`` and ``x.y``: whichever is a module counts."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] == "pipeline":
                base = ".".join(parts[1:])
                if base:
                    names.add(base)
                names.update(f"{base}.{a.name}" if base else a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "pipeline" and len(parts) > 1:
                    names.add(".".join(parts[1:]))
    return names


def _module_closure(*roots: str) -> list[Path]:
    """Source files of the ``pipeline.<root>`` modules and every pipeline module they
    import, transitively."""
    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _PIPELINE_DIR / f"{name.replace('.', '/')}.py"
        if not path.is_file():
            continue   # a package, or a name imported from a module
        seen[name] = path
        try:
            todo.extend(_local_imports(path.read_text()))
        except SyntaxError:
            pass  # still hashed below; a broken file will fail loudly on import anyway
    return [seen[k] for k in sorted(seen)]


@lru_cache(maxsize=8)
def code_version(backend: str = "builtin") -> str:
    """Hash of the reconstruction code (``pipeline/recon/reconstruct.py``, the backend's own
    module ``pipeline/recon/<backend>.py`` when it has one, and the pipeline modules they
    import), the package version and the numerics libraries' versions.

    The backend module is named explicitly because reconstruct.py loads it with
    importlib, which the import scan cannot see.
    """
    from importlib import metadata

    h = hashlib.sha256(f"kiln-recon-cache-v{CACHE_FORMAT}".encode())
    for dist in ("kiln3d",) + _LIBRARIES:
        try:
            h.update(f"{dist}={metadata.version(dist)};".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=none;".encode())
    roots = ("recon.reconstruct", f"recon.{backend}") if backend.isidentifier() else ("recon.reconstruct",)
    for path in _module_closure(*roots):
        h.update(path.relative_to(_PIPELINE_DIR).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def reconstruction_key(image: ImageInput, settings: Settings) -> str:
    """Cache key (64 hex chars) for reconstructing ``image`` with ``settings``.

    Depends on the image and mask content and shapes, every ``reconstruct.*``
    setting, the seed and ``code_version()``; nothing else (bake, mesh, views and
    export settings deliberately do not take part).
    """
    h = hashlib.sha256()
    h.update(input_digest(image.rgb, image.mask).encode())
    h.update(json.dumps(settings.to_dict()["reconstruct"], sort_keys=True).encode())
    h.update(f"seed={int(settings.seed)}".encode())
    h.update(code_version(settings.reconstruct.backend).encode())
    return h.hexdigest()


def _entry(cache_dir: Path, key: str) -> Path:
    if not (len(key) == 64 and all(c in "0123456789abcdef" for c in key)):
        raise ValueError(f"not a reconstruction cache key: {key!r}")
    return Path(cache_dir) / f"recon-{key}.npz"


def save_reconstruction(cache_dir: Path, key: str, recon: Reconstruction) -> Path:
    """Store ``recon`` under ``key`` atomically; returns the entry's path."""
    path = _entry(cache_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    m, g = recon.mesh, recon.gaussians
    arrays: dict[str, np.ndarray] = {
        "format": np.array(CACHE_FORMAT, np.int32),
        "key": np.frombuffer(key.encode(), np.uint8),
        "mesh_vertices": m.vertices, "mesh_faces": m.faces,
        "g_means": g.means, "g_scales": g.scales, "g_quats": g.quats,
        "g_opacities": g.opacities, "g_colors": g.colors,
        "meta_json": np.frombuffer(json.dumps(recon.meta, default=str).encode(), np.uint8),
    }
    if m.vertex_colors is not None:
        arrays["mesh_vertex_colors"] = m.vertex_colors
    if m.uvs is not None:
        arrays["mesh_uvs"] = m.uvs
    if recon.source_camera is not None:
        arrays["source_camera_json"] = np.frombuffer(
            json.dumps(recon.source_camera.to_dict()).encode(), np.uint8)
    buf = io.BytesIO()
    # the stub also types **arrays as savez's own keywords; the keys here are array names
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    atomic_write(path, buf.getbuffer())
    return path


def load_reconstruction(cache_dir: Path, key: str) -> Reconstruction | None:
    """The cached reconstruction for ``key``, or None when absent or unreadable.

    A damaged or stale-format entry is removed so the next save replaces it.
    """
    path = _entry(cache_dir, key)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if int(z["format"]) != CACHE_FORMAT or z["key"].tobytes().decode() != key:
                raise ValueError("format or key mismatch")
            mesh = Mesh(vertices=z["mesh_vertices"], faces=z["mesh_faces"],
                        vertex_colors=z["mesh_vertex_colors"] if "mesh_vertex_colors" in z else None,
                        uvs=z["mesh_uvs"] if "mesh_uvs" in z else None)
            gauss = Gaussians(means=z["g_means"], scales=z["g_scales"], quats=z["g_quats"],
                              opacities=z["g_opacities"], colors=z["g_colors"])
            meta = json.loads(z["meta_json"].tobytes().decode() or "{}")
            source = (SourceCamera.from_dict(json.loads(z["source_camera_json"].tobytes().decode()))
                      if "source_camera_json" in z else None)
        mesh.validate("cached mesh")
        gauss.validate("cached gaussians")
        if source is not None:
            source.validate("cached source camera")
    except Exception as e:  # corrupt zip, missing array, failed validation: recompute
        log.warning("dropping unreadable reconstruction cache entry %s: %s", path.name, e)
        path.unlink(missing_ok=True)
        return None
    try:
        os.utime(path)      # recently used: the disk budget (worker.upkeep) removes the oldest first
    except OSError:
        pass                # removed meanwhile: what was read is whole all the same
    return Reconstruction(mesh=mesh, gaussians=gauss, meta=meta, source_camera=source)


# --------------------------------------------------------------------------- views
#
# The bake views depend on the reconstruction (its key), the view settings, the
# renderer that drew them (backend, device) and the rendering code; not on mesh,
# UV or bake settings. Caching them makes a re-run that only moves the simplify
# slider, the bake mode or the texture size skip the 16 renders too.
#
# Colours and alpha are kept as float16: 1/2048 near 1, far below the 8-bit step of
# the texture they are baked into, at half the bytes. run.py rounds freshly rendered
# views the same way when a cache is in use, so a cache hit bakes exactly what the
# first run baked.

VIEWS_FORMAT = 1
VIEWS_MAX_ENTRY_BYTES = 1 << 30        # larger renders (64 views at 2048^2) are not kept
VIEWS_MAX_TOTAL_BYTES = 4 << 30        # beyond this the least recently used entries go
_VIEW_LIBRARIES = ("numpy", "torch", "gsplat", "numba")
# the modules whose source (with what they import) makes the views' pixels
VIEWS_CODE_ROOTS = ("views.render_views", "camera.cameras")


@lru_cache(maxsize=1)
def views_code_version() -> str:
    """Hash of the view-rendering code (``VIEWS_CODE_ROOTS`` and what they import)
    and the versions of the libraries that compute the pixels."""
    from importlib import metadata

    h = hashlib.sha256(f"kiln-views-cache-v{VIEWS_FORMAT}".encode())
    for dist in ("kiln3d",) + _VIEW_LIBRARIES:
        try:
            h.update(f"{dist}={metadata.version(dist)};".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=none;".encode())
    for path in _module_closure(*VIEWS_CODE_ROOTS):
        h.update(path.relative_to(_PIPELINE_DIR).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def views_key(recon_key: str, settings: Settings, backend: str, device: str, skip_front: bool = False) -> str:
    """Cache key (64 hex chars) of the bake views: the reconstruction key, every
    ``views.*`` setting but the requested backend (the resolved ``backend`` and
    ``device`` take its place: "auto" may mean either), views_code_version(), and
    ``skip_front``: the front view left out (the photo shows it)."""
    views = dict(settings.to_dict()["views"])
    views.pop("backend", None)
    h = hashlib.sha256(b"views;")
    h.update(recon_key.encode())
    h.update(json.dumps(views, sort_keys=True).encode())
    h.update(f"backend={backend};device={device};".encode())
    h.update(views_code_version().encode())
    if skip_front:
        h.update(b"without the front view;")
    return h.hexdigest()


def _views_entry(cache_dir: Path, key: str) -> Path:
    if not (len(key) == 64 and all(c in "0123456789abcdef" for c in key)):
        raise ValueError(f"not a views cache key: {key!r}")
    return Path(cache_dir) / f"views-{key}.npz"


def quantise_views(views: Views) -> Views:
    """The views as the cache stores them (float16 colour and alpha, back in float32)."""
    return Views(rgb=views.rgb.astype(np.float16).astype(np.float32),
                 alpha=views.alpha.astype(np.float16).astype(np.float32), cameras=views.cameras)


def save_views(cache_dir: Path, key: str, views: Views) -> Path | None:
    """Store ``views`` under ``key`` atomically; None when they are too big to keep.
    Evicts the least recently used view entries beyond VIEWS_MAX_TOTAL_BYTES."""
    if (views.rgb.size + views.alpha.size) * 2 > VIEWS_MAX_ENTRY_BYTES:
        return None
    path = _views_entry(cache_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    c = views.cameras
    buf = io.BytesIO()
    np.savez(buf, format=np.array(VIEWS_FORMAT, np.int32), key=np.frombuffer(key.encode(), np.uint8),
             rgb=views.rgb.astype(np.float16), alpha=views.alpha.astype(np.float16),
             viewmats=c.viewmats, Ks=c.Ks, size=np.array([c.width, c.height], np.int64))
    atomic_write(path, buf.getbuffer())
    _evict_views(Path(cache_dir), keep=path)
    return path


def load_views(cache_dir: Path, key: str, cameras: Cameras) -> Views | None:
    """The cached views for ``key`` (checked against the ``cameras`` they must have been
    rendered with), or None. A damaged or mismatching entry is removed."""
    path = _views_entry(cache_dir, key)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if int(z["format"]) != VIEWS_FORMAT or z["key"].tobytes().decode() != key:
                raise ValueError("format or key mismatch")
            rgb, alpha = z["rgb"].astype(np.float32), z["alpha"].astype(np.float32)
            same_cams = (np.array_equal(z["viewmats"], cameras.viewmats) and np.array_equal(z["Ks"], cameras.Ks)
                         and tuple(z["size"]) == (cameras.width, cameras.height))
        n, h, w = len(cameras.viewmats), cameras.height, cameras.width
        if not same_cams or rgb.shape != (n, h, w, 3) or alpha.shape != (n, h, w):
            raise ValueError("cameras or image shapes differ from the request")
        if not (np.isfinite(rgb).all() and np.isfinite(alpha).all()):
            raise ValueError("non-finite pixels")
        os.utime(path)          # recently used: eviction takes the oldest first
    except Exception as e:
        log.warning("dropping unreadable views cache entry %s: %s", path.name, e)
        path.unlink(missing_ok=True)
        return None
    return Views(rgb=rgb, alpha=alpha, cameras=cameras)


def _evict_views(cache_dir: Path, keep: Path) -> None:
    entries = []
    for p in cache_dir.glob("views-*.npz"):
        try:
            st = p.stat()
        except OSError:
            continue
        entries.append((st.st_mtime, st.st_size, p))
    total = sum(e[1] for e in entries)
    for _, size, p in sorted(entries, key=lambda e: e[0]):
        if total <= VIEWS_MAX_TOTAL_BYTES:
            break
        if p != keep:
            p.unlink(missing_ok=True)
            total -= size
