"""Rasterize a mesh in camera views or in UV space: per-pixel face id, barycentrics, depth.

Two backends compute the same :class:`pipeline.types.Raster`:

* ``"moderngl"``: OpenGL 3.3+ through moderngl on EGL. On a machine without a
  GPU this is Mesa's llvmpipe, so it works everywhere and is the reference.
* ``"nvdiffrast"``: ``nvdiffrast.torch.RasterizeCudaContext`` (package
  ``diffrp-nvdiffrast``), CUDA only.

Both use one projection built in *pixel* units with image y pointing down
(OpenCV), mapped to clip space so that clip y = -1 is image row 0. OpenGL's
``glReadPixels`` and nvdiffrast both return clip y = -1 as their first row, so
neither result needs flipping. Pixel centres sit at (col + 0.5, row + 0.5).

Output conventions (see ``Raster``): ``tri_id`` int32, -1 where empty;
``bary`` float32 weights of (v0, v1, v2), perspective-correct in views;
``depth`` camera-space z (not NDC), 0 where empty and in UV space. In UV space
texel (row, col) is at uv = ((col + 0.5) / S, 1 - (row + 0.5) / S).

The rasterizer's state is an explicit object, as in nvdiffrast: the caller makes a
``RasterContext`` (``raster_context(backend, device)``) on the thread that will use it,
passes it to every call, and releases it (``release()``, or a ``with`` block). Nothing
is created at import time and no state hides in the module; a context refuses use from
another thread or a forked child, whose GL or CUDA state it cannot own.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Optional, cast

import numpy as np

from pipeline.backends import check_backend
from kiln.limits import MAX_FACES, MAX_RASTER_SIDE, MAX_TOTAL_PIXELS

from pipeline.types import Cameras, Mesh, Raster
from pipeline.validate import StageInputError, check_array, check_finite

if TYPE_CHECKING:
    import moderngl

# The rasterizers' limits (kiln.limits): a target's side (MAX_RASTER_SIDE), the faces
# (MAX_FACES keeps face ids exact in float32 render targets), views x height x width
# (MAX_TOTAL_PIXELS), whatever a setting allows.
_NV_TILE = 2048                # nvdiffrast's CUDA rasterizer is limited/fragile above this
_NV_ALIGN = 8                  # ... and wants width and height divisible by 8
_NV_BATCH_PIXELS = 2 ** 24     # views rasterized together per nvdiffrast call


class BackendUnavailableError(RuntimeError):
    """The requested rasterizer cannot run in this process (library or device missing)."""


# --------------------------------------------------------------------------- public API


@dataclass(eq=False)
class RasterContext:
    """A rasterizer's state (an EGL context and its program, or nvdiffrast's
    ``RasterizeCudaContext``), owned by the thread and process that made it.

    backend: "moderngl" | "nvdiffrast"; device: the CUDA device nvdiffrast draws on
    ("cpu" for moderngl, which has no device of its own).
    """

    backend: str
    device: str
    _gl: "_GLState | None" = None
    _nv: object = None
    _thread: int = field(default_factory=threading.get_ident)
    _pid: int = field(default_factory=os.getpid)
    released: bool = False

    def check_usable(self) -> None:
        """StageInputError unless this thread of this process may draw with it now."""
        if self.released:
            raise StageInputError(f"this {self.backend} RasterContext was released; make a new one")
        if os.getpid() != self._pid:
            raise StageInputError(f"this {self.backend} RasterContext belongs to process {self._pid}; "
                                  "a child process makes its own")
        if threading.get_ident() != self._thread:
            raise StageInputError(f"this {self.backend} RasterContext belongs to another thread; "
                                  "GL and CUDA contexts are used where they were made")

    def driver(self) -> dict:
        """The GL driver under a moderngl context ("llvmpipe" is Mesa on the CPU) as
        {"renderer", "version"}, for reports; {} for nvdiffrast or when it cannot be read."""
        if self._gl is None or self.released:
            return {}
        try:
            gl = self._gl.ctx
            with gl:   # its info reads empty unless it is current
                return {"renderer": gl.info.get("GL_RENDERER"), "version": gl.info.get("GL_VERSION")}
        except Exception:  # noqa: BLE001 - never a reason to fail a caller
            return {}

    def release(self) -> None:
        """Free the GL or CUDA state (from the owning thread; elsewhere only the reference
        is dropped). Idempotent."""
        if self.released:
            return
        self.released = True
        if self._gl is not None and os.getpid() == self._pid:
            self._gl.release(own_thread=threading.get_ident() == self._thread)
        self._gl = None
        self._nv = None     # dropping the Python object frees the CUDA rasterizer state

    def __enter__(self) -> "RasterContext":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def raster_context(backend: str = "moderngl", device: str = "cuda") -> RasterContext:
    """Make a rasterizer context on this thread (BackendUnavailableError when the backend
    cannot run here). device: CUDA device for ``nvdiffrast``, ignored by moderngl."""
    check_backend("rasterizer", backend)
    if backend == "moderngl":
        return RasterContext("moderngl", "cpu", _gl=_new_gl_state())
    nv, dev = _new_nv_context(device)
    return RasterContext("nvdiffrast", dev, _nv=nv)


def available_backends() -> list[str]:
    """Backends that can run in this process and thread, best first for a CPU-only caller.

    ``moderngl`` is listed when an EGL context can actually be created (one is made and
    released). ``nvdiffrast`` is listed when the package is installed and CUDA is
    available; its JIT build happens on first use, not here.
    """
    out = []
    try:
        raster_context("moderngl").release()
        out.append("moderngl")
    except BackendUnavailableError:
        pass
    if _nvdiffrast_problem() is None:
        out.append("nvdiffrast")
    return out


def rasterize_views(ctx: RasterContext, mesh: Mesh, cameras: Cameras) -> Raster:
    """Rasterize ``mesh`` from every camera.

    ctx:     a RasterContext made on this thread (``raster_context``)
    mesh:    vertices (V, 3) float32, faces (F, 3) int32
    cameras: C cameras, OpenCV convention, image ``height`` x ``width``
    Returns Raster with tri_id (C, H, W) int32, bary (C, H, W, 3) float32,
    depth (C, H, W) float32 = camera-space z of the visible surface.
    """
    _check_context(ctx)
    return _draw(ctx, _views_job(mesh, cameras))


def _views_job(mesh: Mesh, cameras: Cameras) -> "_RasterJob":
    mesh.validate("mesh", max_faces=MAX_FACES)
    cameras.validate("cameras")
    c, h, w = len(cameras), int(cameras.height), int(cameras.width)
    if c * h * w > MAX_TOTAL_PIXELS:
        raise StageInputError(f"{c} views of {w}x{h} are {c * h * w} pixels, more than the limit "
                              f"{MAX_TOTAL_PIXELS}; use fewer views or a lower resolution")
    ortho = cameras.projection == "orthographic"
    views = [_view_projection(mesh.vertices, cameras.viewmats[i], cameras.Ks[i], ortho) for i in range(c)]
    return _RasterJob(positions=mesh.vertices, faces=mesh.faces, width=w, height=h,
                      matrices=np.stack([v[0] for v in views]), zrows=np.stack([v[1] for v in views]),
                      near_far=np.array([v[2] for v in views]), enabled=np.array([v[3] for v in views]),
                      depth_test=True, orthographic=ortho)


def rasterize_uv(ctx: RasterContext, mesh: Mesh, size: int) -> Raster:
    """Rasterize ``mesh`` in its UV layout onto an ``size`` x ``size`` texture grid.

    ctx: a RasterContext made on this thread (``raster_context``)
    mesh.uvs: (V, 2) float32 in [0, 1] is required.
    Returns Raster with tri_id (1, S, S) int32, bary (1, S, S, 3) float32 (affine,
    i.e. the weights of the texel centre inside the UV triangle), depth (1, S, S) zeros.
    Row 0 is v = 1 (top of the texture image).
    """
    _check_context(ctx)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
        raise StageInputError(f"UV raster size must be an integer, got {size!r}")
    size = int(size)
    if not 1 <= size <= MAX_RASTER_SIDE:
        raise StageInputError(f"UV raster size {size} is outside 1..{MAX_RASTER_SIDE}")
    mesh.validate("mesh", max_faces=MAX_FACES)
    if mesh.uvs is None:
        raise StageInputError("mesh has no UVs; unwrap it (pipeline.unwrap.uv.unwrap) before UV rasterization")
    uv3 = np.zeros((mesh.num_vertices, 3), np.float32)
    uv3[:, :2] = mesh.uvs
    # (u, v) -> pixel (u * S, (1 - v) * S): row 0 is the top of the texture (v = 1)
    m = np.array([[size, 0, 0, 0], [0, -size, 0, size], [0, 0, 0, 0], [0, 0, 0, 1]], np.float64)
    jobs = _RasterJob(positions=uv3, faces=mesh.faces, width=size, height=size,
                      matrices=m[None], zrows=np.zeros((1, 4)), near_far=np.array([[0.0, 1.0]]),
                      enabled=np.array([True]), depth_test=False)
    return _draw(ctx, jobs)


def rasterize_silhouettes(ctx: RasterContext, mesh: Mesh, cameras: Cameras) -> np.ndarray:
    """(C, H, W) bool: the pixels ``mesh`` covers from each camera, and nothing else (no
    face ids, barycentrics or depth: a quarter of the read-back, for fitting a camera to a
    mask)."""
    _check_context(ctx)
    jobs = _views_job(mesh, cameras)
    if ctx.backend == "moderngl":
        assert ctx._gl is not None   # held until released, and check_usable refuses a released one
        return _moderngl_coverage(ctx._gl, jobs)
    return _nvdiffrast_rasterize(ctx._nv, ctx.device, jobs).tri_id >= 0


def _check_context(ctx) -> None:
    if not isinstance(ctx, RasterContext):
        raise StageInputError(f"the rasterizer needs a RasterContext (pipeline.raster.rasterize.raster_context), "
                              f"got {type(ctx).__name__}")
    ctx.check_usable()


def _draw(ctx: RasterContext, job: "_RasterJob") -> Raster:
    if ctx.backend == "moderngl":
        assert ctx._gl is not None   # held until released, and check_usable refuses a released one
        return _moderngl_rasterize(ctx._gl, job)
    return _nvdiffrast_rasterize(ctx._nv, ctx.device, job)


def interpolate(raster: Raster, mesh: Mesh, attr: np.ndarray) -> np.ndarray:
    """Barycentric interpolation of per-vertex attributes at every raster pixel.

    attr: (V, K) numeric, one row per mesh vertex.
    Returns (C, H, W, K) float32; 0 where no face covers the pixel.
    """
    _check_raster(raster)
    mesh.validate("mesh")
    if not isinstance(attr, np.ndarray) or attr.ndim != 2 or attr.shape[0] != mesh.num_vertices:
        shape = getattr(attr, "shape", type(attr).__name__)
        raise StageInputError(f"attr must be a ({mesh.num_vertices}, K) array, one row per vertex; got {shape}")
    if not np.issubdtype(attr.dtype, np.number) or np.issubdtype(attr.dtype, np.complexfloating):
        raise StageInputError(f"attr must be real numbers, got dtype {attr.dtype.name}")
    attr = attr.astype(np.float32, copy=False)
    check_finite("attr", attr)
    faces = mesh.faces
    covered = raster.tri_id >= 0
    if covered.any() and int(raster.tri_id.max()) >= mesh.num_faces:
        raise StageInputError(f"raster refers to face {int(raster.tri_id.max())} but the mesh has "
                              f"{mesh.num_faces} faces; was it rasterized from another mesh?")
    out = np.zeros(raster.tri_id.shape + (attr.shape[1],), np.float32)
    f = faces[raster.tri_id[covered]]
    b = raster.bary[covered]
    out[covered] = (b[:, 0:1] * attr[f[:, 0]] + b[:, 1:2] * attr[f[:, 1]]
                    + b[:, 2:3] * attr[f[:, 2]])
    return out


# --------------------------------------------------------------------------- shared math


@dataclass
class _RasterJob:
    """What both backends draw.

    positions: (V, 3) float32 (world positions, or (u, v, 0) in UV space)
    faces:     (F, 3) int32
    matrices:  (C, 4, 4) float64, position -> (X, Y, Zc, W) with pixel = (X/W, Y/W),
               image y down, Zc/W in [-1, 1] between the near and far planes
    zrows:     (C, 4) float64, position -> camera-space z (row 2 of the viewmat; 0 in UV space)
    near_far:  (C, 2) float64, the planes Zc/W = -1 and +1 map to (camera z)
    enabled:   (C,) bool, False for a view with the whole mesh behind the camera
    orthographic: W = 1 and Zc/W linear in camera z (instead of the perspective divide)
    """

    positions: np.ndarray
    faces: np.ndarray
    width: int
    height: int
    matrices: np.ndarray
    zrows: np.ndarray
    near_far: np.ndarray
    enabled: np.ndarray
    depth_test: bool
    orthographic: bool = False

    @property
    def count(self) -> int:
        return int(self.matrices.shape[0])


def _view_projection(vertices: np.ndarray, viewmat: np.ndarray, K: np.ndarray,
                     orthographic: bool = False):
    """Pixel-space projection for one camera; near/far hug the mesh's depth range."""
    view = viewmat.astype(np.float64)
    z = vertices.astype(np.float64) @ view[2, :3] + view[2, 3]
    zmin, zmax = float(z.min()), float(z.max())
    if orthographic:
        # no divide: W = 1, and the depth range maps linearly onto [-1, 1]
        slack = 0.01 * (zmax - zmin) + 1e-6
        near, far = zmin - slack, zmax + slack
        Kd = K.astype(np.float64)
        P = np.zeros((4, 4))
        P[0, :2], P[0, 3] = Kd[0, :2], Kd[0, 2]
        P[1, :2], P[1, 3] = Kd[1, :2], Kd[1, 2]
        P[2, 2] = 2.0 / (far - near)
        P[2, 3] = -(far + near) / (far - near)
        P[3, 3] = 1.0
        return P @ view, view[2].copy(), (near, far), True
    if zmax <= 0.0:
        return np.eye(4), view[2].copy(), (1.0, 2.0), False
    # a little slack so the nearest and farthest vertices are not clipped
    near = max(zmin * 0.99, zmax * 1e-4) if zmin > 0 else zmax * 1e-4
    far = zmax * 1.01 + 1e-6
    Kd = K.astype(np.float64)
    P = np.zeros((4, 4))
    P[0, :3] = Kd[0]
    P[1, :3] = Kd[1]
    P[2, 2] = (far + near) / (far - near)
    P[2, 3] = -2.0 * far * near / (far - near)
    P[3, 2] = 1.0
    return P @ view, view[2].copy(), (near, far), True


