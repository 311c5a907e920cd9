"""Benchmark the UV stage: plain xatlas vs Kiln's own unwrap, on the same meshes, in one run.

    .venv/bin/python bench/uv.py [--faces 10000,30000,100000,300000] [--timeout 300]
                                 [--size 1024] [--gutter 4] [--methods kiln,xatlas]

Meshes: the built-in reconstruction of Kiln's example image (kiln.examples "toy"),
reconstructed at a resolution that gives more faces than asked and simplified
(pyfqmr, as the mesh stage does) to each count; a clean icosphere of 81,920 faces
(xatlas was seen to segfault on one); a noisy icosphere of 20,480 faces (every
vertex moved in or out at random, like a raw scan).

Every (mesh, method) pair runs in its own subprocess under a time limit, so an
xatlas that runs for many minutes is reported as 'timeout' and one that dies as
'crashed (SIGSEGV)' without taking the benchmark down. Inside the subprocess the
libraries are imported and a tiny mesh unwrapped first; the time reported is the
``pipeline.unwrap.uv.unwrap`` call alone. Quality (pipeline.unwrap.uv_metrics, identical for both):

* util: fraction of the texture's texels whose centre lies in a UV triangle;
* area: area-weighted mean of max(r, 1/r), r = a face's share of UV area / of surface area;
* angle: area-weighted mean of sigma1/sigma2 of each face's map (1 = conformal);
* overlaps: faces sharing a texel centre with another face (must be 0);
* charts: connected pieces of the UV layout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _toy_mesh(faces: int, cache: dict):
    """The example toy reconstructed and simplified to about ``faces`` faces."""
    from kiln.examples import draw_object
    from kiln.settings import ReconstructSettings
    from pipeline.meshing.mesh_ops import clean_mesh, simplify_mesh
    from pipeline.recon.reconstruct import reconstruct
    from pipeline.types import ImageInput

    # resolution 160 gives ~126k faces, 320 ~505k
    res = 160 if faces <= 110_000 else 320
    if res not in cache:
        rgb, mask = draw_object(512, "toy", seed=1)
        recon = reconstruct(ImageInput(rgb, mask), ReconstructSettings(resolution=res, num_gaussians=1000),
                            seed=0)
        cache[res] = clean_mesh(recon.mesh, min_component_fraction=0.02, fill_holes=False)
    full = cache[res]
    ratio = 1.0 - faces / full.num_faces
    return simplify_mesh(full, ratio) if ratio > 0 else full


def _sphere(subdivisions: int, noise: float):
    import numpy as np
    import trimesh

    from pipeline.types import Mesh

    s = trimesh.creation.icosphere(subdivisions=subdivisions, radius=0.4)
    v = s.vertices
    if noise:
        v = v * (1.0 + noise * np.random.default_rng(0).standard_normal((len(v), 1)))
    return Mesh(v.astype(np.float32), s.faces.astype(np.int32))


def build_meshes(face_counts: list[int], folder: Path) -> list[tuple[str, Path, int]]:
    import numpy as np

    out, cache = [], {}
    items = [(f"toy {n // 1000}k", lambda n=n: _toy_mesh(n, cache)) for n in face_counts]
    items += [("sphere 82k", lambda: _sphere(6, 0.0)), ("noisy scan 20k", lambda: _sphere(5, 0.02))]
    for name, make in items:
        m = make()
        path = folder / (name.replace(" ", "_") + ".npz")
        np.savez(path, vertices=m.vertices, faces=m.faces)
        out.append((name, path, m.num_faces))
    return out


def run_one(method: str, mesh_path: str, size: int, gutter: int, out_path: str) -> None:
    """Subprocess body: unwrap one mesh with one method, write the figures as JSON."""
    import numpy as np

    from pipeline.types import Mesh
    from pipeline.unwrap.uv import unwrap
    from pipeline.unwrap.uv_metrics import coverage, distortion
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    z = np.load(mesh_path)
    mesh = Mesh(z["vertices"], z["faces"])
    # warm-up: imports and first-call costs are not the unwrap's
    tiny = Mesh(np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0.2]], np.float32),
                np.array([[0, 1, 2], [1, 3, 2]], np.int32))
    unwrap(tiny, 64, 1, 10, method=method)
    t0 = time.perf_counter()
    out = unwrap(mesh, size, gutter, 10_000_000, method=method)
    seconds = time.perf_counter() - t0
    cov = coverage(out.uvs, out.faces, size)
    d = distortion(out.vertices, out.faces, out.uvs)
    f = out.faces
    g = coo_matrix((np.ones(2 * len(f)), (np.r_[f[:, 0], f[:, 1]], np.r_[f[:, 1], f[:, 2]])),
                   shape=(out.num_vertices,) * 2)
    charts = connected_components(g, directed=False)[0]
    Path(out_path).write_text(json.dumps({
        "seconds": seconds, "util": cov.utilisation, "area": d["area"], "angle": d["angle"],
        "overlaps": int(cov.overlapping_faces().size), "charts": int(charts),
        "vertices": out.num_vertices}))


def measure(method: str, mesh_path: Path, size: int, gutter: int, timeout: float) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = Path(tmp.name)
    cmd = [sys.executable, __file__, "--one", method, str(mesh_path), str(size), str(gutter), str(out)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        out.unlink(missing_ok=True)
        return {"status": f"timeout (> {timeout:g} s)"}
    try:
        if proc.returncode < 0:
            return {"status": f"crashed ({signal.Signals(-proc.returncode).name})"}
        if proc.returncode != 0:
            last = (err.decode(errors="replace").strip().splitlines() or ["?"])[-1]
            return {"status": f"failed: {last[:120]}"}
        res = json.loads(out.read_text())
        res["status"] = "ok"
        res["wall"] = time.perf_counter() - t0
        return res
    finally:
        out.unlink(missing_ok=True)


def _cell(r: dict, key: str, fmt: str) -> str:
    return format(r[key], fmt) if r.get("status") == "ok" else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faces", default="10000,30000,100000,300000")
    ap.add_argument("--methods", default="xatlas,kiln")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per (mesh, method)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--gutter", type=int, default=4)
    ap.add_argument("--one", nargs=5, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        method, mesh_path, size, gutter, out = a.one
        run_one(method, mesh_path, int(size), int(gutter), out)
        return

    methods = a.methods.split(",")
    print(f"texture {a.size}, gutter {a.gutter}, limit {a.timeout:g} s per run, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        meshes = build_meshes([int(x) for x in a.faces.split(",")], Path(tmp))
        rows = []
        for name, path, faces in meshes:
            res = {m: measure(m, path, a.size, a.gutter, a.timeout) for m in methods}
            rows.append((name, faces, res))
            for m in methods:
                r = res[m]
                print(f"  {name:15s} {faces:7d} {m:7s} " + (
                    f"{r['seconds']:8.2f} s util {r['util']:.3f} area {r['area']:.3f} "
                    f"angle {r['angle']:.3f} overlaps {r['overlaps']} charts {r['charts']}"
                    if r["status"] == "ok" else r["status"]), flush=True)

    print()
    head = "| mesh | faces | " + " | ".join(
        f"{m} s | {m} util | {m} area | {m} angle | {m} overlaps | {m} charts" for m in methods)
    if "xatlas" in methods and "kiln" in methods:
        head += " | speed-up"
    print(head + " |")
    print("|" + "---|" * (head.count("|")) )
    for name, faces, res in rows:
        cells = [name, f"{faces:,}"]
        for m in methods:
            r = res[m]
            if r["status"] != "ok":
                cells += [r["status"], "-", "-", "-", "-", "-"]
                continue
            cells += [f"{r['seconds']:.2f}", f"{r['util']:.3f}", f"{r['area']:.3f}", f"{r['angle']:.3f}",
                      str(r["overlaps"]), str(r["charts"])]
        if "xatlas" in methods and "kiln" in methods:
            x, k = res["xatlas"], res["kiln"]
            if x["status"] == "ok" and k["status"] == "ok":
                cells.append(f"{x['seconds'] / k['seconds']:.1f}x")
            elif k["status"] == "ok":
                cells.append(f"> {a.timeout / k['seconds']:.0f}x" if x["status"].startswith("timeout") else "-")
            else:
                cells.append("-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
