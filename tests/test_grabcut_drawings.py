"""The weight-free segmenter on what GrabCut's colours cannot tell apart (issue 27 item 5).

A line drawing's objects are the same paper as their background, and a low-contrast
photo's object is nearly the colour around it. Every input here is synthetic with a
known mask, goes through what an upload does (downscaled to the working copy), and one
box around the object must give IoU >= 0.8.
"""

from __future__ import annotations

import time
from dataclasses import replace

import cv2
import numpy as np
import pytest

from app.segment.segment import SEG_MAX_SIDE, GrabCutSegmenter
from app.web.photo import selection
from app.web.state.uploads import SessionState, WorkImage, downscale

Box = tuple[float, float, float, float]


@pytest.fixture(scope="module")
def seg() -> GrabCutSegmenter:
    return GrabCutSegmenter()


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max(1, (a | b).sum()))


def _rounded_rect(x0: float, y0: float, x1: float, y1: float, r: float) -> np.ndarray:
    """Polygon (n, 2) int32 of a rectangle with rounded corners."""
    pts = []
    for cx, cy, a0 in ((x1 - r, y0 + r, 270), (x1 - r, y1 - r, 0), (x0 + r, y1 - r, 90), (x0 + r, y0 + r, 180)):
        pts.append(cv2.ellipse2Poly((int(cx), int(cy)), (int(r), int(r)), 0, a0, a0 + 90, 10))
    return np.concatenate(pts).astype(np.int32)


def _sofa(u: float, ox: float, oy: float) -> list[np.ndarray]:
    """A sofa's parts as polygons (back, seat, arms, legs), drawn back to front;
    u is the size of one unit (the sofa is 10 x 6.3 units)."""
    def rr(x0: float, y0: float, x1: float, y1: float, r: float) -> np.ndarray:
        return _rounded_rect(ox + x0 * u, oy + y0 * u, ox + x1 * u, oy + y1 * u, max(1.0, r * u))
    return [rr(0.5, 0, 9.5, 3.5, 0.6), rr(1.2, 3.0, 8.8, 5.0, 0.3), rr(0, 1.5, 1.5, 5.5, 0.5),
            rr(8.5, 1.5, 10, 5.5, 0.5), rr(0.6, 5.4, 1.0, 6.3, 0.1), rr(9.0, 5.4, 9.4, 6.3, 0.1)]


def _polygon(kind: str, u: float, ox: float, oy: float) -> list[np.ndarray]:
    """A round table top (circle) or a star-shaped wall clock, 10 units across."""
    c = (ox + 5 * u, oy + 5 * u)
    if kind == "circle":
        return [cv2.ellipse2Poly((int(c[0]), int(c[1])), (int(5 * u), int(5 * u)), 0, 0, 360, 2)]
    ang = np.linspace(0, 2 * np.pi, 16, endpoint=False)
    rad = np.where(np.arange(16) % 2 == 0, 5 * u, 3.2 * u)
    return [np.stack([c[0] + rad * np.cos(ang), c[1] + rad * np.sin(ang)], 1).astype(np.int32)]


def _stroke(canvas: np.ndarray, poly: np.ndarray, t: int, gap: float) -> None:
    """Outline ``poly`` with t px lines, leaving ``gap`` px holes in it every so often
    (a drawing scanned or downscaled has holes in its lines)."""
    if gap <= 0:
        cv2.polylines(canvas, [poly], True, 0, t, cv2.LINE_AA)
        return
    closed = np.concatenate([poly, poly[:1]]).astype(np.float64)
    seg_len = np.hypot(*np.diff(closed, axis=0).T)
    cum = np.concatenate([[0], np.cumsum(seg_len)])
    total = cum[-1]
    step = 0.5
    s = np.arange(0, total, step)
    xy = np.stack([np.interp(s, cum, closed[:, 0]), np.interp(s, cum, closed[:, 1])], 1)
    keep = (s % (total / 7)) > gap   # seven holes around the outline
    for a, b, k in zip(xy[:-1], xy[1:], keep[:-1]):
        if k:
            cv2.line(canvas, (int(a[0]), int(a[1])), (int(b[0]), int(b[1])), 0, t, cv2.LINE_AA)


