"""GLB extraction after reconstruction, per stage, on CPU and (where there is one) CUDA.

"Extraction" is what follows the reconstruction in a job: render the bake views, clean
and simplify the mesh, unwrap, bake, export. The reconstruction of a generated 512 px
photo is made once and handed to ``pipeline.run.run_pipeline`` (so its "reconstruct"
stage is a lookup), which then runs exactly the job's code for the rest, in this
process, without a cache. One warm-up run per device (imports, GL/CUDA contexts, JIT
builds), then the median of ``--repeat`` runs per stage. Target on one H100 at default
settings: <= 1.5 s in all (issue 20).

    .venv/bin/python bench/extraction.py [--devices cpu cuda] [--repeat 3] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kiln.stages import STAGES  # noqa: E402 - after the sys.path line above
from worker.child.env import passive_openmp  # noqa: E402

# the stages run in this process: its OpenMP threads sleep as a worker's do, before torch loads
passive_openmp(os.environ)

EXTRACTION = [s for s in STAGES if s != "reconstruct"]
TARGET_S = 1.5


def _settings(device: str, overrides: dict):
    from kiln import settings as settings_mod

    over = {"worker.device": device}
    if device == "cuda":
        over.update({"views.backend": "gsplat", "rasterize.backend": "nvdiffrast"})
    over.update(overrides)
    return settings_mod.load(None, over)


def _run(device: str, recon, image, overrides: dict, repeat: int) -> dict:
    from pipeline import run as run_mod

    settings = _settings(device, overrides)
    backends = run_mod.resolve_backends(settings)
    # the reconstruction is given: the job's own code does everything after it
    run_mod.reconstruct_cached = lambda *a, **k: (recon, True)
    runs = []
    peak = None
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory(prefix="kiln-extract-") as tmp:
        for i in range(repeat + 1):
            t0 = time.perf_counter()
            res = run_mod.run_pipeline(image, settings, Path(tmp), backends=backends, name=f"run{i}")
            wall = time.perf_counter() - t0
            if i:   # the first run warms up
                runs.append({**res.timings, "wall": wall})
            faces = res.stats.faces
    if device == "cuda":
        import torch

        peak = torch.cuda.max_memory_allocated() / 2 ** 30
    out = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in EXTRACTION + ["wall"]}
    out["extraction"] = sum(out[k] for k in EXTRACTION)
    return {"times": out, "backends": backends, "faces": faces, "peak_gib": peak}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", nargs="+", default=["cpu", "cuda"], choices=["cpu", "cuda"])
    p.add_argument("--repeat", type=int, default=3, help="timed runs per device (after one warm-up)")
    p.add_argument("--size", type=int, default=512, help="side of the generated photo")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)

    import torch

    from kiln import settings as settings_mod
    from kiln.examples import draw_object
    from pipeline.recon.reconstruct import reconstruct
    from pipeline.types import ImageInput

    overrides = settings_mod.parse_set(args.set)
    rgb, mask = draw_object(args.size, kind="toy", seed=0)
    image = ImageInput(rgb=rgb, mask=mask)
    base = _settings("cpu", overrides)
    recon = reconstruct(image, base.reconstruct, seed=base.seed)
    results, skipped = {}, {}
    for dev in args.devices:
        if dev == "cuda" and not torch.cuda.is_available():
            skipped[dev] = f"no CUDA device visible to torch {torch.__version__}"
            continue
        print(f"... {dev}: 1 warm-up + {args.repeat} runs", file=sys.stderr, flush=True)
        results[dev] = _run(dev, recon, image, overrides, args.repeat)

    devs = list(results)
    rows = [("stage", *[f"{d} s" for d in devs])]
    for k in EXTRACTION + ["extraction", "wall"]:
        rows.append((k, *[f"{results[d]['times'][k]:.3f}" for d in devs]))
    width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for j, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, width)))
        if j == 0:
            print("  ".join("-" * w for w in width))
    print()
    for d in devs:
        r = results[d]
        b = r["backends"]
        peak = f", peak GPU memory {r['peak_gib']:.2f} GiB" if r["peak_gib"] is not None else ""
        verdict = ""
        if d == "cuda":
            verdict = f"; target <= {TARGET_S} s: {'met' if r['times']['extraction'] <= TARGET_S else 'NOT met'}"
        print(f"{d}: render {b.render}, rasterize {b.rasterize}, {r['faces']} faces{peak}{verdict}")
    for d, why in skipped.items():
        print(f"{d}: skipped ({why})")
    print(f"reconstruction ({recon.mesh.num_faces} faces, {len(recon.gaussians)} Gaussians) made once, "
          f"not timed; torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
