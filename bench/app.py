"""Web UI benchmark: how fast the page is served, how fast a click updates the mask.

    python bench/app.py [--clicks 15] [--no-startup] [--no-sam2] [--json out.json]

1. start-up: wall time from running ``python -m app`` (a fresh process, the same
   command ``kiln serve`` runs) to the first HTTP 200 for the page; the time until
   the worker reported ready is read from the server's log.
2. click -> mask: the click handler as the UI runs it (``add_click`` + overlay +
   JPEG encoding of the overlay, which is what Gradio sends back) on a 1024x768
   image, for GrabCut and for SAM2 tiny with random weights (the same network as
   the real checkpoint, so the same cost), once the image embedding is cached.

Targets (issue 4): page within 15 s; click under 300 ms with a cached embedding.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_startup(timeout: float = 120.0) -> dict:
    with tempfile.TemporaryDirectory(prefix="kiln-bench-app-") as tmp:
        tmp = Path(tmp)
        cfg = tmp / "bench.yaml"
        cfg.write_text(f"worker: {{count: 1}}\napp: {{jobs_dir: {tmp}/var/jobs, cache_dir: {tmp}/var/cache}}\n")
        port = _free_port()
        log = tmp / "server.log"
        t0 = time.perf_counter()
        with open(log, "w") as lf:
            proc = subprocess.Popen([sys.executable, "-m", "app", "--port", str(port), "--config", str(cfg)],
                                    cwd=tmp, stdout=lf, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"))
        page_s = ready_s = None
        try:
            while time.perf_counter() - t0 < timeout:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                        if r.status == 200 and b"gradio" in r.read().lower():
                            page_s = time.perf_counter() - t0
                            break
                except OSError:
                    time.sleep(0.1)
            while time.perf_counter() - t0 < timeout and ready_s is None:
                if "workers ready" in log.read_text():
                    ready_s = time.perf_counter() - t0
                time.sleep(0.1)
        finally:
            proc.terminate()
            proc.wait(30)
        text = log.read_text()
        m = re.search(r"Kiln UI ready in ([\d.]+) s", text)
        return {"page_served_s": page_s, "workers_ready_s": ready_s,
                "server_reported_build_s": float(m.group(1)) if m else None}


def _image() -> np.ndarray:
    sys.path.insert(0, str(ROOT / "tests"))
    from synthetic import make_object_image

    rgb, _ = make_object_image(768, "blob", seed=2)
    canvas = np.zeros((768, 1024, 3), np.uint8) + 60
    canvas[:, 128:896] = rgb
    return canvas


def _click_times(seg, rgb: np.ndarray, n: int) -> tuple[list[float], float]:
    """Seconds per click (handler + overlay + JPEG), after one warm-up click."""
    from PIL import Image

    from app.web.photo import selection
    from app.web.state import uploads

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    st = uploads.load_upload(buf.getvalue(), _app_settings())
    selection.prepare_segmenter(st, seg)
    t = time.perf_counter()
    st = selection.add_click(st, 512, 384, False, seg)
    first = time.perf_counter() - t
    rng = np.random.default_rng(0)
    times = []
    for i in range(n):
        x, y = 512 + rng.uniform(-120, 120), 384 + rng.uniform(-120, 120)
        t = time.perf_counter()
        nxt = selection.add_click(selection.clear_clicks(st) if i % 3 == 0 else st, x, y, False, seg)
        ov = selection.render_overlay(nxt)
        out = io.BytesIO()
        Image.fromarray(ov).save(out, format="JPEG")
        times.append(time.perf_counter() - t)
        st = nxt if i % 3 else st
    return times, first


def _app_settings():
    from kiln.settings import AppSettings

    return AppSettings()


def _sam2_segmenter(tmp: Path):
    try:
        import torch
        import sam2  # noqa: F401
        from hydra import compose
        from hydra.utils import instantiate
        from omegaconf import OmegaConf
    except ImportError as e:
        return None, f"sam2 not installed ({e})"
    from app.segment.segment import Sam2Segmenter, choose_segmenter
    from kiln.settings import AppSettings

    torch.manual_seed(0)
    cfg = compose(config_name="configs/sam2.1/sam2.1_hiera_t.yaml")
    OmegaConf.resolve(cfg)
    ckpt = tmp / "sam2.1_hiera_tiny.pt"
    torch.save({"model": instantiate(cfg.model, _recursive_=True).state_dict()}, ckpt)
    choice = choose_segmenter(AppSettings(sam2_checkpoint=str(ckpt)))
    if not isinstance(choice.segmenter, Sam2Segmenter):
        return None, choice.reason
    return choice.segmenter, "SAM2.1 tiny, random weights"


def _row(name: str, times: list[float], first: float) -> dict:
    ms = sorted(t * 1000 for t in times)
    return {"segmenter": name, "first_click_ms": first * 1000, "median_ms": statistics.median(ms),
            "p90_ms": ms[min(len(ms) - 1, int(0.9 * len(ms)))], "clicks": len(ms)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clicks", type=int, default=15)
    ap.add_argument("--no-startup", action="store_true")
    ap.add_argument("--no-sam2", action="store_true")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    import torch

    results: dict = {"cpu_threads": torch.get_num_threads(), "cpus": os.cpu_count()}
    if not args.no_startup:
        results["startup"] = bench_startup()
    from app.segment.segment import GrabCutSegmenter

    rgb = _image()
    rows = [_row("GrabCut (320 px, 3 iterations)", *_click_times(GrabCutSegmenter(), rgb, args.clicks))]
    if not args.no_sam2:
        with tempfile.TemporaryDirectory(prefix="kiln-bench-sam2-") as tmp:
            seg, note = _sam2_segmenter(Path(tmp))
            if seg is None:
                print(f"SAM2 skipped: {note}", file=sys.stderr)
            else:
                rows.append(_row("SAM2.1 tiny (cached embedding)", *_click_times(seg, rgb, args.clicks)))
    results["clicks"] = rows

    if "startup" in results:
        s = results["startup"]
        print(f"{'start-up (python -m app)':<34}{'seconds':>10}{'target':>10}")
        print(f"{'  page served (HTTP 200)':<34}{s['page_served_s']:>10.2f}{'< 15':>10}")
        if s["workers_ready_s"] is not None:
            print(f"{'  worker ready (capabilities)':<34}{s['workers_ready_s']:>10.2f}{'':>10}")
        print()
    print(f"{'click -> mask + overlay (1024x768)':<34}{'first ms':>10}{'median ms':>11}{'p90 ms':>9}{'target':>9}")
    for r in rows:
        print(f"{'  ' + r['segmenter']:<34}{r['first_click_ms']:>10.0f}{r['median_ms']:>11.0f}"
              f"{r['p90_ms']:>9.0f}{'< 300':>9}")
    print(f"\n(torch threads {results['cpu_threads']}, {results['cpus']} CPUs; 'first' includes the "
          "image embedding for SAM2)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
