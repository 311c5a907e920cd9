"""Reconstruction cache: keyed by exactly what reconstruction depends on, atomic,
self-healing, and used by run_pipeline so post-processing changes skip reconstruction."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import cache
from pipeline.types import Gaussians, ImageInput, Mesh, Reconstruction
from worker_helpers import image, small_settings


def _recon(seed: int = 0, colors: bool = True) -> Reconstruction:
    rng = np.random.default_rng(seed)
    v = rng.uniform(-0.5, 0.5, (12, 3)).astype(np.float32)
    f = rng.integers(0, 12, (20, 3)).astype(np.int32)
    vc = rng.uniform(0, 1, (12, 3)).astype(np.float32) if colors else None
    n = 30
    q = rng.normal(size=(n, 4)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    g = Gaussians(means=rng.uniform(-0.5, 0.5, (n, 3)).astype(np.float32),
                  scales=rng.uniform(0.01, 0.05, (n, 3)).astype(np.float32), quats=q,
                  opacities=rng.uniform(0.1, 1, n).astype(np.float32),
                  colors=rng.uniform(0, 1, (n, 3)).astype(np.float32))
    return Reconstruction(mesh=Mesh(vertices=v, faces=f, vertex_colors=vc), gaussians=g,
                          meta={"backend": "builtin", "scale": 1.5})


def _input(seed=0):
    rgb, mask = image(seed=seed, size=64)
    return ImageInput(rgb=rgb, mask=mask)


def test_key_depends_on_inputs_reconstruct_settings_and_seed_only():
    img, s = _input(), small_settings()
    k = cache.reconstruction_key(img, s)
    assert len(k) == 64 and k == cache.reconstruction_key(_input(), small_settings())
    # post-processing settings do not matter
    for change in ({"bake.enabled": False}, {"mesh.simplify_ratio": 0.9}, {"bake.texture_size": 2048},
                   {"views.count": 8}, {"export.gaussians_ply": True}, {"bake.mode": "fast"},
                   {"worker.device": "cpu"}, {"rasterize.backend": "moderngl"}):
        assert cache.reconstruction_key(img, s.override(change)) == k, change
    # what reconstruction depends on does
    keys = {k}
    for change in ({"reconstruct.thickness": 0.9}, {"reconstruct.resolution": 96},
                   {"reconstruct.num_gaussians": 3000}, {"reconstruct.max_image_side": 512},
                   {"seed": 1}):
        keys.add(cache.reconstruction_key(img, s.override(change)))
    other_mask = ImageInput(rgb=img.rgb, mask=img.mask.copy())
    other_mask.mask[0, 0] = not other_mask.mask[0, 0]
    keys.add(cache.reconstruction_key(other_mask, s))
    other_rgb = ImageInput(rgb=img.rgb.copy(), mask=img.mask)
    other_rgb.rgb[5, 5, 1] ^= 1
    keys.add(cache.reconstruction_key(other_rgb, s))
    assert len(keys) == 8


def test_code_version_covers_reconstruct_and_what_it_imports():
    files = {p.relative_to(cache._PIPELINE_DIR).as_posix() for p in cache._module_closure("recon.reconstruct")}
    assert {"recon/reconstruct.py", "types.py", "validate.py"} <= files
    assert "texture/bake.py" not in files and "io/export.py" not in files
    builtin = {p.relative_to(cache._PIPELINE_DIR).as_posix() for p in cache._module_closure("recon.builtin")}
    assert "recon/builtin.py" in builtin and len(builtin) > 3


def test_views_code_version_covers_the_renderers_and_their_kernels():
    # the folder moves once left the roots naming no file: the hash covered no source at all
    files = {p.relative_to(cache._PIPELINE_DIR).as_posix() for p in cache._module_closure(*cache.VIEWS_CODE_ROOTS)}
    assert {"views/render_views.py", "views/gaussian_math.py", "views/splat_tiles.py",
            "views/splat_kernels.py", "camera/cameras.py"} <= files


def test_code_version_changes_with_the_reconstruction_source(monkeypatch, tmp_path):
    base = cache.code_version()
    fake = tmp_path / "pipeline"
    fake.mkdir()
    # code_version() hashes reconstruct.py, the default backend's own module (loaded
    # with importlib, which the import scan cannot see) and what they import.
    for p in cache._module_closure("recon.reconstruct", "recon.builtin"):
        dst = fake / p.relative_to(cache._PIPELINE_DIR)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(p.read_bytes())
    monkeypatch.setattr(cache, "_PIPELINE_DIR", fake)
    cache.code_version.cache_clear()
    try:
        assert cache.code_version() == base  # same sources, same version
        with open(fake / "recon" / "reconstruct.py", "a") as f:
            f.write("\n# a change\n")
        cache.code_version.cache_clear()
        assert cache.code_version() != base
    finally:
        cache.code_version.cache_clear()


def test_key_follows_the_backend_module_reconstruct_loads_dynamically(monkeypatch, tmp_path):
    img = _input()
    builtin, sam3d = small_settings(), small_settings().override({"reconstruct.backend": "sam3d"})
    fake = tmp_path / "pipeline"
    fake.mkdir()
    for p in cache._PIPELINE_DIR.rglob("*.py"):
        dst = fake / p.relative_to(cache._PIPELINE_DIR)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(p.read_bytes())
    monkeypatch.setattr(cache, "_PIPELINE_DIR", fake)
    cache.code_version.cache_clear()
    try:
        before = cache.reconstruction_key(img, builtin), cache.reconstruction_key(img, sam3d)
        with open(fake / "recon" / "sam3d.py", "a") as f:
            f.write("\n# a change to the SAM 3D conversion\n")
        cache.code_version.cache_clear()
        assert cache.reconstruction_key(img, sam3d) != before[1]
        assert cache.reconstruction_key(img, builtin) == before[0]
    finally:
        cache.code_version.cache_clear()


@pytest.mark.parametrize("colors", [True, False])
def test_save_then_load_gives_the_same_reconstruction(tmp_path, colors):
    r = _recon(colors=colors)
    key = "ab" * 32
    path = cache.save_reconstruction(tmp_path, key, r)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp files left
    back = cache.load_reconstruction(tmp_path, key)
    for a, b in ((r.mesh.vertices, back.mesh.vertices), (r.mesh.faces, back.mesh.faces),
                 (r.gaussians.means, back.gaussians.means), (r.gaussians.quats, back.gaussians.quats),
                 (r.gaussians.opacities, back.gaussians.opacities)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert (back.mesh.vertex_colors is None) == (not colors)
    assert back.meta == r.meta
    assert cache.load_reconstruction(tmp_path, "cd" * 32) is None


def test_damaged_entries_are_dropped_not_trusted(tmp_path):
    key = "ef" * 32
    path = cache.save_reconstruction(tmp_path, key, _recon())
    path.write_bytes(path.read_bytes()[:200])
    assert cache.load_reconstruction(tmp_path, key) is None
    assert not path.exists()
    # an entry that loads but holds invalid data (NaN vertices) is dropped too
    bad = _recon()
    bad.mesh.vertices[0, 0] = np.nan
    cache.save_reconstruction(tmp_path, key, bad)
    assert cache.load_reconstruction(tmp_path, key) is None


def test_keys_must_be_hex_digests(tmp_path):
    with pytest.raises(ValueError):
        cache.load_reconstruction(tmp_path, "../../etc/passwd")


def test_run_pipeline_skips_reconstruction_when_only_postprocessing_changes(tmp_path):
    from pipeline.run import run_pipeline

    img = _input(seed=4)
    s = small_settings(bake__enabled=False)
    first = run_pipeline(img, s, tmp_path / "a", cache_dir=tmp_path / "cache")
    assert not first.reconstruction_cached
    second = run_pipeline(img, s.override({"mesh.simplify_ratio": 0.8}), tmp_path / "b",
                          cache_dir=tmp_path / "cache")
    assert second.reconstruction_cached
    third = run_pipeline(img, s.override({"reconstruct.thickness": 1.0}), tmp_path / "c",
                         cache_dir=tmp_path / "cache")
    assert not third.reconstruction_cached
    assert len(list((tmp_path / "cache").glob("recon-*.npz"))) == 2


def test_unwritable_cache_does_not_fail_the_job(tmp_path):
    from pipeline.run import run_pipeline

    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder should be")
    res = run_pipeline(_input(seed=5), small_settings(**{"bake.enabled": False}), tmp_path / "out",
                       cache_dir=blocked)
    assert res.glb_path.is_file() and not res.reconstruction_cached
    assert res.stats.reconstruction_cache_error


def test_an_entry_served_counts_as_recently_used(tmp_path):
    """The disk budget (worker.upkeep.budget) removes the least recently used entries first:
    one a re-bake is served from is touched, so it is the last to go."""
    import os
    import time

    key = cache.reconstruction_key(_input(), small_settings())
    path = cache.save_reconstruction(tmp_path, key, _recon())
    os.utime(path, (1, 1))
    assert cache.load_reconstruction(tmp_path, key) is not None
    assert path.stat().st_mtime > time.time() - 60
