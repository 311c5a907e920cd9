"""Whole-pipeline benchmark: the CLI path (`kiln run`, through the worker) on a
generated 512 px image at default settings, once per bake mode.

Prints per-stage seconds, total wall time, peak memory of the CLI process and its
worker(s) together (RSS sampled every 50 ms), and the masked PSNR of the baked
texture rendered from the bake cameras against the Gaussian renders.

    .venv/bin/python bench/pipeline.py [--modes opt fast] [--size 512] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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


def run_once(image: Path, mode: str, workdir: Path, extra: list[str]) -> dict:
    import psutil

    report = workdir / f"report-{mode}.json"
    cmd = [sys.executable, "-m", "app.cli.cli", "run", str(image), "-o", str(workdir / f"{mode}.glb"),
           "--bake-mode", mode, "--report", str(report),
           "--set", f"app.jobs_dir={workdir / 'jobs'}", "--set", f"app.cache_dir={workdir / 'cache'}"]
    for e in extra:
        cmd += ["--set", e]
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
    rep["peak_rss_mb"] = peak / 2**20
    return rep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", nargs="+", default=["opt", "fast"], choices=["opt", "fast"])
    ap.add_argument("--size", type=int, default=512, help="generated input image size (default 512)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra setting overrides")
    args = ap.parse_args()

    from kiln.examples import write_examples

    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        write_examples(td, size=args.size)
        image = td / "toy.png"
        reps = {m: run_once(image, m, td, args.set) for m in args.modes}

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}; input {args.size}px, default settings")
    head = f"{'stage':<14}" + "".join(f"{m:>12}" for m in reps)
    print(head)
    print("-" * len(head))
    for s in STAGES:
        print(f"{s:<14}" + "".join(f"{r['timings'].get(s, float('nan')):>12.2f}" for r in reps.values()))
    print("-" * len(head))
    print(f"{'total (wall)':<14}" + "".join(f"{r['wall_s']:>12.2f}" for r in reps.values()))
    print(f"{'peak RSS MB':<14}" + "".join(f"{r['peak_rss_mb']:>12.0f}" for r in reps.values()))
    print(f"{'PSNR dB':<14}" + "".join(f"{r['stats'].get('bake_psnr_db', float('nan')):>12.2f}" for r in reps.values()))
    print(f"{'faces':<14}" + "".join(f"{r['stats'].get('faces', 0):>12}" for r in reps.values()))
    print(f"{'recon cached':<14}" + "".join(f"{str(r['stats'].get('reconstruction_cached')):>12}" for r in reps.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
