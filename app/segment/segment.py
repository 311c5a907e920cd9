"""Click-to-segment on the app's CPU: SAM2 when a checkpoint loads, GrabCut otherwise.

Both segmenters take an (H, W, 3) uint8 image, a list of clicks
``(x, y, label)`` in that image's pixel coordinates (label 1 = object,
0 = background) and an optional box ``(x0, y0, x1, y1)`` around the object
(GrabCut's native input, SAM2's box prompt), and return an (H, W) bool mask. The app hands them its
"working" image (longest side <= ``SEG_MAX_SIDE``), so a click costs the same
whatever the upload's size; the mask is scaled to full size only on Generate.

Nothing here may touch CUDA: the SAM2 predictor is built on CPU by
``app.segment.sam2_model`` and only ever runs there.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from app.segment.clicks import ClickRegions, ColourSpread, Spread
from app.segment.prompts import Box, Click, box_mask, has_prompt, scale_prompt

log = logging.getLogger(__name__)

SEG_MAX_SIDE = 1024


def image_key(rgb: np.ndarray) -> str:
    """Content hash of an (H, W, 3) uint8 image (shape included), used as cache key."""
    h = hashlib.sha1(np.ascontiguousarray(rgb).view(np.uint8).data)
    h.update(str(rgb.shape).encode())
    return h.hexdigest()


def _split(clicks: Sequence[Click]) -> tuple[np.ndarray, np.ndarray]:
    pts = np.array([(c[0], c[1]) for c in clicks], np.float32).reshape(-1, 2)
    labels = np.array([int(c[2]) for c in clicks], np.int32)
    return pts, labels


def keep_clicked_components(mask: np.ndarray, clicks: Sequence[Click],
                            box: Optional[Box] = None) -> np.ndarray:
    """Drop blobs no object click landed in; (H, W) bool -> (H, W) bool.

    Both segmenters sometimes add islands of similar colour far from the
    object; the user only ever asked for the parts they clicked. With a box,
    nothing outside it is kept (the box says where the object is), and without
    object clicks every blob inside it is.
    """
    import cv2

    if box is not None:
        mask = mask & box_mask(mask.shape, box)
    fg = [(int(round(x)), int(round(y))) for x, y, lab in clicks if lab == 1]
    if not fg or not mask.any():
        return mask
    n, labels = cv2.connectedComponents(mask.astype(np.uint8), connectivity=8)
    h, w = mask.shape
    keep = set()
    for x, y in fg:
        x = min(max(x, 0), w - 1)
        y = min(max(y, 0), h - 1)
        if labels[y, x] > 0:
            keep.add(int(labels[y, x]))
    if not keep:
        return mask   # every object click landed outside the mask: show what was found
    return np.isin(labels, sorted(keep))


def drop_touched(mask: np.ndarray, clicks: Sequence[Click], backgrounds: Sequence[np.ndarray]) -> np.ndarray:
    """``mask`` without the pieces a background click's region touches: the rest of the
    thing clicked as background (a table's legs, once its top is out), which the cut left
    apart from the object. The pieces holding object clicks stay, and without object
    clicks (a box alone) the largest piece does."""
    import cv2

    if not backgrounds or not mask.any():
        return mask
    n, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    near = cv2.dilate(np.logical_or.reduce(backgrounds).astype(np.uint8), np.ones((3, 3), np.uint8)) > 0
    touched = set(np.unique(labels[near]).tolist()) - {0}
    h, w = mask.shape
    keep = {int(labels[min(max(int(round(y)), 0), h - 1), min(max(int(round(x)), 0), w - 1)])
            for x, y, lab in clicks if lab == 1} - {0}
    if not keep:
        keep = {1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))}
    drop = sorted(touched - keep)
    return mask & ~np.isin(labels, drop) if drop else mask


def _resize_mask(mask: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(h, w) bool ``mask`` scaled to ``shape`` (H, W), edges interpolated."""
    import cv2

    if mask.shape == tuple(shape):
        return mask
    up = cv2.resize(mask.astype(np.uint8) * 255, (shape[1], shape[0]), interpolation=cv2.INTER_LINEAR)
    return up >= 128


def fills_box(mask: np.ndarray, box: Box, span: float = 0.5) -> bool:
    """Whether ``mask`` looks like the object a box was drawn around: it spans at least
    ``span`` of the box's width and of its height. A box is drawn snugly around the whole
    object, so an empty mask or a small piece of one means the colours did not separate."""
    ys, xs = np.nonzero(mask)
    if not len(xs):
        return False
    return (xs.max() - xs.min() + 1 >= span * (box[2] - box[0])
            and ys.max() - ys.min() + 1 >= span * (box[3] - box[1]))


class GrabCutSegmenter:
    """Weight-free selection: closed outlines in line drawings, OpenCV GrabCut otherwise.

    Everything runs on a copy downscaled to ``outline_max_side`` (the app's working
    copy already is), so a 27 MP upload costs what a small one does.

    A line drawing's objects are the same paper as their background, which GrabCut
    cannot separate: there ``app.segment.outline`` selects the regions whose strokes
    close around them. Elsewhere GrabCut runs on a copy downscaled to ``max_side``.
    Seeds (issue 38: clicks as people expect them from SAM): what each click lands on,
    its connected region of about the clicked colour (``app.segment.clicks``), is
    certain object or certain background, so a background click removes the thing it
    lands on and cuts what joined the object through it, and the object is what stays
    connected to the object clicks. Probable object: the clicked colours near each
    object click (its region grown by ``grow`` of its size and ``grow_min`` of the
    image), so a touching thing of other colours (a rug under a sofa) is not taken
    along; unless everything within ``wide_grow`` of the image around the clicks adds
    only what surrounds them (a many-coloured object: ``_one_thing``). The rest is
    probable background, a thin frame at the border certain background. A drawn box
    replaces the probable object and, as in GrabCut's own rectangle mode, everything
    outside it is certain background.
    When a box's GrabCut mask does not fill the box (a low-contrast photo, where noise
    outweighs the object's difference from its surroundings), it runs again on a
    smoothed copy.
    """

    name = "GrabCut"

    def __init__(self, max_side: int = 320, iterations: int = 3, grow: float = 0.5,
                 grow_min: float = 0.05, wide_grow: float = 0.45, enclosed: float = 0.7,
                 outline_max_side: int = SEG_MAX_SIDE, retry_blur: float = 1.5, retry_iterations: int = 1,
                 click_regions: Optional[ClickRegions] = None, colour_bin: int = 8, sure: float = 0.85):
        self.max_side = max_side
        self.iterations = iterations
        self.grow = grow
        self.grow_min = grow_min
        self.wide_grow = wide_grow
        self.enclosed = enclosed
        self.colour_bin = colour_bin
        self.sure = sure
        self.click_regions = click_regions or ClickRegions()
        # (image, clicks up to the last object click, iterations) -> wide prior or not
        self._modes: OrderedDict[tuple, bool] = OrderedDict()
        self._lock = threading.Lock()
        self.outline_max_side = outline_max_side
        self.retry_blur = retry_blur
        self.retry_iterations = retry_iterations

    def prepare(self, rgb: np.ndarray) -> None:
        """Nothing to precompute; present so both segmenters share one interface."""

    def segment(self, rgb: np.ndarray, clicks: Sequence[Click], box: Optional[Box] = None) -> np.ndarray:
        import cv2

        from app.segment.outline import select_outlined

        h, w = rgb.shape[:2]
        if not has_prompt(clicks, box):
            return np.zeros((h, w), bool)
        scale = min(1.0, self.outline_max_side / max(h, w))
        if scale < 1:
            fine = cv2.resize(rgb, (max(8, round(w * scale)), max(8, round(h * scale))),
                              interpolation=cv2.INTER_AREA)
        else:
            fine = rgb
        fclicks, fbox = scale_prompt(clicks, box, fine.shape[1] / w, fine.shape[0] / h)
        mask = select_outlined(fine, fclicks, fbox)
        if mask is None:
            mask = self._grabcut(fine, fclicks, fbox)
        return _resize_mask(mask, (h, w))

    def _grabcut(self, rgb: np.ndarray, clicks: Sequence[Click], box: Optional[Box]) -> np.ndarray:
        """GrabCut's mask of (h, w, 3) ``rgb``, run on a copy of at most ``max_side``; with a
        box, run again on a smoothed copy when the first mask does not fill the box."""
        import cv2

        h, w = rgb.shape[:2]
        scale = min(1.0, self.max_side / max(h, w))
        sw, sh = max(8, round(w * scale)), max(8, round(h * scale))
        small = cv2.resize(rgb, (sw, sh), interpolation=cv2.INTER_AREA) if scale < 1 else rgb.copy()
        sclicks, sbox = scale_prompt(clicks, box, sw / w, sh / h)
        mask = self._grabcut_small(small, sclicks, sbox, self.iterations)
        if sbox is not None and not fills_box(mask, sbox):
            # downscaling averages some noise away; smoothing more lets a colour that
            # differs from its surroundings by less than the noise stand out. One
            # iteration: as good on such photos as three, at half the time
            blurred = cv2.GaussianBlur(small, (0, 0), self.retry_blur)
            retry = self._grabcut_small(blurred, sclicks, sbox, self.retry_iterations)
            if fills_box(retry, sbox):
                mask = retry
        return _resize_mask(mask, (h, w))

    def _probable_object(self, lab: np.ndarray, clicks: Sequence[Click],
                         objects: Sequence[np.ndarray]) -> np.ndarray:
        """(h, w) bool: where the rest of the clicked object may be, without a box.

        Around each object click, its region grown by ``grow`` of the region's own size and
        by ``grow_min`` of the image (the rest of the sofa a cushion belongs to); within
        that, the pixels of about the clicked colour (``ClickRegions.near_colour``) and those
        next to the region (its anti-aliased edge). Other colours start as background, so
        GrabCut's object colours are the clicked ones and a thing of another colour touching
        the object (a rug under a sofa) is not taken along; GrabCut adds them back where its
        colour model says they are the object's.
        """
        import cv2

        h, w = lab.shape[:2]
        side = max(h, w)
        out = np.zeros((h, w), bool)
        edge = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * max(2, side // 80) + 1,) * 2)
        for (x, y, _), region in zip([c for c in clicks if c[2] == 1], objects):
            ys, xs = np.nonzero(region)
            px = self.grow * (xs.max() - xs.min() + 1) + self.grow_min * side
            py = self.grow * (ys.max() - ys.min() + 1) + self.grow_min * side
            x0, x1 = max(int(xs.min() - px), 0), min(int(np.ceil(xs.max() + px)), w - 1)
            y0, y1 = max(int(ys.min() - py), 0), min(int(np.ceil(ys.max() + py)), h - 1)
            cx, cy = min(max(int(round(x)), x0), x1), min(max(int(round(y)), y0), y1)
            near = self.click_regions.near_colour(lab[y0:y1 + 1, x0:x1 + 1], cx - x0, cy - y0)
            close = cv2.dilate(region[y0:y1 + 1, x0:x1 + 1].astype(np.uint8), edge) > 0
            out[y0:y1 + 1, x0:x1 + 1] |= near | close
        return out

    def _grabcut_small(self, small: np.ndarray, clicks: Sequence[Click], sbox: Optional[Box],
                       iterations: int) -> np.ndarray:
        """GrabCut on ``small`` seeded as the class docstring says; (h, w) bool.

        Without a box, one of two priors: the probable object only the clicked colours near
        the clicks (``_probable_object``: "narrow"), or everything within ``wide_grow`` of the
        image around the object clicks ("wide", where the frame's colours decide). The wide
        mask wins when what it adds surrounds the clicks (a many-coloured object: a striped
        toy, a checker; ``_one_thing``) and it does not look like several things (``Spread``:
        a sofa, and the rug under its feet); else the narrow one. GrabCut runs once where
        the colours around the clicks tell which (``_unseen_around``): at least ``sure`` of
        them unlike the backdrop, the wide prior (kept unless a spread warning fires on it);
        less than ``enclosed`` of them around the narrow mask, the narrow one. Only between
        does it run both and compare them (issue 38 item 2: two runs doubled a click's cost).
        """
        import cv2

        sh, sw = small.shape[:2]
        side = max(sh, sw)
        lab = self.click_regions.lab(small)
        objects, backgrounds = self.click_regions.regions(lab, clicks)
        if sbox is not None:
            prior = box_mask((sh, sw), sbox)
            return self._run(small, clicks, sbox, prior, objects, backgrounds, iterations)
        # which prior is decided once per object click, by the clicks up to it: later
        # background clicks correct the selection in the same mode (a background click beside
        # a striped toy must not turn it back into one stripe), and the same clicks always
        # give the same mask, whatever came before
        last = max(i for i, c in enumerate(clicks) if c[2] == 1)
        key = (image_key(small), tuple(clicks[:last + 1]), iterations)
        with self._lock:
            wide_mode = self._modes.get(key)
        if wide_mode is not None:
            prior = self._wide_prior(clicks, (sh, sw)) if wide_mode else self._probable_object(lab, clicks, objects)
            return self._run(small, clicks, sbox, prior, objects, backgrounds, iterations)
        upto = list(clicks[:last + 1])
        o2, b2 = (objects, backgrounds) if len(upto) == len(clicks) else self.click_regions.regions(lab, upto)
        narrow_prior = self._probable_object(lab, upto, o2)
        clicked = np.logical_or.reduce(o2)
        # one GrabCut where the colours around the clicked ones tell the mode (issue 38: two
        # runs cost a click twice as much): all around them colours the backdrop lacks (a
        # striped toy: the wide prior, checked for other things taken along), or the
        # backdrop's own around the narrow selection (a sofa: the narrow one); both run and
        # are compared (``_one_thing``) only between the two
        wide_mode, wide = None, None
        if self._unseen_around(lab, narrow_prior | clicked, upto) >= self.sure:
            wide = self._run(small, upto, sbox, self._wide_prior(upto, (sh, sw)), o2, b2, iterations)
            if not Spread().check(wide, upto) and not ColourSpread().check(small, wide, upto):
                wide_mode, narrow = True, wide
        if wide_mode is None:
            narrow = self._run(small, upto, sbox, narrow_prior, o2, b2, iterations)
            if self._unseen_around(lab, narrow | clicked, upto) >= self.enclosed:
                if wide is None:   # a wide run refused above by a spread warning is compared as it is
                    wide = self._run(small, upto, sbox, self._wide_prior(upto, (sh, sw)), o2, b2, iterations)
                wide_mode = self._one_thing(wide & ~narrow, narrow) and not Spread().check(wide, upto)
            else:
                wide_mode, wide = False, narrow
        with self._lock:
            self._modes[key] = wide_mode
            while len(self._modes) > 256:
                self._modes.popitem(last=False)
        if len(upto) == len(clicks):
            assert wide is not None   # every way above ends with a wide mask (the narrow one when not compared)
            return wide if wide_mode else narrow
        prior = self._wide_prior(clicks, (sh, sw)) if wide_mode else self._probable_object(lab, clicks, objects)
        return self._run(small, clicks, sbox, prior, objects, backgrounds, iterations)

    def _unseen_around(self, lab: np.ndarray, near: np.ndarray, clicks: Sequence[Click]) -> float:
        """The share of the ring of pixels around ``near`` (a selection, with the clicks'
        regions) of colours not seen where the wide prior puts certain or probable background
        (the border frame, the image outside the wide box; Lab in bins of ``colour_bin``, a
        bin's neighbours counting as seen). The wide run makes an object of the clicks'
        surroundings only where its colour model sets them apart from that background: not
        a ring of the wall's or the backdrop's colours."""
        import cv2

        sh, sw = lab.shape[:2]
        side = max(sh, sw)
        frame = ~self._wide_prior(clicks, (sh, sw))
        f = max(1, side // 100)
        frame[:f] = frame[-f:] = True
        frame[:, :f] = frame[:, -f:] = True
        ring = (cv2.dilate(near.astype(np.uint8), np.ones((3, 3), np.uint8)) > 0) & ~near & ~frame
        if not ring.any():
            return 0.0
        q = (lab // self.colour_bin).astype(np.int32)
        n = 256 // self.colour_bin + 1
        seen = np.zeros((n, n, n), np.uint8)
        seen[q[frame, 0], q[frame, 1], q[frame, 2]] = 1
        # neighbouring bins too: a colour on a bin's edge, and a little noise
        near_bins = np.zeros_like(seen)
        for d0 in (-1, 0, 1):
            for d1 in (-1, 0, 1):
                for d2 in (-1, 0, 1):
                    near_bins |= np.roll(seen, (d0, d1, d2), axis=(0, 1, 2))
        r = q[ring]
        return float(1 - near_bins[r[:, 0], r[:, 1], r[:, 2]].mean())

    def _wide_prior(self, clicks: Sequence[Click], shape: tuple[int, int]) -> np.ndarray:
        """(h, w) bool: the box around the object clicks grown by ``wide_grow`` of the image."""
        sh, sw = shape
        spts, labels = _split(clicks)
        fg = spts[labels == 1]
        pad = self.wide_grow * max(sh, sw)
        x0, y0 = np.floor(fg.min(0) - pad).astype(int)
        x1, y1 = np.ceil(fg.max(0) + pad).astype(int)
        prior = np.zeros((sh, sw), bool)
        prior[max(y0, 0):max(y1, 0) + 1, max(x0, 0):max(x1, 0) + 1] = True
        return prior

    def _one_thing(self, added: np.ndarray, narrow: np.ndarray) -> bool:
        """Whether what the wide prior ``added`` to the ``narrow`` selection is more of the
        clicked thing: it surrounds the narrow selection, holding at least ``enclosed`` of
        the ring of pixels just outside it. A many-coloured object's other colours lie all
        around the clicked one; the wall and the floor around a sofa stay out of both, and
        a rug under it or a table beside it meet only a side of it."""
        import cv2

        ring = cv2.dilate(narrow.astype(np.uint8), np.ones((3, 3), np.uint8)) > 0
        ring &= ~narrow
        return bool(ring.any()) and float(added[ring].mean()) >= self.enclosed

    def _run(self, small: np.ndarray, clicks: Sequence[Click], sbox: Optional[Box], prior: np.ndarray,
             objects: Sequence[np.ndarray], backgrounds: Sequence[np.ndarray], iterations: int) -> np.ndarray:
        """One GrabCut run: ``prior`` probable object, the rest probable background (with a
        box: certain background), the clicks' regions and disks certain; (h, w) bool."""
        import cv2

        sh, sw = small.shape[:2]
        spts, labels = _split(clicks)
        side = max(sh, sw)
        if sbox is not None:
            seeds = np.full((sh, sw), cv2.GC_BGD, np.uint8)
            seeds[prior] = cv2.GC_PR_FGD
        else:
            seeds = np.full((sh, sw), cv2.GC_PR_BGD, np.uint8)
            seeds[prior] = cv2.GC_PR_FGD
            frame = max(1, side // 100)
            seeds[:frame] = cv2.GC_BGD
            seeds[-frame:] = cv2.GC_BGD
            seeds[:, :frame] = cv2.GC_BGD
            seeds[:, -frame:] = cv2.GC_BGD
        # what a click lands on is certain: its background regions first, then the object's,
        # then each click's own disk, so a click always decides its own pixels
        for region in backgrounds:
            seeds[region] = cv2.GC_BGD
        for region in objects:
            seeds[region] = cv2.GC_FGD
        r = max(2, side // 80)
        for (x, y), lab in zip(spts, labels):
            cv2.circle(seeds, (int(round(x)), int(round(y))), r,
                       int(cv2.GC_FGD if lab == 1 else cv2.GC_BGD), -1)
        bgd = np.zeros((1, 65), np.float64)
        fgd = np.zeros((1, 65), np.float64)
        # GrabCut's k-means draws from OpenCV's per-thread RNG: seed it so the same
        # clicks always give the same mask (and the worker's cache sees the same input)
        cv2.setRNGSeed(12345)
        try:
            # no rect with GC_INIT_WITH_MASK: OpenCV takes None, its stub wants a tuple
            cv2.grabCut(small, seeds, None, bgd, fgd, iterations,  # type: ignore[call-overload]
                        cv2.GC_INIT_WITH_MASK)
        except cv2.error as e:
            # GrabCut refuses when one side has no samples at all (e.g. a click fills the image)
            log.info("grabCut failed (%s); using the seed region", e)
        small_mask = (seeds == cv2.GC_FGD) | (seeds == cv2.GC_PR_FGD)
        return drop_touched(keep_clicked_components(small_mask, clicks, sbox), clicks, backgrounds)


class Sam2Segmenter:
    """SAM2 image predictor with image embeddings cached by image content.

    One model serves every session. Embeddings are computed by a single
    background thread on a shallow copy of the predictor (same weights, its own
    per-image state), so a slow encoder run (seconds on CPU) for one upload
    never blocks another session's clicks; decoding swaps the cached features
    into the decoding predictor under a lock, so sessions never see each
    other's image. ``prepare`` starts the embedding right after an upload.
    """

    name = "SAM2"

    def __init__(self, predictor, label: str = "", cache_size: int = 8):
        import copy

        self.predictor = predictor
        self._embedder = copy.copy(predictor)
        self.label = label
        self._decode_lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[dict, tuple[int, int]]] = OrderedDict()
        self._pending: dict[str, Future] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sam2-embed")
        self._cache_size = cache_size
        self.embeddings_computed = 0   # for tests/benchmarks: proves the cache is used

    def _embed(self, key: str, rgb: np.ndarray) -> tuple[dict, tuple[int, int]]:
        """Runs on the pool thread only: (features dict of tensors, (H, W))."""
        import torch

        with self._cache_lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        with torch.inference_mode():
            self._embedder.set_image(rgb)
        entry = (self._embedder._features, tuple(self._embedder._orig_hw[0]))
        self._embedder.reset_predictor()
        with self._cache_lock:
            self.embeddings_computed += 1
            self._cache[key] = entry
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return entry

    def _future(self, key: str, rgb: np.ndarray) -> Future:
        with self._cache_lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                done: Future = Future()
                done.set_result(self._cache[key])
                return done
            fut = self._pending.get(key)
            if fut is None:
                fut = self._pool.submit(self._embed, key, np.ascontiguousarray(rgb))
                self._pending[key] = fut
                fut.add_done_callback(lambda _f: self._drop_pending(key))
            return fut

    def _drop_pending(self, key: str) -> None:
        with self._cache_lock:
            self._pending.pop(key, None)

    def prepare(self, rgb: np.ndarray) -> None:
        """Start computing the embedding of (H, W, 3) uint8 ``rgb`` in the background."""
        self._future(image_key(rgb), rgb)

    def segment(self, rgb: np.ndarray, clicks: Sequence[Click], box: Optional[Box] = None) -> np.ndarray:
        import torch

        h, w = rgb.shape[:2]
        pts, labels = _split(clicks)
        if not has_prompt(clicks, box):
            return np.zeros((h, w), bool)
        features, hw = self._future(image_key(rgb), rgb).result()
        with self._decode_lock:
            p = self.predictor
            p._features, p._orig_hw = features, [hw]
            p._is_image_set, p._is_batch = True, False
            with torch.inference_mode():
                # one click is ambiguous (part / whole object): ask for three and take the best
                masks, scores, _ = p.predict(
                    point_coords=pts if len(clicks) else None,
                    point_labels=labels if len(clicks) else None,
                    box=None if box is None else np.asarray(box, np.float32),
                    multimask_output=len(clicks) == 1 and box is None)
        best = masks[int(np.argmax(scores))] > 0
        return keep_clicked_components(best, clicks, box)

    def propose(self, rgb: np.ndarray, points: np.ndarray, chunk: int = 8) -> tuple[np.ndarray, np.ndarray]:
        """SAM 2's three candidates for each of ``points`` ((N, 2) float x, y in ``rgb``'s
        pixels), each point alone an object click: (logits (N, 3, H, W) float16, predicted
        IoU (N, 3) float32). For ``app.segment.sam2_auto``, which prompts without a person;
        the embedding is cached and shared with clicks on the same image."""
        import torch

        features, hw = self._future(image_key(rgb), rgb).result()
        pts = np.asarray(points, np.float32).reshape(-1, 1, 2)
        logits, scores = [], []
        with self._decode_lock:
            p = self.predictor
            p._features, p._orig_hw = features, [hw]
            p._is_image_set, p._is_batch = True, False
            with torch.inference_mode():
                for i in range(0, len(pts), chunk):
                    part = pts[i:i + chunk]
                    m, s, _ = p.predict(point_coords=part, point_labels=np.ones(part.shape[:2], np.int32),
                                        multimask_output=True, return_logits=True)
                    logits.append(np.asarray(m, np.float16).reshape(len(part), 3, *m.shape[-2:]))
                    scores.append(np.asarray(s, np.float32).reshape(len(part), 3))
        return np.concatenate(logits), np.concatenate(scores)


@dataclass
class SegmenterChoice:
    segmenter: object          # GrabCutSegmenter | Sam2Segmenter
    description: str           # for the UI, e.g. "SAM2 sam2.1 tiny (sam2.1_hiera_tiny.pt)"
    reason: str = ""           # why GrabCut is used, when it is


def choose_segmenter(app_settings) -> SegmenterChoice:
    """SAM2 when a checkpoint is found and loads; otherwise GrabCut, with the reason.

    ``app_settings``: ``kiln.settings.AppSettings``. Loading failures never raise:
    they become the reason shown in the UI.
    """
    grabcut = GrabCutSegmenter()
    try:
        from app.segment.sam2_model import Sam2LoadError, load_predictor, resolve_checkpoint
    except ImportError as e:
        return SegmenterChoice(grabcut, "GrabCut", f"SAM2 support unavailable ({e})")
    info = resolve_checkpoint(app_settings)
    if info is None:
        from kiln.checkpoints import models_dir

        return SegmenterChoice(grabcut, "GrabCut",
                               f"no SAM2 checkpoint configured or found in {models_dir()}/")
    try:
        predictor = load_predictor(info)
    except Sam2LoadError as e:
        return SegmenterChoice(grabcut, "GrabCut", str(e))
    except Exception as e:  # noqa: BLE001 - a broken model must not stop the app from serving
        log.exception("unexpected error loading SAM2")
        return SegmenterChoice(grabcut, "GrabCut", f"SAM2 failed to load: {type(e).__name__}: {e}")
    return SegmenterChoice(Sam2Segmenter(predictor, info.label), f"SAM2 {info.label}")
