"""The weight-free automatic mask: model the background from the image border, keep what
stands out from it (``border_model_mask``; ``app.segment.automask`` explains when it runs).

Made for an object on a plain or smooth background: product shots, studio photos,
cut-outs flattened onto a colour. Steps, each with a refusal when its assumption fails:

1. On a copy at most ``WORK_SIDE`` a side, fit the background's colour to a strip along
   the border: a quadratic polynomial of position per CIE Lab channel (a plain colour, a
   linear or radial gradient, a vignette), robustly, so an object that runs off one side
   does not bend it. Refused: a border whose colours stray from the fit (texture, noise,
   clutter) or of which much is something else.
2. Pixels far from the model (``NOISE_SIGMAS`` of the border's own noise, JPEG's
   included, and at least ``MIN_CONTRAST``) seed GrabCut: only they start as probable
   object (a band around them would teach GrabCut the background's colours as the
   object's), background-like pixels reached from the border away from them are certain
   background. Refused: nothing stands out.
3. The largest, most central piece of GrabCut's answer is the object; holes in it are
   filled unless they look like background and are not tiny (the space inside a
   handle). Refused: two pieces of similar size, many pieces (clutter), a speck, almost
   the whole image, an object running off the image along much of the border or from
   one side to the opposite one (a table edge, a horizon), or a threshold and a GrabCut
   that disagree about the outline (colours too close to the background's).
4. The object's neighbourhood is cut again from the full-size photo at the work copy's
   pixel budget, so a small object's outline is found at its own resolution.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from app.segment.maskshape import (
    components,
    dilate,
    erode,
    fill_holes,
    frame_contact,
    iou,
    open_specks,
    piece_weights,
    spans,
    to_size,
    work_copy,
)
from app.segment.one_object import ONE_OBJECT, AutoMask

# the side of the copy the method works on: GrabCut at 400 px costs ~0.3 s on a 2-core CPU
WORK_SIDE = 400
# the border strip's width, as a share of the work copy's longest side
BORDER_STRIP = 0.02
# the border is plain when its colours stray from the fitted background by at most this
# (1.48 x the median residual, CIE Lab units; a clean JPEG of a backdrop is ~0.5 to 2) ...
MAX_BORDER_NOISE = 5.0
# ... and when at most this share of the strip is something else (the object running off
# one side, or clutter)
MAX_BORDER_OTHER = 0.3
# a pixel stands out when it is this many noise scales from the model, and at least
# MIN_CONTRAST Lab units (a just noticeable difference is ~2.3)
NOISE_SIGMAS = 5.0
MIN_CONTRAST = 6.0
# the one-object rule (shares, frame contact, second objects, clutter, specks) is every
# method's: app.segment.one_object
SPECK = ONE_OBJECT.speck
# the agreement (threshold vs GrabCut, times the plain share of the border) below which
# the outline is not trusted
MIN_SCORE = 0.5
# the zoomed second cut is kept when it agrees this well with the first (else the first)
MIN_REFINE_AGREEMENT = 0.8


@dataclass(frozen=True)
class Background:
    """The background's colour, fitted to the border strip of a work copy.

    ``coef``: (T, 3) polynomial coefficients over coordinates normalised to [-1, 1]
    across the image (the same for the photo and any copy of it); ``noise``: the border's
    residual scale, Lab units; ``other``: the share of the strip the fit does not
    explain; ``degree``: the polynomial's degree."""

    coef: np.ndarray
    noise: float
    other: float
    degree: int

    def colour(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """(..., 3) Lab predicted at normalised coordinates ``x``, ``y`` (same shape)."""
        terms = poly_terms(x.ravel(), y.ravel(), self.degree)
        return (terms @ self.coef).reshape(*x.shape, 3).astype(np.float32)

    def image(self, shape: tuple[int, int], box: Optional[tuple[int, int, int, int]] = None,
              full: Optional[tuple[int, int]] = None) -> np.ndarray:
        """(h, w, 3) Lab over a (h, w) image; with ``box`` (x0, y0, x1, y1) in a ``full``
        (H, W) image, over that box sampled at (h, w)."""
        h, w = shape
        H, W = full or shape
        x0, y0, x1, y1 = box or (0, 0, W, H)
        xs = x0 + (np.arange(w) + 0.5) * (x1 - x0) / w
        ys = y0 + (np.arange(h) + 0.5) * (y1 - y0) / h
        gx, gy = np.meshgrid(xs / W * 2 - 1, ys / H * 2 - 1)
        return self.colour(gx, gy)

    @property
    def spread(self) -> float:
        """How far the model's colour travels over the image (Lab units): ~0 plain."""
        corners = self.image((9, 9)).reshape(-1, 3)
        return float(np.linalg.norm(corners - corners.mean(0), axis=1).max())


def to_lab(rgb: np.ndarray) -> np.ndarray:
    """(h, w, 3) uint8 sRGB -> (h, w, 3) float32 CIE Lab (L 0..100), lightly blurred so
    that JPEG's blocks and sensor noise count less than colour."""
    import cv2

    return cv2.cvtColor(cv2.GaussianBlur(rgb, (3, 3), 0).astype(np.float32) / 255.0, cv2.COLOR_RGB2Lab)


def poly_terms(x: np.ndarray, y: np.ndarray, degree: int) -> np.ndarray:
    """(N, T) monomials x^i y^j, i + j <= degree, of coordinates in [-1, 1]."""
    return np.stack([x ** i * y ** j for i in range(degree + 1) for j in range(degree + 1 - i)], 1)


def border_strip(h: int, w: int) -> np.ndarray:
    """(h, w) bool, the frame ``BORDER_STRIP`` of the longest side wide (>= 2 px)."""
    b = max(2, round(BORDER_STRIP * max(h, w)))
    strip = np.zeros((h, w), bool)
    strip[:b], strip[-b:], strip[:, :b], strip[:, -b:] = True, True, True, True
    return strip


def fit_background(lab: np.ndarray, degree: int = 2, iterations: int = 6) -> Background:
    """The background's colour fitted to the border strip of ``lab`` ((h, w, 3) Lab).

    A polynomial of degree <= 3 is fixed by its values on a rectangle's four sides, so one
    fitted to the border predicts the inside. Least squares over the strip, then again
    over the pixels within three noise scales of the fit, until they stop changing (the
    noise scale, 1.48 x the median residual over the whole strip, stays robust while less
    than half of the strip is something else).
    """
    h, w = lab.shape[:2]
    ys, xs = np.nonzero(border_strip(h, w))
    samples = lab[ys, xs].astype(np.float64)
    terms = poly_terms((xs + 0.5) / w * 2 - 1, (ys + 0.5) / h * 2 - 1, degree)
    inliers = np.ones(len(samples), bool)
    noise = 0.0
    coef = np.zeros((terms.shape[1], 3))
    for _ in range(iterations):
        coef = np.linalg.lstsq(terms[inliers], samples[inliers], rcond=None)[0]
        resid = np.linalg.norm(samples - terms @ coef, axis=1)
        noise = 1.4826 * float(np.median(resid))
        new = resid <= max(3.0 * noise, MIN_CONTRAST / 2)
        if new.sum() < 4 * terms.shape[1] or np.array_equal(new, inliers):
            break
        inliers = new
    return Background(coef=coef, noise=noise, other=float(1.0 - inliers.mean()), degree=degree)


# --------------------------------------------------------------------------- GrabCut

def _grabcut(rgb: np.ndarray, seeds: np.ndarray, iterations: int = 4) -> np.ndarray:
    """GrabCut of (h, w, 3) uint8 ``rgb`` from a seed map of cv2.GC_* values: (h, w) bool.
    OpenCV's RNG is seeded, so the same photo always gives the same mask."""
    import cv2

    seeds = seeds.copy()
    cv2.setRNGSeed(12345)
    try:
        cv2.grabCut(rgb, seeds, None, np.zeros((1, 65)), np.zeros((1, 65)),  # type: ignore[call-overload]
                    iterations, cv2.GC_INIT_WITH_MASK)
    except cv2.error:
        pass   # one side had no samples: the seeds are the answer
    return (seeds == cv2.GC_FGD) | (seeds == cv2.GC_PR_FGD)


def _outside(background_like: np.ndarray) -> np.ndarray:
    """The background-like pixels reached from the image's border through others like them."""
    labels, _ = components(background_like)
    ring = np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]])
    ids = np.unique(ring)
    return np.isin(labels, ids[ids > 0])


