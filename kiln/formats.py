"""The files a job can write, by one name each: what ``--format`` accepts, what each file is
called beside the GLB, and which key it has in a job's outputs.

Pure Python: the settings, the worker, the pipeline and every front end name files by this
table, so a name is spelled once.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

# What ``export.formats`` / ``--format`` accepts. The GLB is always written: it is the job's
# primary output, the one the worker checks and the viewer shows.
FORMATS = ("glb", "obj", "stl", "ply")
PRIMARY = "glb"
TEXTURE_FORMATS = ("png", "jpeg", "webp")
UNITS = ("m", "mm")
# Kiln's model coordinates are taken as metres; an STL in millimetres is scaled by this
UNIT_SCALE = {"m": 1.0, "mm": 1000.0}

# a job's output key -> the file name's tail after the stem. "ply" is the Gaussians' .ply
# (``export.gaussians_ply``, older than the mesh formats), so the mesh PLY is "mesh_ply".
OUTPUT_TAIL = {"glb": ".glb", "ply": ".ply", "obj": ".obj.zip", "stl": ".stl", "mesh_ply": ".mesh.ply"}
# the formats besides the GLB, in the order front ends list them
EXTRA_OUTPUTS = ("obj", "stl", "mesh_ply")
# what a person reads for each output
OUTPUT_LABEL = {"glb": "GLB", "ply": "Gaussians (.ply)", "obj": "OBJ (.zip: .obj + .mtl + texture)",
                "stl": "STL", "mesh_ply": "PLY mesh (vertex colours)"}


def output_key(fmt: str) -> str:
    """The outputs key of a format of ``FORMATS`` ("ply" -> "mesh_ply")."""
    return "mesh_ply" if fmt == "ply" else fmt


def format_of(key: str) -> str:
    """The ``--format`` name of an outputs key ("mesh_ply" -> "ply"), a scene object's too
    ("mesh_ply@bench" -> "ply")."""
    key = base_key(key)
    return "ply" if key == "mesh_ply" else key


def object_key(key: str, name: str) -> str:
    """The outputs key of one object's file of a scene bake: ``obj@bench``."""
    return f"{key}@{name}"


def base_key(key: str) -> str:
    """The format's outputs key of ``key``, an object's (``obj@bench`` -> ``obj``) or not."""
    return key.split("@", 1)[0]


def extra_keys(keys: Iterable[str]) -> list[str]:
    """The other formats' output keys among ``keys`` (any iterable of keys) in the order front
    ends list them: ``EXTRA_OUTPUTS``' order, then a scene's objects' (``obj@bench``) sorted."""
    given = set(keys)
    return [k for k in EXTRA_OUTPUTS if k in given] + sorted(k for k in given if "@" in k and base_key(k) in EXTRA_OUTPUTS)


def output_name(stem: str, key: str) -> str:
    """The file name of output ``key`` for a job whose GLB is ``<stem>.glb``; a scene object's
    file (``obj@bench``) is ``<stem>.bench.obj.zip``."""
    base, _, name = key.partition("@")
    return stem + (f".{name}" if name else "") + OUTPUT_TAIL[base]


def output_path(glb: str | Path, key: str) -> Path:
    """Where output ``key`` goes beside the GLB at ``glb`` (same folder, same stem)."""
    glb = Path(glb)
    return glb.with_name(output_name(glb.stem if glb.suffix.lower() == ".glb" else glb.name, key))


def human_bytes(n: int) -> str:
    """1234567 -> '1.2 MB' (decimal units, as file managers and browsers show sizes)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def obj_zip_stem(name: str) -> str:
    """The stem of an OBJ zip's name: 'horse-1.obj.zip' -> 'horse-1'."""
    return name.removesuffix(".zip").removesuffix(".obj") or "model"


def renamed_obj_zip(src: str | Path, stem: str) -> bytes:
    """The OBJ zip at ``src`` (``pipeline.io.mesh_formats.export_obj_zip``'s: ``<old>.obj``,
    ``<old>.mtl`` and maybe ``<old>.<image>``) with its members named ``<stem>.*`` and the
    references between them (``mtllib``, ``map_Kd``) following. A job writes its files as
    'model'; a person gets them named after their photo, so two models unzipped into one
    folder do not overwrite each other."""
    import io
    import zipfile

    old = obj_zip_stem(Path(src).name)
    buf = io.BytesIO()
    with zipfile.ZipFile(src) as z_in, zipfile.ZipFile(buf, "w") as z_out:
        for info in z_in.infolist():
            data = z_in.read(info)
            if not info.filename.startswith(old + "."):
                z_out.writestr(info, data)
                continue
            suffix = info.filename[len(old):]
            if suffix == ".obj":
                data = data.replace(f"mtllib {old}.mtl\n".encode(), f"mtllib {stem}.mtl\n".encode(), 1)
            elif suffix == ".mtl":
                data = data.replace(f"map_Kd {old}.".encode(), f"map_Kd {stem}.".encode())
            z_out.writestr(stem + suffix, data, compress_type=info.compress_type)
    return buf.getvalue()


def copy_output(key: str, src: str | Path, dst: str | Path) -> Path:
    """Copy output ``key`` of a job to ``dst`` atomically (``kiln.atomic``); an OBJ zip's
    members are named after ``dst`` (``renamed_obj_zip``)."""
    from kiln.atomic import atomic_copy, atomic_write

    if base_key(key) == "obj":
        return atomic_write(dst, renamed_obj_zip(src, obj_zip_stem(Path(dst).name)))
    return atomic_copy(src, dst)
