"""Mesh cleanup and quadric simplification."""

from __future__ import annotations

import numpy as np
import pytest
import trimesh

from kiln.settings import ReconstructSettings
from pipeline.meshing.mesh_ops import clean_mesh, simplify_mesh
from pipeline.recon.reconstruct import reconstruct
from pipeline.types import ImageInput, Mesh
from pipeline.validate import StageInputError
from synthetic import make_object_image


def _mesh(tm: trimesh.Trimesh, colors=None) -> Mesh:
    return Mesh(vertices=np.asarray(tm.vertices, np.float32), faces=np.asarray(tm.faces, np.int32),
                vertex_colors=colors)


def _tm(mesh: Mesh) -> trimesh.Trimesh:
    return trimesh.Trimesh(mesh.vertices, mesh.faces, process=False)


def _sphere_with_colors(subdivisions=3):
    tm = trimesh.creation.icosphere(subdivisions=subdivisions, radius=0.4)
    colors = ((np.asarray(tm.vertices) / 0.8) + 0.5).astype(np.float32)    # colour = position
    return tm, colors


@pytest.fixture(scope="module")
def recon_mesh() -> Mesh:
    rgb, mask = make_object_image(256, "blob", seed=1)
    s = ReconstructSettings(resolution=112, num_gaussians=1000)
    return reconstruct(ImageInput(rgb, mask), s, seed=0).mesh


# --------------------------------------------------------------------------- clean

def test_clean_keeps_a_clean_mesh(recon_mesh):
    out = clean_mesh(recon_mesh, 0.01, False)
    assert np.array_equal(out.faces, recon_mesh.faces)
    assert np.array_equal(out.vertices, recon_mesh.vertices)
    assert np.array_equal(out.vertex_colors, recon_mesh.vertex_colors)
    assert _tm(out).is_watertight
    assert np.isclose(_tm(out).volume, _tm(recon_mesh).volume)


def test_clean_merges_duplicate_vertices_of_a_triangle_soup():
    tm, colors = _sphere_with_colors()
    soup_v = tm.vertices[tm.faces].reshape(-1, 3)
    soup_c = colors[tm.faces].reshape(-1, 3)
    soup = Mesh(np.asarray(soup_v, np.float32), np.arange(len(soup_v), dtype=np.int32).reshape(-1, 3),
                soup_c)
    assert not _tm(soup).is_watertight
    out = clean_mesh(soup, 0.0, False)
    assert out.num_vertices == len(tm.vertices)
    assert out.num_faces == len(tm.faces)
    assert _tm(out).is_watertight and _tm(out).volume > 0
    # each vertex keeps its colour (colour = position)
    assert np.allclose(out.vertex_colors, out.vertices / 0.8 + 0.5, atol=1e-5)


def test_clean_drops_degenerate_and_duplicate_faces():
    tm, colors = _sphere_with_colors()
    f = np.asarray(tm.faces)
    extra = np.concatenate([
        f[:10],                              # exact duplicates
        f[10:20, ::-1],                      # duplicates with the other winding
        np.stack([f[:5, 0], f[:5, 0], f[:5, 1]], 1),   # repeated vertex
    ])
    dirty = Mesh(np.asarray(tm.vertices, np.float32), np.concatenate([f, extra]).astype(np.int32), colors)
    assert not _tm(dirty).is_watertight
    out = clean_mesh(dirty, 0.0, False)
    assert out.num_faces == len(f)
    assert _tm(out).is_watertight and _tm(out).volume > 0
    # the originals (first occurrences) stay, winding included
    assert np.array_equal(out.faces, f)


def test_clean_drops_small_floating_parts():
    big, big_c = _sphere_with_colors(subdivisions=3)                     # 1280 faces
    small = trimesh.creation.icosphere(subdivisions=0, radius=0.05)      # 20 faces
    small.apply_translation([0.45, 0.45, 0.45])
    both = trimesh.util.concatenate([big, small])
    colors = np.concatenate([big_c, np.zeros((len(small.vertices), 3), np.float32)])
    mesh = _mesh(both, colors)
    out = clean_mesh(mesh, 0.05, False)
    assert out.num_faces == 1280
    assert np.linalg.norm(out.vertices, axis=1).max() < 0.41            # the speck is gone
    assert np.allclose(out.vertex_colors, out.vertices / 0.8 + 0.5, atol=1e-5)
    # with fraction 0 nothing is dropped; with a tiny fraction the speck (20 >= 0.01*1280) stays
    assert clean_mesh(mesh, 0.0, False).num_faces == 1300
    assert clean_mesh(mesh, 0.01, False).num_faces == 1300


def test_fill_holes_closes_cut_out_faces():
    tm, colors = _sphere_with_colors()
    keep = np.ones(len(tm.faces), bool)
    keep[[0, 100, 500]] = False                                           # three separate holes
    holed = Mesh(np.asarray(tm.vertices, np.float32), np.asarray(tm.faces[keep], np.int32), colors)
    assert not _tm(holed).is_watertight
    assert not _tm(clean_mesh(holed, 0.0, False)).is_watertight
    filled = clean_mesh(holed, 0.0, True)
    assert _tm(filled).is_watertight and _tm(filled).is_winding_consistent
    assert filled.num_faces == len(tm.faces)
    assert filled.num_vertices == len(tm.vertices) and filled.vertex_colors is not None


