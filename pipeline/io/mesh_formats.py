"""The model in the formats people ask for besides the GLB: OBJ (a zip of .obj + .mtl + the
texture), STL (for printing) and a PLY mesh with vertex colours.

Frames: the OBJ and the PLY keep Kiln's (glTF's) y-up frame, as the GLB has it. The STL is
turned z-up, the frame slicers assume for a print bed: (x, y, z) -> (x, -z, y), a rotation
(its triangles keep their winding). Units: Kiln's coordinates are taken as metres; an STL in
millimetres is scaled by 1000 (``kiln.formats.UNIT_SCALE``) and the scale is reported.

UV seams split vertices that share a position (the GLB needs one UV per vertex). The STL and
the PLY have no UVs, so those vertices are joined again (``weld``): the mesh is connected
where the surface is, which printing and repair tools want; the PLY's colour of a joined
vertex is the mean of its copies'.

Each writer writes atomically (``kiln.atomic``) and returns ``kiln.records.OutputFile``:
name, bytes, and the vertices and faces a reader finds.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Optional

import numpy as np

from kiln.atomic import atomic_write
from kiln.formats import UNIT_SCALE, UNITS, obj_zip_stem
from kiln.records import OutputFile

from pipeline.types import Mesh, Texture
from pipeline.validate import StageInputError

# the grey of a mesh without colours (as the plain GLB's material: 200 / 255)
PLAIN_GREY = 200.0 / 255.0
# vertices closer than this (in Kiln's units; the model spans about 1) are one vertex to weld
WELD_STEP = 1e-7


def vertex_colours(mesh: Mesh, texture: Optional[Texture]) -> np.ndarray:
    """(V, 3) float32 sRGB colours in [0, 1] of ``mesh``'s vertices: the texture sampled
    (bilinear) at each vertex's UV when there is one, else the mesh's vertex colours, else
    plain grey."""
    if texture is not None and mesh.uvs is not None:
        return sample_texture(texture.image, mesh.uvs)
    if mesh.vertex_colors is not None:
        return np.clip(mesh.vertex_colors, 0.0, 1.0).astype(np.float32)
    return np.full((mesh.num_vertices, 3), PLAIN_GREY, np.float32)


def sample_texture(image: np.ndarray, uvs: np.ndarray) -> np.ndarray:
    """Bilinear samples of ``image`` ((H, W, 3) uint8, row 0 = top = v 1) at ``uvs`` ((N, 2),
    texel centres at (i + 0.5) / size), clamped to the edge; (N, 3) float32 in [0, 1]
    (``pipeline.raster.image_sampling.sample_texture``, the bake's lookup)."""
    from pipeline.raster.image_sampling import sample_texture as lookup

    return np.clip(lookup(image, uvs), 0.0, 1.0)


def weld(vertices: np.ndarray, faces: np.ndarray,
         colours: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """(vertices, faces, colours) with the vertices at one position (within ``WELD_STEP``)
    joined and unused ones dropped; a joined vertex's colour is its copies' mean."""
    used = np.unique(faces)
    # positions on a fine grid, as readers join them (trimesh: 8 decimals): a pole computed
    # as sin(pi) is 1e-16 off the axis and must still be one vertex
    keys = np.round(vertices[used].astype(np.float64) / WELD_STEP).astype(np.int64)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    unique = vertices[used][first]
    inverse = inverse.reshape(-1)
    remap = np.full(len(vertices), -1, np.int64)
    remap[used] = inverse
    new_faces = remap[faces].astype(np.int32)
    new_colours = None
    if colours is not None:
        sums = np.zeros((len(unique), 3), np.float64)
        np.add.at(sums, inverse, colours[used])
        counts = np.bincount(inverse, minlength=len(unique))[:, None]
        new_colours = (sums / counts).astype(np.float32)
    return unique.astype(np.float32), new_faces, new_colours


def _as_bytes(colours: np.ndarray) -> np.ndarray:
    return np.rint(np.clip(colours, 0.0, 1.0) * 255.0).astype(np.uint8)


# --------------------------------------------------------------------------- OBJ


def export_obj_zip(mesh: Mesh, texture: Optional[Texture], path, texture_format: str = "png") -> OutputFile:
    """A zip (``path`` is ``<stem>.obj.zip``) holding ``<stem>.obj``, ``<stem>.mtl`` and
    ``<stem>.png|jpg|webp`` with a texture: one vt per vertex (OBJ's v = 0 is the image's
    bottom, as Kiln's). Without one, ``<stem>.obj`` alone with the vertex colours as
    ``v x y z r g b``, which Blender, MeshLab and trimesh read (a material would hide them
    from readers that prefer it)."""
    from pipeline.io.texture_file import SUFFIX, encode_texture

    mesh.validate("mesh")
    path = Path(path)
    stem = obj_zip_stem(path.name)
    image_name = None
    image = b""
    if texture is not None:
        if mesh.uvs is None:
            raise StageInputError("a textured OBJ needs mesh.uvs; unwrap the mesh first")
        image_name = stem + SUFFIX[texture_format]
        image = encode_texture(texture.image, texture_format)
    obj = _obj_text(mesh, None if texture is not None else vertex_colours(mesh, None), stem, image_name)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{stem}.obj", obj, compress_type=zipfile.ZIP_DEFLATED)
        if image_name:
            mtl = f"newmtl kiln_baked\nKa 0 0 0\nKd 1 1 1\nKs 0 0 0\nillum 1\nmap_Kd {image_name}\n"
            z.writestr(f"{stem}.mtl", mtl, compress_type=zipfile.ZIP_DEFLATED)
            z.writestr(image_name, image, compress_type=zipfile.ZIP_STORED)   # compressed already
    atomic_write(path, buf.getvalue())
    return OutputFile(key="obj", name=path.name, bytes=path.stat().st_size, vertices=mesh.num_vertices,
                      faces=mesh.num_faces, texture_format=texture_format if texture is not None else None,
                      up="y")


def _rows(line: str, values: np.ndarray) -> str:
    """``line`` (a %-format of one row, with its newline) over every row of ``values``."""
    return (line * len(values)) % tuple(values.reshape(-1).tolist())


def _obj_text(mesh: Mesh, colours: Optional[np.ndarray], stem: str, image_name: Optional[str]) -> str:
    from pipeline.io.export import smooth_vertex_normals

    head = f"# Kiln\n" + (f"mtllib {stem}.mtl\n" if image_name else "") + f"o {stem}\n"
    v = mesh.vertices.astype(np.float64)
    if colours is not None:
        parts = [_rows("v %.6g %.6g %.6g %.4f %.4f %.4f\n", np.concatenate([v, colours.astype(np.float64)], 1))]
    else:
        parts = [_rows("v %.6g %.6g %.6g\n", v)]
    parts.append(_rows("vn %.5f %.5f %.5f\n", smooth_vertex_normals(mesh).astype(np.float64)))
    f = mesh.faces.astype(np.int64) + 1
    if image_name is not None:
        assert mesh.uvs is not None   # export_obj_zip checked it
        parts.append(_rows("vt %.6f %.6f\n", mesh.uvs.astype(np.float64)))
        parts.append("usemtl kiln_baked\n")
        parts.append(_rows("f %d/%d/%d %d/%d/%d %d/%d/%d\n", np.repeat(f, 3, axis=1)))
    else:
        parts.append(_rows("f %d//%d %d//%d %d//%d\n", np.repeat(f, 2, axis=1)))
    return head + "".join(parts)


# --------------------------------------------------------------------------- STL


def export_stl(mesh: Mesh, path, units: str = "m") -> OutputFile:
    """A binary STL, z-up, in ``units`` ("m" or "mm"), its vertices welded."""
    import trimesh

    mesh.validate("mesh")
    if units not in UNITS:
        raise StageInputError(f"units {units!r} is not one of {', '.join(UNITS)}")
    scale = UNIT_SCALE[units]
    v, f, _ = weld(mesh.vertices, mesh.faces)
    z_up = np.stack([v[:, 0], -v[:, 2], v[:, 1]], 1).astype(np.float64) * scale
    tm = trimesh.Trimesh(vertices=z_up, faces=f, process=False, validate=False)
    path = Path(path)
    atomic_write(path, trimesh.exchange.stl.export_stl(tm))
    return OutputFile(key="stl", name=path.name, bytes=path.stat().st_size, vertices=len(v), faces=len(f),
                      units=units, scale=scale, up="z")


# --------------------------------------------------------------------------- PLY


def export_mesh_ply(mesh: Mesh, texture: Optional[Texture], path) -> OutputFile:
    """A binary PLY mesh (y-up, as the GLB) with a colour per vertex: the texture sampled at
    the vertex when there is one (``vertex_colours``), the vertices welded."""
    from plyfile import PlyData, PlyElement

    mesh.validate("mesh")
    v, f, colours = weld(mesh.vertices, mesh.faces, vertex_colours(mesh, texture))
    assert colours is not None   # weld returns colours when given them
    rgb = _as_bytes(colours)
    verts = np.empty(len(v), dtype=[("x", "<f4"), ("y", "<f4"), ("z", "<f4"),
                                    ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    verts["x"], verts["y"], verts["z"] = v[:, 0], v[:, 1], v[:, 2]
    verts["red"], verts["green"], verts["blue"] = rgb[:, 0], rgb[:, 1], rgb[:, 2]
    tris = np.empty(len(f), dtype=[("vertex_indices", "i4", (3,))])
    tris["vertex_indices"] = f
    ply = PlyData([PlyElement.describe(verts, "vertex"), PlyElement.describe(tris, "face")],
                  text=False, byte_order="<")
    path = Path(path)
    atomic_write(path, ply.write)
    return OutputFile(key="mesh_ply", name=path.name, bytes=path.stat().st_size, vertices=len(v), faces=len(f),
                      up="y")
