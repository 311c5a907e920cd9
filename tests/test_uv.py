"""UV unwrapping: charts inside [0, 1], not overlapping, separated by the gutter.

The contract tests run for both unwrappers (Kiln's own and xatlas); the rest
covers what only Kiln's has: charts that fold are split, noisy meshes stay valid.
"""

from __future__ import annotations

import numpy as np
import pytest
import trimesh

from kiln.settings import ReconstructSettings
from pipeline.meshing.mesh_ops import simplify_mesh
from pipeline.recon.reconstruct import reconstruct
from pipeline.types import ImageInput, Mesh
from pipeline.unwrap.uv import unwrap
from pipeline.validate import StageInputError
from synthetic import make_object_image


@pytest.fixture(scope="module")
def small_mesh() -> Mesh:
    """A reconstructed blob simplified to about 2k faces."""
    rgb, mask = make_object_image(256, "blob", seed=2)
    recon = reconstruct(ImageInput(rgb, mask), ReconstructSettings(resolution=80, num_gaussians=1000),
                        seed=0)
    return simplify_mesh(recon.mesh, 0.9)


def chart_labels(mesh: Mesh) -> np.ndarray:
    """(F,) chart id per face: faces sharing an (already split) vertex are one chart."""
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    f = mesh.faces
    a = np.concatenate([f[:, 0], f[:, 1]])
    b = np.concatenate([f[:, 1], f[:, 2]])
    g = sp.coo_matrix((np.ones(a.size), (a, b)), shape=(mesh.num_vertices,) * 2)
    return connected_components(g, directed=False)[1][f[:, 0]]


def rasterize_charts(mesh: Mesh, size: int, inset: float = 1e-3):
    """Texel-centre rasterization of every UV triangle, each shrunk by ``inset`` (barycentric).

    Returns (count (S, S) int: triangles covering each texel, label (S, S) int: chart id, -1 none).
    Texel (row, col) centre is at uv ((col + .5) / S, 1 - (row + .5) / S).
    """
    labels = chart_labels(mesh)
    count = np.zeros((size, size), np.int32)
    label = np.full((size, size), -1, np.int64)
    p = np.stack([mesh.uvs[:, 0] * size, (1.0 - mesh.uvs[:, 1]) * size], 1).astype(np.float64)
    for tri, chart in zip(p[mesh.faces], labels):
        (x0, y0), (x1, y1) = np.floor(tri.min(0)).astype(int), np.ceil(tri.max(0)).astype(int)
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1 + 1, size), min(y1 + 1, size)
        rows, cols = np.mgrid[y0:y1, x0:x1]
        px, py = cols + 0.5, rows + 0.5
        a, b, c = tri
        det = (b[0] - a[0]) * (c[1] - a[1]) - (c[0] - a[0]) * (b[1] - a[1])
        if abs(det) < 1e-12:
            continue
        w1 = ((px - a[0]) * (c[1] - a[1]) - (c[0] - a[0]) * (py - a[1])) / det
        w2 = ((b[0] - a[0]) * (py - a[1]) - (px - a[0]) * (b[1] - a[1])) / det
        inside = (w1 > inset) & (w2 > inset) & (1.0 - w1 - w2 > inset)
        count[rows[inside], cols[inside]] += 1
        label[rows[inside], cols[inside]] = chart
    return count, label


def min_chart_distance(label: np.ndarray, limit: int = 64) -> int:
    """Smallest Chebyshev distance in texels between texels of two different charts."""
    from scipy import ndimage

    big = 1 << 30          # a float64-exact sentinel: ndimage passes cval through a double
    for d in range(1, limit):
        hi = ndimage.maximum_filter(label, size=d + 1, mode="constant", cval=-1)
        lo = ndimage.minimum_filter(np.where(label < 0, big, label), size=d + 1, mode="constant", cval=big)
        if ((hi >= 0) & (lo < big) & (hi != lo)).any():
            return d
    return limit


