"""Write the results: a y-up GLB (textured or vertex-coloured) and a standard 3DGS .ply.

Kiln's world is already glTF's (y up, +z front), so no axis change happens here.
UVs: Kiln's v = 0 is the bottom of the texture image, glTF's v = 0 is the top;
trimesh's glTF exporter writes v' = 1 - v, so the texture image goes in unflipped
(row 0 = top) and texel (row, col) keeps its place.

Every file is written to a temporary name in the target folder and moved into
place with ``os.replace``, so a crash never leaves a half-written file under the
final name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kiln.atomic import atomic_write
from kiln.glb import GLBError

from pipeline.views.gaussian_math import SH_C0
from pipeline.geometry import vertex_normals
from kiln.limits import MAX_FACES, MAX_RASTER_SIDE

from pipeline.types import Gaussians, Mesh, Texture
from pipeline.validate import StageInputError, check_array

ROUGHNESS = 0.9


# --------------------------------------------------------------------------- GLB


def export_glb(mesh: Mesh, texture: Texture | None, path, texture_format: str = "png") -> Path:
    """Write ``mesh`` as a binary glTF and return its path.

    mesh:    vertices (V, 3) float32, faces (F, 3) int32; with a texture also uvs (V, 2) float32
    texture: image (S, S, 3) uint8, row 0 = top (v = 1), or None for a vertex-coloured GLB
             (mesh.vertex_colors (V, 3) float32 in [0, 1]; a plain grey material when absent)
    texture_format: how the texture is stored, "png", "jpeg" or "webp" (``EXT_texture_webp``,
             declared required: glTF 2.0 itself knows only PNG and JPEG)

    Smooth vertex normals are computed over vertices that share a position, so UV
    seams (split vertices) do not show as creases. The material is PBR with
    metallic 0 and roughness 0.9. Vertex colours are stored as glTF's COLOR_0,
    which the format defines as linear: Kiln's colours (sRGB, as image files hold
    them) are converted so a viewer shows the same colour as the textured path.
    """
    import trimesh
    from PIL import Image

    from pipeline.io.glb_texture import replace_image
    from pipeline.io.texture_file import MIME, encode_texture

    mesh.validate("mesh", max_faces=MAX_FACES)
    if texture_format not in MIME:
        raise StageInputError(f"texture format {texture_format!r} is not one of {', '.join(MIME)}")
    path = Path(path)
    tm = trimesh.Trimesh(vertices=mesh.vertices.astype(np.float64), faces=mesh.faces,
                         process=False, validate=False)
    if texture is not None:
        _check_texture(texture)
        if mesh.uvs is None:
            raise StageInputError("a textured GLB needs mesh.uvs; unwrap the mesh first")
        # a one-texel stand-in: the texture's own bytes go in below, encoded once (glb_texture)
        material = trimesh.visual.material.PBRMaterial(
            name="kiln_baked", baseColorTexture=Image.new("RGB", (1, 1)),
            baseColorFactor=[255, 255, 255, 255], metallicFactor=0.0, roughnessFactor=ROUGHNESS)
        tm.visual = trimesh.visual.TextureVisuals(uv=mesh.uvs.astype(np.float64), material=material)
    elif mesh.vertex_colors is not None:
        linear = srgb_to_linear(np.clip(mesh.vertex_colors, 0.0, 1.0))
        rgba = np.concatenate([np.rint(linear * 255.0), np.full((mesh.num_vertices, 1), 255.0)], 1)
        tm.visual = trimesh.visual.ColorVisuals(mesh=tm, vertex_colors=rgba.astype(np.uint8))
    else:
        material = trimesh.visual.material.PBRMaterial(
            name="kiln_plain", baseColorFactor=[200, 200, 200, 255], metallicFactor=0.0,
            roughnessFactor=ROUGHNESS)
        tm.visual = trimesh.visual.TextureVisuals(material=material)
    # a settable cached property in trimesh, which its annotations show as a method
    tm.vertex_normals = smooth_vertex_normals(mesh)  # type: ignore[method-assign]
    data = trimesh.exchange.gltf.export_glb(trimesh.Scene(tm), include_normals=True)
    if texture is not None:
        data = replace_image(data, encode_texture(texture.image, texture_format), MIME[texture_format])
    return atomic_write(path, data)


def check_glb(path) -> dict:
    """Load a GLB back and check it is usable before a job is reported done.

    Returns {'faces': int, 'vertices': int, 'texture_size': (w, h) or None, 'bytes': int}.
    Raises GLBError naming the problem (missing, empty, unreadable, no faces, non-finite).
    """
    import trimesh

    path = Path(path)
    if not path.is_file():
        raise GLBError(f"GLB {path} does not exist")
    size = path.stat().st_size
    if size == 0:
        raise GLBError(f"GLB {path} is empty (0 bytes)")
    try:
        scene = trimesh.load(path, file_type="glb", force="scene", process=False)
    except Exception as e:   # trimesh raises many types on corrupt input
        raise GLBError(f"GLB {path} cannot be read: {type(e).__name__}: {e}") from None
    # force="scene" makes it a trimesh.Scene (load is annotated with the base class)
    meshes = [g for g in scene.geometry.values() if isinstance(g, trimesh.Trimesh)]  # type: ignore[attr-defined]
    faces = sum(len(g.faces) for g in meshes)
    vertices = sum(len(g.vertices) for g in meshes)
    if faces == 0:
        raise GLBError(f"GLB {path} holds no triangles")
    for g in meshes:
        if not np.isfinite(g.vertices).all():
            raise GLBError(f"GLB {path} has non-finite vertex positions")
        uv = getattr(g.visual, "uv", None)
        if uv is not None and not np.isfinite(uv).all():
            raise GLBError(f"GLB {path} has non-finite texture coordinates")
    return {"faces": int(faces), "vertices": int(vertices), "texture_size": _texture_size(meshes),
            "bytes": int(size)}


def smooth_vertex_normals(mesh: Mesh) -> np.ndarray:
    """(V, 3) float32 unit normals, shared by vertices at the same position (so split
    UV-seam vertices agree); +y where there is none, as glTF wants unit normals."""
    n = vertex_normals(mesh.vertices, mesh.faces)
    n[np.linalg.norm(n, axis=1) == 0] = [0.0, 1.0, 0.0]
    return n.astype(np.float32)


def srgb_to_linear(c: np.ndarray) -> np.ndarray:
    """sRGB-encoded values in [0, 1] -> linear, same shape, float64."""
    c = np.asarray(c, np.float64)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def linear_to_srgb(c: np.ndarray) -> np.ndarray:
    """Linear values in [0, 1] -> sRGB-encoded, same shape, float64 (``srgb_to_linear``'s inverse)."""
    c = np.clip(np.asarray(c, np.float64), 0.0, 1.0)
    return np.where(c <= 0.0031308, c * 12.92, 1.055 * c ** (1 / 2.4) - 0.055)


def _check_texture(texture: Texture) -> None:
    check_array("texture.image", texture.image, dtype=np.uint8, shape=(None, None, 3))
    h, w = texture.image.shape[:2]
    if h == 0 or w == 0:
        raise StageInputError("texture.image is empty")
    if max(h, w) > MAX_RASTER_SIDE:
        raise StageInputError(f"texture.image is {w}x{h}; at most {MAX_RASTER_SIDE} texels a side")


def _texture_size(meshes) -> tuple[int, int] | None:
    for g in meshes:
        material = getattr(g.visual, "material", None)
        image = getattr(material, "baseColorTexture", None) if material is not None else None
        if image is None and material is not None:
            image = getattr(material, "image", None)
        if image is not None:
            width, height = image.size
            return int(width), int(height)
    return None


# --------------------------------------------------------------------------- Gaussians


def export_gaussians_ply(g: Gaussians, path) -> Path:
    """Write Gaussians as the binary little-endian .ply that 3DGS tools read.

    Properties per vertex (all float32): x y z, nx ny nz (0), f_dc_0..2 = (colour - 0.5) / SH_C0,
    opacity (logit), scale_0..2 (log of the standard deviations), rot_0..3 = (w, x, y, z).
    """
    from plyfile import PlyData, PlyElement

    g.validate("gaussians")
    n = len(g)
    names = (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2", "opacity"]
             + [f"scale_{i}" for i in range(3)] + [f"rot_{i}" for i in range(4)])
    rows = np.empty(n, dtype=[(name, "<f4") for name in names])
    cols = [g.means, np.zeros((n, 3), np.float32), (g.colors - 0.5) / SH_C0,
            _logit(g.opacities)[:, None], np.log(g.scales), g.quats]
    flat = np.concatenate([np.asarray(c, np.float64).reshape(n, -1) for c in cols], 1)
    for k, name in enumerate(names):
        rows[name] = flat[:, k]
    path = Path(path)
    ply = PlyData([PlyElement.describe(rows, "vertex")], text=False, byte_order="<")

    def write(f):
        ply.write(f)

    return atomic_write(path, write)


def _logit(p: np.ndarray) -> np.ndarray:
    # opacities may be exactly 1; keep the logit finite (float32 sigmoid(16.1) rounds to 1 anyway)
    p = np.clip(np.asarray(p, np.float64), 1e-7, 1.0 - 1e-7)
    return np.log(p) - np.log1p(-p)
