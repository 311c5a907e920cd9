"""The grid's nearest neighbours within a radius are cKDTree's (pipeline.texture.near_grid)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial import cKDTree

from pipeline.texture import near_grid
from pipeline.texture.near_grid import NearGrid


def _surface_points(rng, n):
    # points on a squashed sphere: a surface, as the symmetry search's targets are
    d = rng.normal(size=(n, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    return d * np.array([1.0, 0.6, 0.3]) + np.array([0.2, -0.1, 0.05])


@pytest.mark.parametrize("radius", [0.01, 0.05, 0.3, 5.0])
def test_matches_ckdtree_query_with_upper_bound(radius):
    rng = np.random.default_rng(3)
    points = _surface_points(rng, 20000)
    # near the surface, far off it, and outside the grid's box on every side
    queries = np.concatenate([_surface_points(rng, 3000) + rng.normal(scale=0.02, size=(3000, 3)),
                              rng.uniform(-8.0, 8.0, size=(2000, 3))])
    dist, idx = NearGrid(points, radius).query(queries)
    want_d, want_i = cKDTree(points).query(queries, distance_upper_bound=radius)
    assert np.isfinite(want_d).any() and not np.isfinite(want_d).all()
    np.testing.assert_array_equal(dist, want_d)
    np.testing.assert_array_equal(idx, want_i)


def test_tiny_radius_against_a_wide_cloud_caps_the_cells():
    rng = np.random.default_rng(4)
    points = rng.uniform(0.0, 1000.0, size=(5000, 3))
    queries = points[:500] + rng.normal(scale=1e-4, size=(500, 3))
    grid = NearGrid(points, 1e-3)
    assert grid.dims.max() <= near_grid.MAX_CELLS_PER_AXIS + 1
    dist, idx = grid.query(queries)
    want_d, want_i = cKDTree(points).query(queries, distance_upper_bound=1e-3)
    np.testing.assert_array_equal(dist, want_d)
    np.testing.assert_array_equal(idx, want_i)


def test_a_tie_keeps_the_lower_index():
    points = np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    dist, idx = NearGrid(points, 2.0).query(np.zeros((1, 3)))
    assert idx[0] == 0 and dist[0] == 1.0


def test_nothing_at_exactly_the_radius():
    # cKDTree's upper bound is strict: a point at exactly the radius is not returned
    dist, idx = NearGrid(np.array([[1.0, 0.0, 0.0]]), 1.0).query(np.zeros((1, 3)))
    assert np.isinf(dist[0]) and idx[0] == 1


def test_refuses_bad_input():
    with pytest.raises(ValueError, match="radius"):
        NearGrid(np.zeros((3, 3)), 0.0)
    with pytest.raises(ValueError, match="shape"):
        NearGrid(np.zeros((3, 2)), 1.0)
    with pytest.raises(ValueError, match="finite"):
        NearGrid(np.zeros((3, 3)), 1.0).query(np.full((1, 3), np.nan))


@pytest.mark.parametrize("tilt", [0.0, 0.05, 0.6, 1.5])
def test_symmetry_score_is_the_k_d_trees(tilt):
    """The score reads the grid within its reach and the k-d tree beyond: the same plane
    figures as the k-d tree alone, for a plane near the right one and far from it (whose
    median distance lies beyond the reach)."""
    from functools import partial

    from pipeline.texture.symmetry import SCORE_REACH, SymmetrySearch

    rng = np.random.default_rng(5)
    tgt = _surface_points(rng, 20000)
    tgt_n = (tgt - np.array([0.2, -0.1, 0.05])) / np.array([1.0, 0.6, 0.3]) ** 2
    tgt_n /= np.linalg.norm(tgt_n, axis=1, keepdims=True)
    pts, nrm = tgt[:3000], tgt_n[:3000]
    n = np.array([np.sin(tilt), 0.0, np.cos(tilt)])
    plane = (n, float(n @ np.array([0.2, -0.1, 0.05])))
    search, tol, size = SymmetrySearch(), 0.015 * 2.0, 2.0
    tree = cKDTree(tgt)

    def everywhere(points):
        return tree.query(points)

    def within(points, radius):
        d, i = tree.query(points, distance_upper_bound=radius)
        return d, i

    grid = NearGrid(tgt, tol * SCORE_REACH)
    got = search._score(plane, pts, nrm, grid.query, everywhere, tgt_n, tol, size)
    want = search._score(plane, pts, nrm, partial(within, radius=np.inf), everywhere, tgt_n, tol, size)
    assert got == want
