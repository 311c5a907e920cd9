"""Benchmark clicks on cluttered pictures with the weight-free segmenter (GrabCut and the line
drawings' outlines; issue 38 item 1): the object's IoU after 1, 2 and 3 clicks, what each
background click does, and seconds per click, against a control (another git revision's
``app/``, by default ``main``).

    .venv/bin/python bench/clicks.py [--control main] [--repeat 3]

Pictures (tests/clutter.py, tests/test_grabcut_drawings.py): a flat-colour room whose sofa
is about the wall's colour ("beige") or blue, the side table, plant and rug touching it, a
lamp in front of a glass door; a striped toy and a checkered pebble alone on a studio
backdrop (tests/composites.py: clicks must still take in a many-coloured object); and a
line drawing of a room. The first click is on the sofa's seat (on a single object: its
middle); the next two follow the usual protocol (the centre of the larger error: an object
click on what is missing, a background click on what is wrongly in).

Background clicks: one at a time after the first click, on each other thing (selected or
not), at that thing's most inner pixel; "removed" is the share of the image the click took
out of the selection, "IoU" the object's before and after. Then a box over the sofa, the
table and the lamp (a selection that has the others in it) and one background click on the
table, the lamp or the door: "of it", the share of that thing's selected pixels the click
took out. Seconds: CPU seconds of this process (the machine is shared), the last click only, on a segmenter that saw the clicks before it (as on
the page), best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pictures():
    """{name: (work-copy rgb, {thing: mask}, target thing, first click)}."""
    import numpy as np

    import clutter
    import test_grabcut_drawings as d

    out = {}
    for scheme in ("beige", "blue"):
        rgb, masks = clutter.room_scene(scheme)
        sofa = masks["sofa"]
        seat = sofa & (np.arange(sofa.shape[0])[:, None] > 0.61 * sofa.shape[0])
        ys, xs = np.nonzero(seat)
        out[f"room, {scheme} sofa"] = (rgb, masks, "sofa", (float(np.median(xs)), float(np.median(ys)), 1))
    import composites

    for kind in ("toy", "pebble"):   # one many-coloured object on a studio backdrop: no clutter
        rgb, gt = composites.composite(kind, "gradient", seed=3)
        ys, xs = np.nonzero(gt)
        out[f"single {kind}"] = (rgb, {kind: gt}, kind, (float(np.median(xs)), float(np.median(ys)), 1))
    rgb, gt, box = d.as_work(*d.room_drawing(2048, 3, "sofa"))
    ys, xs = np.nonzero(gt)
    out["line drawing, sofa"] = (rgb, {"sofa": gt}, "sofa", (float(np.median(xs)), float(np.median(ys)), 1))
    return out


def measure(repeat: int) -> dict:
    """The figures of this process's ``app`` (whichever tree is first on sys.path)."""
    import numpy as np

    import clutter
    from app.segment.segment import GrabCutSegmenter

    res: dict = {}
    for name, (rgb, masks, target, first) in pictures().items():
        truth = masks[target]
        secs: list[float] = []

        def run(clicks, box=None):
            """The mask for ``clicks`` as the page gets it: a fresh segmenter that saw the
            clicks before the last one (what it keeps between clicks is warm, as on the
            page), the last click timed."""
            best = float("inf")
            for _ in range(repeat):
                seg = GrabCutSegmenter()
                if len(clicks) > 1:
                    seg.segment(rgb, list(clicks[:-1]), box)
                t0 = time.process_time()   # CPU seconds: the machine is shared, wall time is not the click's
                m = seg.segment(rgb, list(clicks), box)
                best = min(best, time.process_time() - t0)
            if box is None:
                secs.append(best)
            return m

        series = clutter.click_series(run, truth, first, 3)
        row: dict = {"iou": [clutter.iou(m, truth) for _, m in series],
                     "share": [float(m.mean()) for _, m in series],
                     "clicks": [("obj" if c[2] else "bg") for c, _ in series]}
        one = series[0][1]
        bg = []
        for thing, tm in masks.items():
            if thing in (target, "wall", "floor"):
                continue
            x, y = clutter.inner_point(tm)
            after = run([first, (x, y, 0)])
            bg.append({"thing": thing, "removed": float((one & ~after).mean()),
                       "added": float((after & ~one).mean()),
                       "iou": [clutter.iou(one, truth), clutter.iou(after, truth)]})
        row["background"] = bg
        # a selection that has the others in it: a box over the sofa, the table and the lamp
        boxed = []
        if "table" in masks:
            ys, xs = np.nonzero(masks[target] | masks["table"] | masks["lamp"])
            box = (xs.min() - 10.0, ys.min() - 10.0, xs.max() + 10.0, ys.max() + 10.0)
            before = GrabCutSegmenter().segment(rgb, [], box)
            for thing in ("table", "lamp", "door"):
                x, y = clutter.inner_point(masks[thing])
                after = run([(x, y, 0)], box)
                boxed.append({"thing": thing, "removed": float((before & ~after).mean()),
                              "added": float((after & ~before).mean()),
                              "removed_of_thing": float((before & ~after & masks[thing]).sum()
                                                        / max(1, (before & masks[thing]).sum())),
                              "iou": [clutter.iou(before, truth), clutter.iou(after, truth)]})
        row["boxed"] = boxed
        row["warnings"] = warnings(rgb, masks, target, first)
        row["seconds"] = float(np.median(secs))
        row["first_seconds"] = secs[0]   # a new object click: the one that chooses the prior
        row["first_click"], row["one_grabcut"] = (first_click_cost(rgb, first, 2 * repeat) if "line" not in name
                                                  else (float("nan"), float("nan")))
        res[name] = row
    return res


