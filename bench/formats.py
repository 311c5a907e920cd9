"""Benchmark the export of every format: a real photo's model written as GLB, OBJ zip, STL and
PLY mesh with each texture encoding, the size of each file and the time each writer took.

    .venv/bin/python bench/formats.py [--image IMG --mask MASK] [--texture-size 1024] [--repeat 3]

The model: the pipeline run once on the photo (default: the SAM 3D human-object fixture's
photo and its mask in /work/shared/fixtures, built-in reconstruction, fast bake), its GLB read
back (``pipeline.io.mesh_file.read_mesh``). Then for each texture format (png, jpeg, webp) the
writers of ``pipeline.io.mesh_formats`` / ``export.export_glb`` run ``--repeat`` times on that
mesh and texture; the table gives each file's size and the median time of its writer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURE = ROOT.parent / "shared" / "fixtures" / "sam3d-human-object"


def _model(image: Path, mask: Path, texture_size: int, out: Path):
    import numpy as np

    from kiln.imageio import load_image
    from kiln.maskfile import load_mask
    from kiln.settings import load
    from pipeline.io.mesh_file import read_mesh
    from pipeline.run import run_pipeline
    from pipeline.types import ImageInput

    rgb, _ = load_image(image, max_pixels=50_000_000)
    m = load_mask(mask, max_pixels=50_000_000).mask
    s = load(None, {"bake.mode": "fast", "bake.texture_size": texture_size, "views.count": 8,
                    "views.resolution": 256})
    t0 = time.perf_counter()
    res = run_pipeline(ImageInput(rgb, m), s, out)
    print(f"pipeline on {image.name} ({rgb.shape[1]}x{rgb.shape[0]}): {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    model = read_mesh(res.glb_path)
    assert model.texture is not None and np.asarray(model.texture).shape[0] == texture_size
    return model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", type=Path, default=FIXTURE / "image.png")
    p.add_argument("--mask", type=Path, default=FIXTURE / "human_mask.png")
    p.add_argument("--texture-size", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    if not args.image.is_file() or not args.mask.is_file():
        print(f"missing {args.image} or {args.mask}: give --image and --mask", file=sys.stderr)
        return 2

    from kiln.formats import human_bytes
    from pipeline.io import mesh_formats as M
    from pipeline.io.export import export_glb
    from pipeline.types import Texture

    with tempfile.TemporaryDirectory(prefix="kiln-formats-") as tmp:
        out = Path(tmp)
        model = _model(args.image, args.mask, args.texture_size, out / "run")
        mesh = model.mesh
        tex = Texture(model.texture, model.texture[..., 0] >= 0)
        writers = {
            "glb": lambda fmt: export_glb(mesh, tex, out / f"{fmt}.glb", texture_format=fmt).stat().st_size,
            "obj.zip": lambda fmt: M.export_obj_zip(mesh, tex, out / f"{fmt}.obj.zip", fmt).bytes,
            "stl (mm)": lambda fmt: M.export_stl(mesh, out / f"{fmt}.stl", "mm").bytes,
            "mesh.ply": lambda fmt: M.export_mesh_ply(mesh, tex, out / f"{fmt}.mesh.ply").bytes,
        }
        print(f"mesh: {mesh.num_vertices} vertices, {mesh.num_faces} faces; texture {args.texture_size}^2; "
              f"median of {args.repeat}")
        print(f"{'file':<10} {'texture':<8} {'bytes':>10} {'size':>9} {'vs png':>7} {'seconds':>8}")
        print("-" * 57)
        png_size: dict = {}
        for fmt in ("png", "jpeg", "webp"):
            for name, write in writers.items():
                if fmt != "png" and name in ("stl (mm)", "mesh.ply"):
                    continue   # no texture inside: the same file for every encoding
                times, size = [], 0
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    size = write(fmt)
                    times.append(time.perf_counter() - t0)
                png_size.setdefault(name, size)
                ratio = f"{png_size[name] / size:6.1f}x" if fmt != "png" else f"{'':>7}"
                texture = fmt if name in ("glb", "obj.zip") else "-"
                print(f"{name:<10} {texture:<8} {size:>10} {human_bytes(size):>9} {ratio} {statistics.median(times):8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
