"""The frames other tools write splats, meshes and cameras in, and finding which one a
splat + mesh pair uses.

A splat and its mesh often come out of one tool in different frames (the trap users hit):

| source  | splat file -> mesh file (p_mesh = R p_splat) | where it comes from |
|---------|-----------------------------------------------|---------------------|
| kiln    | identity                                      | pipeline/io/export.py writes both in Kiln's world |
| inria   | identity                                      | 3DGS scenes: a mesh extracted from the splat keeps its frame |
| sam3d   | (x, y, z) -> (x, z, -y)                       | sam-3d-objects: ``save_ply`` writes the canonical z-up frame as is; ``to_glb`` (tdfy_dit/utils/postprocessing_utils.py) turns it y up with ``vertices @ [[1,0,0],[0,0,-1],[0,1,0]]`` |
| trellis | (x, y, z) -> (x, -y, -z)                      | TRELLIS: ``save_ply`` (representations/gaussian/gaussian_model.py) applies (x, -z, y) to the canonical frame, ``to_glb`` (utils/postprocessing_utils.py) (x, z, -y): together a half turn about x |

Meshes placed in a camera's frame (SAM 3D Body; SAM 3D Objects' scene GLBs) use OpenGL's
camera convention: the camera at the origin looking down -z, y up (``CAMERA_FRAMES``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.camera.rotations import matrix_to_quat, quat_mul
from pipeline.types import Gaussians, Mesh
from pipeline.validate import StageInputError


@dataclass(frozen=True)
class Frame:
    """How a source's splat file sits relative to its mesh file: p_mesh = rotation @ p_splat."""

    source: str
    rotation: np.ndarray      # (3, 3) float64, a proper rotation
    origin: str               # where the convention comes from


def _rows(*rows) -> np.ndarray:
    return np.array(rows, np.float64)


SPLAT_TO_MESH = {
    "kiln": Frame("kiln", np.eye(3), "Kiln writes its .ply and GLB in one world frame"),
    "inria": Frame("inria", np.eye(3), "3DGS: a mesh made from a splat keeps the splat's frame"),
    "sam3d": Frame("sam3d", _rows([1, 0, 0], [0, 0, 1], [0, -1, 0]),
                   "SAM 3D Objects: canonical z-up splat; to_glb turns (x, y, z) into (x, z, -y)"),
    "trellis": Frame("trellis", _rows([1, 0, 0], [0, -1, 0], [0, 0, -1]),
                     "TRELLIS: save_ply applies (x, -z, y), to_glb (x, z, -y): a half turn about x"),
}
SOURCES = ("auto",) + tuple(SPLAT_TO_MESH)

# world -> camera (OpenCV axes) for a mesh that already sits in a camera's frame
CAMERA_FRAMES = {
    "opencv": np.eye(4),
    "opengl": np.diag([1.0, -1.0, -1.0, 1.0]),   # y up, looking down -z: flip y and z
}

# a splat fits its mesh when its centres' median distance to the surface is under this
# share of the mesh's bounding-box diagonal (Kiln's own pair: 0.001; the same pair in a
# wrong frame: 0.04-0.08 on a nearly symmetric toy)
FIT_TOLERANCE = 0.02
SURFACE_SAMPLES = 100_000
QUERY_POINTS = 20_000


def transform_gaussians(g: Gaussians, rotation: np.ndarray) -> Gaussians:
    """``g`` turned by ``rotation`` (3, 3): centres and orientations (quaternion lengths kept)."""
    rot = np.asarray(rotation, np.float64)
    if np.allclose(rot, np.eye(3)):
        return g
    q = quat_mul(np.broadcast_to(matrix_to_quat(rot), g.quats.shape), g.quats.astype(np.float64))
    return Gaussians(means=(g.means.astype(np.float64) @ rot.T).astype(np.float32), scales=g.scales,
                     quats=q.astype(np.float32), opacities=g.opacities, colors=g.colors)


class SurfaceDistance:
    """Distances to a mesh's surface, as shares of its bounding-box diagonal: to a dense
    area-weighted sample of the surface, built once and queried per candidate."""

    def __init__(self, mesh: Mesh, seed: int = 0):
        import trimesh
        from scipy.spatial import cKDTree

        tm = trimesh.Trimesh(mesh.vertices, mesh.faces, process=False, validate=False)
        samples, _ = trimesh.sample.sample_surface(tm, SURFACE_SAMPLES, seed=seed)
        self._tree = cKDTree(samples)
        self._diag = max(float(np.linalg.norm(tm.bounds[1] - tm.bounds[0])), 1e-12)
        self._rng = np.random.default_rng(seed)

    def median(self, points: np.ndarray) -> float:
        """Median distance of ``points`` (N, 3) (at most QUERY_POINTS of them, drawn evenly)."""
        pts = np.asarray(points, np.float64)
        if len(pts) > QUERY_POINTS:
            pts = pts[self._rng.choice(len(pts), QUERY_POINTS, replace=False)]
        dist, _ = self._tree.query(pts)
        return float(np.median(dist)) / self._diag


@dataclass(frozen=True)
class FrameFit:
    """Which source frame put a splat on its mesh. ``distances``: the median surface distance
    (share of the mesh's diagonal) for every distinct candidate."""

    source: str
    distance: float
    distances: dict

    @property
    def note(self) -> str:
        tried = ", ".join(f"{k} {v:.3f}" for k, v in self.distances.items())
        return (f"splat frame: {self.source} (median distance of its centres to the mesh surface "
                f"{self.distance:.4f} of the mesh's size; tried {tried})")


def fit_frame(mesh: Mesh, g: Gaussians, source: str = "auto") -> FrameFit:
    """The frame of ``source`` (checked), or with "auto" the candidate whose transform puts
    the splat's centres on the mesh surface. StageInputError when none fits, naming the
    distances and suggesting --source."""
    if source != "auto" and source not in SPLAT_TO_MESH:
        raise StageInputError(f"unknown splat source {source!r}; choose one of {', '.join(SOURCES)}")
    names = [source] if source != "auto" else ["kiln", "sam3d", "trellis"]   # inria = kiln's frame
    surface = SurfaceDistance(mesh)
    distances = {n: surface.median(transform_gaussians(g, SPLAT_TO_MESH[n].rotation).means) for n in names}
    best = min(distances, key=lambda n: distances[n])
    if distances[best] > FIT_TOLERANCE:
        tried = ", ".join(f"{k}: {v:.3f}" for k, v in distances.items())
        hint = ("; the splat may be posed differently from the mesh (pass --source to say which "
                "tool wrote them, or give a splat and mesh from the same run)")
        raise StageInputError(f"the splat does not lie on the mesh in {'any known frame' if source == 'auto' else source + ' frame'}: "
                              f"median distance of its centres to the surface, as a share of the mesh's size, "
                              f"{tried} (a fit is <= {FIT_TOLERANCE}){hint}")
    return FrameFit(best, distances[best], distances)
