"""Meshes other tools wrote (GLB/glTF, OBJ with its MTL, PLY, STL), read through trimesh into
Kiln's ``Mesh``, with their UVs, vertex colours and base-colour texture when they have them.

Positions stay in the file's own frame (a GLB's is glTF's: y up), so a baked result lines up
with the file it came from. UVs follow Kiln's convention (v = 0 is the bottom row of the
texture image; trimesh already turns glTF's top-left origin round). glTF stores vertex
colours linear, the other formats as image files do (sRGB): they are brought to sRGB, which
Kiln's meshes hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from kiln.limits import MAX_FACES, MAX_RASTER_SIDE, model_file_problem

from pipeline.types import Mesh
from pipeline.validate import StageInputError

FORMATS = {".glb": "glb", ".gltf": "gltf", ".obj": "obj", ".ply": "ply", ".stl": "stl"}


@dataclass(frozen=True)
class MeshFile:
    """A mesh file as Kiln reads it.

    mesh:    vertices (V, 3) float32, faces (F, 3) int32, uvs (V, 2) float32 or None,
             vertex_colors (V, 3) float32 sRGB in [0, 1] or None
    texture: (H, W, 3) uint8 base-colour image (row 0 = top) the UVs index, or None
    format:  "glb" | "gltf" | "obj" | "ply" | "stl"
    notes:   what a person should know about how it was read
    """

    mesh: Mesh
    texture: Optional[np.ndarray]
    format: str
    notes: tuple[str, ...] = ()


def mesh_format(path: Path) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise StageInputError(f"{path.name}: unknown mesh type {path.suffix or '(no extension)'}; "
                              f"Kiln reads {', '.join(sorted(FORMATS))}")
    return fmt


def read_mesh(path) -> MeshFile:
    """Read a mesh file. StageInputError names what is wrong (type, size, no faces, a point
    cloud given as a mesh, non-finite positions, too many faces)."""
    import trimesh

    path = Path(path)
    fmt = mesh_format(path)
    problem = model_file_problem(path, "model")
    if problem:
        raise StageInputError(problem)
    if fmt == "glb":
        _check_glb_layout(path)
    try:
        loaded = trimesh.load(path, process=False, maintain_order=True)
        return _from_loaded(loaded, path, fmt)
    except StageInputError:
        raise
    except Exception as e:   # trimesh raises many types on corrupt input, and decodes textures lazily
        raise StageInputError(f"{path.name} cannot be read as {fmt.upper()}: {type(e).__name__}: {e}") from None


def _from_loaded(loaded, path: Path, fmt: str) -> MeshFile:
    """Kiln's MeshFile from what trimesh loaded (its textures are decoded only now, by PIL)."""
    tm, notes = _one_mesh(loaded, path)
    faces = np.asarray(tm.faces)
    if len(faces) == 0:
        if fmt == "ply":
            raise StageInputError(f"{path.name} has no faces: this looks like a splat or point cloud; "
                                  "pass it as --splat")
        raise StageInputError(f"{path.name} holds no triangles")
    if len(faces) > MAX_FACES:
        raise StageInputError(f"{path.name} has {len(faces)} faces, more than Kiln takes ({MAX_FACES}); "
                              "simplify it first")
    vertices = np.asarray(tm.vertices, np.float64)
    if not np.isfinite(vertices).all():
        bad = int((~np.isfinite(vertices)).any(axis=1).sum())
        raise StageInputError(f"{path.name}: {bad} vertices have non-finite positions (NaN or inf)")
    uvs, texture, colours = _visual(tm, fmt, notes, path.name)
    mesh = Mesh(vertices=vertices.astype(np.float32), faces=faces.astype(np.int32),
                vertex_colors=colours, uvs=uvs)
    return MeshFile(mesh=mesh.validate(path.name, max_faces=MAX_FACES), texture=texture,
                    format=fmt, notes=tuple(notes))


def _check_glb_layout(path: Path) -> None:
    """Refuse a GLB whose header or chunk lengths do not match the file, before trimesh reads it:
    trimesh believes them, so a flipped bit in a chunk's length makes it allocate up to 4 GiB
    (``read(length)``), and it reads bytes past the header's total length as further chunks.
    The glTF spec: the total length is the file's, and the chunks fill it exactly."""
    import struct

    size = path.stat().st_size
    bad = f"{path.name} cannot be read as GLB:"
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 12:
            raise StageInputError(f"{bad} it has {size} bytes, fewer than a GLB header's 12")
        magic, version, length = struct.unpack("<4sII", head)
        if magic != b"glTF":
            raise StageInputError(f"{bad} it does not start with 'glTF'")
        if length != size:
            what = "truncated" if length > size else "corrupt (bytes after its end)"
            raise StageInputError(f"{bad} it is {what}: its header says {length} bytes, the file has {size}")
        at = 12
        while at + 8 <= length:
            f.seek(at)
            chunk_length, _ = struct.unpack("<II", f.read(8))
            if at + 8 + chunk_length > length:
                raise StageInputError(f"{bad} it is corrupt: a chunk of {chunk_length} bytes at byte {at} "
                                      f"runs past the end of the file ({length} bytes)")
            at += 8 + chunk_length
        if at != length:
            raise StageInputError(f"{bad} it is corrupt: its chunks end at byte {at}, not at its end ({length})")


