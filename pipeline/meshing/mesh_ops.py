"""Mesh stage: clean up a reconstructed mesh and simplify it to a target face count.

Simplification matters beyond file size: UV unwrapping and rasterization time
grow with faces (xatlas: 20k faces ~4 s, 100k ~40 s), and oversized meshes
going straight into rasterization is what crashed earlier tools.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from kiln.limits import MAX_FACES, MIN_EXACT_FACES

from pipeline.types import Mesh
from pipeline.validate import StageInputError

MERGE_TOLERANCE = 1e-7        # of the bounding-box diagonal: vertices closer than this are one
MIN_TARGET_FACES = 4
TARGET_TOLERANCE = 0.05       # simplify_mesh aims to land within 5 % of the target face count
# ... and within 2 % of an exact count asked for (``faces``): a game engine's or a printer's
# budget, which people set as a number, not as a share of a mesh they have not seen
EXACT_TOLERANCE = 0.02
# Kept faces (thin parts) only take collapses moving them less than this share of their own
# median edge: a stem keeps its width, a straight run of it still loses its extra vertices.
# 0.3 kept every stem of tests/test_thin_parts.py whole; 1.0 lost half of the 2 px one.
KEEP_TOLERANCE = 0.25
KEEP_SHARE = 0.5              # of the face target, at most, for kept faces: the body needs the rest


def _validate(mesh: Mesh) -> None:
    if isinstance(getattr(mesh, "faces", None), np.ndarray) and len(mesh.faces) > MAX_FACES:
        raise StageInputError(f"mesh has {len(mesh.faces)} faces, more than the limit {MAX_FACES} "
                              "the mesh stage handles; lower reconstruct.resolution")
    mesh.validate("mesh")


# --------------------------------------------------------------------------- cleaning

def clean_mesh(mesh: Mesh, min_component_fraction: float, fill_holes: bool) -> Mesh:
    """Merge duplicate vertices, drop degenerate and duplicate faces and small parts.

    mesh: vertices (V, 3) float32, faces (F, 3) int32, optional vertex_colors (V, 3)
    float32 and uvs (V, 2) float32 (vertices with different UVs are kept apart, so
    UV seams survive). Connected parts with fewer faces than ``min_component_fraction``
    times the largest part's are dropped. ``fill_holes`` closes boundary loops with
    triangle fans (trimesh), adding faces but no vertices.
    Returns a new Mesh with the same attributes, unreferenced vertices removed.
    """
    _validate(mesh)
    # the fraction's domain, for any caller; mesh.min_component_fraction's narrower range is
    # checked once, when settings are built (kiln.settings)
    if not 0.0 <= min_component_fraction <= 1.0:
        raise StageInputError(f"min_component_fraction must be in [0, 1], got {min_component_fraction}")

    verts, faces, colors, uvs = _merge_vertices(mesh)
    faces = _drop_degenerate(verts, faces)
    faces = _drop_duplicate_faces(faces)
    if len(faces) == 0:
        raise StageInputError("mesh has no faces left after removing degenerate and duplicate faces")
    faces = _drop_small_components(len(verts), faces, min_component_fraction)
    if fill_holes:
        faces = _fill_holes(verts, faces)
    return _compact(verts, faces, colors, uvs).validate("cleaned mesh")


def _merge_vertices(mesh: Mesh):
    v = mesh.vertices.astype(np.float64)
    diag = float(np.linalg.norm(v.max(axis=0) - v.min(axis=0))) or 1.0
    key = np.round(v / (diag * MERGE_TOLERANCE)).astype(np.int64)
    if mesh.uvs is not None:
        key = np.concatenate([key, np.round(mesh.uvs.astype(np.float64) / MERGE_TOLERANCE)
                              .astype(np.int64)], axis=1)
    _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
    # number merged vertices in order of first appearance, so a clean mesh comes back unchanged
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    inverse = rank[inverse.ravel()]
    first = first[order]
    colors = None
    if mesh.vertex_colors is not None:
        # average the colours that land on one vertex
        counts = np.bincount(inverse, minlength=len(first)).astype(np.float64)
        colors = np.stack([np.bincount(inverse, weights=mesh.vertex_colors[:, k], minlength=len(first))
                           for k in range(3)], axis=1) / counts[:, None]
        colors = colors.astype(np.float32)
    uvs = mesh.uvs[first] if mesh.uvs is not None else None
    return mesh.vertices[first], inverse[mesh.faces].astype(np.int64), colors, uvs


def _drop_degenerate(verts: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """Faces with a repeated vertex or (numerically) zero area."""
    distinct = ((faces[:, 0] != faces[:, 1]) & (faces[:, 1] != faces[:, 2])
                & (faces[:, 0] != faces[:, 2]))
    v = verts.astype(np.float64)
    cross = np.cross(v[faces[:, 1]] - v[faces[:, 0]], v[faces[:, 2]] - v[faces[:, 0]])
    diag = float(np.linalg.norm(v.max(axis=0) - v.min(axis=0))) or 1.0
    area_ok = np.linalg.norm(cross, axis=1) > (diag * MERGE_TOLERANCE) ** 2
    return faces[distinct & area_ok]


def _drop_duplicate_faces(faces: np.ndarray) -> np.ndarray:
    """Faces over the same three vertices (either winding); the first one stays."""
    _, first = np.unique(np.sort(faces, axis=1), axis=0, return_index=True)
    return faces[np.sort(first)]


def _face_components(num_vertices: int, faces: np.ndarray) -> np.ndarray:
    """(F,) int component label of each face; faces sharing a vertex are connected."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    a = np.concatenate([faces[:, 0], faces[:, 1]])
    b = np.concatenate([faces[:, 1], faces[:, 2]])
    graph = sp.coo_matrix((np.ones(a.size, np.int8), (a, b)), shape=(num_vertices, num_vertices))
    _, labels = connected_components(graph, directed=False)
    return labels[faces[:, 0]]


