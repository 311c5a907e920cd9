"""Gaussian splats in the INRIA 3DGS PLY layout, as 3DGS, SAM 3D Objects, TRELLIS and
Kiln (``pipeline.io.export.export_gaussians_ply``) write them.

One ``vertex`` element, binary little-endian, one record per splat:
``x y z`` (``nx ny nz`` unused), ``f_dc_0..2`` (degree-0 spherical harmonic), optional
``f_rest_*`` (degrees 1-3, 3 x 3 / 8 / 15 coefficients), ``opacity`` as a logit,
``scale_0..2`` as logs of the standard deviations, ``rot_0..3`` = (w, x, y, z), not
normalised. Kiln's renderers take view-independent colour, so the colour is the DC term
(0.5 + SH_C0 * f_dc, clipped to [0, 1]) and the higher bands are reported, not used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kiln.limits import model_file_problem

from pipeline.views.gaussian_math import SH_C0
from pipeline.types import Gaussians
from pipeline.validate import StageInputError

MAX_HEADER_BYTES = 1 << 16
REQUIRED = (["x", "y", "z", "f_dc_0", "f_dc_1", "f_dc_2", "opacity"]
            + [f"scale_{i}" for i in range(3)] + [f"rot_{i}" for i in range(4)])
_TYPES = {"float": "<f4", "float32": "<f4", "double": "<f8", "float64": "<f8",
          "uchar": "u1", "uint8": "u1", "char": "i1", "int8": "i1", "short": "<i2", "int16": "<i2",
          "ushort": "<u2", "uint16": "<u2", "int": "<i4", "int32": "<i4", "uint": "<u4", "uint32": "<u4"}
# SH coefficients per colour channel beyond the DC term, by degree
_REST_PER_DEGREE = {0: 0, 1: 3, 2: 8, 3: 15}


@dataclass(frozen=True)
class SplatFile:
    """A splat file read into Kiln's Gaussians.

    gaussians: means/scales/quats/opacities/colors, activated (see ``Gaussians``)
    sh_degree: 0-3, from the number of ``f_rest_*`` properties
    """

    gaussians: Gaussians
    sh_degree: int

    @property
    def note(self) -> str:
        extra = (f"; its SH degree {self.sh_degree} (view-dependent colour) is baked as the "
                 "view-independent DC colour") if self.sh_degree else ""
        return f"{len(self.gaussians)} splats{extra}"


def _header(data: bytes, path: Path) -> tuple[int, int, list[tuple[str, str]]]:
    """(offset of the data, vertex count, [(property, numpy type)]) of a splat PLY."""
    end = data.find(b"end_header\n", 0, MAX_HEADER_BYTES)
    if not data.startswith(b"ply\n") or end < 0:
        raise StageInputError(f"{path.name} is not a PLY file (no 'ply' ... 'end_header' header)")
    lines = data[:end].decode("ascii", "replace").splitlines()[1:]
    fmt = next((ln.split()[1] for ln in lines if ln.startswith("format ") and len(ln.split()) > 1), "")
    if fmt != "binary_little_endian":
        raise StageInputError(f"{path.name} is a {fmt or 'format-less'} PLY; splats are read from "
                              "binary little-endian PLY files (as 3DGS, SAM 3D and TRELLIS write them)")
    elements: list[tuple[str, int, list]] = []
    for ln in lines:
        parts = ln.split()
        if not parts or parts[0] in ("comment", "obj_info", "format"):
            continue
        if parts[0] == "element" and len(parts) == 3:
            if not parts[2].isdigit():
                raise StageInputError(f"{path.name}: PLY element line {ln!r} needs a count of 0 or more")
            elements.append((parts[1], int(parts[2]), []))
        elif parts[0] == "property" and elements:
            if len(parts) >= 3 and parts[1] == "list":
                elements[-1][2].append((parts[-1], "list"))
            elif len(parts) == 3 and parts[1] in _TYPES:
                elements[-1][2].append((parts[2], _TYPES[parts[1]]))
            else:
                raise StageInputError(f"{path.name}: unsupported PLY property line {ln!r}")
    names = [e[0] for e in elements]
    if "face" in names and next(e[1] for e in elements if e[0] == "face") > 0:
        raise StageInputError(f"{path.name} holds faces: it is a mesh, not a splat; pass it as --mesh")
    if not elements or elements[0][0] != "vertex":
        raise StageInputError(f"{path.name} has no 'vertex' element first; a splat PLY holds one "
                              f"record per splat in 'vertex' (found: {', '.join(names) or 'nothing'})")
    _, count, props = elements[0]
    if any(t == "list" for _, t in props):
        raise StageInputError(f"{path.name}: list properties in 'vertex' are not a splat layout")
    names = [p for p, _ in props]
    twice = sorted({p for p in names if names.count(p) > 1})
    if twice:
        raise StageInputError(f"{path.name}: property {twice[0]!r} appears more than once in 'vertex'")
    return end + len(b"end_header\n"), count, props


def read_splat(path) -> SplatFile:
    """Read an INRIA-layout splat PLY. StageInputError names what is missing or wrong."""
    path = Path(path)
    problem = model_file_problem(path, "splat")
    if problem:
        raise StageInputError(problem)
    data = path.read_bytes()
    offset, count, props = _header(data, path)
    names = [p for p, _ in props]
    missing = [p for p in REQUIRED if p not in names]
    if missing:
        raise StageInputError(f"{path.name} is not a 3DGS splat: missing propert"
                              f"{'y' if len(missing) == 1 else 'ies'} {', '.join(missing)} "
                              f"(it has {', '.join(names[:12])}{' ...' if len(names) > 12 else ''})")
    rest = [p for p in names if p.startswith("f_rest_")]
    if any(not p[7:].isdigit() for p in rest):
        raise StageInputError(f"{path.name}: {next(p for p in rest if not p[7:].isdigit())!r} is not an "
                              "SH coefficient (f_rest_0, f_rest_1, ...)")
    rest.sort(key=lambda p: int(p[7:]))
    per_channel = len(rest) // 3
    degree = next((d for d, k in _REST_PER_DEGREE.items() if k == per_channel), None)
    if degree is None or len(rest) % 3:
        raise StageInputError(f"{path.name} has {len(rest)} f_rest_* properties; SH degrees 0-3 have "
                              "0, 9, 24 or 45")
    if count <= 0:
        raise StageInputError(f"{path.name} holds no splats")
    dtype = np.dtype(props)
    need = offset + count * dtype.itemsize
    if len(data) < need:
        raise StageInputError(f"{path.name} is truncated: {count} splats need {need} bytes, "
                              f"the file has {len(data)}")
    rec = np.frombuffer(data, dtype=dtype, count=count, offset=offset)

    def cols(*keys):
        return np.stack([rec[k].astype(np.float64) for k in keys], 1)

    means = cols("x", "y", "z")
    dc = cols("f_dc_0", "f_dc_1", "f_dc_2")
    logit = rec["opacity"].astype(np.float64)
    log_scale = cols("scale_0", "scale_1", "scale_2")
    quats = cols("rot_0", "rot_1", "rot_2", "rot_3")
    for what, a in (("positions", means), ("colours", dc), ("opacities", logit[:, None]),
                    ("scales", log_scale), ("rotations", quats)):
        bad = int((~np.isfinite(a)).any(axis=1).sum())
        if bad:
            raise StageInputError(f"{path.name}: {bad} splats have non-finite {what}")
    if (np.linalg.norm(quats, axis=1) < 1e-12).any():
        raise StageInputError(f"{path.name}: some splats have a zero rotation quaternion")
    g = Gaussians(means=means.astype(np.float32),
                  scales=np.exp(np.clip(log_scale, -30.0, 30.0)).astype(np.float32),
                  quats=quats.astype(np.float32),
                  opacities=(1.0 / (1.0 + np.exp(-np.clip(logit, -60.0, 60.0)))).astype(np.float32),
                  colors=np.clip(0.5 + SH_C0 * dc, 0.0, 1.0).astype(np.float32))
    return SplatFile(gaussians=g.validate("splat"), sh_degree=degree)