def _clip_from_pixels(x0: int, y0: int, tw: int, th: int) -> np.ndarray:
    """(4, 4) map from homogeneous pixel coords (X, Y, Zc, W) to clip space for the tile
    [x0, x0+tw) x [y0, y0+th); tile row 0 lands at clip y = -1, pixel centres at +0.5.
    The offsets sit in the W column so they survive the perspective divide."""
    T = np.eye(4)
    T[0] = [2.0 / tw, 0.0, 0.0, -(2.0 * x0 / tw + 1.0)]
    T[1] = [0.0, 2.0 / th, 0.0, -(2.0 * y0 / th + 1.0)]
    return T


def _empty_raster(c: int, h: int, w: int) -> Raster:
    return Raster(tri_id=np.full((c, h, w), -1, np.int32), bary=np.zeros((c, h, w, 3), np.float32),
                  depth=np.zeros((c, h, w), np.float32))


def _store(raster: Raster, i: int, rows: slice, cols: slice, ids: np.ndarray, b0: np.ndarray,
           b1: np.ndarray, depth: np.ndarray) -> None:
    """Write one block of backend output into view ``i`` of ``raster`` (pre-filled as empty).

    ids: face id + 1 as float (0 = empty); b0, b1: weights of v0 and v1; depth: camera z.
    """
    tri = np.rint(ids).astype(np.int32) - 1
    raster.tri_id[i, rows, cols] = tri
    cov = tri >= 0
    n = int(np.count_nonzero(cov))
    if n == 0:
        return
    b = np.empty((n, 3), np.float32)
    b[:, 0] = b0[cov]
    b[:, 1] = b1[cov]
    b[:, 2] = 1.0 - b[:, 0] - b[:, 1]
    # float round-off (and nvdiffrast's unclamped u + v > 1) can leave tiny negatives
    np.clip(b, 0.0, 1.0, out=b)
    b /= np.maximum(b.sum(axis=1, keepdims=True), 1e-12)
    bary = raster.bary[i, rows, cols]       # a view: basic slicing
    bary[cov] = b
    dep = raster.depth[i, rows, cols]
    dep[cov] = depth[cov]