def room_drawing(width: int, line: int, obj: str = "sofa", gap: float = 0.0,
                 ) -> tuple[np.ndarray, np.ndarray, Box]:
    """A line drawing of a room (black lines on white, 4:3) with an object in it.

    Returns (grey (H, W) uint8, the object's filled mask (H, W) bool, a box around it
    with a 3 % margin). The room's lines go behind the object (the floor line meets its
    sides, the rug is wider than the box); a window, a picture, a lamp stand elsewhere,
    and a side table half inside the box's right edge.
    """
    h = width * 3 // 4
    w = width
    canvas = np.full((h, w), 255, np.uint8)

    def p(fx: float, fy: float) -> tuple[int, int]:
        return int(fx * w), int(fy * h)

    cv2.line(canvas, p(0, 0.62), p(1, 0.62), 0, line)                       # floor line
    cv2.line(canvas, p(0.1, 0), p(0.1, 0.62), 0, line)                      # wall corner
    cv2.line(canvas, p(0.1, 0.62), p(0, 1), 0, line)
    cv2.rectangle(canvas, p(0.62, 0.1), p(0.85, 0.38), 0, line)             # window
    cv2.line(canvas, p(0.735, 0.1), p(0.735, 0.38), 0, line)
    cv2.rectangle(canvas, p(0.2, 0.08), p(0.33, 0.22), 0, line)             # picture
    cv2.circle(canvas, p(0.94, 0.48), int(0.04 * h), 0, line)               # lamp
    cv2.line(canvas, p(0.94, 0.52), p(0.94, 0.8), 0, line)
    cv2.ellipse(canvas, p(0.45, 0.87), (int(0.42 * w), int(0.08 * h)), 0, 0, 360, 0, line)   # rug
    u = w / 26
    if obj == "sofa":
        ox, oy, ext_w, ext_h = 0.25 * w, 0.42 * h, 10 * u, 6.3 * u
        parts = _sofa(u, ox, oy)
    else:
        u = h / 26
        ox, oy, ext_w, ext_h = 0.3 * w, 0.3 * h, 10 * u, 10 * u
        parts = _polygon(obj, u, ox, oy)
    margin_x, margin_y = 0.03 * w, 0.03 * h
    box = (ox - margin_x, oy - margin_y, ox + ext_w + margin_x, oy + ext_h + margin_y)
    # a side table straddling the box's right edge, a little apart from the object: a
    # neighbour the box cuts through (one touching the object would be one shape with it)
    table = _rounded_rect(box[2] - 0.015 * w, oy + 0.45 * ext_h, box[2] + 0.08 * w, oy + ext_h, 0.005 * w)
    cv2.fillPoly(canvas, [table], 255)
    cv2.polylines(canvas, [table], True, 0, line, cv2.LINE_AA)
    mask = np.zeros((h, w), np.uint8)
    for part in parts:   # back to front: each part hides the lines behind it
        cv2.fillPoly(canvas, [part], 255)
        _stroke(canvas, part, line, gap)
        cv2.fillPoly(mask, [part], 1)
        cv2.polylines(mask, [part], True, 1, line)
    if obj == "sofa":   # seams between the cushions
        for fx in (3.7, 6.3):
            x = int(ox + fx * u)
            cv2.line(canvas, (x, int(oy + 0.6 * u)), (x, int(oy + 5.0 * u)), 0, line, cv2.LINE_AA)
    return canvas, mask > 0, box


def as_work(grey: np.ndarray, mask: np.ndarray, box: Box) -> tuple[np.ndarray, np.ndarray, Box]:
    """What an upload hands the segmenter: the RGB copy downscaled to SEG_MAX_SIDE
    (INTER_AREA, as app.web.state.uploads does), with the mask and box scaled alike."""
    rgb = downscale(np.dstack([grey] * 3) if grey.ndim == 2 else grey, SEG_MAX_SIDE)
    s = rgb.shape[1] / grey.shape[1]
    small = cv2.resize(mask.astype(np.uint8) * 255, (rgb.shape[1], rgb.shape[0]),
                       interpolation=cv2.INTER_AREA) >= 128
    return rgb, small, (box[0] * s, box[1] * s, box[2] * s, box[3] * s)


def low_contrast_photo(bg: float, fg: float, noise: float, texture: float,
                       colour: tuple[float, float, float] = (1.0, 1.0, 1.0), seed: int = 0,
                       quality: int = 85) -> tuple[np.ndarray, np.ndarray, Box]:
    """A 1024x768 photo of a blob barely lighter than the wall behind it, through JPEG.

    Background grey ``bg`` and object grey ``fg`` (times ``colour`` per channel), the
    object with a ``texture`` amplitude pattern, both with Gaussian ``noise`` and a
    light falling off across the frame. Returns (rgb, mask, a box with a 3 % margin).
    """
    rng = np.random.default_rng(seed)
    h, w = 768, 1024
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    cx, cy = 0.5 * w, 0.55 * h
    theta = np.arctan2(yy - cy, xx - cx)
    radius = 0.25 + 0.04 * np.cos(3 * theta + 1) + 0.03 * np.cos(5 * theta)
    mask = np.hypot((xx - cx) / w, (yy - cy) / h) <= radius
    grey = np.where(mask, fg + texture * np.sin(xx / 9.0) * np.sin(yy / 13.0), bg)
    grey = grey + rng.normal(0, noise, (h, w)) + 10 * (xx / w - 0.5)
    rgb = np.clip(np.dstack([grey * c for c in colour]), 0, 255).astype(np.uint8)
    ok, buf = cv2.imencode(".jpg", rgb, [cv2.IMWRITE_JPEG_QUALITY, quality])
    rgb = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
    ys, xs = np.nonzero(mask)
    box = (xs.min() - 0.03 * w, ys.min() - 0.03 * h, xs.max() + 0.03 * w, ys.max() + 0.03 * h)
    return rgb, mask, box


