"""A scene bake against the single bakes it replaces: the real person and bench of one photo.

Target (issue 39): the person and the bench baked together as one scene
(``kiln bake --scene``) take at most the sum of their single bakes plus 20 %. Each case is
``kiln bake --in-process`` in a fresh process (file checks, reading, the camera fit or the
pose fit, the bakes, the export), with the same settings: --simplify-ratio 0.95 and the
defaults otherwise. The bench alone has its camera fitted to its mask (field of view and all);
in the scene it keeps the person's camera and its pose is fitted under it. The cases run
interleaved, ``--repeat`` times; the table gives each case's fastest and slowest run and the
load average before and after (the machine is shared: compare within one run of this script).

    .venv/bin/python bench/scene.py [--repeat 2] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT.parent / "shared" / "fixtures" / "sam3d-human-object"
SLACK = 0.20   # the scene may take this much more than the single bakes together


def _focal() -> str:
    return str(json.loads((FIXTURES / "focal_length.json").read_text())["focal_length"])


def cases() -> dict[str, list[str]]:
    image = ["--image", str(FIXTURES / "image.png")]
    return {
        "person": ["--mesh", str(FIXTURES / "human_sam3d_body.ply"), *image,
                   "--mask", str(FIXTURES / "human_mask.png"), "--focal", _focal()],
        "bench": ["--mesh", str(FIXTURES / "bench_sam3d.glb"), *image,
                  "--mask", str(FIXTURES / "bench_mask.png")],
        "scene": ["--scene", "--mesh", str(FIXTURES / "human_sam3d_body.ply"), "--mask", str(FIXTURES / "human_mask.png"),
                  "--mesh", str(FIXTURES / "bench_sam3d.glb"), "--mask", str(FIXTURES / "bench_mask.png"),
                  *image, "--focal", _focal()],
    }


def run(name: str, args: list[str], extra: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory(prefix="kiln-bench-scene-") as tmp:
        out, rep = Path(tmp) / f"{name}.glb", Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "app.cli", "bake", *args, "--simplify-ratio", "0.95", *extra, "--in-process",
               "--set", f"app.jobs_dir={tmp}/jobs", "--set", f"app.cache_dir={tmp}/cache", "--report", str(rep),
               "-o", str(out)]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        return wall, json.loads(rep.read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args(argv)
    if not FIXTURES.is_dir():
        print(f"the real SAM 3D fixtures are missing: {FIXTURES}")
        return 2
    extra = [x for kv in a.set for x in ("--set", kv)]
    before = os.getloadavg()
    walls: dict[str, list[float]] = {k: [] for k in cases()}
    notes: dict[str, str] = {}
    for _ in range(a.repeat):
        for name, args in cases().items():
            wall, rep = run(name, args, extra)
            walls[name].append(wall)
            st = rep["stats"]
            if name == "scene":
                notes[name] = "; ".join(f"{o['name']} {o['placement']['how']} IoU {o['silhouette']['iou']:.2f}"
                                        for o in st["scene"])
            else:
                notes[name] = f"camera {st['model']['camera']}, IoU {st['model']['silhouette']['iou']:.2f}"
    after = os.getloadavg()
    print(f"{'case':8} {'fastest s':>10} {'slowest s':>10}  what")
    for name, w in walls.items():
        print(f"{name:8} {min(w):10.1f} {max(w):10.1f}  {notes[name]}")
    singles = min(walls["person"]) + min(walls["bench"])
    scene = min(walls["scene"])
    print(f"sum of singles {singles:.1f} s, scene {scene:.1f} s: {100 * scene / singles:.0f} % of it "
          f"(target <= {100 * (1 + SLACK):.0f} %: {'met' if scene <= (1 + SLACK) * singles else 'NOT met'})")
    print(f"load average before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, "
          f"after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f} (2 cores shared)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
