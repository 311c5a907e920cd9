"""GLB checks' shared error, and a structural check cheap enough for the app process
(standard library only: no trimesh, no pipeline).

The worker already loads every result with ``pipeline.io.export.check_glb``; this
second look (``check_glb_light``), on the supervisor's side, catches what can go wrong between the two
processes (a truncated file, a worker that claimed success and died while
writing) before a job is marked done. It reads the 12-byte header, the JSON chunk
and the BIN chunk's header, and checks that they agree with each other and with
the file size.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

_MAGIC = b"glTF"
_JSON = 0x4E4F534A
_BIN = 0x004E4942


class GLBError(ValueError):
    """The file is not a usable GLB (missing, truncated, unreadable, no triangles,
    non-finite data); the message says which check failed."""


def check_glb_light(path: Path) -> dict:
    """Return {'bytes', 'meshes', 'images', 'accessors'} or raise GLBError."""
    path = Path(path)
    if not path.is_file():
        raise GLBError(f"{path.name} does not exist")
    size = path.stat().st_size
    if size < 20:
        raise GLBError(f"{path.name} is {size} bytes, too small to be a GLB")
    with open(path, "rb") as f:
        magic, version, length = struct.unpack("<4sII", f.read(12))
        if magic != _MAGIC:
            raise GLBError(f"{path.name} does not start with the GLB magic 'glTF'")
        if version != 2:
            raise GLBError(f"{path.name} is glTF version {version}, expected 2")
        if length != size:
            raise GLBError(f"{path.name} header says {length} bytes but the file has {size} (truncated?)")
        json_len, json_type = struct.unpack("<II", f.read(8))
        if json_type != _JSON or 12 + 8 + json_len > size:
            raise GLBError(f"{path.name} has no valid JSON chunk")
        try:
            doc = json.loads(f.read(json_len).decode("utf-8").rstrip(" \x00"))
        except (UnicodeDecodeError, ValueError) as e:
            raise GLBError(f"{path.name} JSON chunk does not parse: {e}") from None
        pos = 12 + 8 + json_len
        buffers = doc.get("buffers") or []
        if buffers and "uri" not in buffers[0]:
            if pos + 8 > size:
                raise GLBError(f"{path.name} declares a binary buffer but has no BIN chunk")
            bin_len, bin_type = struct.unpack("<II", f.read(8))
            if bin_type != _BIN or pos + 8 + bin_len > size:
                raise GLBError(f"{path.name} BIN chunk header is invalid or runs past the end")
            if bin_len < int(buffers[0].get("byteLength", 0)):
                raise GLBError(f"{path.name} BIN chunk is shorter than buffer 0's byteLength")
    meshes = doc.get("meshes") or []
    if not meshes or not any(m.get("primitives") for m in meshes):
        raise GLBError(f"{path.name} contains no mesh primitives")
    return {"bytes": size, "meshes": len(meshes), "images": len(doc.get("images") or []),
            "accessors": len(doc.get("accessors") or [])}
