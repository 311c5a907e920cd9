"""Bake views cache: a re-run that changes only mesh/UV/bake settings renders no views,
one that changes what the views depend on renders them again, and both bake the same."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import cache
from pipeline.camera.cameras import sphere_cameras
from pipeline.types import ImageInput, Views
from worker_helpers import image, small_settings


def _input(seed=3):
    rgb, mask = image(seed=seed, size=64)
    return ImageInput(rgb=rgb, mask=mask)


class RenderCounter:
    """Wraps render_views.render_gaussians and counts the calls."""

    def __init__(self, monkeypatch):
        from pipeline.views import render_views

        self.calls = 0
        real = render_views.render_gaussians

        def counting(*a, **k):
            self.calls += 1
            return real(*a, **k)

        monkeypatch.setattr(render_views, "render_gaussians", counting)


def test_rerun_with_only_postprocessing_changes_skips_reconstruction_and_views(tmp_path, monkeypatch):
    from pipeline.recon import reconstruct
    from pipeline.run import run_pipeline

    renders = RenderCounter(monkeypatch)
    img, s = _input(), small_settings()
    c = tmp_path / "cache"
    first = run_pipeline(img, s, tmp_path / "a", cache_dir=c)
    assert renders.calls == 1 and first.stats.views_cached is False

    def no_reconstruct(*a, **k):
        raise AssertionError("reconstruction ran again")

    monkeypatch.setattr(reconstruct, "reconstruct", no_reconstruct)
    for i, change in enumerate(({"mesh.simplify_ratio": 0.8}, {"bake.mode": "fast"},
                                {"bake.texture_size": 512}, {"bake.unwrap": "xatlas"})):
        res = run_pipeline(img, s.override(change), tmp_path / f"b{i}", cache_dir=c)
        assert res.reconstruction_cached and res.stats.views_cached is True, change
    assert renders.calls == 1

    # the views depend on the view settings: those render again
    again = run_pipeline(img, s.override({"views.count": 3}), tmp_path / "c", cache_dir=c)
    assert again.stats.views_cached is False and renders.calls == 2


def test_cache_hit_bakes_the_same_texture_as_the_first_run(tmp_path):
    import trimesh

    from pipeline.run import run_pipeline

    img, s = _input(seed=4), small_settings(**{"bake.mode": "fast"})
    a = run_pipeline(img, s, tmp_path / "a", cache_dir=tmp_path / "cache")
    b = run_pipeline(img, s, tmp_path / "b", cache_dir=tmp_path / "cache")
    assert not a.stats.views_cached and b.stats.views_cached

    def texture(path):
        scene = trimesh.load(path)
        geom = next(iter(scene.geometry.values()))
        return np.asarray(geom.visual.material.baseColorTexture)

    assert np.array_equal(texture(a.glb_path), texture(b.glb_path))


def _views(n=2, size=16, seed=0) -> Views:
    rng = np.random.default_rng(seed)
    cams = sphere_cameras(n, 2.4, 40.0, size)
    return Views(rgb=rng.uniform(0, 1, (n, size, size, 3)).astype(np.float32),
                 alpha=rng.uniform(0, 1, (n, size, size)).astype(np.float32), cameras=cams)


def test_views_key_follows_view_settings_renderer_and_reconstruction_only():
    s = small_settings()
    rk = "ab" * 32
    k = cache.views_key(rk, s, "cpu", "cpu")
    for change in ({"mesh.simplify_ratio": 0.8}, {"bake.mode": "fast"}, {"bake.texture_size": 2048},
                   {"bake.unwrap": "xatlas"}, {"views.backend": "cpu"}, {"rasterize.backend": "moderngl"}):
        assert cache.views_key(rk, s.override(change), "cpu", "cpu") == k, change
    keys = {k, cache.views_key("cd" * 32, s, "cpu", "cpu"), cache.views_key(rk, s, "gsplat", "cuda")}
    for change in ({"views.count": 5}, {"views.resolution": 256}, {"views.radius": 3.0},
                   {"views.fov_deg": 30.0}):
        keys.add(cache.views_key(rk, s.override(change), "cpu", "cpu"))
    assert len(keys) == 7


def test_views_round_trip_and_bad_entries_are_dropped(tmp_path):
    v = _views()
    key = "ef" * 32
    path = cache.save_views(tmp_path, key, v)
    back = cache.load_views(tmp_path, key, v.cameras)
    q = cache.quantise_views(v)
    assert np.array_equal(back.rgb, q.rgb) and np.array_equal(back.alpha, q.alpha)
    assert np.abs(back.rgb - v.rgb).max() < 1e-3
    # asked for with other cameras: not trusted, removed
    assert cache.load_views(tmp_path, key, sphere_cameras(3, 2.4, 40.0, 16)) is None
    assert not path.exists()
    cache.save_views(tmp_path, key, v)
    path.write_bytes(b"not a zip")
    assert cache.load_views(tmp_path, key, v.cameras) is None and not path.exists()
    with pytest.raises(ValueError):
        cache.load_views(tmp_path, "../x", v.cameras)


def test_least_recently_used_views_are_evicted(tmp_path, monkeypatch):
    import os

    v = _views()
    paths = []
    for i in range(3):
        paths.append(cache.save_views(tmp_path, f"{i:x}" * 64, v))
        os.utime(paths[-1], (1000 + i, 1000 + i))      # deterministic ages
    one = paths[0].stat().st_size
    monkeypatch.setattr(cache, "VIEWS_MAX_TOTAL_BYTES", int(3.5 * one))
    paths.append(cache.save_views(tmp_path, "d" * 64, v))
    assert not paths[0].exists() and all(p.exists() for p in paths[1:])


def test_views_kept_as_tensors_store_the_same_cache_and_bake_the_same(tmp_path, monkeypatch):
    """On a GPU the renderer leaves the views on the device (run.py asks for tensors when the
    device is CUDA); forced here on the CPU, the cache entry holds the same arrays, the bake
    gets tensors holding the same values as the numpy run's, and the textures agree."""
    import torch
    import trimesh

    from pipeline.texture import bake
    from pipeline.views import render_views
    from pipeline.run import run_pipeline

    baked = []
    real_bake = bake.bake_texture

    def recording_bake(mesh, views, *a, **k):
        baked.append(views)
        return real_bake(mesh, views, *a, **k)

    monkeypatch.setattr(bake, "bake_texture", recording_bake)
    img, s = _input(seed=5), small_settings(**{"bake.mode": "fast"})
    a = run_pipeline(img, s, tmp_path / "a", cache_dir=tmp_path / "ca")

    real_render = render_views.render_gaussians
    monkeypatch.setattr(render_views, "render_gaussians",
                        lambda *a_, **k: real_render(*a_, **{**k, "as_tensors": True}))
    b = run_pipeline(img, s, tmp_path / "b", cache_dir=tmp_path / "cb")
    assert not a.stats.views_cached and not b.stats.views_cached

    assert isinstance(baked[0].rgb, np.ndarray) and isinstance(baked[1].rgb, torch.Tensor)
    assert np.array_equal(baked[1].rgb.numpy(), baked[0].rgb)
    assert np.array_equal(baked[1].alpha.numpy(), baked[0].alpha)

    (entry_a,) = (tmp_path / "ca").rglob("views-*.npz")
    (entry_b,) = (tmp_path / "cb").rglob("views-*.npz")
    assert entry_a.name == entry_b.name
    with np.load(entry_a) as za, np.load(entry_b) as zb:
        assert sorted(za.files) == sorted(zb.files)
        for name in za.files:    # the zip's timestamps differ; every array's bytes must not
            assert za[name].dtype == zb[name].dtype and za[name].tobytes() == zb[name].tobytes(), name

    def texture(path):
        geom = next(iter(trimesh.load(path).geometry.values()))
        return np.asarray(geom.visual.material.baseColorTexture)

    assert np.array_equal(texture(a.glb_path), texture(b.glb_path))