def _check_raster(raster: Raster) -> None:
    check_array("raster.tri_id", raster.tri_id, dtype=np.int32, shape=(None, None, None))
    c, h, w = raster.tri_id.shape
    check_array("raster.bary", raster.bary, dtype=np.float32, shape=(c, h, w, 3))
    check_finite("raster.bary", raster.bary)


# --------------------------------------------------------------------------- moderngl backend

_VERTEX_SHADER = """
#version 330
uniform mat4 mvp;
uniform vec4 zrow;
in vec3 in_pos;
out vec2 v_bary;
out float v_z;
void main() {
    vec4 p = vec4(in_pos, 1.0);
    gl_Position = mvp * p;
    v_z = dot(zrow, p);
    // triangles are drawn non-indexed, so vertex k of a face is gl_VertexID % 3
    int k = gl_VertexID % 3;
    v_bary = vec2(k == 0 ? 1.0 : 0.0, k == 1 ? 1.0 : 0.0);
}
"""

_FRAGMENT_SHADER = """
#version 330
in vec2 v_bary;
in float v_z;
out vec4 out_raster;
void main() {
    // face id + 1 is exact in float32 below 2^24 faces; 0 = cleared = empty
    out_raster = vec4(v_bary, v_z, float(gl_PrimitiveID + 1));
}
"""