def _state(rgb: np.ndarray) -> SessionState:
    img = WorkImage(name="drawing.png", work=rgb, work_alpha=None, key="k",
                    size=(rgb.shape[0], rgb.shape[1]), source=b"", has_alpha=False)
    return SessionState(image=img)


# -- line drawings ----------------------------------------------------------------

@pytest.mark.parametrize("width,line,obj,gap", [
    (1024, 2, "sofa", 0),        # drawn at the working size
    (1024, 3, "circle", 0),
    (1024, 2, "star", 0),
    (2048, 3, "sofa", 3.0),      # lines with holes in them
    (6000, 3, "sofa", 0),        # 27 MP: the lines are faint and thin once downscaled
    (6000, 4, "star", 6.0),
    (1024, 7, "sofa", 0),        # a marker's thick lines
])
def test_one_box_selects_a_line_drawn_object(seg, width, line, obj, gap):
    grey, mask, box = room_drawing(width, line, obj, gap)
    rgb, gt, wbox = as_work(grey, mask, box)
    got = seg.segment(rgb, [], wbox)
    iou = _iou(got, gt)
    print(f"{width}px {line}px {obj} gap {gap}: IoU {iou:.3f}")
    assert iou >= 0.8, iou


def test_one_box_selects_the_sofa_in_a_scanned_drawing(seg):
    """Grey paper with grain, grey pencil lines, through JPEG."""
    grey, mask, box = room_drawing(3000, 4, "sofa")
    rng = np.random.default_rng(1)
    scan = 232 - 0.65 * (255 - grey.astype(np.float32)) + rng.normal(0, 4, grey.shape)
    ok, buf = cv2.imencode(".jpg", np.clip(scan, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 75])
    rgb, gt, wbox = as_work(cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE), mask, box)
    iou = _iou(seg.segment(rgb, [], wbox), gt)
    print(f"scanned drawing: IoU {iou:.3f}")
    assert iou >= 0.8, iou


def test_a_tight_or_loose_box_still_selects_the_sofa(seg):
    """A box that clips the outline a little, and one with more of the room inside it:
    the floor line, the window's corner, most of the side table."""
    rgb, gt, (x0, y0, x1, y1) = as_work(*room_drawing(2048, 3, "sofa"))
    bw, bh = x1 - x0, y1 - y0
    tight = (x0 + 0.08 * bw, y0 + 0.08 * bh, x1 - 0.03 * bw, y1 - 0.08 * bh)
    loose = (x0 - 0.15 * bw, y0 - 0.3 * bh, x1 + 0.12 * bw, y1 + 0.1 * bh)
    for name, box in (("tight", tight), ("loose", loose)):
        iou = _iou(seg.segment(rgb, [], box), gt)
        print(f"{name} box: IoU {iou:.3f}")
        assert iou >= 0.8, (name, iou)