def first_click_cost(rgb, first, repeat: int) -> tuple[float, float]:
    """(CPU seconds of a new object click on a fresh segmenter, of one GrabCut run with the
    prior it chose and the same preparation: working copy, Lab, the click's regions), best of
    ``repeat`` each, measured alternately so that the machine's load weighs on both alike;
    (nan, nan) on a tree without the choice."""
    import cv2

    from app.segment.segment import GrabCutSegmenter

    seg = GrabCutSegmenter()
    seg.segment(rgb, [first])   # warm: OpenCV's first calls, the lazy imports
    if not getattr(seg, "_modes", None):
        return float("nan"), float("nan")
    wide = list(seg._modes.values())[0]
    click = one = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        GrabCutSegmenter().segment(rgb, [first])
        click = min(click, time.process_time() - t0)
        t0 = time.process_time()
        h, w = rgb.shape[:2]
        s = min(1.0, seg.max_side / max(h, w))
        small = cv2.resize(rgb, (round(w * s), round(h * s)), interpolation=cv2.INTER_AREA)
        c = [(first[0] * s, first[1] * s, 1)]
        lab = seg.click_regions.lab(small)
        o, b = seg.click_regions.regions(lab, c)
        prior = seg._wide_prior(c, small.shape[:2]) if wide else seg._probable_object(lab, c, o)
        seg._run(small, c, None, prior, o, b, seg.iterations)
        one = min(one, time.process_time() - t0)
    return click, one


def warnings(rgb, masks: dict, target: str, first) -> dict:
    """{selection: [thin parts warned, share beyond the clicked colours]} for the target alone
    and with the things around it, as if the clicks had selected them (the page's warnings,
    ``app.segment.clicks``); empty on a tree without the colour rule."""
    import numpy as np

    try:
        from app.segment.clicks import ColourSpread, Spread
    except ImportError:
        return {}
    combos = [()] + [c for c in (("rug",), ("plant",), ("rug", "plant"), ("table", "lamp"),
                                 ("table", "lamp", "door")) if all(t in masks for t in c)]
    out = {}
    for extra in combos:
        m = masks[target] | np.logical_or.reduce([masks[e] for e in extra]) if extra else masks[target]
        out["+".join((target,) + extra)] = [bool(Spread().check(m, [first])),
                                            ColourSpread().outside(rgb, m, [first])]
    return out


def control_figures(ref: str, repeat: int) -> dict:
    """``measure`` on ``ref``'s ``app/`` (and the rest of its tree), with this tree's pictures."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        out = subprocess.run([sys.executable, __file__, "--app-root", tmp, "--repeat", str(repeat), "--json"],
                             check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def print_table(label: str, res: dict) -> None:  # noqa: C901 - three tables
    print(f"\n{label}")
    print(f"{'picture':22s} {'clicks':12s} {'IoU 1':>6s} {'IoU 2':>6s} {'IoU 3':>6s} {'share 1':>8s} {'s/click':>8s} {'s 1st':>6s} {'alternately: 1st / one GC':>26s}")
    for name, r in res.items():
        iou = [f"{v:6.3f}" for v in r["iou"]]
        print(f"{name:22s} {'+'.join(r['clicks']):12s} {' '.join(iou)} {100 * r['share'][0]:7.1f}% "
              f"{r['seconds']:8.2f} {r.get('first_seconds', float('nan')):6.2f} {r.get('first_click', float('nan')):13.3f} / {r.get('one_grabcut', float('nan')):.3f}")
    print(f"{'picture':22s} {'background click on':20s} {'removed':>8s} {'added':>7s} {'IoU before->after':>18s}")
    for name, r in res.items():
        for b in r["background"]:
            print(f"{name:22s} {b['thing']:20s} {100 * b['removed']:7.1f}% {100 * b['added']:6.1f}% "
                  f"{b['iou'][0]:8.3f} -> {b['iou'][1]:.3f}")
    print(f"{'picture':22s} {'box, then bg click on':22s} {'removed':>8s} {'of it':>6s} {'IoU before->after':>18s}")
    for name, r in res.items():
        for b in r["boxed"]:
            print(f"{name:22s} {b['thing']:22s} {100 * b['removed']:7.1f}% {100 * b['removed_of_thing']:5.0f}% "
                  f"{b['iou'][0]:8.3f} -> {b['iou'][1]:.3f}")
    print(f"{'picture':22s} {'selection':24s} {'thin parts':>10s} {'beyond colours':>15s}")
    for name, r in res.items():
        for sel, (thin, beyond) in r.get("warnings", {}).items():
            print(f"{name:22s} {sel:24s} {'warned' if thin else '-':>10s} {100 * beyond:14.1f}%")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--control", default="main", help="git revision to compare with ('' for none)")
    p.add_argument("--repeat", type=int, default=3, help="runs per click; the best is timed")
    p.add_argument("--app-root", default=str(ROOT), help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, args.app_root)
    if args.json:
        print(json.dumps(measure(args.repeat)))
        return 0
    if args.control:
        print_table(f"control: {args.control}", control_figures(args.control, args.repeat))
    print_table("this tree", measure(args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
