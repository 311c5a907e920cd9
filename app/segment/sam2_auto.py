"""SAM 2 without clicks: prompt a grid of points, keep the object (``sam2_mask``).

``app.segment.automask`` runs this when the app's segmenter is SAM 2. Each grid point
is an object click of its own and gets SAM 2's three candidates (part, larger part,
whole); a candidate is an object when SAM 2 trusts it (predicted IoU), it is stable
(thresholding its logits at -1 and +1 gives nearly the same mask, as SAM's own
automatic mask generator measures it), and it is clear of the image border (a mask
along the border is the background, or an object cut by the frame). Of those, the
largest one near the middle wins: size first, centrality as the tie-break, as a person
framing one object would have it.

With the random-weight checkpoints the tests build, only the plumbing can be checked,
not the choice: no real SAM 2 weights can be downloaded here.
"""

from __future__ import annotations

import time

import numpy as np

from app.segment.maskshape import (
    components,
    fill_holes,
    frame_contact,
    open_specks,
    piece_weights,
    spans,
    to_size,
    work_copy,
)
from app.segment.one_object import ONE_OBJECT, AutoMask

# SAM 2 sees the image at this side (its encoder resizes to 1024 anyway; the candidates'
# full-size logits cost N x 3 x side^2 x 2 bytes)
WORK_SIDE = 512
# grid points per side over the middle of the image (plus its centre)
GRID = 4
GRID_SPAN = (0.2, 0.8)
# SAM's automatic mask generator keeps candidates above a predicted IoU of 0.8 and a
# stability of 0.95 (logit offset 1.0); one object in a product shot is a clearer
# case, so a little looser
MIN_PREDICTED_IOU = 0.7
MIN_STABILITY = 0.85
STABILITY_OFFSET = 1.0


def grid_points(h: int, w: int) -> np.ndarray:
    """(GRID^2 + 1, 2) float32 x, y: a GRID x GRID lattice over the image's middle and its centre."""
    lo, hi = GRID_SPAN
    u = np.linspace(lo, hi, GRID)
    gx, gy = np.meshgrid(u * w, u * h)
    pts = np.concatenate([[[w / 2, h / 2]], np.stack([gx.ravel(), gy.ravel()], 1)])
    return pts.astype(np.float32)


def stability(logits: np.ndarray) -> float:
    """IoU of the mask at logit +offset and at -offset (1: the outline is sharp)."""
    hi = int((logits > STABILITY_OFFSET).sum())
    lo = int((logits > -STABILITY_OFFSET).sum())
    return hi / lo if lo else 0.0


def sam2_mask(rgb: np.ndarray, segmenter, side: int = WORK_SIDE) -> AutoMask:
    """The object of (H, W, 3) uint8 ``rgb`` by SAM 2 through ``segmenter`` (a
    ``Sam2Segmenter``); ``problem`` set when no candidate is an object."""
    t0 = time.perf_counter()
    H, W = rgb.shape[:2]
    small = work_copy(rgb, side)
    h, w = small.shape[:2]
    points = grid_points(h, w)
    logits, predicted = segmenter.propose(small, points)
    if logits.ndim != 4 or logits.shape[:2] != predicted.shape or logits.shape[0] != len(points) \
            or logits.shape[2:] != (h, w):
        raise ValueError(f"SAM 2 answered candidates of shape {logits.shape} with scores {predicted.shape} "
                         f"for {len(points)} points on a {w}x{h} image")
    t1 = time.perf_counter()
    best, best_rank, best_score, passed = None, -1.0, 0.0, 0
    for i in range(logits.shape[0]):
        for k in range(logits.shape[1]):
            lg = logits[i, k].astype(np.float32)
            mask = lg > 0
            share = float(mask.mean())
            if not ONE_OBJECT.min_share <= share <= ONE_OBJECT.max_share or predicted[i, k] < MIN_PREDICTED_IOU:
                continue
            stable = stability(lg)
            if stable < MIN_STABILITY or frame_contact(mask) > ONE_OBJECT.max_frame_contact or spans(mask):
                continue
            passed += 1
            labels, stats = components(mask)
            rank = float(piece_weights(labels, stats).max())   # size x centrality of its main piece
            if rank > best_rank:
                best, best_rank, best_score = mask, rank, float(predicted[i, k]) * stable
    timings = {"sam2_s": t1 - t0, "choose_s": time.perf_counter() - t1}
    detail = (f"SAM 2: {len(points)} points, {logits.shape[0] * logits.shape[1]} candidates, "
              f"{passed} stable objects clear of the border")
    if best is None:
        return AutoMask(np.zeros((H, W), bool), "sam2", 0.0,
                        "none of SAM 2's candidates is a stable object clear of the image border",
                        detail, timings)
    labels, stats = components(open_specks(best))
    main = labels == 1 + int(np.argmax(piece_weights(labels, stats))) if len(stats) > 1 else best
    obj = fill_holes(main, main)   # only tiny holes: a larger one SAM 2 left open shows background
    timings["total_s"] = time.perf_counter() - t0
    return AutoMask(to_size(obj, (H, W)), "sam2", round(best_score, 4), None, detail, timings)