def _drop_small_components(num_vertices: int, faces: np.ndarray, fraction: float) -> np.ndarray:
    labels = _face_components(num_vertices, faces)
    sizes = np.bincount(labels)
    keep = sizes[labels] >= fraction * sizes.max()
    return faces[keep]


def _fill_holes(verts: np.ndarray, faces: np.ndarray) -> np.ndarray:
    import trimesh

    tm = trimesh.Trimesh(vertices=verts, faces=faces, process=False, validate=False)
    trimesh.repair.fill_holes(tm, use_fan=True)
    return np.asarray(tm.faces, dtype=np.int64)


def _compact(verts, faces, colors, uvs) -> Mesh:
    used = np.zeros(len(verts), bool)
    used[faces.ravel()] = True
    remap = np.cumsum(used) - 1
    return Mesh(
        vertices=np.ascontiguousarray(verts[used], dtype=np.float32),
        faces=np.ascontiguousarray(remap[faces], dtype=np.int32),
        vertex_colors=None if colors is None else np.ascontiguousarray(colors[used], np.float32),
        uvs=None if uvs is None else np.ascontiguousarray(uvs[used], np.float32),
    )


# --------------------------------------------------------------------------- simplification

def simplify_mesh(mesh: Mesh, ratio: float, keep: Optional[np.ndarray] = None, faces: int = 0) -> Mesh:
    """Quadric decimation (pyfqmr) removing ``ratio`` of the faces, or down to ``faces`` faces.

    The target is round(F * (1 - ratio)) faces and the result lands within 5 % of it
    (fqmr overshoots or stops short now and then, so it is retried with other
    settings and the closest result kept). ratio 0 returns ``mesh`` itself.
    ``faces`` > 0 asks for that many faces instead of a ratio, within 2 % (``EXACT_TOLERANCE``):
    more than the mesh has is refused, as many returns ``mesh`` itself.
    Vertex colours are carried over from the nearest original vertex; UVs are
    dropped (unwrap after simplifying).
    mesh: vertices (V, 3) float32, faces (F, 3) int32. Returns a new Mesh.

    keep: optional (F,) bool, faces whose shape matters more than their size says (thin
    parts, ``pipeline.meshing.thin_faces``). They are simplified apart from the rest: only
    collapses that move them less than KEEP_TOLERANCE of their median edge, while the rest
    takes what is left of the target; the cut between the two is locked in both and welded
    back. They take at most KEEP_SHARE of the target (beyond it they are decimated to it;
    with ``faces`` given, a count too small to keep them is refused instead).
    """
    _validate(mesh)
    tolerance = TARGET_TOLERANCE
    if faces:
        target = exact_target(mesh.num_faces, faces)
        if target == mesh.num_faces:
            return mesh
        tolerance = EXACT_TOLERANCE
    else:
        try:
            ratio = float(ratio)
        except (TypeError, ValueError):
            ratio = float("nan")
        # the ratio's domain (1 would remove every face), for any caller; mesh.simplify_ratio's
        # range is checked once, when settings are built (kiln.settings)
        if not 0.0 <= ratio < 1.0:
            raise StageInputError(f"simplify ratio must be in [0, 1) (the fraction of faces removed), "
                                  f"got {ratio!r}")
        if ratio == 0.0:
            return mesh
        target = int(round(mesh.num_faces * (1.0 - ratio)))
        if target < MIN_TARGET_FACES:
            raise StageInputError(f"simplify ratio {ratio} would leave {target} of the mesh's "
                                  f"{mesh.num_faces} faces; lower mesh.simplify_ratio")
    if keep is not None:
        keep = np.asarray(keep, bool)
        if keep.shape != (mesh.num_faces,):
            raise StageInputError(f"keep must be one flag per face, shape ({mesh.num_faces},), "
                                  f"got {keep.shape}")
    if keep is not None and keep.any() and not keep.all():
        verts, new_faces = _decimate_keeping(mesh.vertices, mesh.faces, keep, target, tolerance,
                                             refuse_short=bool(faces))
    else:
        verts, new_faces = _decimate(mesh.vertices, mesh.faces, target, tolerance=tolerance)
    colors = None
    if mesh.vertex_colors is not None:
        from scipy.spatial import cKDTree

        _, nearest = cKDTree(mesh.vertices).query(verts)
        colors = mesh.vertex_colors[nearest]
    return _compact(verts, new_faces, colors, None).validate("simplified mesh")