@dataclass
class _GLState:
    ctx: moderngl.Context
    program: moderngl.Program
    fbo: Optional[moderngl.Framebuffer] = None
    fbo_size: tuple[int, int] = (0, 0)
    owned: list[Any] = field(default_factory=list)   # the fbo's attachments

    def framebuffer(self, width: int, height: int) -> moderngl.Framebuffer:
        if self.fbo_size != (width, height):
            self._drop_fbo()
            color = self.ctx.texture((width, height), 4, dtype="f4")
            depth = self.ctx.depth_renderbuffer((width, height))
            self.fbo = self.ctx.framebuffer(color_attachments=[color], depth_attachment=depth)
            self.owned = [color, depth]
            self.fbo_size = (width, height)
        assert self.fbo is not None   # made above for this size
        return self.fbo

    def _drop_fbo(self) -> None:
        if self.fbo is not None:
            self.fbo.release()
            for obj in self.owned:
                obj.release()
        self.fbo, self.owned, self.fbo_size = None, [], (0, 0)

    def release(self, own_thread: bool = True) -> None:
        try:
            if own_thread:
                with self.ctx:
                    self._drop_fbo()
                    self.program.release()
            self.ctx.release()
        except Exception:   # releasing is best effort; a dead context must not mask the caller's error
            pass


