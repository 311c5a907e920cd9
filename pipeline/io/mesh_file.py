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

from kiln.limits import MAX_FACES, MAX_MODEL_FILE_BYTES

from ..types import Mesh
from ..validate import StageInputError

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
    if not path.is_file():
        raise StageInputError(f"{path} does not exist")
    size = path.stat().st_size
    if size > MAX_MODEL_FILE_BYTES:
        raise StageInputError(f"{path.name} is {size / 2 ** 30:.1f} GiB; Kiln reads model files of at "
                              f"most {MAX_MODEL_FILE_BYTES / 2 ** 30:.0f} GiB")
    try:
        loaded = trimesh.load(path, process=False, maintain_order=True)
    except Exception as e:   # trimesh raises many types on corrupt input
        raise StageInputError(f"{path.name} cannot be read as {fmt.upper()}: {type(e).__name__}: {e}") from None
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
    uvs, texture, colours = _visual(tm, fmt, notes)
    mesh = Mesh(vertices=vertices.astype(np.float32), faces=faces.astype(np.int32),
                vertex_colors=colours, uvs=uvs)
    return MeshFile(mesh=mesh.validate(path.name, max_faces=MAX_FACES), texture=texture,
                    format=fmt, notes=tuple(notes))


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
                raise StageInputError(f"{path.name} holds only points: this looks like a splat or point "
                                      "cloud; pass it as --splat")
            raise StageInputError(f"{path.name} holds no triangle mesh")
        if len(meshes) > 1:
            notes.append(f"{len(meshes)} meshes in the file, joined into one")
            return trimesh.util.concatenate(meshes), notes
        return meshes[0], notes
    if isinstance(loaded, trimesh.PointCloud):
        raise StageInputError(f"{path.name} has no faces: this looks like a splat or point cloud; "
                              "pass it as --splat")
    if not isinstance(loaded, trimesh.Trimesh):
        raise StageInputError(f"{path.name} holds no triangle mesh (trimesh read a {type(loaded).__name__})")
    return loaded, notes


def _visual(tm, fmt: str, notes: list[str]):
    """(uvs (V, 2) float32 or None, texture (H, W, 3) uint8 or None, vertex colours or None)."""
    from ..export import linear_to_srgb

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
            texture = np.asarray(image.convert("RGB"), np.uint8)
    elif getattr(visual, "kind", None) == "vertex":
        rgba = np.asarray(visual.vertex_colors, np.float64)[:, :3] / 255.0
        colours = (linear_to_srgb(rgba) if fmt in ("glb", "gltf") else rgba).astype(np.float32)
    return uvs, texture, colours