def exact_target(mesh_faces: int, faces: int) -> int:
    """The face count ``faces`` asked of a mesh of ``mesh_faces`` faces, or a StageInputError
    saying why it cannot be made: more faces than the mesh has (simplifying only removes),
    or fewer than a closed surface needs to keep its outline."""
    if faces > mesh_faces:
        raise StageInputError(f"{faces} faces asked, but the mesh has only {mesh_faces}: simplifying "
                              f"removes faces, it cannot add them; ask for {mesh_faces} or fewer")
    if faces < MIN_EXACT_FACES:
        raise StageInputError(f"{faces} faces cannot keep the object's shape (its outline needs at least "
                              f"{MIN_EXACT_FACES}); ask for more")
    return faces


def equivalent_ratio(mesh_faces: int, faces: int, ratio: float) -> float:
    """The share of faces removed: ``ratio``, or what asking for ``faces`` of ``mesh_faces``
    removes (for rules sized by the simplified mesh's edges, e.g. thin parts)."""
    return max(0.0, 1.0 - faces / max(mesh_faces, 1)) if faces else ratio


def _fqmr(vertices: np.ndarray, faces: np.ndarray, target: int, aggressiveness: float,
          preserve_border: bool, max_iterations: int = 100, lossless: Optional[float] = None):
    """One pyfqmr run: to ``target`` faces, or lossless below error ``lossless`` when given."""
    import pyfqmr

    s = pyfqmr.Simplify()
    s.setMesh(np.asarray(vertices, np.float64), np.asarray(faces, np.int32))
    if lossless is not None:
        s.simplify_mesh_lossless(verbose=False, epsilon=lossless, preserve_border=preserve_border)
    else:
        s.simplify_mesh(target_count=target, aggressiveness=aggressiveness,
                        preserve_border=preserve_border, max_iterations=max_iterations, verbose=False)
    v2, f2, _ = s.getMesh()
    return np.asarray(v2, np.float64), np.asarray(f2, np.int64)