def _seeds(stands_out: np.ndarray, dist: np.ndarray, thresh: float, core: np.ndarray,
           keep_out: np.ndarray) -> np.ndarray:
    """GrabCut's seed map: ``stands_out`` probable object, ``core`` (eroded, strongly
    different) certain object, background-like pixels reached from the border and outside
    ``keep_out`` certain background, the rest probable background."""
    import cv2

    seeds = np.full(dist.shape, cv2.GC_PR_BGD, np.uint8)
    seeds[stands_out] = cv2.GC_PR_FGD
    seeds[core & (dist > 2 * thresh)] = cv2.GC_FGD
    seeds[_outside(dist <= thresh) & ~keep_out] = cv2.GC_BGD
    seeds[border_strip(*dist.shape) & (dist <= thresh)] = cv2.GC_BGD
    return seeds


# --------------------------------------------------------------------------- the method

class _Refused(Exception):
    """A step's assumption failed; the message says which, in plain words."""

    def __init__(self, problem: str, score: float = 0.0):
        super().__init__(problem)
        self.problem = problem
        self.score = score


def border_model_mask(rgb: np.ndarray, side: int = WORK_SIDE) -> AutoMask:
    """The weight-free method (the module's docstring) on (H, W, 3) uint8 ``rgb``."""
    t0 = time.perf_counter()
    H, W = rgb.shape[:2]
    small = work_copy(rgb, side)
    lab = to_lab(small)
    bg = fit_background(lab)
    kind = "plain colour" if bg.spread < 3.0 else "smooth gradient"
    detail = (f"background: {kind} fitted to the image border (noise {bg.noise:.1f}, "
              f"{100 * bg.other:.0f} % of the border something else)")
    timings = {"background_s": time.perf_counter() - t0}
    try:
        _check_border(bg)
        dist = np.linalg.norm(lab - bg.image(lab.shape[:2]), axis=2)
        thresh = max(NOISE_SIGMAS * bg.noise, MIN_CONTRAST)
        t1 = time.perf_counter()
        obj, agree = _first_cut(small, dist, thresh)
        timings["cut_s"] = time.perf_counter() - t1
        _check_object(obj)
        score = agree * (1.0 - bg.other)
        if score < MIN_SCORE:
            raise _Refused("the object's colours are too close to the background's to tell its "
                           f"outline (the colour threshold and GrabCut agree on only "
                           f"{100 * agree:.0f} % of it)", score)
    except _Refused as e:
        timings["total_s"] = time.perf_counter() - t0
        return AutoMask(np.zeros((H, W), bool), "border-model", round(e.score, 4), e.problem,
                        detail, timings)
    t2 = time.perf_counter()
    mask, zoom = _zoomed_cut(rgb, obj, bg, thresh, side)
    timings["zoom_s"] = time.perf_counter() - t2
    timings["total_s"] = time.perf_counter() - t0
    if zoom > 1.05:
        detail += f"; outline cut again at {zoom:.1f}x"
    return AutoMask(mask, "border-model", round(score, 4), None, detail, timings)


