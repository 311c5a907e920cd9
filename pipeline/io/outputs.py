"""Every file a job's export writes, from one call: the GLB (always: the job's primary output,
the one checked and shown) and the formats of ``export.formats`` beside it, named by
``kiln.formats`` (``<name>.glb``, ``<name>.obj.zip``, ``<name>.stl``, ``<name>.mesh.ply``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from kiln.formats import output_key, output_name
from kiln.records import OutputFile
from kiln.settings import ExportSettings

from pipeline.types import Mesh, Texture


def write_outputs(mesh: Mesh, texture: Optional[Texture], out_dir, name: str,
                  export: ExportSettings) -> tuple[OutputFile, ...]:
    """Write the GLB and the other formats asked for into ``out_dir``, each atomically; the
    GLB first in the answer. ``texture`` None: a vertex-coloured model (no bake)."""
    from pipeline.io import mesh_formats
    from pipeline.io.export import export_glb

    out = Path(out_dir)
    glb = export_glb(mesh, texture, out / output_name(name, "glb"), texture_format=export.texture_format)
    files = [OutputFile(key="glb", name=glb.name, bytes=glb.stat().st_size, vertices=mesh.num_vertices,
                        faces=mesh.num_faces, texture_format=export.texture_format if texture is not None else None,
                        up="y")]
    for fmt in export.formats:
        key = output_key(fmt)
        path = out / output_name(name, key)
        if key == "obj":
            files.append(mesh_formats.export_obj_zip(mesh, texture, path, export.texture_format))
        elif key == "stl":
            files.append(mesh_formats.export_stl(mesh, path, export.units))
        elif key == "mesh_ply":
            files.append(mesh_formats.export_mesh_ply(mesh, texture, path))
    return tuple(files)