def test_clean_refuses_nan_vertices():
    tm, _ = _sphere_with_colors(1)
    mesh = _mesh(tm)
    mesh.vertices[3, 1] = np.nan
    with pytest.raises(StageInputError, match="vertices.*non-finite"):
        clean_mesh(mesh, 0.01, False)


def test_clean_refuses_bad_fraction_and_indices():
    tm, _ = _sphere_with_colors(1)
    with pytest.raises(StageInputError, match="min_component_fraction"):
        clean_mesh(_mesh(tm), 1.5, False)
    bad = _mesh(tm)
    bad.faces[0, 0] = 10_000
    with pytest.raises(StageInputError, match="faces"):
        clean_mesh(bad, 0.01, False)


def test_absurdly_large_meshes_are_refused():
    n = 10_000_001     # a broadcast view: the test allocates nothing
    huge = Mesh(vertices=np.float32([[0, 0, 0], [1, 0, 0], [0, 1, 0]]),
                faces=np.broadcast_to(np.int32([[0, 1, 2]]), (n, 3)))
    with pytest.raises(StageInputError, match="more than the limit"):
        clean_mesh(huge, 0.01, False)
    with pytest.raises(StageInputError, match="more than the limit"):
        simplify_mesh(huge, 0.9)


# --------------------------------------------------------------------------- simplify

@pytest.mark.parametrize("ratio", [0.5, 0.9, 0.95, 0.99])
def test_simplify_hits_the_target(recon_mesh, ratio):
    out = simplify_mesh(recon_mesh, ratio)
    target = round(recon_mesh.num_faces * (1 - ratio))
    assert abs(out.num_faces - target) <= 0.05 * target
    assert out.vertices.dtype == np.float32 and out.faces.dtype == np.int32
    tm = _tm(out)
    assert tm.is_watertight and tm.volume > 0
    # the shape survives: volume within a few percent; quadric-optimal vertices may
    # sit a little outside the input's bounds, not more
    assert abs(tm.volume - _tm(recon_mesh).volume) / _tm(recon_mesh).volume < 0.05
    assert np.abs(out.vertices).max() <= 0.5 + 0.02


def test_simplify_carries_vertex_colors():
    tm, colors = _sphere_with_colors(subdivisions=5)                     # 20480 faces
    out = simplify_mesh(Mesh(np.asarray(tm.vertices, np.float32), np.asarray(tm.faces, np.int32),
                             colors), 0.95)
    assert out.vertex_colors is not None and out.vertex_colors.shape == (out.num_vertices, 3)
    assert out.vertex_colors.dtype == np.float32
    # colour = position on the input; nearest-vertex transfer keeps that to within a vertex spacing
    assert np.abs(out.vertex_colors - (out.vertices / 0.8 + 0.5)).max() < 0.05


def test_simplify_ratio_zero_returns_the_mesh(recon_mesh):
    assert simplify_mesh(recon_mesh, 0.0) is recon_mesh


@pytest.mark.parametrize("ratio", [1.0, -0.1, 1.5, float("nan"), "half"])
def test_simplify_refuses_bad_ratios(recon_mesh, ratio):
    with pytest.raises(StageInputError, match="ratio"):
        simplify_mesh(recon_mesh, ratio)


def test_simplify_refuses_a_target_below_a_few_faces():
    tm, _ = _sphere_with_colors(1)                                       # 80 faces
    with pytest.raises(StageInputError, match="simplify_ratio"):
        simplify_mesh(_mesh(tm), 0.99)


def test_simplify_reaches_the_target_on_an_open_sheet():
    # a wavy 100x100 sheet: its 400 border vertices are locked by default, which
    # stops fqmr near 450 faces; the retry unlocks the border
    n = 100
    xs = np.linspace(-0.5, 0.5, n + 1)
    x, y = np.meshgrid(xs, xs)
    v = np.stack([x.ravel(), y.ravel(), 0.02 * np.sin(6 * x.ravel()) * np.cos(5 * y.ravel())], 1)
    idx = np.arange((n + 1) ** 2).reshape(n + 1, n + 1)
    a, b, c, d = idx[:-1, :-1].ravel(), idx[:-1, 1:].ravel(), idx[1:, 1:].ravel(), idx[1:, :-1].ravel()
    f = np.concatenate([np.stack([a, b, c], 1), np.stack([a, c, d], 1)])
    sheet = Mesh(v.astype(np.float32), f.astype(np.int32))
    out = simplify_mesh(sheet, 0.99)
    assert abs(out.num_faces - 200) <= 10
    # still a sheet spanning the square
    assert np.abs(out.vertices[:, :2]).max() > 0.45 and np.abs(out.vertices[:, 2]).max() < 0.05