@pytest.mark.parametrize("method", ["kiln", "xatlas"])
@pytest.mark.parametrize("size, gutter", [(256, 2), (512, 4)])
def test_unwrap_packs_charts_without_overlap_and_with_gutter(small_mesh, size, gutter, method):
    out = unwrap(small_mesh, texture_size=size, gutter=gutter, max_faces=100_000, method=method)
    out.validate()
    assert out.uvs.dtype == np.float32 and out.faces.dtype == np.int32
    assert out.vertices.dtype == np.float32
    assert out.uvs.min() >= 0.0 and out.uvs.max() <= 1.0
    assert out.num_faces == small_mesh.num_faces
    assert out.num_vertices >= small_mesh.num_vertices          # split along seams

    count, label = rasterize_charts(out, size)
    assert count.max() == 1, "UV triangles overlap"
    charts = len(np.unique(label[label >= 0]))
    assert charts >= 2
    # every chart can be dilated by `gutter` texels (what the baker does) without
    # reaching another chart
    assert min_chart_distance(label) >= 2 * gutter + 1
    # the atlas is used, not shrunk into a corner
    assert (count > 0).mean() > 0.3


@pytest.mark.parametrize("method", ["kiln", "xatlas"])
def test_unwrap_keeps_geometry_and_colours_face_by_face(small_mesh, method):
    out = unwrap(small_mesh, texture_size=256, gutter=2, max_faces=100_000, method=method)
    assert np.array_equal(out.vertices[out.faces], small_mesh.vertices[small_mesh.faces])
    assert np.array_equal(out.vertex_colors[out.faces], small_mesh.vertex_colors[small_mesh.faces])
    # and the surface stays closed once seams are welded again
    welded = trimesh.Trimesh(out.vertices, out.faces, process=True)
    assert welded.is_watertight and welded.volume > 0


@pytest.mark.parametrize("method", ["kiln", "xatlas"])
def test_unwrap_uv_area_follows_surface_area(small_mesh, method):
    """Texel density is roughly uniform: UV area per surface area varies little across faces."""
    out = unwrap(small_mesh, texture_size=512, gutter=4, max_faces=100_000, method=method)
    uv = out.uvs[out.faces].astype(np.float64)
    uv_area = 0.5 * np.abs((uv[:, 1, 0] - uv[:, 0, 0]) * (uv[:, 2, 1] - uv[:, 0, 1])
                           - (uv[:, 2, 0] - uv[:, 0, 0]) * (uv[:, 1, 1] - uv[:, 0, 1]))
    xyz = out.vertices[out.faces].astype(np.float64)
    area = 0.5 * np.linalg.norm(np.cross(xyz[:, 1] - xyz[:, 0], xyz[:, 2] - xyz[:, 0]), axis=1)
    ratio = uv_area[area > 0] / area[area > 0]
    assert (uv_area > 0).all()
    assert np.percentile(ratio, 90) / np.percentile(ratio, 10) < 3.0


@pytest.mark.parametrize("method", ["kiln", "xatlas"])
def test_large_gutter_on_small_texture_still_fits(small_mesh, method):
    out = unwrap(small_mesh, texture_size=128, gutter=8, max_faces=100_000, method=method)
    count, label = rasterize_charts(out, 128)
    assert count.max() == 1
    assert min_chart_distance(label) >= 17


def test_unwrap_refuses_too_many_faces(small_mesh):
    with pytest.raises(StageInputError, match="simplify_ratio"):
        unwrap(small_mesh, texture_size=256, gutter=2, max_faces=small_mesh.num_faces - 1)


@pytest.mark.parametrize("size, gutter, word", [(8, 2, "texture_size"), (256, -1, "gutter"),
                                                (256, 40, "gutter"), (256.0, 2, "texture_size")])