def _load_triton_before_mesa() -> None:
    """Load Triton (and its LLVM) before Mesa's llvmpipe loads its own.

    Measured here: once an EGL context exists, a later ``import torch._dynamo`` (which
    any ``torch.optim`` optimizer or ``torch.compile`` triggers) segfaults inside
    Triton's LLVM; with Triton loaded first both work. Importing ``triton`` alone is
    enough (checked: EGL context, then torch._dynamo and an Adam step, exit 0; without
    it SIGSEGV) and costs ~0.3 s where ``torch._dynamo`` costs ~3 s of worker start-up.
    """
    try:
        import triton  # noqa: F401
    except Exception:  # not installed: no second LLVM to clash with
        pass


def _new_gl_state() -> _GLState:
    try:
        import moderngl
    except ImportError as e:
        raise BackendUnavailableError(f"moderngl is not installed: {e}") from None
    _load_triton_before_mesa()
    try:
        # moderngl's stub types every keyword as a dict; backend is a str (its docs and code)
        ctx = moderngl.create_standalone_context(backend="egl", require=330)  # type: ignore[arg-type]
    except Exception as e:
        raise BackendUnavailableError(
            f"cannot create an OpenGL context on EGL ({e}); install Mesa's EGL and GL drivers "
            "(Debian: libegl1 libgl1-mesa-dri libegl-mesa0)") from None
    try:
        program = ctx.program(vertex_shader=_VERTEX_SHADER, fragment_shader=_FRAGMENT_SHADER)
    except Exception as e:
        ctx.release()   # not cached yet: nobody else would ever free it
        raise BackendUnavailableError(f"the OpenGL driver cannot build the rasterizer's shaders: "
                                      f"{e}") from None
    return _GLState(ctx=ctx, program=program)


