"""How much several photos cost a model bake: the same model baked from 1, 2 and 4 photos
(cameras given, so the fit's own time is left out: a fit costs the same per photo as with one),
at Kiln's default texture size, in one process, best of ``--repeat``. Target (issue 34):
4 photos bake in at most twice the one-photo time.

The model is an ellipsoid (20k faces, new UVs as `kiln bake --new-uvs` makes) with a smooth
colour, its photos 640x480 renders from cameras round it.

    .venv/bin/python bench/multi_photo.py [--repeat 3] [--texture-size 1024]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    import numpy as np
    import trimesh

    from kiln.settings import load
    from pipeline.backends import resolve_backends
    from pipeline.camera.cameras import intrinsics, look_at
    from pipeline.io.mesh_file import MeshFile
    from pipeline.raster.rasterize import raster_context
    from pipeline.texture.bake import render_textured
    from pipeline.texture.model_bake import ModelInputs, PlacedPhoto, bake_model
    from pipeline.types import ImageInput, Mesh, SourceCamera, Texture

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--texture-size", type=int, default=1024)
    a = ap.parse_args()
    ctx = raster_context("moderngl")
    tm = trimesh.creation.icosphere(subdivisions=5, radius=0.5)
    tm.vertices[:, 1] *= 0.8
    mesh = Mesh(tm.vertices.astype(np.float32), tm.faces.astype(np.int32))
    colour = np.clip(0.45 + 0.3 * np.sin(4 * tm.vertices[:, [0, 1, 2]] + [1.0, 0.0, 2.0]), 0, 1).astype(np.float32)
    coloured = Mesh(mesh.vertices, mesh.faces, vertex_colors=colour)

    def camera(yaw: float) -> SourceCamera:
        y, p = math.radians(yaw), math.radians(10.0)
        eye = 2.6 * np.array([math.cos(p) * math.sin(y), math.sin(p), math.cos(p) * math.cos(y)])
        return SourceCamera(look_at(eye), intrinsics(40.0, 640, 480), 640, 480)

    def photo(cam: SourceCamera) -> ImageInput:
        from pipeline.raster.rasterize import interpolate, rasterize_views

        r = rasterize_views(ctx, coloured, cam.as_cameras())
        cov = np.asarray(r.tri_id[0]) >= 0
        rgb = np.where(cov[..., None], np.asarray(interpolate(r, coloured, colour)[0]), 0.5)
        return ImageInput((rgb * 255).round().astype(np.uint8), cov)

    del render_textured, Texture   # the bake renders nothing; the photos are rasterized above
    s = load(None, {"bake.texture_size": a.texture_size, "mesh.simplify_ratio": 0.0})
    backends = resolve_backends(s)
    yaws = (0, 180, 90, 270)
    photos = [(photo(camera(y)), camera(y)) for y in yaws]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for count in (1, 2, 4):
            (first, cam), *more = photos[:count]
            inputs = ModelInputs(model=MeshFile(mesh=mesh, texture=None, format="ply"), photo=first, camera=cam,
                                 camera_how="file",
                                 more_photos=tuple(PlacedPhoto(f"p{i}", p, c, None, "file")
                                                   for i, (p, c) in enumerate(more, start=2)))
            best, res = math.inf, None
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                got = bake_model(inputs, s, backends, Path(tmp), ctx, name=f"m{count}")
                if time.perf_counter() - t0 < best:   # the best run's own stage times
                    best, res = time.perf_counter() - t0, got
            assert res is not None
            rows.append((count, best, res.timings, res.stats.bake.timings.get("photo", 0.0),
                         res.stats.bake.texels_from))
    base = rows[0][1]
    print(f"{'photos':>6} {'bake_model s':>12} {'x one':>6} {'photo step s':>12}  stages; texels from")
    for count, best, timings, photo_s, shares in rows:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in timings.items())
        print(f"{count:>6} {best:>12.2f} {best / base:>6.2f} {photo_s:>12.2f}  {stages}; {dict(shares)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