def _decimate(vertices: np.ndarray, faces: np.ndarray, target: int, border_may_move: bool = True,
              tolerance: float = TARGET_TOLERANCE):
    """Run fqmr until within ``tolerance`` of ``target`` faces; keep the closest try.
    With ``border_may_move`` False, open borders stay where they are in every try."""
    def miss(f):
        return abs(len(f) - target) / target

    best = _fqmr(vertices, faces, target, 7.0, True)
    # Too many faces left: the error threshold grew too slowly (or borders are locked);
    # continue from the result. Too few: restart gentler, removing fewer faces per pass.
    attempts = [(9.0, True, 200), (11.0, not border_may_move, 400)] if len(best[1]) > target else \
               [(5.0, True, 200), (3.0, True, 400)]
    for aggressiveness, border, iterations in attempts:
        if miss(best[1]) <= tolerance:
            break
        start = best if len(best[1]) > target else (vertices, faces)
        trial = _fqmr(start[0], start[1], target, aggressiveness, border, iterations)
        if miss(trial[1]) < miss(best[1]):
            best = trial
    # still outside a tight tolerance (an exact count): fqmr stops a pass past its target,
    # so ask again, from the original mesh, for a target moved by what the last try missed
    ask = target
    for _ in range(4):
        if miss(best[1]) <= tolerance:
            break
        ask = max(MIN_TARGET_FACES, int(round(ask * target / max(len(best[1]), 1))))
        trial = _fqmr(vertices, faces, ask, 5.0, border_may_move, 400)
        if miss(trial[1]) < miss(best[1]):
            best = trial
    return best


def _decimate_keeping(vertices: np.ndarray, faces: np.ndarray, keep: np.ndarray, target: int,
                      tolerance: float = TARGET_TOLERANCE, refuse_short: bool = False):
    """``_decimate`` with the ``keep`` faces simplified apart (see ``simplify_mesh``).
    ``refuse_short``: a target too small for the kept faces is refused, not met by
    decimating them (an exact count asked by a person, who can ask for more)."""
    faces = np.asarray(faces, np.int64)
    v = np.asarray(vertices, np.float64)
    kept_v, kept_f = _submesh(v, faces[keep])
    rest_v, rest_f = _submesh(v, faces[~keep])
    edges = np.linalg.norm(kept_v[kept_f[:, [1, 2, 0]]] - kept_v[kept_f], axis=2)
    lossless = (KEEP_TOLERANCE * float(np.median(edges.min(axis=1)))) ** 2   # fqmr: a squared distance
    kept_v, kept_f = _fqmr(kept_v, kept_f, 0, 0.0, True, lossless=lossless)
    share = max(int(KEEP_SHARE * target), MIN_TARGET_FACES)
    if len(kept_f) > share and refuse_short:
        need = int(np.ceil(len(kept_f) / KEEP_SHARE))
        raise StageInputError(f"{target} faces cannot keep the mask's thin parts: they alone need "
                              f"{len(kept_f)} faces; ask for at least {need} faces (or set "
                              "mesh.keep_thin_parts false)")
    if len(kept_f) > share:
        kept_v, kept_f = _decimate(kept_v, kept_f, share, border_may_move=False)
    rest_target = max(target - len(kept_f), MIN_TARGET_FACES)
    # the kept faces' count is exact: the rest's share of the tolerance is the whole of it
    rest_v, rest_f = _decimate(rest_v, rest_f, rest_target, border_may_move=False,
                               tolerance=tolerance * target / rest_target)
    # the cut's vertices were locked in both halves, so they come back bit for bit
    cut = np.intersect1d(faces[keep].ravel(), faces[~keep].ravel())
    allv = np.concatenate([rest_v, kept_v])
    allf = np.concatenate([rest_f, kept_f + len(rest_v)])
    return allv, _weld(allv, v[cut])[allf]


def _submesh(vertices: np.ndarray, faces: np.ndarray):
    used, local = np.unique(faces, return_inverse=True)
    return vertices[used], local.reshape(-1, 3)


def _weld(vertices: np.ndarray, points: np.ndarray) -> np.ndarray:
    """(V,) index of each vertex after merging the vertices that sit exactly on one of ``points``."""
    row = np.dtype((np.void, 3 * 8))
    as_rows = np.ascontiguousarray(vertices, np.float64).view(row).ravel()
    on_cut = np.flatnonzero(np.isin(as_rows, np.ascontiguousarray(points, np.float64).view(row).ravel()))
    index = np.arange(len(vertices))
    if len(on_cut):
        _, first, inverse = np.unique(as_rows[on_cut], return_index=True, return_inverse=True)
        index[on_cut] = on_cut[first][inverse.ravel()]
    return index