def _drawn_views(state: _GLState, job: _RasterJob, depth_test: bool) -> Iterator[tuple[int, Any]]:
    """Draw ``job``'s enabled views one after another; yields (view index, framebuffer) with
    the view drawn, for the caller to read before the next one. Buffers are freed at the end
    (or when the caller stops early)."""
    import moderngl

    ctx, prog = state.ctx, state.program
    expanded = np.ascontiguousarray(job.positions[job.faces.reshape(-1)], dtype=np.float32)
    with ctx:
        vbo = ctx.buffer(expanded.tobytes())
        vao = None
        try:
            vao = ctx.vertex_array(prog, [(vbo, "3f", "in_pos")])
            fbo = state.framebuffer(job.width, job.height)
            fbo.use()
            if depth_test:
                ctx.enable(moderngl.DEPTH_TEST)
            else:
                ctx.disable(moderngl.DEPTH_TEST)
            ctx.disable(moderngl.CULL_FACE | moderngl.BLEND)
            to_clip = _clip_from_pixels(0, 0, job.width, job.height)
            # both are uniforms of _VERTEX_SHADER (a program member may be other kinds)
            mvp_u, zrow_u = cast(moderngl.Uniform, prog["mvp"]), cast(moderngl.Uniform, prog["zrow"])
            for i in range(job.count):
                if not job.enabled[i]:
                    continue
                fbo.clear(0.0, 0.0, 0.0, 0.0, depth=1.0)
                mvp = (to_clip @ job.matrices[i]).astype(np.float32)
                mvp_u.write(np.ascontiguousarray(mvp.T).tobytes())   # GLSL is column-major
                zrow_u.value = tuple(float(x) for x in job.zrows[i])
                vao.render(moderngl.TRIANGLES, vertices=expanded.shape[0])
                yield i, fbo
        finally:
            if vao is not None:
                vao.release()
            vbo.release()


def _moderngl_coverage(state: _GLState, job: _RasterJob) -> np.ndarray:
    """Coverage only: each view read back as bytes, whose alpha (face id + 1, clamped) is
    255 where a face lies and 0 where none does."""
    h, w = job.height, job.width
    out = np.zeros((job.count, h, w), bool)
    for i, fbo in _drawn_views(state, job, depth_test=False):
        out[i] = np.frombuffer(fbo.read(components=4, dtype="f1"), np.uint8).reshape(h, w, 4)[..., 3] > 0
    return out


