"""Cluttered pictures with known masks, for clicks (issue 38 item 1): a flat-colour room
illustration whose things touch one another, and the protocol that clicks on it as a person
would. Shared by tests/test_clicks.py and bench/clicks.py.

``room_scene`` draws a room in the style of a flat illustration: a wall, a wooden floor, a
glass door, a sofa about the wall's colour, a side table touching its arm, a lamp on the
table in front of the door, a plant in a pot touching the other arm, a rug under the sofa's
feet. Every thing's mask is known (what stays visible of it after the things in front are
drawn). Drawn at 2x and area-averaged (anti-aliased edges), light noise, then JPEG.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

Click = tuple[float, float, int]

# colour schemes: the sofa about the wall's colour (the hard case), and a blue one
SCHEMES = {
    "beige": dict(wall=(214, 200, 178), floor=(168, 128, 92), sofa=(196, 178, 150), seat=(205, 188, 160),
                  table=(138, 96, 64), shade=(244, 226, 170), stem=(60, 55, 50), glass=(176, 198, 206),
                  frame=(236, 234, 228), pot=(190, 96, 60), leaf=(70, 130, 70), rug=(150, 70, 64)),
    "blue": dict(wall=(190, 198, 204), floor=(150, 120, 96), sofa=(70, 100, 140), seat=(80, 112, 152),
                 table=(196, 160, 110), shade=(236, 236, 228), stem=(40, 40, 44), glass=(160, 186, 196),
                 frame=(250, 250, 250), pot=(230, 226, 214), leaf=(60, 120, 60), rug=(200, 190, 160)),
}


def _rr(canvas: np.ndarray, x0: float, y0: float, x1: float, y1: float, r: float, value) -> None:
    """A filled rectangle with rounded corners (radius r), coordinates in canvas pixels."""
    import cv2

    r = max(1, int(r))
    x0, y0, x1, y1 = int(x0), int(y0), int(x1), int(y1)
    cv2.rectangle(canvas, (x0 + r, y0), (x1 - r, y1), value, -1)
    cv2.rectangle(canvas, (x0, y0 + r), (x1, y1 - r), value, -1)
    for cx, cy in ((x0 + r, y0 + r), (x1 - r, y0 + r), (x0 + r, y1 - r), (x1 - r, y1 - r)):
        cv2.circle(canvas, (cx, cy), r, value, -1)


def room_scene(scheme: str = "beige", width: int = 1024, seed: int = 0,
               quality: int = 88) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(JPEG-decoded (H, W, 3) uint8 picture, {thing: visible mask (H, W) bool}), 4:3.

    Things: "sofa" (back, seat, two arms, legs, cushion seams), "table" (touching the sofa's
    right arm), "lamp" (on the table, its shade in front of the door), "door" (glass door
    with its frame, behind the table and lamp), "plant" (in a pot touching the left arm),
    "rug" (under the sofa's feet), "wall", "floor".
    """
    import cv2

    c = SCHEMES[scheme]
    W, H = 2 * width, 2 * (width * 3 // 4)
    label = np.zeros((H, W), np.uint8)    # which thing each pixel shows
    img = np.zeros((H, W, 3), np.float32)
    names = ["wall", "floor", "door", "rug", "sofa", "table", "lamp", "plant"]
    ids = {n: i for i, n in enumerate(names)}

    def put(name: str, draw: Callable[[np.ndarray, int], None], colour) -> None:
        """Draw a part of ``name`` in ``colour`` over what is there."""
        m = np.zeros((H, W), np.uint8)
        draw(m, 1)
        sel = m > 0
        img[sel] = colour
        label[sel] = ids[name]

    def px(fx: float, fy: float) -> tuple[int, int]:
        return int(fx * W), int(fy * H)

    # wall with a light falling off to the right, floor with planks
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    img[:] = np.array(c["wall"], np.float32) * (1.02 - 0.08 * xx[..., None] / W)
    horizon = 0.6
    floor = yy >= horizon * H
    img[floor] = np.array(c["floor"], np.float32)
    label[floor] = ids["floor"]
    for k in range(8):   # plank seams, darker
        y = int((horizon + 0.05 * k ** 1.2) * H)
        img[y:y + 3, :][floor[y:y + 3, :]] *= 0.85
    # glass door: frame, then two panes
    put("door", lambda m, v: cv2.rectangle(m, px(0.66, 0.08), px(0.9, horizon + 0.02), v, -1), c["frame"])
    put("door", lambda m, v: cv2.rectangle(m, px(0.68, 0.11), px(0.775, horizon - 0.01), v, -1), c["glass"])
    put("door", lambda m, v: cv2.rectangle(m, px(0.785, 0.11), px(0.88, horizon - 0.01), v, -1), c["glass"])
    # rug on the floor, under the sofa's feet
    put("rug", lambda m, v: cv2.ellipse(m, px(0.42, 0.86), (int(0.34 * W), int(0.1 * H)), 0, 0, 360, v, -1),
        c["rug"])
    # sofa: back, seat, arms, legs; x from 0.2 to 0.64 of the width
    sx0, sx1, sy0, sy1 = 0.2, 0.64, 0.4, 0.8
    sofa = np.array(c["sofa"], np.float32)
    put("sofa", lambda m, v: _rr(m, (sx0 + 0.025) * W, sy0 * H, (sx1 - 0.025) * W, 0.64 * H, 0.02 * W, v),
        sofa * 0.93)
    put("sofa", lambda m, v: _rr(m, (sx0 + 0.03) * W, 0.6 * H, (sx1 - 0.03) * W, 0.74 * H, 0.01 * W, v),
        c["seat"])
    put("sofa", lambda m, v: _rr(m, sx0 * W, 0.5 * H, (sx0 + 0.05) * W, 0.76 * H, 0.015 * W, v), sofa)
    put("sofa", lambda m, v: _rr(m, (sx1 - 0.05) * W, 0.5 * H, sx1 * W, 0.76 * H, 0.015 * W, v), sofa)
    for fx in (sx0 + 0.02, sx1 - 0.035):
        put("sofa", lambda m, v, fx=fx: cv2.rectangle(m, px(fx, 0.76), px(fx + 0.015, sy1), v, -1), (70, 50, 40))
    for fx in (0.347, 0.493):   # cushion seams: darker lines of the sofa's own
        put("sofa", lambda m, v, fx=fx: cv2.line(m, px(fx, 0.43), px(fx, 0.73), v, 5), sofa * 0.7)
    # side table touching the right arm, lamp on it in front of the door
    tx0, tx1 = sx1 - 0.002, sx1 + 0.12
    put("table", lambda m, v: cv2.rectangle(m, px(tx0, 0.58), px(tx1, 0.61), v, -1), c["table"])
    for fx in (tx0 + 0.01, tx1 - 0.02):
        put("table", lambda m, v, fx=fx: cv2.rectangle(m, px(fx, 0.61), px(fx + 0.012, 0.8), v, -1),
            np.array(c["table"], np.float32) * 0.8)
    lx = (tx0 + tx1) / 2
    put("lamp", lambda m, v: cv2.rectangle(m, px(lx - 0.025, 0.56), px(lx + 0.025, 0.58), v, -1), c["stem"])
    put("lamp", lambda m, v: cv2.rectangle(m, px(lx - 0.004, 0.36), px(lx + 0.004, 0.56), v, -1), c["stem"])
    shade = np.array([[lx - 0.05, 0.37], [lx + 0.05, 0.37], [lx + 0.035, 0.22], [lx - 0.035, 0.22]]) * [W, H]
    put("lamp", lambda m, v: cv2.fillPoly(m, [shade.astype(np.int32)], v), c["shade"])
    # plant: a pot touching the left arm, leaves above it against the wall
    put("plant", lambda m, v: cv2.rectangle(m, px(sx0 - 0.09, 0.66), px(sx0 + 0.002, 0.8), v, -1), c["pot"])
    rng = np.random.default_rng(seed + 7)
    for _ in range(9):
        ang = rng.uniform(-2.6, -0.5)
        cx, cy = (sx0 - 0.045) * W, 0.66 * H
        ex, ey = cx + 0.1 * W * np.cos(ang), cy + 0.32 * H * np.sin(ang) * rng.uniform(0.7, 1.0)
        put("plant", lambda m, v, cx=cx, cy=cy, ex=ex, ey=ey: cv2.ellipse(
            m, (int((cx + ex) / 2), int((cy + ey) / 2)),
            (int(np.hypot(ex - cx, ey - cy) / 2), int(0.012 * W)),
            float(np.degrees(np.arctan2(ey - cy, ex - cx))), 0, 360, v, -1), c["leaf"])
    # area-average to the final size: anti-aliased edges; noise; JPEG
    small = cv2.resize(img, (W // 2, H // 2), interpolation=cv2.INTER_AREA)
    small += np.random.default_rng(seed).normal(0, 2.0, small.shape).astype(np.float32)
    rgb = np.clip(small + 0.5, 0, 255).astype(np.uint8)
    ok, buf = cv2.imencode(".jpg", rgb[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
    rgb = np.ascontiguousarray(cv2.imdecode(buf, cv2.IMREAD_COLOR)[..., ::-1])
    masks = {}
    for n, i in ids.items():
        cover = cv2.resize((label == i).astype(np.float32), (W // 2, H // 2), interpolation=cv2.INTER_AREA)
        masks[n] = cover >= 0.5
    return rgb, masks


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max(1, (a | b).sum()))


def inner_point(region: np.ndarray) -> tuple[float, float]:
    """(x, y) of the pixel of ``region`` farthest from its edge: where a person clicks."""
    import cv2

    d = cv2.distanceTransform(np.pad(region, 1).astype(np.uint8), cv2.DIST_L2, 5)[1:-1, 1:-1]
    y, x = np.unravel_index(int(np.argmax(d)), d.shape)
    return float(x), float(y)


def next_click(mask: np.ndarray, truth: np.ndarray) -> Click:
    """The click a person makes next (the usual interactive-segmentation protocol): inside the
    larger error, an object click on what is missing or a background click on what is
    wrongly selected, at the point farthest from that error's edge."""
    import cv2

    errors = []
    for region, label in ((truth & ~mask, 1), (mask & ~truth, 0)):
        n, lab, stats, _ = cv2.connectedComponentsWithStats(region.astype(np.uint8), connectivity=8)
        if n > 1:
            k = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
            errors.append((int(stats[k, cv2.CC_STAT_AREA]), lab == k, label))
    if not errors:
        return (*inner_point(truth), 1)
    _, region, label = max(errors, key=lambda e: e[0])
    return (*inner_point(region), label)


def click_series(segment: Callable[[Sequence[Click]], np.ndarray], truth: np.ndarray, first: Click,
                 n: int = 3) -> list[tuple[Click, np.ndarray]]:
    """``n`` clicks: ``first``, then each ``next_click`` on the mask so far; [(click, mask)]."""
    clicks = [first]
    out = []
    for i in range(n):
        mask = segment(clicks)
        out.append((clicks[-1], mask))
        if i + 1 < n:
            clicks.append(next_click(mask, truth))
    return out