def test_unwrap_refuses_bad_sizes(small_mesh, size, gutter, word):
    with pytest.raises(StageInputError, match=word):
        unwrap(small_mesh, texture_size=size, gutter=gutter, max_faces=100_000)


def test_unwrap_refuses_nan_vertices(small_mesh):
    bad = Mesh(small_mesh.vertices.copy(), small_mesh.faces.copy())
    bad.vertices[0, 0] = np.nan
    with pytest.raises(StageInputError, match="non-finite"):
        unwrap(bad, texture_size=256, gutter=2, max_faces=100_000)


def test_unwrap_refuses_unknown_method(small_mesh):
    with pytest.raises(StageInputError, match="unwrap method"):
        unwrap(small_mesh, texture_size=256, gutter=2, max_faces=100_000, method="magic")


def uv_signed_areas(mesh: Mesh) -> np.ndarray:
    q = mesh.uvs[mesh.faces].astype(np.float64)
    d1, d2 = q[:, 1] - q[:, 0], q[:, 2] - q[:, 0]
    return 0.5 * (d1[:, 0] * d2[:, 1] - d1[:, 1] * d2[:, 0])


def noisy_sphere(subdivisions: int = 5, noise: float = 0.02, seed: int = 0) -> Mesh:
    """An icosphere with every vertex pushed in or out at random: a scan-like surface."""
    s = trimesh.creation.icosphere(subdivisions=subdivisions, radius=0.4)
    rng = np.random.default_rng(seed)
    v = s.vertices * (1.0 + noise * rng.standard_normal((len(s.vertices), 1)))
    return Mesh(v.astype(np.float32), s.faces.astype(np.int32))


def test_kiln_unwrap_of_a_noisy_scan_has_no_flips_or_overlaps():
    mesh = noisy_sphere()
    out = unwrap(mesh, texture_size=1024, gutter=2, max_faces=100_000)
    assert np.array_equal(out.vertices[out.faces], mesh.vertices[mesh.faces])
    assert (uv_signed_areas(out) > 0).all(), "folded UV triangles"
    count, label = rasterize_charts(out, 1024)
    assert count.max() == 1, "UV triangles overlap"
    assert min_chart_distance(label) >= 5
    assert (count > 0).mean() > 0.3


def test_charts_that_fold_are_split_until_none_does(monkeypatch):
    """A whole closed sphere as one chart cannot be flattened: LSCM folds it. The unwrap
    must notice (UV area <= 0, or the chart overlapping itself) and cut it up."""
    import pipeline.unwrap.charts as charts_mod

    monkeypatch.setattr(charts_mod, "segment", lambda graph: np.zeros(graph.num_faces, np.int64))
    mesh = noisy_sphere(subdivisions=4, noise=0.0)
    out = unwrap(mesh, texture_size=512, gutter=2, max_faces=100_000)
    assert (uv_signed_areas(out) > 0).all()
    count, label = rasterize_charts(out, 512)
    assert count.max() == 1
    assert len(np.unique(label[label >= 0])) > 1


def test_uv_metrics_see_overlaps_and_distortion():
    from pipeline.unwrap.uv_metrics import coverage, distortion

    v = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]], np.float32)
    f = np.array([[0, 1, 2], [1, 3, 2]], np.int32)
    iso = np.array([[0.1, 0.1], [0.6, 0.1], [0.1, 0.6], [0.6, 0.6]], np.float32)
    cov = coverage(iso, f, 64)
    assert cov.count.max() == 1 and cov.overlapping_faces().size == 0
    assert abs(cov.utilisation - 0.25) < 0.03
    d = distortion(v, f, iso)
    assert abs(d["area"] - 1) < 1e-6 and abs(d["angle"] - 1) < 1e-6
    folded = iso.copy()
    folded[3] = [0.05, 0.05]            # the second triangle now covers the first
    assert set(coverage(folded, f, 64).overlapping_faces()) == {0, 1}
    stretched = iso * [1.0, 0.5]
    assert distortion(v, f, stretched)["angle"] == pytest.approx(2.0)


