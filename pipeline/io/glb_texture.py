"""Put an encoded texture into a GLB that trimesh wrote.

trimesh encodes a GLB's images itself, as PNG, or as WebP or JPEG at PIL's default quality
and (for JPEG) only when the image was decoded from a JPEG; Kiln wants the one encoding it
chose (``pipeline.io.texture_file``) and no second lossy pass. So the GLB is written with a
one-texel stand-in and its image's bytes are swapped here: the binary chunk is laid out
again (every buffer view 4-byte aligned, as accessors need), the image's ``mimeType`` set,
and for WebP the texture points at its image through ``EXT_texture_webp``, which the file
then lists as used and required (glTF 2.0 itself allows only PNG and JPEG).
"""

from __future__ import annotations

import json
import struct

from kiln.glb import GLBError

_JSON = 0x4E4F534A
_BIN = 0x004E4942
WEBP_EXTENSION = "EXT_texture_webp"


def _pad(data: bytes, fill: bytes) -> bytes:
    return data + fill * (-len(data) % 4)


def split_glb(glb: bytes) -> tuple[dict, bytes]:
    """(JSON document, BIN chunk bytes) of a GLB; GLBError when it is not one."""
    if len(glb) < 20 or glb[:4] != b"glTF":
        raise GLBError("not a GLB (no 'glTF' magic)")
    json_len, json_type = struct.unpack_from("<II", glb, 12)
    if json_type != _JSON:
        raise GLBError("the GLB's first chunk is not JSON")
    doc = json.loads(glb[20:20 + json_len].decode("utf-8").rstrip(" \x00"))
    pos = 20 + json_len
    binary = b""
    if pos + 8 <= len(glb):
        bin_len, bin_type = struct.unpack_from("<II", glb, pos)
        if bin_type != _BIN:
            raise GLBError("the GLB's second chunk is not BIN")
        binary = glb[pos + 8:pos + 8 + bin_len]
    return doc, binary


def join_glb(doc: dict, binary: bytes) -> bytes:
    """A GLB of ``doc`` and ``binary`` (both chunks padded to 4 bytes as the format wants)."""
    text = _pad(json.dumps(doc, separators=(",", ":")).encode("utf-8"), b" ")
    chunks = struct.pack("<II", len(text), _JSON) + text
    if binary:
        binary = _pad(binary, b"\x00")
        chunks += struct.pack("<II", len(binary), _BIN) + binary
    return struct.pack("<4sII", b"glTF", 2, 12 + len(chunks)) + chunks


def replace_image(glb: bytes, data: bytes, mime: str, index: int = 0) -> bytes:
    """``glb`` with image ``index``'s bytes replaced by ``data`` (a ``mime`` file); with
    "image/webp" every texture of that image goes through ``EXT_texture_webp``."""
    doc, binary = split_glb(glb)
    images = doc.get("images") or []
    if index >= len(images) or "bufferView" not in images[index]:
        raise GLBError(f"the GLB has no embedded image {index}")
    target = images[index]["bufferView"]
    views = doc.get("bufferViews") or []
    out = bytearray()
    for i, view in enumerate(views):
        if view.get("buffer", 0) != 0:
            raise GLBError("the GLB has more than one buffer")
        start = view.get("byteOffset", 0)
        chunk = data if i == target else binary[start:start + view["byteLength"]]
        out += b"\x00" * (-len(out) % 4)
        view["byteOffset"] = len(out)
        view["byteLength"] = len(chunk)
        out += chunk
    doc["buffers"][0]["byteLength"] = len(out)
    images[index]["mimeType"] = mime
    if mime == "image/webp":
        for texture in doc.get("textures") or []:
            if texture.get("source") == index:
                del texture["source"]
                texture.setdefault("extensions", {})[WEBP_EXTENSION] = {"source": index}
        for key in ("extensionsUsed", "extensionsRequired"):
            if WEBP_EXTENSION not in doc.setdefault(key, []):
                doc[key].append(WEBP_EXTENSION)
    return join_glb(doc, bytes(out))
