"""Benchmark the automatic mask (``--mask auto``'s border model): silhouette IoU against the
true alpha and seconds per image, on the JPEG composites of tests/composites.py, plus the
cluttered negatives of tests/test_automask.py (refused or not, and why).

    .venv/bin/python bench/automask.py [--repeat 3] [--quality 85]

Objects: Kiln's drawn cut-outs (toy, pebble, blob) with anti-aliased alpha; backgrounds:
plain grey, white, a linear gradient, a vignette; two framings: 480x360 with the object in
the middle, and 1100x1500 with a smaller object off-centre. Seconds: the best of
``--repeat`` runs of ``find_object`` alone (decoding excluded).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quality", type=int, default=85)
    args = p.parse_args(argv)

    import numpy as np

    import composites as c
    import test_automask as t
    from app.segment.automask import find_object

    framings = {"480x360 middle": dict(size=300, canvas=(360, 480), at=(0.5, 0.5)),
                "1100x1500 small, off-centre": dict(size=500, canvas=(1500, 1100), at=(0.4, 0.6))}
    print(f"{'object':8s} {'background':10s} {'framing':28s} {'IoU':>7s} {'seconds':>8s}")
    by_bg: dict[str, list[float]] = {}
    secs: dict[str, list[float]] = {}
    for framing, kw in framings.items():
        for bg in ("grey", "white", "gradient", "vignette"):
            for kind in ("toy", "pebble", "blob"):
                photo, truth = c.composite(kind, bg, seed=3, quality=args.quality, **kw)
                best = float("inf")
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    got = find_object(photo)
                    best = min(best, time.perf_counter() - t0)
                score = t.iou(got.mask, truth) if got.found else 0.0
                by_bg.setdefault(bg, []).append(score)
                secs.setdefault(framing, []).append(best)
                print(f"{kind:8s} {bg:10s} {framing:28s} {score:7.4f} {best:8.2f}"
                      + ("" if got.found else f"  REFUSED: {got.problem}"))
    print()
    for bg, scores in by_bg.items():
        print(f"{bg:10s} IoU min {min(scores):.4f}  mean {statistics.mean(scores):.4f}")
    for framing, s in secs.items():
        print(f"{framing:28s} seconds median {statistics.median(s):.2f}  max {max(s):.2f}")
    print()
    for name, (make, _) in t.NEGATIVES.items():
        got = find_object(c.as_jpeg(make(360, 480), args.quality))
        print(f"{name:28s} {'refused' if not got.found else 'FOUND ' + format(got.share, '.2f')}: "
              f"{got.problem or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