def blob_with_handle() -> Mesh:
    """A ball with a long thin rod: the rod's charts would fix the atlas' texel density."""
    rod = trimesh.creation.cylinder(radius=0.02, height=1.0, sections=24)
    for _ in range(3):
        rod = rod.subdivide()
    m = trimesh.util.concatenate([rod, trimesh.creation.icosphere(3, radius=0.15)])
    return Mesh(m.vertices.astype(np.float32), m.faces.astype(np.int32))


def _coverage_by_pairs(uvs, faces, size):
    """The vectorised numpy rule the compiled coverage replaced, as its reference: every
    (triangle, texel centre of its box) pair as arrays, the same barycentric formulae.
    Returns (count (S*S,), hit_face, hit_texel) in face order."""
    from pipeline.unwrap.uv_metrics import INSET

    p = np.stack([uvs[:, 0].astype(np.float64) * size, (1.0 - uvs[:, 1].astype(np.float64)) * size], 1)
    tri = p[faces]
    lo = np.clip(np.ceil(tri.min(1) - 0.5), 0, size - 1).astype(np.int64)
    hi = np.clip(np.floor(tri.max(1) - 0.5), 0, size - 1).astype(np.int64)
    ncol = np.maximum(hi[:, 0] - lo[:, 0] + 1, 0)
    n = ncol * np.maximum(hi[:, 1] - lo[:, 1] + 1, 0)
    a, b, c = tri[:, 0], tri[:, 1], tri[:, 2]
    det = (b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (c[:, 0] - a[:, 0]) * (b[:, 1] - a[:, 1])
    n[np.abs(det) < 1e-12] = 0
    fid = np.repeat(np.arange(len(faces)), n)
    local = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    col = lo[fid, 0] + local % ncol[fid]
    row = lo[fid, 1] + local // np.maximum(ncol[fid], 1)
    px, py = col + 0.5, row + 0.5
    ax, ay, d = a[fid, 0], a[fid, 1], det[fid]
    w1 = ((px - ax) * (c[fid, 1] - ay) - (c[fid, 0] - ax) * (py - ay)) / d
    w2 = ((b[fid, 0] - ax) * (py - ay) - (px - ax) * (b[fid, 1] - ay)) / d
    inside = (w1 > INSET) & (w2 > INSET) & (1.0 - w1 - w2 > INSET)
    texel = row[inside] * size + col[inside]
    return np.bincount(texel, minlength=size * size), fid[inside], texel


def test_compiled_coverage_decides_every_centre_as_the_array_version_did(small_mesh):
    from pipeline.unwrap.uv_metrics import coverage

    rng = np.random.default_rng(3)
    # a real atlas, random triangles (folded, overlapping, outside [0, 1], degenerate ones)
    atlas = unwrap(small_mesh, 256, 2, 20000)
    layouts = [(atlas.uvs, atlas.faces, 256)]
    pts = rng.uniform(-0.2, 1.2, (300, 2)).astype(np.float32)
    tris = rng.integers(0, 300, (400, 3))
    tris[:20, 2] = tris[:20, 1]                                   # degenerate
    layouts.append((pts, tris, 64))
    for uvs, faces, size in layouts:
        got = coverage(uvs, faces, size)
        count, hit_face, hit_texel = _coverage_by_pairs(uvs, faces, size)
        np.testing.assert_array_equal(got.count.ravel(), count)
        np.testing.assert_array_equal(got.hit_face, hit_face)
        np.testing.assert_array_equal(got.hit_texel, hit_texel)
        assert got.count.sum() > 0


def test_long_thin_parts_are_cut_so_they_do_not_shrink_the_atlas(monkeypatch):
    import pipeline.unwrap.uv as uv_mod
    from pipeline.unwrap.uv_metrics import coverage

    mesh = blob_with_handle()
    out = unwrap(mesh, texture_size=512, gutter=2, max_faces=100_000)
    count, label = rasterize_charts(out, 512)
    assert count.max() == 1 and min_chart_distance(label) >= 5
    util = (count > 0).mean()
    monkeypatch.setattr(uv_mod, "LONG_CHART", 1e9)       # the rod left whole
    rod_whole = unwrap(mesh, 512, 2, 100_000)
    whole = coverage(rod_whole.uvs, rod_whole.faces, 512)
    assert util > 0.5 and util > whole.utilisation + 0.15, (util, whole.utilisation)


def test_kiln_unwrap_refuses_a_mesh_without_area():
    flat = Mesh(np.zeros((3, 3), np.float32), np.array([[0, 1, 2]], np.int32))
    with pytest.raises(StageInputError, match="no surface area"):
        unwrap(flat, texture_size=256, gutter=2, max_faces=100)


# --------------------------------------------------------------------------- the photo chart

@pytest.fixture(scope="module")
def seen_blob():
    """The small blob and the camera its photo was taken with (orthographic, built-in backend)."""
    rgb, mask = make_object_image(256, "blob", seed=2)
    recon = reconstruct(ImageInput(rgb, mask), ReconstructSettings(resolution=80, num_gaussians=1000),
                        seed=0)
    return simplify_mesh(recon.mesh, 0.9), recon.source_camera


def photo_offsets(out: Mesh, camera, size: int) -> np.ndarray:
    """(V, 2) texel position (x right, y down, texel centres at .5) minus photo pixel position."""
    px, _ = camera.project(out.vertices)
    tex = np.stack([out.uvs[:, 0] * size, (1.0 - out.uvs[:, 1]) * size], 1).astype(np.float64)
    return tex - px


def facing(out: Mesh, camera, cos_min: float) -> np.ndarray:
    v = out.vertices.astype(np.float64)[out.faces]
    n = np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
    n /= np.maximum(np.linalg.norm(n, axis=1, keepdims=True), 1e-12)
    if camera.projection == "orthographic":
        to_cam = -camera.viewmat[2, :3].astype(np.float64)
    else:
        R, t = camera.viewmat[:3, :3].astype(np.float64), camera.viewmat[:3, 3].astype(np.float64)
        to_cam = -(R.T @ t) - v.mean(1)
        to_cam /= np.linalg.norm(to_cam, axis=1, keepdims=True)
    return (n * to_cam).sum(-1) >= cos_min


def test_photo_chart_puts_texel_centres_on_photo_pixel_centres(seen_blob):
    """Faces the photo sees squarely get UV = their projection into the photo at one texel
    per pixel, shifted by whole texels: a photo pixel centre is a texel centre, so the bake
    copies the photo and a viewer at the photo's camera shows it without resampling."""
    mesh, camera = seen_blob
    size, gutter = 512, 2
    out = unwrap(mesh, texture_size=size, gutter=gutter, max_faces=100_000, source_camera=camera)
    assert np.array_equal(out.vertices[out.faces], mesh.vertices[mesh.faces])
    count, label = rasterize_charts(out, size)
    assert count.max() == 1, "UV triangles overlap"
    assert min_chart_distance(label) >= 2 * gutter + 1
    front = facing(out, camera, 0.5)
    assert front.mean() > 0.3
    d = photo_offsets(out, camera, size)[out.faces[front]]             # (K, 3, 2)
    offset = np.median(d.reshape(-1, 2), axis=0)
    on_grid = (np.abs(d - offset).max(axis=(1, 2)) < 1e-3)
    # all but faces cut off from the rest (they get ordinary charts) are one rigid, unscaled copy
    assert on_grid.mean() > 0.98, on_grid.mean()
    assert np.abs(offset - np.round(offset)).max() < 1e-3, "photo pixel centres miss the texel centres"
    # without the camera the same faces are laid out by LSCM, off the photo's grid
    plain = unwrap(mesh, texture_size=size, gutter=gutter, max_faces=100_000)
    assert np.ptp(photo_offsets(plain, camera, size)[plain.faces[front]].reshape(-1, 2), axis=0).max() > 1.0


def test_photo_chart_halves_when_the_photo_is_larger_than_the_atlas_holds(seen_blob):
    mesh, camera = seen_blob
    big = camera.scaled(8.0)                           # the same view on a 2048 px photo
    size = 512
    out = unwrap(mesh, texture_size=size, gutter=2, max_faces=100_000, source_camera=big)
    count, _ = rasterize_charts(out, size)
    assert count.max() == 1
    front = facing(out, big, 0.5)
    px, _ = big.project(out.vertices)
    tex = np.stack([out.uvs[:, 0] * size, (1.0 - out.uvs[:, 1]) * size], 1).astype(np.float64)
    f = out.faces[front]
    scale = np.linalg.norm(tex[f[:, 1]] - tex[f[:, 0]], axis=1) / np.maximum(
        np.linalg.norm(px[f[:, 1]] - px[f[:, 0]], axis=1), 1e-9)
    s = float(np.median(scale))
    assert min(abs(s - k) for k in (0.5, 0.25, 0.125)) < 1e-5, s      # a whole mip level
    assert (np.abs(scale - s) < 1e-3).mean() > 0.98


@pytest.mark.parametrize("projection", ["orthographic", "perspective"])
def test_photo_chart_leaves_out_surface_the_photo_cannot_see(projection):
    """A small square in front of a large one, both facing the camera: the large one is
    partly hidden, so it must not share the photo's grid (it would overlap the small one)."""
    from pipeline.camera.cameras import intrinsics, look_at
    from pipeline.types import SourceCamera

    def square(half, z, n=4):
        g = np.linspace(-half, half, n + 1)
        xx, yy = np.meshgrid(g, g)
        v = np.stack([xx.ravel(), yy.ravel(), np.full(xx.size, z)], 1)
        f = []
        for r in range(n):
            for c in range(n):
                a, b, d, e = r * (n + 1) + c, r * (n + 1) + c + 1, (r + 1) * (n + 1) + c, (r + 1) * (n + 1) + c + 1
                f += [(a, b, e), (a, e, d)]                    # counter-clockwise seen from +z
        return v, np.array(f)

    v1, f1 = square(0.15, 0.2)
    v2, f2 = square(0.4, -0.2)
    mesh = Mesh(vertices=np.concatenate([v1, v2]).astype(np.float32),
                faces=np.concatenate([f1, f2 + len(v1)]).astype(np.int32))
    if projection == "orthographic":
        vm = np.diag([1.0, -1.0, -1.0, 1.0])
        vm[2, 3] = 2.0
        K = np.array([[200.0, 0, 128], [0, 200.0, 128], [0, 0, 1]])
    else:
        vm = look_at(np.array([0.0, 0.0, 2.0]), np.zeros(3))
        K = intrinsics(40.0, 256, 256)
    camera = SourceCamera(viewmat=np.asarray(vm, np.float32), K=np.asarray(K, np.float32),
                          width=256, height=256, projection=projection)
    size = 512
    out = unwrap(mesh, texture_size=size, gutter=2, max_faces=1000, source_camera=camera)
    count, _ = rasterize_charts(out, size)
    assert count.max() == 1, "hidden surface shares texels with what hides it"
    d = photo_offsets(out, camera, size)
    near = d[out.faces[: len(f1)]].reshape(-1, 2)
    assert np.ptp(near, axis=0).max() < 1e-3 and np.abs(near[0] - np.round(near[0])).max() < 1e-3
    hidden = d[out.faces[len(f1):]].reshape(-1, 2)
    assert np.abs(hidden - near[0]).max() > 1.0