def test_clicks_on_a_drawing_choose_the_closed_shapes(seg):
    """One click on a cushion selects the whole sofa (its cushions are one shape with
    their strokes). A box over the sofa and the side table beside it selects the sofa,
    the larger; object clicks on both select both; a background click inside a cushion
    leaves that cushion out."""
    rgb, gt, box = as_work(*room_drawing(2048, 3, "sofa"))
    ys, xs = np.nonzero(gt)
    cx, cy = float(np.median(xs)), float(np.median(ys))
    iou = _iou(seg.segment(rgb, [(cx, cy, 1)]), gt)
    print(f"one click on the sofa: IoU {iou:.3f}")
    assert iou >= 0.8, iou

    wide = (box[0], box[1], box[2] + 0.3 * (box[2] - box[0]), box[3])
    tx, ty = box[2] + 0.1 * (box[2] - box[0]), box[3] - 0.15 * (box[3] - box[1])
    assert rgb[int(ty), int(tx)].min() == 255 and rgb[int(ty), int(tx) - 50].min() == 255
    sofa_only = seg.segment(rgb, [], wide)
    assert not sofa_only[int(ty), int(tx)] and _iou(sofa_only, gt) >= 0.8, _iou(sofa_only, gt)
    both = seg.segment(rgb, [(cx, cy, 1), (tx, ty, 1)], wide)
    assert both[int(ty), int(tx)] and (both & gt).sum() >= 0.95 * gt.sum()

    u = (xs.max() - xs.min()) / 10   # the sofa is 10 units wide; its middle seat cushion:
    sx, sy = xs.min() + 5 * u, ys.min() + 4 * u
    holed = seg.segment(rgb, [(sx, sy, 0)], box)
    assert not holed[int(sy), int(sx)] and holed[int(sy), int(sx - 2 * u)]
    print(f"box and a background click in a cushion: IoU {_iou(holed, gt):.3f}")
    assert 0.8 <= _iou(holed, gt) < 0.95, _iou(holed, gt)


@pytest.mark.timing(reason="one box must take under 3 s")
def test_drawing_on_full_size_input_is_fast(seg):
    """The segmenter downscales first: a 27 MP drawing handed over whole costs little
    more than its working copy."""
    grey, mask, box = room_drawing(6000, 3, "sofa")
    rgb = np.dstack([grey] * 3)
    t0 = time.perf_counter()
    got = seg.segment(rgb, [], box)
    took = time.perf_counter() - t0
    iou = _iou(got, mask)
    print(f"27 MP drawing: {took:.3f} s, IoU {iou:.3f}")
    assert got.shape == mask.shape and iou >= 0.8, iou
    assert took < 3.0, f"{took:.2f} s for one box"   # about 0.2 s; lenient for a busy machine


# -- low-contrast photos ------------------------------------------------------------

@pytest.mark.parametrize("bg,fg,noise,texture,colour", [
    (128, 150, 8, 8, (1.0, 1.0, 1.0)),       # grey on grey, textured
    (128, 140, 6, 4, (1.0, 1.0, 1.0)),
    (128, 134, 15, 4, (1.0, 1.0, 1.0)),      # noise over twice the difference: needs the smoothed rerun
    (200, 188, 6, 5, (1.0, 0.94, 0.82)),     # a beige sofa against a beige wall
])
def test_one_box_selects_a_low_contrast_object(seg, bg, fg, noise, texture, colour):
    rgb, gt, box = low_contrast_photo(bg, fg, noise, texture, colour)
    got = seg.segment(rgb, [], box)
    iou = _iou(got, gt)
    print(f"bg {bg} fg {fg} noise {noise}: IoU {iou:.3f}")
    assert iou >= 0.8, iou


# -- nothing there ------------------------------------------------------------------

def test_a_box_on_blank_paper_or_plain_wall_selects_nothing_and_says_what_next(seg):
    rgb, _, _ = as_work(*room_drawing(2048, 3, "sofa"))
    blank = (0.38 * rgb.shape[1], 0.03 * rgb.shape[0], 0.58 * rgb.shape[1], 0.3 * rgb.shape[0])
    assert not seg.segment(rgb, [], blank).any()
    photo, gt, _ = low_contrast_photo(128, 134, 15, 4)
    assert not seg.segment(photo, [], (20, 20, 200, 150)).any()

    state = replace(_state(rgb), box=blank, mask=np.zeros(rgb.shape[:2], bool))
    text = selection.mask_summary(state)
    assert "nothing in the box stands out" in text and "click on the object inside the box" in text
    assert "mask file" in text and "drag a box" not in text, "the box was dragged already"
    clicked = replace(state, clicks=((10.0, 10.0, 1),))
    assert "click on other parts of the object" in selection.mask_summary(clicked)
    only_bg = replace(_state(rgb), clicks=((10.0, 10.0, 0),))
    assert "only background clicks" in selection.mask_summary(only_bg)
    assert "click the object or drag a box" in selection.mask_summary(_state(rgb))


def test_a_photo_on_white_is_left_to_grabcut(seg):
    """A product photographed on white is mostly paper-coloured too, but its object is
    filled, not drawn: it must not be taken for a line drawing."""
    from app.segment.outline import is_line_art, paper_ink

    rgb, gt, box = low_contrast_photo(250, 90, 3, 30, (0.9, 0.6, 0.4))
    x0, y0, x1, y1 = (int(v) for v in box)
    assert not is_line_art(*paper_ink(rgb[y0:y1, x0:x1]))
    assert _iou(seg.segment(rgb, [], box), gt) >= 0.9
