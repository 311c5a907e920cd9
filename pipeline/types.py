"""Plain data passed between stages. Every array's dtype and shape is documented.

Conventions used everywhere in Kiln (see ``pipeline/camera/cameras.py``):

* World space is right-handed, **y up**, the object's front faces **+z**; the
  reconstructed object is normalised into the cube [-0.5, 0.5]^3 at the origin.
  This is glTF's convention, so export needs no axis change.
* Cameras follow OpenCV (and gsplat): camera x right, y down, looking along +z.
  ``viewmats`` map world to camera; ``Ks`` are pinhole intrinsics in pixels,
  with pixel (col, row) covering [col, col+1) x [row, row+1), so the centre of
  the top-left pixel is (0.5, 0.5). Image row 0 is the top of the image.
* Colours are float32 in [0, 1], linear in the sense of "what the image file
  holds" (no colour management).
* Triangle ids are int32 with -1 meaning "no triangle"; barycentric weights are
  for the triangle's vertices (v0, v1, v2) and sum to 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from kiln.limits import MAX_PHOTO_SIDE, MAX_RASTER_SIDE

from pipeline.validate import StageInputError, check_array, check_finite, is_tensor

# More Gaussians than any stage can hold (the renderers keep ~200 bytes each per
# view in flight); such a count is a bug upstream, refused before any work.
MAX_GAUSSIANS = 10_000_000


@dataclass
class ImageInput:
    """A photo and the object's mask.

    rgb:  (H, W, 3) uint8
    mask: (H, W) bool, True on the object
    """

    rgb: np.ndarray
    mask: np.ndarray

    def validate(self) -> "ImageInput":
        check_array("image", self.rgb, dtype=np.uint8, shape=(None, None, 3))
        check_array("mask", self.mask, dtype=np.bool_, shape=self.rgb.shape[:2])
        return self


@dataclass
class Mesh:
    """A triangle mesh, optionally with per-vertex colours and a UV layout.

    vertices:      (V, 3) float32, world space
    faces:         (F, 3) int32, indices into vertices, counter-clockwise seen from outside
    vertex_colors: (V, 3) float32 in [0, 1] or None
    uvs:           (V, 2) float32 in [0, 1] or None; v = 0 is the *bottom* row of
                   the texture image (glTF flips this on export, see export.py)

    ``validate`` checks a mesh once: it remembers the arrays it passed, so each stage a
    mesh goes through may call it and only the first pays for the scans (finiteness, face
    indices). Stages make new meshes rather than change arrays in place, so the memory holds.
    """

    vertices: np.ndarray
    faces: np.ndarray
    vertex_colors: Optional[np.ndarray] = None
    uvs: Optional[np.ndarray] = None
    _checked: Optional[tuple] = field(default=None, init=False, repr=False, compare=False)

    def _arrays(self) -> tuple:
        """The identity of the arrays this mesh holds (alive as long as the mesh is)."""
        return tuple((id(a), getattr(a, "shape", None), getattr(a, "dtype", None))
                     for a in (self.vertices, self.faces, self.vertex_colors, self.uvs))

    @property
    def num_vertices(self) -> int:
        return int(self.vertices.shape[0])

    @property
    def num_faces(self) -> int:
        return int(self.faces.shape[0])

    def validate(self, name: str = "mesh", max_faces: int | None = None) -> "Mesh":
        if self._checked is not None and self._checked == self._arrays():
            if max_faces is not None and self.num_faces > max_faces:
                raise StageInputError(f"{name} has {self.num_faces} faces, more than the limit "
                                      f"{max_faces}; simplify more (raise mesh.simplify_ratio)")
            return self
        check_array(f"{name}.vertices", self.vertices, dtype=np.float32, shape=(None, 3))
        check_finite(f"{name}.vertices", self.vertices)
        check_array(f"{name}.faces", self.faces, dtype=np.int32, shape=(None, 3))
        if self.num_faces == 0:
            raise StageInputError(f"{name} has no faces")
        if max_faces is not None and self.num_faces > max_faces:
            raise StageInputError(f"{name} has {self.num_faces} faces, more than the limit {max_faces}; "
                                  "simplify more (raise mesh.simplify_ratio)")
        if self.faces.min() < 0 or self.faces.max() >= self.num_vertices:
            raise StageInputError(f"{name}.faces index vertices outside 0..{self.num_vertices - 1}")
        if self.vertex_colors is not None:
            check_array(f"{name}.vertex_colors", self.vertex_colors, dtype=np.float32,
                        shape=(self.num_vertices, 3))
            check_finite(f"{name}.vertex_colors", self.vertex_colors)
        if self.uvs is not None:
            check_array(f"{name}.uvs", self.uvs, dtype=np.float32, shape=(self.num_vertices, 2))
            check_finite(f"{name}.uvs", self.uvs)
        self._checked = self._arrays()
        return self


@dataclass
class Gaussians:
    """3D Gaussians, the parametrisation gsplat and the 3DGS .ply format use.

    means:     (N, 3) float32, world space centres
    scales:    (N, 3) float32, > 0, standard deviations along the local axes (not log)
    quats:     (N, 4) float32, rotation as (w, x, y, z), unit length
    opacities: (N,)   float32 in (0, 1] (not logit)
    colors:    (N, 3) float32 in [0, 1], view-independent colour
    """

    means: np.ndarray
    scales: np.ndarray
    quats: np.ndarray
    opacities: np.ndarray
    colors: np.ndarray

    def __len__(self) -> int:
        return int(self.means.shape[0])

    def validate(self, name: str = "gaussians") -> "Gaussians":
        check_array(f"{name}.means", self.means, dtype=np.float32, shape=(None, 3))
        n = len(self)
        if n == 0:
            raise StageInputError(f"{name} is empty")
        if n > MAX_GAUSSIANS:
            raise StageInputError(f"{name} holds {n} Gaussians, more than the limit {MAX_GAUSSIANS}")
        check_array(f"{name}.scales", self.scales, dtype=np.float32, shape=(n, 3))
        check_array(f"{name}.quats", self.quats, dtype=np.float32, shape=(n, 4))
        check_array(f"{name}.opacities", self.opacities, dtype=np.float32, shape=(n,))
        check_array(f"{name}.colors", self.colors, dtype=np.float32, shape=(n, 3))
        for k in ("means", "scales", "quats", "opacities", "colors"):
            check_finite(f"{name}.{k}", getattr(self, k))
        if (self.scales <= 0).any():
            raise StageInputError(f"{name}.scales must be positive")
        return self


PROJECTIONS = ("perspective", "orthographic")


@dataclass
class Cameras:
    """C cameras sharing one image size and one projection.

    viewmats: (C, 4, 4) float32, world -> camera (OpenCV axes)
    Ks:       (C, 3, 3) float32, intrinsics in pixels
    width, height: image size in pixels
    projection: "perspective" (pinhole: pixel = K @ (x/z, y/z, 1)) or
                "orthographic" (pixel = K @ (x, y, 1); camera z only orders depth).
                The Gaussian renderers take perspective cameras only.
    """

    viewmats: np.ndarray
    Ks: np.ndarray
    width: int
    height: int
    projection: str = "perspective"

    def __len__(self) -> int:
        return int(self.viewmats.shape[0])

    def validate(self, name: str = "cameras", max_side: int = MAX_RASTER_SIDE) -> "Cameras":
        """Shapes, finiteness, whole-pixel sizes within 1..``max_side`` (a raster's, unless
        the caller describes something never drawn at its size), a known projection."""
        check_array(f"{name}.viewmats", self.viewmats, dtype=np.float32, shape=(None, 4, 4))
        c = len(self)
        if c == 0:
            raise StageInputError(f"{name} is empty")
        check_array(f"{name}.Ks", self.Ks, dtype=np.float32, shape=(c, 3, 3))
        check_finite(f"{name}.viewmats", self.viewmats)
        check_finite(f"{name}.Ks", self.Ks)
        for side in (self.width, self.height):
            if isinstance(side, bool) or not isinstance(side, (int, np.integer)):
                raise StageInputError(f"{name} image size must be whole pixels, got "
                                      f"{self.width!r} x {self.height!r}")
        if not (1 <= self.width <= max_side and 1 <= self.height <= max_side):
            raise StageInputError(f"{name} image size {self.width}x{self.height} is outside 1..{max_side}")
        if self.projection not in PROJECTIONS:
            raise StageInputError(f"{name} projection {self.projection!r} is not one of "
                                  + ", ".join(PROJECTIONS))
        return self


@dataclass
class Views:
    """Rendered images of the object, one per camera.

    rgb:   (C, H, W, 3) float32 in [0, 1], straight (not premultiplied) colour
    alpha: (C, H, W)    float32 in [0, 1], accumulated opacity
    Both numpy arrays, or both torch tensors on the render device when the renderer was
    asked to keep them there (``render_gaussians(..., as_tensors=True)``).
    """

    rgb: np.ndarray
    alpha: np.ndarray
    cameras: Cameras

    @property
    def on_device(self) -> bool:
        """True when rgb and alpha are torch tensors (on whatever device rendered them)."""
        return not isinstance(self.rgb, np.ndarray)

    def validate(self, name: str = "views") -> "Views":
        """Shapes, dtypes and finiteness, for numpy arrays and device tensors alike (a
        tensor is checked on its device, without copying it to the host)."""
        if not isinstance(self.cameras, Cameras):
            raise StageInputError(f"{name}.cameras must be Cameras, got {type(self.cameras).__name__}")
        self.cameras.validate(f"{name}.cameras")
        c, h, w = len(self.cameras), self.cameras.height, self.cameras.width
        check_array(f"{name}.rgb", self.rgb, dtype=np.float32, shape=(c, h, w, 3), allow_tensor=True)
        check_array(f"{name}.alpha", self.alpha, dtype=np.float32, shape=(c, h, w), allow_tensor=True)
        if is_tensor(self.rgb) != is_tensor(self.alpha) or \
                (is_tensor(self.rgb) and self.rgb.device != self.alpha.device):
            raise StageInputError(f"{name}.rgb and {name}.alpha must be on one device")
        check_finite(f"{name}.rgb", self.rgb)
        check_finite(f"{name}.alpha", self.alpha)
        return self

    def to_numpy(self) -> "Views":
        """These views with numpy arrays (copied off the device), or ``self`` when they are."""
        if not self.on_device:
            return self
        # tensors here: Views are typed as numpy, and hold torch tensors on the render device
        return Views(rgb=self.rgb.detach().cpu().numpy(),  # type: ignore[attr-defined]
                     alpha=self.alpha.detach().cpu().numpy(),  # type: ignore[attr-defined]
                     cameras=self.cameras)


@dataclass
class Raster:
    """Per-pixel visibility from rasterizing a mesh, in camera views or UV space.

    tri_id: (C, H, W)    int32, index of the visible face, -1 where none
    bary:   (C, H, W, 3) float32, weights of the face's vertices v0, v1, v2 (0 where none)
    depth:  (C, H, W)    float32, camera-space z (distance along the view axis), 0 where none;
                         for UV-space rasterization it is 0 everywhere
    Row 0 is the top of the image. For UV space, texel (row, col) is at
    uv = ((col + 0.5) / S, 1 - (row + 0.5) / S).
    """

    tri_id: np.ndarray
    bary: np.ndarray
    depth: np.ndarray

    @property
    def covered(self) -> np.ndarray:
        return self.tri_id >= 0


@dataclass
class SourceCamera:
    """The camera the input photo was taken with, in the reconstruction's world frame.

    viewmat: (4, 4) float32, world -> camera (OpenCV axes, like ``Cameras.viewmats``)
    K:       (3, 3) float32, intrinsics in pixels of the *original* photo, before any
             downscaling for reconstruction (top-left pixel centre at (0.5, 0.5))
    width, height: the original photo's size in pixels
    projection: "perspective" or "orthographic" (see ``Cameras``)

    Projecting the reconstruction's mesh with it lands on the photo's mask.
    """

    viewmat: np.ndarray
    K: np.ndarray
    width: int
    height: int
    projection: str = "perspective"

    def as_cameras(self) -> Cameras:
        """This camera as a one-view ``Cameras`` at the photo's full resolution."""
        return Cameras(viewmats=np.asarray(self.viewmat, np.float32)[None],
                       Ks=np.asarray(self.K, np.float32)[None], width=int(self.width),
                       height=int(self.height), projection=self.projection)

    def validate(self, name: str = "source camera") -> "SourceCamera":
        check_array(f"{name}.viewmat", self.viewmat, dtype=np.float32, shape=(4, 4))
        check_array(f"{name}.K", self.K, dtype=np.float32, shape=(3, 3))
        # the photo's own size: a 20000x100 strip is admitted, and only drawn scaled down
        self.as_cameras().validate(name, max_side=MAX_PHOTO_SIDE)
        if not (self.K[0, 0] > 0 and self.K[1, 1] > 0):
            raise StageInputError(f"{name}.K must have positive focal lengths / scales, got "
                                  f"{self.K[0, 0]:.4g}, {self.K[1, 1]:.4g}")
        return self

    def project(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, 3) world points -> ((N, 2) float64 pixel coordinates (col, row), (N,) camera z)."""
        p = np.asarray(points, np.float64) @ self.viewmat[:3, :3].T.astype(np.float64) \
            + self.viewmat[:3, 3].astype(np.float64)
        z = p[:, 2]
        xy = p[:, :2] if self.projection == "orthographic" else \
            p[:, :2] / np.where(np.abs(z) < 1e-12, 1e-12, z)[:, None]
        K = self.K.astype(np.float64)
        return xy @ K[:2, :2].T + K[:2, 2], z

    def scaled(self, factor: float) -> "SourceCamera":
        """The same camera for the photo resized by ``factor`` (pixel coordinates scale
        with the image because pixel edges, not centres, sit at whole numbers)."""
        K = self.K.astype(np.float64).copy()
        K[:2] *= factor
        return SourceCamera(viewmat=self.viewmat, K=K.astype(np.float32),
                            width=max(1, round(self.width * factor)),
                            height=max(1, round(self.height * factor)), projection=self.projection)

    def to_dict(self) -> dict:
        return {"projection": self.projection, "width": int(self.width), "height": int(self.height),
                "viewmat": np.asarray(self.viewmat, np.float64).tolist(),
                "K": np.asarray(self.K, np.float64).tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "SourceCamera":
        return cls(viewmat=np.asarray(d["viewmat"], np.float32), K=np.asarray(d["K"], np.float32),
                   width=int(d["width"]), height=int(d["height"]),
                   projection=str(d.get("projection", "perspective")))


@dataclass
class Reconstruction:
    """What a reconstructor returns: the object as a mesh and as Gaussians, same frame,
    and the camera the photo was taken from (``None`` only for backends that cannot say)."""

    mesh: Mesh
    gaussians: Gaussians
    meta: dict = field(default_factory=dict)
    source_camera: Optional[SourceCamera] = None


@dataclass
class Texture:
    """A baked texture image.

    image: (S, S, 3) uint8, row 0 is the top of the image (v = 1)
    seen:  (S, S) bool, texels some view coloured (the rest were inpainted or are gutter)
    """

    image: np.ndarray
    seen: np.ndarray
