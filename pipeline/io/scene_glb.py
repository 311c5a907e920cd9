"""One GLB from several: a scene's objects, each baked into its own GLB, joined into one file
with a node per object, named after it.

The join works on the files' JSON and binary chunks, so every texture keeps the bytes and the
encoding its bake chose (PNG, JPEG or WebP, ``pipeline.io.glb_texture``) and nothing is
decoded again. Each object's own root nodes become the children of its named node; the
objects' vertices are already in the scene's one frame, so the named nodes carry no transform.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from kiln.atomic import atomic_write
from kiln.glb import GLBError

from pipeline.io.glb_texture import join_glb, split_glb

# the glTF arrays that refer to one another by index, and which of their fields hold indices
_INDEXED = ("accessors", "bufferViews", "images", "samplers", "textures", "materials", "meshes", "nodes")


def join_scene(parts: Sequence[tuple[str, Path]], path: Path) -> Path:
    """Write the GLBs of ``parts`` ((node name, GLB path), in order) as one GLB at ``path``."""
    if not parts:
        raise GLBError("a scene needs at least one object")
    out: dict = {"asset": {"version": "2.0", "generator": "Kiln scene"}, "scene": 0,
                 "scenes": [{"nodes": []}], "buffers": [{"byteLength": 0}]}
    for key in _INDEXED:
        out[key] = []
    used: list[str] = []
    required: list[str] = []
    binary = bytearray()
    for name, glb in parts:
        doc, data = split_glb(Path(glb).read_bytes())
        if len(doc.get("buffers") or []) > 1:
            raise GLBError(f"{glb}: more than one buffer")
        base = {key: len(out[key]) for key in _INDEXED}
        binary += b"\x00" * (-len(binary) % 8)
        shift = len(binary)
        binary += data
        for view in doc.get("bufferViews") or []:
            view = dict(view, buffer=0, byteOffset=view.get("byteOffset", 0) + shift)
            out["bufferViews"].append(view)
        for acc in doc.get("accessors") or []:
            out["accessors"].append(_shifted(acc, {"bufferView": base["bufferViews"]}))
        for image in doc.get("images") or []:
            out["images"].append(_shifted(image, {"bufferView": base["bufferViews"]}))
        out["samplers"] += doc.get("samplers") or []
        for tex in doc.get("textures") or []:
            tex = _shifted(tex, {"source": base["images"], "sampler": base["samplers"]})
            for ext in (tex.get("extensions") or {}).values():
                if "source" in ext:
                    ext["source"] += base["images"]
            out["textures"].append(tex)
        for mat in doc.get("materials") or []:
            out["materials"].append(_material(mat, base["textures"]))
        for mesh in doc.get("meshes") or []:
            prims = []
            for prim in mesh.get("primitives", []):
                prim = _shifted(prim, {"indices": base["accessors"], "material": base["materials"]})
                prim["attributes"] = {k: v + base["accessors"] for k, v in prim["attributes"].items()}
                prims.append(prim)
            out["meshes"].append(dict(mesh, primitives=prims))
        for node in doc.get("nodes") or []:
            node = _shifted(node, {"mesh": base["meshes"]})
            if "children" in node:
                node["children"] = [c + base["nodes"] for c in node["children"]]
            out["nodes"].append(node)
        scene = (doc.get("scenes") or [{}])[doc.get("scene", 0)]
        out["nodes"].append({"name": name, "children": [n + base["nodes"] for n in scene.get("nodes", [])]})
        out["scenes"][0]["nodes"].append(len(out["nodes"]) - 1)
        used += [e for e in doc.get("extensionsUsed", []) if e not in used]
        required += [e for e in doc.get("extensionsRequired", []) if e not in required]
    out["buffers"][0]["byteLength"] = len(binary)
    if used:
        out["extensionsUsed"] = used
    if required:
        out["extensionsRequired"] = required
    for key in _INDEXED:
        if not out[key]:
            del out[key]
    return atomic_write(Path(path), join_glb(out, bytes(binary)))


def _shifted(item: dict, by: dict[str, int]) -> dict:
    item = dict(item)
    for key, shift in by.items():
        if key in item:
            item[key] += shift
    return item


def _material(mat: dict, textures: int) -> dict:
    """``mat`` with every texture reference (``{"index": i, ...}`` anywhere in it) shifted."""
    def walk(value, key=""):
        if isinstance(value, dict):
            moved = {k: walk(v, k) for k, v in value.items()}
            if key.endswith("Texture") and "index" in moved:
                moved["index"] += textures
            return moved
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(mat)
