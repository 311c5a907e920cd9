"""pipeline.raster.rasterize: moderngl (EGL/llvmpipe) checked against camera math, ray casting and
an independent reference; the nvdiffrast wrapper checked through a reference with nvdiffrast's
documented output conventions, and against the real library where CUDA is present."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

from pipeline.raster import rasterize as R
from pipeline.raster import raster_agreement
from pipeline.camera.cameras import camera_centers, intrinsics, look_at, project, sphere_cameras
from pipeline.geometry import face_normals
from pipeline.types import Cameras, Mesh
from pipeline.validate import StageInputError
from raster_helpers import gl_context
from reference_nvdiffrast import reference_nvdiffrast  # noqa: F401 - a fixture

pytestmark = pytest.mark.skipif("moderngl" not in R.available_backends(),
                                reason="no EGL OpenGL context on this machine")


# ----------------------------------------------------------------------------- helpers


def to_mesh(tm) -> Mesh:
    return Mesh(np.asarray(tm.vertices, np.float32), np.asarray(tm.faces, np.int32))


def one_camera(eye, width, height, fov=40.0, dcx=0.0, dcy=0.0) -> Cameras:
    K = intrinsics(fov, width, height)
    K[0, 2] += dcx
    K[1, 2] += dcy
    return Cameras(viewmats=look_at(eye)[None], Ks=K[None], width=width, height=height)


def pixel_centres(h, w):
    rows, cols = np.mgrid[0:h, 0:w]
    return np.stack([cols + 0.5, rows + 0.5], -1).reshape(-1, 2), rows.ravel(), cols.ravel()


def cross2(a, b):
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def signed_edge_distances(p: np.ndarray, tri2d: np.ndarray) -> np.ndarray:
    """(N, 3) distances of 2D points to the triangle's edges, positive inside (either winding)."""
    a, b, c = tri2d.astype(np.float64)
    area = cross2(b - a, c - a)
    d = []
    for s, e in ((a, b), (b, c), (c, a)):
        edge = e - s
        d.append(np.sign(area) * cross2(edge, p - s) / np.linalg.norm(edge))
    return np.stack(d, 1)