def test_the_front_view_is_not_rendered_where_the_photo_shows_it(tmp_path, monkeypatch):
    """The built-in reconstruction's photo looks at the object's front, along the first bake
    view: with the photo projected that view is not rendered (the bake takes the photo's
    pixels there); without the photo it is. The two sets of views are cached apart."""
    from pipeline.views import render_views
    from pipeline.run import run_pipeline

    counts: list[int] = []
    real = render_views.render_gaussians

    def counting(g, cameras, *a, **k):
        counts.append(len(cameras))
        return real(g, cameras, *a, **k)

    monkeypatch.setattr(render_views, "render_gaussians", counting)
    img, s = _input(), small_settings()
    n = s.views.count
    c = tmp_path / "cache"
    with_photo = run_pipeline(img, s, tmp_path / "a", cache_dir=c)
    without = run_pipeline(img, s.override({"bake.photo_projection": False}), tmp_path / "b", cache_dir=c)
    assert counts == [n - 1, n]
    assert not with_photo.stats.views_cached and not without.stats.views_cached
    assert run_pipeline(img, s, tmp_path / "c", cache_dir=c).stats.views_cached and counts == [n - 1, n]


def test_photo_shows_front_within_five_degrees():
    import math

    from pipeline.camera.cameras import look_at, photo_shows_front
    from pipeline.types import SourceCamera

    cams = sphere_cameras(4, 2.4, 40.0, 16)
    K = np.array([[20.0, 0, 8], [0, 20.0, 8], [0, 0, 1]], np.float32)

    def photo(deg: float) -> SourceCamera:
        eye = 3.0 * np.array([math.sin(math.radians(deg)), 0.0, math.cos(math.radians(deg))])
        return SourceCamera(viewmat=look_at(eye).astype(np.float32), K=K, width=16, height=16)

    assert photo_shows_front(photo(0.0), cams) and photo_shows_front(photo(4.0), cams)
    assert not photo_shows_front(photo(6.0), cams) and not photo_shows_front(photo(180.0), cams)