def _check_border(bg: Background) -> None:
    if bg.noise > MAX_BORDER_NOISE:
        raise _Refused(f"the background is not plain (its colours vary by {bg.noise:.0f} along the "
                       f"image border, where a plain one varies by under {MAX_BORDER_NOISE:.0f})")
    if bg.other > MAX_BORDER_OTHER:
        raise _Refused(f"the background is not plain ({100 * bg.other:.0f} % of the image border is "
                       "neither one colour nor a smooth gradient)")


def _first_cut(small: np.ndarray, dist: np.ndarray, thresh: float) -> tuple[np.ndarray, float]:
    """(the object on the work copy (h, w) bool, the threshold's agreement with GrabCut);
    _Refused when nothing, or not one thing, stands out."""
    h, w = dist.shape
    side = max(h, w)
    stands_out = dist > thresh
    rough = open_specks(stands_out)
    labels, stats = components(rough)
    if len(stats) < 2:
        raise _Refused("nothing stands out from the background (the image looks empty)")
    main = 1 + int(np.argmax(piece_weights(labels, stats)))
    things = np.isin(labels, np.nonzero(stats[:, 4] >= max(4, SPECK * h * w))[0][1:])
    seeds = _seeds(things, dist, thresh, core=erode(labels == main, 0.01 * side),
                   keep_out=dilate(rough, 0.03 * side))
    cut = open_specks(_grabcut(small, seeds))
    labels, stats = components(cut)
    if len(stats) < 2:
        raise _Refused("nothing stands out from the background (the image looks empty)")
    weights = piece_weights(labels, stats)
    main = 1 + int(np.argmax(weights))
    similar, others = ONE_OBJECT.other_pieces(stats, main, h * w)
    if similar:
        raise _Refused(f"{similar + 1} separate things of similar size stand out from the "
                       "background, not one object")
    if ONE_OBJECT.cluttered(others, float(stats[main, 4])):
        raise _Refused(f"the image is cluttered ({len(others) + 1} separate things stand out from "
                       "the background)")
    obj = fill_holes(labels == main, stands_out, SPECK)
    rough_obj = fill_holes(rough & dilate(obj, 2), stands_out, SPECK)
    return obj, iou(rough_obj, obj)