def grid_uv_mesh(faces: int, seed: int = 0) -> Mesh:
    """``faces`` unshared triangles, each with its own UV triangle inside a grid cell."""
    rng = np.random.default_rng(seed)
    n = int(np.ceil(np.sqrt(faces)))
    k = np.arange(faces)
    corner = np.stack([(k % n) / n, (k // n) / n], 1)
    # a jittered half-cell triangle per cell; every other one wound the other way round
    local = np.array([[0.06, 0.06], [0.94, 0.06], [0.06, 0.94]]) + rng.uniform(-0.05, 0.05, (faces, 3, 2))
    local[1::2] = local[1::2, ::-1]
    local /= n
    uvs = (corner[:, None] + local).reshape(-1, 2)
    verts = rng.normal(size=(3 * faces, 3))
    return Mesh(verts.astype(np.float32), np.arange(3 * faces, dtype=np.int32).reshape(-1, 3),
                uvs=uvs.astype(np.float32))


# ----------------------------------------------------------------------------- camera views


TRIANGLE = np.array([[-0.45, -0.3, 0.5], [0.5, -0.35, -0.6], [0.0, 0.45, 0.1]], np.float32)


def test_single_triangle_covers_exactly_its_projection():
    mesh = Mesh(TRIANGLE, np.array([[0, 1, 2]], np.int32))
    cams = one_camera((0.4, 0.3, 2.0), width=72, height=56, dcx=3.7, dcy=-2.2)
    r = R.rasterize_views(gl_context(), mesh, cams)
    assert r.tri_id.shape == (1, 56, 72) and r.tri_id.dtype == np.int32
    assert r.bary.shape == (1, 56, 72, 3) and r.bary.dtype == np.float32
    assert r.depth.shape == (1, 56, 72) and r.depth.dtype == np.float32
    uv, _ = project(TRIANGLE, cams.viewmats[0], cams.Ks[0])
    p, rows, cols = pixel_centres(56, 72)
    d = signed_edge_distances(p, uv)
    inside, outside = (d > 0.02).all(1), (d < -0.02).any(1)
    got = r.tri_id[0, rows, cols]
    assert inside.sum() > 300
    assert (got[inside] == 0).all()
    assert (got[outside] == -1).all()
    assert (r.bary[0, rows[outside], cols[outside]] == 0).all()
    assert (r.depth[0, rows[outside], cols[outside]] == 0).all()


def test_barycentrics_are_perspective_correct_and_depth_is_camera_z():
    mesh = Mesh(TRIANGLE, np.array([[0, 1, 2]], np.int32))
    cams = one_camera((0.4, 0.3, 2.0), width=72, height=56, dcx=3.7, dcy=-2.2)
    r = R.rasterize_views(gl_context(), mesh, cams)
    cov = r.covered[0]
    rows, cols = np.nonzero(cov)
    b = r.bary[0][cov]
    assert np.allclose(b.sum(1), 1.0, atol=1e-5) and (b >= 0).all()
    points = R.interpolate(r, mesh, mesh.vertices)[0][cov]
    uv, z = project(points, cams.viewmats[0], cams.Ks[0])
    # the surface point a pixel reports lies on that pixel's ray (llvmpipe snaps vertices to 1/256 px)
    assert np.abs(uv[:, 0] - (cols + 0.5)).max() < 0.02
    assert np.abs(uv[:, 1] - (rows + 0.5)).max() < 0.02
    np.testing.assert_allclose(r.depth[0][cov], z, rtol=0, atol=2e-4)
    # screen-space (affine) weights would miss the ray by far more on this slanted triangle
    uv_v, _ = project(TRIANGLE, cams.viewmats[0], cams.Ks[0])
    centres = np.stack([cols + 0.5, rows + 0.5], 1)
    affine = np.linalg.solve(np.array([[*uv_v[:, 0]], [*uv_v[:, 1]], [1, 1, 1]], np.float64),
                             np.concatenate([centres.T, np.ones((1, len(centres)))]))
    assert np.abs(affine.T - b).max() > 0.02


def test_nearer_face_wins_whatever_the_draw_order():
    def quad(z, x0):
        v = np.array([[x0, -0.3, z], [x0 + 0.6, -0.3, z], [x0 + 0.6, 0.3, z], [x0, 0.3, z]])
        return v, np.array([[0, 1, 2], [0, 2, 3]])

    near_v, near_f = quad(0.2, -0.5)
    far_v, far_f = quad(-0.2, -0.2)
    cams = one_camera((0.0, 0.0, 2.0), 64, 64)
    for order in ("near_first", "far_first"):
        parts = [(near_v, near_f), (far_v, far_f)] if order == "near_first" else [(far_v, far_f), (near_v, near_f)]
        verts = np.concatenate([parts[0][0], parts[1][0]]).astype(np.float32)
        faces = np.concatenate([parts[0][1], parts[1][1] + 4]).astype(np.int32)
        near_ids = {0, 1} if order == "near_first" else {2, 3}
        r = R.rasterize_views(gl_context(), Mesh(verts, faces), cams)
        ids = r.tri_id[0]
        # pixel columns where both quads overlap: x in [-0.2, 0.1] world at the image centre row
        pts = np.array([[-0.05, 0.0, 0.2], [-0.05, 0.0, -0.2]], np.float32)
        uv, _ = project(pts, cams.viewmats[0], cams.Ks[0])
        row, col = int(uv[0, 1]), int(uv[0, 0])
        assert ids[row, col] in near_ids, order
        np.testing.assert_allclose(r.depth[0, row, col], 1.8, atol=1e-4)
        # a pixel only the far quad covers reports the far quad
        uv_far, _ = project(np.array([[0.3, 0.0, -0.2]], np.float32), cams.viewmats[0], cams.Ks[0])
        assert ids[int(uv_far[0, 1]), int(uv_far[0, 0])] not in near_ids
        assert r.depth[0, int(uv_far[0, 1]), int(uv_far[0, 0])] == pytest.approx(2.2, abs=1e-4)


def test_cube_shows_only_front_faces():
    import trimesh

    mesh = to_mesh(trimesh.creation.box(extents=(0.8, 0.6, 0.7)))
    cams = sphere_cameras(6, 2.4, 40.0, 96)
    r = R.rasterize_views(gl_context(), mesh, cams)
    normals = face_normals(mesh.vertices, mesh.faces)
    centres = camera_centers(cams)
    points = R.interpolate(r, mesh, mesh.vertices)
    for c in range(len(cams)):
        cov = r.covered[c]
        assert cov.mean() > 0.05
        to_cam = centres[c] - points[c][cov]
        facing = np.einsum("ij,ij->i", normals[r.tri_id[c][cov]], to_cam)
        assert (facing > 0).all(), f"view {c} shows back faces"


def test_ids_and_depth_match_ray_casting():
    import trimesh

    tm = trimesh.creation.icosphere(subdivisions=2, radius=0.45)
    tm.vertices[:, 0] *= 1.3   # not a sphere: depth varies across faces differently per axis
    mesh = to_mesh(tm)
    cams = one_camera((0.9, 0.5, 2.0), width=80, height=64, dcx=1.3)
    r = R.rasterize_views(gl_context(), mesh, cams)
    p, rows, cols = pixel_centres(64, 80)
    K, V = cams.Ks[0].astype(np.float64), cams.viewmats[0].astype(np.float64)
    d_cam = np.linalg.solve(K, np.concatenate([p.T, np.ones((1, len(p)))])).T
    dirs = d_cam @ V[:3, :3]          # camera -> world rotation is the transpose of R
    origin = camera_centers(cams)[0].astype(np.float64)
    origins = np.repeat(origin[None], len(p), 0)
    hit_face = tm.ray.intersects_first(origins, dirs)
    got = r.tri_id[0, rows, cols]
    agree = (got == hit_face)
    assert agree.mean() > 0.98, agree.mean()   # only edge pixels may differ
    assert ((got >= 0) == (hit_face >= 0)).mean() > 0.99
    locs, idx_ray, _ = tm.ray.intersects_location(origins, dirs, multiple_hits=False)
    z_ray = (locs @ V[:3, :3].T + V[:3, 3])[:, 2]
    same = agree[idx_ray] & (hit_face[idx_ray] >= 0)
    np.testing.assert_allclose(r.depth[0, rows[idx_ray][same], cols[idx_ray][same]], z_ray[same],
                               atol=2e-4)


def test_views_that_cannot_see_the_mesh_are_empty():
    import trimesh

    mesh = to_mesh(trimesh.creation.icosphere(subdivisions=1, radius=0.3))
    away = look_at((0.0, 0.0, 2.0), target=(0.0, 0.0, 5.0))     # mesh behind the camera
    K = intrinsics(40.0, 32, 32)
    cams = Cameras(viewmats=np.stack([away, look_at((0.0, 0.0, 2.0))]), Ks=np.stack([K, K]),
                   width=32, height=32)
    r = R.rasterize_views(gl_context(), mesh, cams)
    assert (r.tri_id[0] == -1).all() and (r.depth[0] == 0).all()
    assert r.covered[1].any()


def test_inside_the_mesh_only_nearby_faces_are_clipped():
    import trimesh

    mesh = to_mesh(trimesh.creation.icosphere(subdivisions=2, radius=1.0))
    cams = Cameras(viewmats=look_at((0.0, 0.0, 0.0), target=(0.0, 0.0, 1.0))[None],
                   Ks=intrinsics(60.0, 48, 48)[None], width=48, height=48)
    r = R.rasterize_views(gl_context(), mesh, cams)
    # the camera sits at the centre of a closed sphere: every pixel sees the wall around it
    assert r.covered.all()
    points = R.interpolate(r, mesh, mesh.vertices)[0]
    radius = np.linalg.norm(points, axis=-1)
    assert radius.min() > 0.9 and radius.max() < 1.0 + 1e-4
    np.testing.assert_allclose(r.depth[0], points[..., 2], atol=2e-4)


# ----------------------------------------------------------------------------- UV space


@pytest.mark.parametrize("size", [64, 50])
def test_uv_raster_covers_exactly_the_uv_triangles(size):
    mesh = grid_uv_mesh(40)
    r = R.rasterize_uv(gl_context(), mesh, size)
    assert r.tri_id.shape == (1, size, size)
    assert (r.depth == 0).all()
    p, rows, cols = pixel_centres(size, size)
    uv_centres = np.stack([p[:, 0] / size, 1.0 - p[:, 1] / size], 1)   # texel (row, col) -> uv
    got = r.tri_id[0, rows, cols]
    uv = mesh.uvs[mesh.faces]
    in_any = np.zeros(len(p), bool)
    for f in range(mesh.num_faces):
        d = signed_edge_distances(uv_centres, uv[f]) * size   # in texels
        inside = (d > 1e-3).all(1)
        assert (got[inside] == f).all(), f
        in_any |= ~(d < -1e-3).any(1)
    assert (got[~in_any] == -1).all()
    cov = r.covered[0]
    assert cov.sum() > 0.1 * size * size
    # interpolating the UVs at a texel gives back the texel centre
    back = R.interpolate(r, mesh, mesh.uvs)[0][cov]
    rr, cc = np.nonzero(cov)
    np.testing.assert_allclose(back[:, 0], (cc + 0.5) / size, atol=1e-5)
    np.testing.assert_allclose(back[:, 1], 1.0 - (rr + 0.5) / size, atol=1e-5)


def test_uv_row_zero_is_the_top_of_the_texture():
    verts = np.zeros((3, 3), np.float32)
    uvs = np.array([[0.0, 1.0], [0.25, 1.0], [0.0, 0.75]], np.float32)    # top-left corner
    r = R.rasterize_uv(gl_context(), Mesh(verts, np.array([[0, 1, 2]], np.int32), uvs=uvs), 16)
    rows, cols = np.nonzero(r.covered[0])
    assert rows.max() < 4 and cols.max() < 4
    assert r.covered[0, 0, 0]


# ----------------------------------------------------------------------------- interpolate, helpers


def test_interpolate_zero_where_uncovered_and_exact_at_vertices_weights():
    import trimesh

    mesh = to_mesh(trimesh.creation.icosphere(subdivisions=1, radius=0.4))
    r = R.rasterize_views(gl_context(), mesh, one_camera((0.0, 0.0, 2.0), 40, 40))
    colours = np.random.default_rng(1).uniform(size=(mesh.num_vertices, 3)).astype(np.float32)
    out = R.interpolate(r, mesh, colours)
    assert out.shape == (1, 40, 40, 3) and out.dtype == np.float32
    assert (out[0][~r.covered[0]] == 0).all()
    row, col = np.argwhere(r.covered[0])[7]
    f = mesh.faces[r.tri_id[0, row, col]]
    np.testing.assert_allclose(out[0, row, col], r.bary[0, row, col] @ colours[f], rtol=1e-5)


def test_face_normals_point_outwards():
    import trimesh

    mesh = to_mesh(trimesh.creation.icosphere(subdivisions=1, radius=0.4))
    n = face_normals(mesh.vertices, mesh.faces)
    centres = mesh.vertices[mesh.faces].mean(1)
    assert n.dtype == np.float64 and n.shape == (mesh.num_faces, 3)
    np.testing.assert_allclose(np.linalg.norm(n, axis=1), 1.0, atol=1e-5)
    assert (np.einsum("ij,ij->i", n, centres) > 0).all()


# ----------------------------------------------------------------------------- validation


def _tri_mesh(**kw) -> Mesh:
    base = dict(vertices=TRIANGLE.copy(), faces=np.array([[0, 1, 2]], np.int32))
    base.update(kw)
    return Mesh(**base)


@pytest.mark.parametrize("mesh, word", [
    (_tri_mesh(vertices=TRIANGLE.astype(np.float64)), "float32"),
    (_tri_mesh(vertices=np.where(np.eye(3, dtype=bool), np.nan, TRIANGLE).astype(np.float32)), "non-finite"),
    (_tri_mesh(faces=np.array([[0, 1, 3]], np.int32)), "outside"),
    (_tri_mesh(faces=np.array([[0, 1, 2]], np.int64)), "int32"),
    (_tri_mesh(faces=np.zeros((0, 3), np.int32)), "no faces"),
])
def test_bad_meshes_are_refused(mesh, word):
    with pytest.raises(StageInputError, match=word):
        R.rasterize_views(gl_context(), mesh, one_camera((0, 0, 2), 16, 16))


def test_limits_and_arguments_are_checked(monkeypatch):
    mesh = _tri_mesh()
    with pytest.raises(StageInputError, match="8192"):
        R.rasterize_views(gl_context(), mesh, one_camera((0, 0, 2), 9000, 16))
    with pytest.raises(StageInputError, match="8192"):
        R.rasterize_uv(gl_context(), _tri_mesh(uvs=np.zeros((3, 2), np.float32)), 9000)
    with pytest.raises(StageInputError, match="integer"):
        R.rasterize_uv(gl_context(), _tri_mesh(uvs=np.zeros((3, 2), np.float32)), 64.0)
    with pytest.raises(StageInputError, match="no UVs"):
        R.rasterize_uv(gl_context(), mesh, 64)
    with pytest.raises(StageInputError, match="unknown rasterizer backend"):
        R.raster_context("optix")
    with pytest.raises(StageInputError, match="needs a RasterContext"):
        R.rasterize_views("moderngl", mesh, one_camera((0, 0, 2), 16, 16))
    monkeypatch.setattr(R, "MAX_FACES", 0)
    with pytest.raises(StageInputError, match="faces, more than the limit"):
        R.rasterize_views(gl_context(), mesh, one_camera((0, 0, 2), 16, 16))
    monkeypatch.setattr(R, "MAX_FACES", 10)
    monkeypatch.setattr(R, "MAX_TOTAL_PIXELS", 100)
    with pytest.raises(StageInputError, match="pixels"):
        R.rasterize_views(gl_context(), mesh, one_camera((0, 0, 2), 16, 16))


def test_interpolate_checks_its_inputs():
    mesh = _tri_mesh()
    r = R.rasterize_views(gl_context(), mesh, one_camera((0, 0, 2), 16, 16))
    with pytest.raises(StageInputError, match=r"\(3, K\)"):
        R.interpolate(r, mesh, np.zeros((4, 2), np.float32))
    with pytest.raises(StageInputError, match="non-finite"):
        R.interpolate(r, mesh, np.full((3, 1), np.inf, np.float32))
    smaller = Mesh(mesh.vertices, np.zeros((0, 3), np.int32))
    with pytest.raises(StageInputError):
        R.interpolate(r, smaller, np.zeros((3, 1), np.float32))


# ----------------------------------------------------------------------------- contexts


def test_a_context_is_the_callers_object_used_on_its_thread_until_released():
    rc = R.raster_context("moderngl")
    assert rc.backend == "moderngl" and rc.driver().get("renderer")
    assert R.rasterize_views(rc, _tri_mesh(), one_camera((0, 0, 2), 16, 16)).covered.any()
    # another thread makes its own; this one is refused there
    other = {}

    def elsewhere():
        try:
            R.rasterize_views(rc, _tri_mesh(), one_camera((0, 0, 2), 16, 16))
        except StageInputError as e:
            other["refused"] = str(e)
        with R.raster_context("moderngl") as mine:
            other["own"] = R.rasterize_views(mine, _tri_mesh(), one_camera((0, 0, 2), 16, 16)).covered.any()

    t = threading.Thread(target=elsewhere)
    t.start()
    t.join()
    assert "another thread" in other["refused"] and other["own"]
    rc.release()
    rc.release()   # idempotent
    with pytest.raises(StageInputError, match="released"):
        R.rasterize_views(rc, _tri_mesh(), one_camera((0, 0, 2), 16, 16))
    with R.raster_context("moderngl") as fresh:   # a new one works after a release
        assert R.rasterize_views(fresh, _tri_mesh(), one_camera((0, 0, 2), 16, 16)).covered.any()
    assert fresh.released


def test_a_context_refuses_a_forked_child():
    import os

    rc = R.raster_context("moderngl")
    try:
        pid = os.fork()
        if pid == 0:   # the child only checks; it never touches the parent's GL state
            try:
                rc.check_usable()
                os._exit(1)
            except StageInputError as e:
                os._exit(0 if "process" in str(e) else 2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        rc.release()


def test_context_is_released_when_the_shaders_do_not_build(monkeypatch):
    import moderngl

    made = []
    real = moderngl.create_standalone_context

    def record(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(moderngl, "create_standalone_context", record)
    monkeypatch.setattr(R, "_FRAGMENT_SHADER", "#version 330\nthis is not GLSL")
    failure = {}

    def use():
        try:
            R.raster_context("moderngl")
        except Exception as e:  # noqa: BLE001 - inspected below
            failure["error"] = e

    t = threading.Thread(target=use)
    t.start()
    t.join()
    assert len(made) == 1 and isinstance(made[0].mglo, moderngl.InvalidObject)   # released
    assert isinstance(failure.get("error"), R.BackendUnavailableError)
    assert "shaders" in str(failure["error"])


def test_import_creates_no_context_and_loads_no_gl():
    code = ("import sys, pipeline.raster.rasterize as r; "
            "assert 'moderngl' not in sys.modules and 'torch' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


# ----------------------------------------------------------------------------- nvdiffrast


def _compare(candidate, reference, depth=True, min_interior=50):
    """The selftest's judgement (pipeline.raster.raster_agreement), plus enough pixels to judge.
    Triangles of a pixel or two leave no interior pixel (min_interior=0): there only the
    covered-pixel, barycentric-offset and depth checks judge."""
    agreement = raster_agreement.compare(candidate, reference, depth=depth)
    assert agreement.ok, agreement.failures()
    assert agreement.interior >= min_interior and agreement.same > 500, agreement


def test_nvdiffrast_wrapper_conventions_with_a_reference_rasterizer(reference_nvdiffrast):
    import trimesh

    tm = trimesh.creation.icosphere(subdivisions=1, radius=0.45)
    tm.vertices[:, 1] *= 0.7
    mesh = to_mesh(tm)
    K = intrinsics(40.0, 70, 45)
    K[0, 2] += 2.5
    cams = Cameras(viewmats=np.stack([look_at((0.9, 0.5, 2.0)), look_at((-1.5, -0.8, 1.2))]),
                   Ks=np.stack([K, K]), width=70, height=45)
    with R.raster_context("nvdiffrast", "cpu") as rc:
        nv = R.rasterize_views(rc, mesh, cams)
        uv_nv = R.rasterize_uv(rc, grid_uv_mesh(30), 45)
    gl = R.rasterize_views(gl_context(), mesh, cams)
    _compare(nv, gl)
    uvm = grid_uv_mesh(30)
    _compare(uv_nv, R.rasterize_uv(gl_context(), uvm, 45), depth=False)


def test_nvdiffrast_tiles():
    assert R._tiles(512) == [(0, 512, 512)]
    assert R._tiles(100) == [(0, 104, 100)]
    assert R._tiles(3000) == [(0, 1504, 1504), (1504, 1504, 1496)]
    assert all(size % 8 == 0 and size <= 2048 for _, size, _ in R._tiles(8192))


def test_nvdiffrast_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(R, "_nvdiffrast_problem", lambda: "nvdiffrast is not installed (test)")
    with pytest.raises(R.BackendUnavailableError, match="not installed"):
        R.raster_context("nvdiffrast")
    assert "nvdiffrast" not in R.available_backends()


def _nvdiffrast_skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "needs CUDA (nvdiffrast RasterizeCudaContext); this machine has none"
    return R._nvdiffrast_problem()


@pytest.mark.gpu
@pytest.mark.skipif(_nvdiffrast_skip_reason() is not None, reason=str(_nvdiffrast_skip_reason()))
def test_nvdiffrast_matches_moderngl_on_cuda():
    import trimesh

    coarse, fine = (to_mesh(trimesh.creation.icosphere(subdivisions=s, radius=0.45)) for s in (2, 4))
    nv = R.raster_context("nvdiffrast", "cuda")
    for res in (96, 100, 512):
        cams = sphere_cameras(8, 2.4, 40.0, res)
        for mesh, min_interior in ((coarse, 50), (fine, 50 if res >= 512 else 0)):
            _compare(R.rasterize_views(nv, mesh, cams), R.rasterize_views(gl_context(), mesh, cams),
                     min_interior=min_interior)
    uvm = grid_uv_mesh(2000)
    for size in (256, 1000, 2500):
        _compare(R.rasterize_uv(nv, uvm, size), R.rasterize_uv(gl_context(), uvm, size), depth=False)
    nv.release()


def test_optimizer_after_egl_context_does_not_segfault():
    """Mesa's llvmpipe and Triton's LLVM clash when Triton loads second (SIGSEGV in
    triton/knobs.py): the rasterizer must load torch's compiler stack first."""
    import subprocess
    import sys

    code = (
        "import numpy as np, trimesh\n"
        "from pipeline.types import Mesh\n"
        "from pipeline.raster import rasterize\n"
        "m = trimesh.creation.icosphere(2)\n"
        "uv = (m.vertices[:, :2] * 0.5 + 0.5).clip(0, 1).astype(np.float32)\n"
        "rasterize.rasterize_uv(rasterize.raster_context(), Mesh(m.vertices.astype(np.float32), m.faces.astype(np.int32), uvs=uv), 32)\n"
        "import torch\n"
        "torch.optim.Adam([torch.zeros(3, requires_grad=True)])\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


def test_silhouettes_are_the_coverage_of_the_full_raster():
    import trimesh

    mesh = to_mesh(trimesh.creation.icosphere(subdivisions=2, radius=0.45))
    cams = sphere_cameras(5, 2.0, 40.0, 96)
    cams.Ks[2, 0, 2] += 30.0          # one view with the object partly outside the image
    full = R.rasterize_views(gl_context(), mesh, cams)
    sil = R.rasterize_silhouettes(gl_context(), mesh, cams)
    assert sil.dtype == bool and sil.shape == full.tri_id.shape
    assert (sil == (full.tri_id >= 0)).all() and sil.any()