def _one_mesh(loaded, path: Path):
    """A single Trimesh from what trimesh loaded (a scene's meshes joined, transforms applied)."""
    import trimesh

    notes: list[str] = []
    if isinstance(loaded, trimesh.Scene):
        meshes = [g for g in loaded.dump() if isinstance(g, trimesh.Trimesh)] \
            if hasattr(loaded, "dump") else []
        if not meshes:
            points = [g for g in loaded.geometry.values() if isinstance(g, trimesh.PointCloud)]
            if points:
                raise StageInputError(_only_points(path))
            raise StageInputError(f"{path.name} holds no triangle mesh")
        if len(meshes) > 1:
            notes.append(f"{len(meshes)} meshes in the file, joined into one")
            return trimesh.util.concatenate(meshes), notes
        return meshes[0], notes
    if isinstance(loaded, trimesh.PointCloud):
        raise StageInputError(_only_points(path))
    if not isinstance(loaded, trimesh.Trimesh):
        raise StageInputError(f"{path.name} holds no triangle mesh (trimesh read a {type(loaded).__name__})")
    return loaded, notes


def _only_points(path: Path) -> str:
    if path.suffix.lower() == ".ply":   # the format splats come in
        return f"{path.name} has no faces: this looks like a splat or point cloud; pass it as --splat"
    return f"{path.name} holds no triangles, only points"


def _visual(tm, fmt: str, notes: list[str], name: str = "mesh"):
    """(uvs (V, 2) float32 or None, texture (H, W, 3) uint8 or None, vertex colours or None)."""
    from pipeline.io.export import linear_to_srgb

    visual = tm.visual
    uvs = texture = colours = None
    uv = getattr(visual, "uv", None)
    if uv is not None and len(uv) == len(tm.vertices):
        uv = np.asarray(uv, np.float64)
        if np.isfinite(uv).all():
            uvs = uv.astype(np.float32)
        else:
            notes.append("its UVs have non-finite values and were dropped")
        material = getattr(visual, "material", None)
        image = None
        if material is not None:
            image = getattr(material, "baseColorTexture", None) or getattr(material, "image", None)
        if image is not None:
            # PIL decodes on convert(): check the size its header claims first
            if image.width * image.height > MAX_RASTER_SIDE ** 2 or min(image.size) < 1:
                raise StageInputError(f"{name}: its texture is {image.width}x{image.height} pixels; Kiln reads "
                                      f"textures of at most {MAX_RASTER_SIDE}x{MAX_RASTER_SIDE}")
            texture = np.asarray(image.convert("RGB"), np.uint8)
    elif getattr(visual, "kind", None) == "vertex":
        rgba = np.asarray(visual.vertex_colors, np.float64)[:, :3] / 255.0
        colours = (linear_to_srgb(rgba) if fmt in ("glb", "gltf") else rgba).astype(np.float32)
    return uvs, texture, colours


def companions(path) -> tuple[list[Path], list[str]]:
    """(the files a mesh file refers to, relative to its folder; notes on those it cannot
    use): an OBJ's ``mtllib`` files and the textures they name, a glTF's external buffers
    and images. A job copies them beside the mesh, keeping these relative names, so the
    reader finds them as it would next to the original. Missing ones are left out (the
    reader then says what it lacks: no texture, say); a reference outside the mesh's folder
    is left out and named."""
    import json

    path = Path(path)
    fmt = mesh_format(path)
    refs: list[str] = []
    if fmt == "obj":
        for mtl in _lines_after(path, "mtllib"):
            refs.append(mtl)
            mtl_path = path.parent / mtl
            if mtl_path.is_file():
                refs += [ln.split()[-1] for ln in mtl_path.read_text(errors="replace").splitlines()
                         if ln.strip().split(" ")[0] in ("map_Kd", "map_Ka", "map_d") and len(ln.split()) > 1]
    elif fmt == "gltf":
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return [], []   # the reader says what is wrong with it
        refs = [str(item["uri"]) for key in ("buffers", "images") for item in doc.get(key, [])
                if isinstance(item, dict) and "uri" in item and not str(item["uri"]).startswith("data:")]
    found: list[Path] = []
    notes: list[str] = []
    base = path.parent.resolve()
    for ref in dict.fromkeys(refs):
        cand = (path.parent / ref).resolve()
        if not cand.is_relative_to(base):
            notes.append(f"{ref}: outside the mesh's folder, left out")
        elif cand.is_file():
            found.append(cand.relative_to(base))
    return found, notes


def _lines_after(path: Path, keyword: str) -> list[str]:
    out = []
    with open(path, "r", errors="replace") as f:
        for line in f:
            if line.startswith(keyword + " "):
                out.append(line[len(keyword) + 1:].strip())
    return out