def _moderngl_rasterize(state: _GLState, job: _RasterJob) -> Raster:
    c, h, w = job.count, job.height, job.width
    out = _empty_raster(c, h, w)
    strip = max(1, (64 << 20) // (w * 16))   # read back in strips of <= 64 MiB
    for i, fbo in _drawn_views(state, job, depth_test=job.depth_test):
        for y0 in range(0, h, strip):
            rows = min(strip, h - y0)
            data = fbo.read(viewport=(0, y0, w, rows), components=4, dtype="f4")
            px = np.frombuffer(data, np.float32).reshape(rows, w, 4)
            _store(out, i, slice(y0, y0 + rows), slice(0, w), px[..., 3], px[..., 0], px[..., 1], px[..., 2])
    return out


# --------------------------------------------------------------------------- nvdiffrast backend


def _nvdiffrast_problem() -> str | None:
    """Why nvdiffrast cannot run here, or None. Imports nothing heavy unless the package exists."""
    import importlib.util

    if importlib.util.find_spec("nvdiffrast") is None:
        return "nvdiffrast is not installed (pip install diffrp-nvdiffrast; it JIT-compiles on first use)"
    try:
        import torch
    except ImportError:
        return "nvdiffrast needs torch, which is not installed"
    if not torch.cuda.is_available():
        return "nvdiffrast needs CUDA, and torch sees no CUDA device in this process"
    return None


def _new_nv_context(device: str) -> tuple[object, str]:
    """(nvdiffrast's RasterizeCudaContext, its device as 'cuda:N')."""
    problem = _nvdiffrast_problem()
    if problem is not None:
        raise BackendUnavailableError(problem)
    import nvdiffrast.torch as dr
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        raise BackendUnavailableError(f"nvdiffrast runs on CUDA devices only, got device {device!r}")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    # torch >= 2.11 (pybind11 3) no longer leaves the JIT-built plugin importable by name
    from pipeline.raster.nvdiffrast_plugin import ensure_importable

    ensure_importable()
    return dr.RasterizeCudaContext(device=dev), str(dev)


def _tiles(n: int) -> list[tuple[int, int, int]]:
    """Split n pixels into tiles: (start, padded tile size, real pixels in the tile)."""
    count = math.ceil(n / _NV_TILE)
    size = math.ceil(math.ceil(n / count) / _NV_ALIGN) * _NV_ALIGN
    return [(s, size, min(size, n - s)) for s in range(0, n, size)]


def _nvdiffrast_rasterize(rctx, device: str, job: _RasterJob) -> Raster:
    import nvdiffrast.torch as dr
    import torch

    dev = torch.device(device)
    c, h, w = job.count, job.height, job.width
    out = _empty_raster(c, h, w)
    views = [i for i in range(c) if job.enabled[i]]
    if not views:
        return out
    with torch.no_grad():
        pos_h = torch.from_numpy(np.concatenate(
            [job.positions.astype(np.float64), np.ones((job.positions.shape[0], 1))], 1)).to(dev)
        tri = torch.from_numpy(np.ascontiguousarray(job.faces, dtype=np.int32)).to(dev)
        for y0, th, rows in _tiles(h):
            for x0, tw, cols in _tiles(w):
                to_clip = _clip_from_pixels(x0, y0, tw, th)
                batch = max(1, _NV_BATCH_PIXELS // (th * tw))
                for b0 in range(0, len(views), batch):
                    idx = views[b0:b0 + batch]
                    mvp = torch.from_numpy(np.stack([to_clip @ job.matrices[i] for i in idx])).to(dev)
                    # float64 transform, then the contiguous float32 nvdiffrast requires
                    clip = torch.matmul(pos_h[None], mvp.transpose(1, 2)).float().contiguous()
                    rast, _ = dr.rasterize(rctx, clip, tri, resolution=[th, tw], grad_db=False)
                    block = _nv_block(rast[:, :rows, :cols], job, idx)
                    at = (np.asarray(idx), slice(y0, y0 + rows), slice(x0, x0 + cols))
                    out.tri_id[at], out.bary[at], out.depth[at] = block
    return out


def _nv_block(rast, job: _RasterJob, idx: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """nvdiffrast's output for views ``idx`` (B, h, w, 4) (u, v, z_ndc, face id + 1), turned
    into Raster arrays on its own device, so only the finished block crosses to the host:
    tri_id (B, h, w) int32, bary (B, h, w, 3) float32, depth (B, h, w) float32 camera z, each
    zeroed (tri_id -1) where no face is. The same rules as ``_store``, which the GL path uses."""
    import torch

    tri = torch.round(rast[..., 3]).to(torch.int32) - 1
    cov = tri >= 0
    b = torch.stack([rast[..., 0], rast[..., 1], 1.0 - rast[..., 0] - rast[..., 1]], dim=-1)
    # float round-off (and nvdiffrast's unclamped u + v > 1) can leave tiny negatives
    b = b.clamp_(0.0, 1.0)
    b = b / b.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    b = torch.where(cov[..., None], b, torch.zeros((), dtype=b.dtype, device=b.device))
    if not job.depth_test:
        depth = torch.zeros_like(rast[..., 2])
    else:
        z = rast[..., 2].double()
        nf = torch.as_tensor(job.near_far[idx], dtype=torch.float64, device=rast.device)
        near, far = nf[:, 0, None, None], nf[:, 1, None, None]
        if job.orthographic:
            depth = near + (z + 1.0) * 0.5 * (far - near)
        else:   # invert z_ndc = A - B / z (see ``_view_projection``)
            depth = (2.0 * far * near / (far - near)) / ((far + near) / (far - near) - z)
        depth = torch.where(cov, depth, torch.zeros((), dtype=depth.dtype, device=depth.device)).float()
    return tri.cpu().numpy(), b.cpu().numpy(), depth.cpu().numpy()