def _check_object(obj: np.ndarray) -> None:
    problem = ONE_OBJECT.outline_problem(obj)
    if problem is None:
        return
    kind, figure = problem
    if kind == "specks":
        raise _Refused("nothing but specks stands out from the background "
                       f"({100 * float(figure):.2f} % of the image)")
    if kind == "too large":
        raise _Refused(f"what differs from the border's colour covers {100 * float(figure):.0f} % of the "
                       "image: no background is left around an object")
    if kind == "runs off":
        raise _Refused(f"the object runs off the image along {100 * float(figure):.0f} % of its border, "
                       "so the border cannot show the background")
    raise _Refused(f"what stands out from the border's colour reaches across the image from "
                   f"{figure} (a table edge, a floor or a horizon?), so the background is not plain")


def _zoomed_cut(rgb: np.ndarray, obj: np.ndarray, bg: Background, thresh: float,
                side: int) -> tuple[np.ndarray, float]:
    """((H, W) bool mask, zoom): the object's box (plus a margin) cut again from the
    full-size photo at ``side`` pixels, seeded by the first cut, when that sees it at
    least 1.3x larger; else the first cut scaled up. A second cut that disagrees with
    the first (IoU < ``MIN_REFINE_AGREEMENT``) is dropped."""
    import cv2

    H, W = rgb.shape[:2]
    h, w = obj.shape
    ys, xs = np.nonzero(obj)
    sx, sy = W / w, H / h
    margin = 0.15 * max(np.ptp(xs) + 1, np.ptp(ys) + 1) + 3
    x0 = int(max(0, np.floor((xs.min() - margin) * sx)))
    y0 = int(max(0, np.floor((ys.min() - margin) * sy)))
    x1 = int(min(W, np.ceil((xs.max() + 1 + margin) * sx)))
    y1 = int(min(H, np.ceil((ys.max() + 1 + margin) * sy)))
    crop = work_copy(rgb[y0:y1, x0:x1], side)
    ch, cw = crop.shape[:2]
    kx, ky = cw / (x1 - x0), ch / (y1 - y0)     # crop pixels per photo pixel
    zoom = kx / (w / W)
    if zoom < 1.3:
        return to_size(obj, (H, W)), 1.0
    lab = to_lab(crop)
    dist = np.linalg.norm(lab - bg.image((ch, cw), (x0, y0, x1, y1), (H, W)), axis=2)
    # the first cut in the crop's pixels: work pixel centre (u + 0.5) sx is photo x
    to_crop = np.array([[sx * kx, 0, (0.5 * sx - x0) * kx - 0.5], [0, sy * ky, (0.5 * sy - y0) * ky - 0.5]])
    prior = cv2.warpAffine(obj.astype(np.float32), to_crop, (cw, ch), flags=cv2.INTER_LINEAR) >= 0.5
    side_px = max(ch, cw)
    stands_out = dist > thresh
    seeds = _seeds(prior | (stands_out & dilate(prior, 0.02 * side_px)), dist, thresh,
                   core=erode(prior, 0.03 * side_px), keep_out=dilate(prior, 0.04 * side_px))
    cut = open_specks(_grabcut(crop, seeds))
    labels, stats = components(cut)
    if len(stats) < 2:
        return to_size(obj, (H, W)), 1.0
    overlap = np.bincount(labels[prior], minlength=len(stats))[1:]
    piece = fill_holes(labels == 1 + int(np.argmax(overlap)), stands_out, SPECK)
    if iou(piece, prior) < MIN_REFINE_AGREEMENT:
        return to_size(obj, (H, W)), 1.0
    out = np.zeros((H, W), bool)
    out[y0:y1, x0:x1] = to_size(piece, (y1 - y0, x1 - x0))
    return out, zoom
