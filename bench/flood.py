"""Flood benchmark: many sessions, oversized decodes and a pile of uploads against a real
``python -m app``; the server must keep answering with its memory under a stated bound.

    python bench/flood.py [--sessions 50] [--uploads 200] [--megapixels 39.7] [--json out.json]

What it does, all from 127.0.0.1 (one client, as far as the per-client limits go):

1. ``--sessions`` browsers (each its own cookie and tab) upload a small PNG (~150 KB) that
   decodes to ``--megapixels`` MP, 8 at a time, as a person's upload would go (Gradio's
   upload route, then the upload event through the queue);
2. ``--uploads`` raw uploads of ``--upload-mb`` MB each to Gradio's upload route;
3. meanwhile and after: the page (GET /) is fetched and timed, and the server process's
   resident memory is sampled every 0.1 s.

Reports the peak and final RSS of the server process (not its workers), how many
uploads were kept / refused and why, and the page latency. The bound it checks:
peak RSS <= baseline + ``--bound-mb`` (default 1024 MB).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bomb_png(megapixels: float) -> bytes:
    """A PNG of ``megapixels`` MP (4:3) that compresses to little: flat colour, one square."""
    import numpy as np
    from PIL import Image

    w = int((megapixels * 1e6 * 4 / 3) ** 0.5)
    h = int(megapixels * 1e6 / w)
    img = np.full((h, w, 3), 235, np.uint8)
    img[h // 3: 2 * h // 3, w // 3: 2 * w // 3] = (180, 40, 30)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG", compress_level=9)
    return buf.getvalue()


def _upload_fn(base: str) -> tuple[int, int]:
    import httpx

    cfg = httpx.get(base + "/config", timeout=30).json()
    comp = next(c["id"] for c in cfg["components"] if c["props"].get("elem_id") == "kiln-upload")
    dep = next(d for d in cfg["dependencies"] if [comp, "upload"] in d["targets"])
    return dep["id"], comp


def one_session(base: str, fn: tuple[int, int], png: bytes, i: int) -> str:
    """A fresh browser uploads ``png`` in a fresh tab: 'kept', 'refused: ...' or 'error: ...'."""
    import httpx

    with httpx.Client(base_url=base, timeout=120) as c:
        c.get("/")
        r = c.post("/gradio_api/upload", files={"files": (f"bomb{i}.png", png, "image/png")})
        if r.status_code != 200:
            return f"upload HTTP {r.status_code}"
        tab = f"flood{i:05d}tab"
        r = c.post("/gradio_api/queue/join", json={
            "data": [{"path": r.json()[0], "orig_name": f"bomb{i}.png", "meta": {"_type": "gradio.FileData"}}],
            "fn_index": fn[0], "trigger_id": fn[1], "session_hash": tab})
        if r.status_code != 200:
            return f"join HTTP {r.status_code}"
        with c.stream("GET", "/gradio_api/queue/data", params={"session_hash": tab}) as s:
            for line in s.iter_lines():
                if line.startswith("data:") and '"process_completed"' in line:
                    text = json.dumps(json.loads(line[5:]).get("output", {}))
                    if "Cannot use this file" in text:
                        why = text.split("Cannot use this file:**", 1)[1][:90]
                        return "refused: " + why.strip(" \\\"")
                    return "kept"
    return "error: no answer"


def run_flood(sessions: int = 50, uploads: int = 200, megapixels: float = 39.7, upload_mb: float = 4.0,
              bound_mb: float = 1024.0, settings: tuple[str, ...] = (), timeout: float = 600.0) -> dict:
    import httpx
    import psutil

    png = bomb_png(megapixels)
    out: dict = {"png_kb": round(len(png) / 1024, 1), "megapixels": megapixels}
    with tempfile.TemporaryDirectory(prefix="kiln-flood-") as tmp:
        tmp = Path(tmp)
        port = _free_port()
        base = f"http://127.0.0.1:{port}"
        sets = [f"app.jobs_dir={tmp}/var/jobs", f"app.cache_dir={tmp}/var/cache", "worker.count=1",
                "worker.device=cpu", *settings]
        cmd = [sys.executable, "-m", "app", "--port", str(port), "--no-examples"]
        for s in sets:
            cmd += ["--set", s]
        log = open(tmp / "server.log", "w")
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"))
        try:
            t0 = time.monotonic()
            while True:
                if proc.poll() is not None:
                    raise RuntimeError("server exited: " + (tmp / "server.log").read_text()[-2000:])
                try:
                    if httpx.get(base + "/", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() - t0 > 120:
                    raise RuntimeError("server did not come up in 120 s")
                time.sleep(0.2)
            ps = psutil.Process(proc.pid)
            time.sleep(2.0)   # let the background start-up (worker spawn, segmenter) settle
            baseline = ps.memory_info().rss
            peak = [baseline]
            page_ms: list[float] = []
            stop = threading.Event()

            def watch():
                while not stop.is_set():
                    try:
                        peak[0] = max(peak[0], ps.memory_info().rss)
                    except psutil.Error:
                        return
                    stop.wait(0.1)

            def ping():
                while not stop.is_set():
                    t = time.perf_counter()
                    try:
                        ok = httpx.get(base + "/", timeout=30).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    page_ms.append((time.perf_counter() - t) * 1000 if ok else float("inf"))
                    stop.wait(0.5)

            threads = [threading.Thread(target=watch), threading.Thread(target=ping)]
            for t in threads:
                t.start()
            fn = _upload_fn(base)
            t_flood = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                outcomes = list(pool.map(lambda i: one_session(base, fn, png, i), range(sessions)))
            blob = os.urandom(int(upload_mb * 1024 * 1024))

            def raw_upload(i):
                with httpx.Client(base_url=base, timeout=120) as c:
                    return c.post("/gradio_api/upload", files={"files": (f"u{i}.png", blob, "image/png")}).status_code

            with ThreadPoolExecutor(8) as pool:
                codes = list(pool.map(raw_upload, range(uploads)))
            flood_s = time.monotonic() - t_flood
            final_page = httpx.get(base + "/", timeout=30)
            time.sleep(1.0)
            stop.set()
            for t in threads:
                t.join()
            final = ps.memory_info().rss
            kinds: dict[str, int] = {}
            for o in outcomes:
                key = o.split(":")[0]
                kinds[key] = kinds.get(key, 0) + 1
            out.update({
                "sessions": sessions, "session_outcomes": kinds,
                "refusal_example": next((o for o in outcomes if o.startswith("refused")), None),
                "uploads": uploads, "upload_mb": upload_mb,
                "upload_codes": {str(c): codes.count(c) for c in sorted(set(codes))},
                "flood_s": round(flood_s, 1),
                "rss_baseline_mb": round(baseline / 2**20), "rss_peak_mb": round(peak[0] / 2**20),
                "rss_final_mb": round(final / 2**20), "bound_mb": bound_mb,
                "within_bound": peak[0] - baseline <= bound_mb * 2**20,
                "page_during_ms_max": round(max(page_ms), 1) if page_ms else None,
                "page_failures": sum(1 for x in page_ms if x == float("inf")),
                "page_after": final_page.status_code,
                "session_dirs": len(list((tmp / "var" / "sessions").glob("*"))),
            })
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--uploads", type=int, default=200)
    p.add_argument("--megapixels", type=float, default=39.7)
    p.add_argument("--upload-mb", type=float, default=4.0)
    p.add_argument("--bound-mb", type=float, default=1024.0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args(argv)
    res = run_flood(a.sessions, a.uploads, a.megapixels, a.upload_mb, a.bound_mb, tuple(a.set))
    print(json.dumps(res, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0 if res["within_bound"] and res["page_after"] == 200 and not res["page_failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
