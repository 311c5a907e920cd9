"""Whole-pipeline benchmark: the CLI path (`kiln run`, through the worker) on a
generated 512 px image (or ``--image``) at default settings, per bake mode.

Each run is a fresh ``kiln run`` process with empty job and cache folders (nothing cached:
the worker's start, torch's import and the reconstruction are in every run). Prints the
median over ``--repeat`` runs of: per-stage seconds, total wall time (process start to
exit), the CPU seconds (user + sys) of the CLI and its worker together, peak memory of the
CLI process and its worker(s) together (RSS sampled every 50 ms), and the masked PSNR of
the baked texture rendered from the bake cameras against the Gaussian renders; and the
load average before the first run and after the last (wall times mean little on a busy
machine: compare CPU seconds there).

    .venv/bin/python bench/pipeline.py [--modes opt fast] [--size 512] [--image PHOTO.png]
                                       [--repeat 3] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kiln.stages import STAGES  # noqa: E402 - after the sys.path line above


def tree_rss(proc) -> int:
    import psutil

    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def children_cpu() -> float:
    """User + sys seconds of this process's waited-for descendants (the CLI and, as the
    CLI waits for it, its worker)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(image: Path, mode: str, workdir: Path, extra: list[str], run: int = 0) -> dict:
    import psutil

    report = workdir / f"report-{mode}-{run}.json"
    fresh = workdir / f"run-{mode}-{run}"     # empty job and cache folders: nothing cached
    cmd = [sys.executable, "-m", "app.cli.cli", "run", str(image), "-o", str(workdir / f"{mode}.glb"),
           "--bake-mode", mode, "--report", str(report),
           "--set", f"app.jobs_dir={fresh / 'jobs'}", "--set", f"app.cache_dir={fresh / 'cache'}"]
    for e in extra:
        cmd += ["--set", e]
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps = psutil.Process(proc.pid)
    peak = 0
    stop = threading.Event()

    def sample():
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, tree_rss(ps))
            time.sleep(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    stop.set()
    th.join()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"kiln run failed ({proc.returncode}):\n{err[-3000:]}")
    rep = json.loads(report.read_text())
    rep["wall_s"] = wall
    rep["cpu_s"] = children_cpu() - cpu0
    rep["peak_rss_mb"] = peak / 2**20
    return rep


def median_report(runs: list[dict]) -> dict:
    """Per-stage timings, wall, CPU and peak memory: the median over ``runs``; stats from the first."""
    stages = {s for r in runs for s in r["timings"]}
    return {"timings": {s: statistics.median(r["timings"].get(s, float("nan")) for r in runs) for s in stages},
            "wall_s": statistics.median(r["wall_s"] for r in runs),
            "cpu_s": statistics.median(r["cpu_s"] for r in runs),
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs),
            "stats": runs[0]["stats"], "walls": [round(r["wall_s"], 2) for r in runs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=["opt", "fast"], choices=["opt", "fast"])
    ap.add_argument("--size", type=int, default=512, help="generated input image size (default 512)")
    ap.add_argument("--image", type=Path, help="a photo to run instead of the generated toy (RGBA: its alpha is the mask)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per mode; the table shows their median (default 1)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra setting overrides")
    args = ap.parse_args()

    from kiln.examples import write_examples

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        if args.image is None:
            write_examples(td, size=args.size)
        image = args.image.resolve() if args.image is not None else td / "toy.png"
        reps = {m: median_report([run_once(image, m, td, args.set, i) for i in range(max(1, args.repeat))])
                for m in args.modes}
    load_after = os.getloadavg()

    what = image.name if args.image is not None else f"the generated {args.size}px toy"
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}; input {what}, default settings; "
          f"median of {max(1, args.repeat)} run(s); load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after")
    head = f"{'stage':<14}" + "".join(f"{m:>12}" for m in reps)
    print(head)
    print("-" * len(head))
    for s in STAGES:
        print(f"{s:<14}" + "".join(f"{r['timings'].get(s, float('nan')):>12.2f}" for r in reps.values()))
    print("-" * len(head))
    print(f"{'total (wall)':<14}" + "".join(f"{r['wall_s']:>12.2f}" for r in reps.values()))
    print(f"{'CPU user+sys':<14}" + "".join(f"{r['cpu_s']:>12.2f}" for r in reps.values()))
    print(f"{'peak RSS MB':<14}" + "".join(f"{r['peak_rss_mb']:>12.0f}" for r in reps.values()))
    print(f"{'PSNR dB':<14}" + "".join(f"{r['stats'].get('bake_psnr_db', float('nan')):>12.2f}" for r in reps.values()))
    print(f"{'faces':<14}" + "".join(f"{r['stats'].get('faces', 0):>12}" for r in reps.values()))
    print(f"{'recon cached':<14}" + "".join(f"{str(r['stats'].get('reconstruction_cached')):>12}" for r in reps.values()))
    for m, r in reps.items():
        print(f"{m}: wall of each run {r['walls']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
