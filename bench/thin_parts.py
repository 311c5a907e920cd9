"""Thin parts through the whole default job: what the mesh stage keeps and what it costs.

For the stems photo of tests/test_thin_parts.py (stems 2, 3, 4 px wide on a 512 px photo)
and the real SAM 3D example photo with each of its masks (../shared/fixtures), runs the
default job with the bake off (the mesh stage is the same) with ``mesh.keep_thin_parts``
on and off, and prints per row: GLB faces, faces simplified apart, the mesh stage's
seconds (median of --repeat runs), the GLB's silhouette IoU against the mask from the
photo's camera (OpenCV fills the triangles, 4x supersampled: not Kiln's renderer), and the
share of each stem's pixels covered.

    .venv/bin/python bench/thin_parts.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
FIXTURES = ROOT.parent / "shared" / "fixtures" / "sam3d-human-object"
SUPERSAMPLE = 4


def silhouette(mesh, camera, shape: tuple[int, int]) -> np.ndarray:
    """(H, W) bool: pixels over half covered by ``mesh`` seen from ``camera`` (OpenCV fill)."""
    import cv2

    px, _ = camera.project(mesh.vertices)
    shift = 8
    tris = np.round((px * SUPERSAMPLE - 0.5) * (1 << shift)).astype(np.int32)[mesh.faces]
    img = np.zeros((shape[0] * SUPERSAMPLE, shape[1] * SUPERSAMPLE), np.uint8)
    for tri in tris:
        cv2.fillConvexPoly(img, tri, 1, lineType=cv2.LINE_8, shift=shift)
    return img.reshape(shape[0], SUPERSAMPLE, shape[1], SUPERSAMPLE).mean(axis=(1, 3)) > 0.5


def inputs() -> list[tuple[str, np.ndarray, np.ndarray, dict]]:
    from test_thin_parts import _photo_with_stems

    rgb, mask, stems = _photo_with_stems()
    rows = [("stems photo 512 px", rgb, mask, stems)]
    if FIXTURES.is_dir():
        from PIL import Image

        photo = np.asarray(Image.open(FIXTURES / "image.png").convert("RGB"))
        for name in ("human_mask.png", "bench_mask.png"):
            m = np.asarray(Image.open(FIXTURES / name).convert("L")) > 127
            rows.append((f"SAM 3D photo, {name}", photo, m, {}))
    else:
        print(f"(fixtures missing at {FIXTURES}: real rows skipped)")
    return rows


def run_once(rgb, mask, keep: bool):
    import trimesh

    from kiln.settings import Settings
    from pipeline.meshing import mesh_ops
    from pipeline.meshing.thin_faces import thin_part_faces
    from pipeline.recon import reconstruct as R
    from pipeline.run import run_pipeline
    from pipeline.types import ImageInput, Mesh

    settings = Settings().override({"bake.enabled": False, "mesh.keep_thin_parts": keep})
    image = ImageInput(rgb, mask)
    with tempfile.TemporaryDirectory() as out:
        res = run_pipeline(image, settings, out)
        glb = trimesh.load(res.glb_path, force="mesh")
    mesh = Mesh(np.asarray(glb.vertices, np.float32), np.asarray(glb.faces, np.int32))
    recon = R.reconstruct(image, settings.reconstruct, seed=settings.seed)
    m = settings.mesh
    clean = mesh_ops.clean_mesh(recon.mesh, m.min_component_fraction, m.fill_holes)
    apart = int(thin_part_faces(clean, recon.source_camera, mask, m.simplify_ratio).sum()) if keep else 0
    return mesh, recon.source_camera, apart, res.timings["mesh"], res.timings["reconstruct"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per row; the median time is printed")
    args = ap.parse_args()
    print("| input | thin parts | GLB faces | faces simplified apart (of the cleaned mesh) | mesh stage s "
          "| reconstruct s | GLB silhouette IoU | stems covered |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rgb, mask, stems in inputs():
        for keep in (True, False):
            runs = [run_once(rgb, mask, keep) for _ in range(max(1, args.repeat))]
            mesh, camera, apart = runs[0][:3]
            sil = silhouette(mesh, camera, mask.shape)
            iou = (sil & mask).sum() / (sil | mask).sum()
            covered = ", ".join(f"{k} {(sil & p).sum() / p.sum():.2f}" for k, p in stems.items())
            print(f"| {name} | {'kept apart' if keep else 'plain'} | {mesh.num_faces} | {apart} "
                  f"| {statistics.median(r[3] for r in runs):.3f} | {statistics.median(r[4] for r in runs):.3f} "
                  f"| {iou:.4f} | {covered or '-'} |")


if __name__ == "__main__":
    main()
