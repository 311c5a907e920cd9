"""Find the one object of a photo without clicks: ``find_object(rgb, segmenter, rembg, method)``.

Kiln needs a mask, and a photo without transparency or clicks has none. Every peer
(TRELLIS, SF3D, Hunyuan3D) removes the background itself, so ``kiln run --mask auto``
(one image or a batch) and the script API's ``/generate`` with ``mask="auto"`` ask this
module for one. The front end computes it before the job is submitted; the mask is
then checked like any other (``kiln.limits.mask_problem``,
``worker.jobs.inputs.check_reconstructable``).

Three methods:

* ``border-model`` (``app.segment.border_model``; no weights, always available): an
  object on a plain or smooth background (product shots, studio photos, cut-outs
  flattened onto a colour). The background is modelled from the image border, what
  stands out seeds GrabCut, the main central piece is kept.
* ``sam2`` (``app.segment.sam2_auto``; when the app's segmenter is SAM 2 because a
  checkpoint loaded): SAM 2 prompted with a grid of points, the object chosen by size,
  centrality, the model's quality score and stability.
* ``rembg`` (``app.segment.rembg_auto``; when rembg is installed and its model file is
  in Kiln's models folder): rembg's background-removal model, its mask checked for one
  main object.

Which runs: ``ORDER`` (the setting ``app.auto_mask`` = ``auto``) tries the methods at
hand in turn and the first that finds one object answers; ``app.auto_mask`` = one
method's name runs that method alone (``find_object``'s ``method``).

None guesses silently: when no single object is found, ``AutoMask.problem`` says
why in plain words ("the background is not plain: ...") and the mask is empty; the
front end adds what to do instead ("click the object on the page or give --mask").
Each works on a copy of a few hundred pixels a side and scales the mask back, so the cost
(well under a second on 2 CPU cores for the border model) does not grow with the photo.

Nothing here touches CUDA (SAM 2 runs on the app's CPU, as it does for clicks; rembg on
onnxruntime's CPU provider).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

import numpy as np

from app.segment.one_object import METHODS, NAMES as _NAMES, AutoMask

__all__ = ["AutoMask", "Finder", "find_object", "METHODS", "ORDER", "CHOICES"]

# app.auto_mask = auto: the methods at hand in this order, the first that finds one object
# answers. SAM 2 first: its checkpoint is there because someone chose it (for clicks too).
# rembg next: a model trained for this very task. The border model, which needs no
# weights and works only on plain backgrounds, last.
ORDER = ("sam2", "rembg", "border-model")
# what app.auto_mask takes (kiln.settings lists the same)
CHOICES = ("auto",) + ORDER


def find_object(rgb: np.ndarray, segmenter=None, rembg=None, method: str = "auto") -> AutoMask:
    """The one object of ``rgb``, an (H, W, 3) uint8 RGB image of at least 16 pixels a side.

    ``segmenter``: the app's click segmenter (``app.segment.segment.choose_segmenter``);
    a ``Sam2Segmenter`` makes SAM 2 available (sharing its cached embeddings and lock with
    click segmentation), None or a ``GrabCutSegmenter`` does not. ``rembg``: a loaded
    ``app.segment.rembg_auto.RembgModel`` or None. ``method``: one of ``CHOICES``; "auto"
    tries the available methods in ``ORDER``, a method's name runs that one alone (and
    answers with a ``problem`` when it is not available). An image in which no single
    object can be told is not an error: the answer's ``problem`` says why (every tried
    method's reason, the first method's name). Raises ``ValueError`` for an array that is
    not such an image or an unknown ``method``.
    """
    _check_rgb(rgb)
    if method not in CHOICES:
        raise ValueError(f"unknown automatic mask method {method!r}; one of {', '.join(CHOICES)}")
    at_hand = {"sam2": segmenter if hasattr(segmenter, "propose") else None, "rembg": rembg,
               "border-model": True}
    if method != "auto" and at_hand[method] is None:
        return AutoMask(np.zeros(rgb.shape[:2], bool), method, 0.0,
                        f"{_NAMES[method]} is not available here (app.auto_mask is {method})")
    failed: list[AutoMask] = []
    for name in ORDER if method == "auto" else (method,):
        if at_hand[name] is None:
            continue
        got = _run(name, rgb, segmenter, rembg)
        if got.found:
            if not failed:
                return got
            before = "; ".join(f"{f.method_name} found none ({f.problem})" for f in failed)
            return replace(got, detail=f"{before}; {got.detail}")
        failed.append(got)
    first = failed[0]
    problem = f"{first.problem}" + "".join(f"; and {f.method_name}: {f.problem}" for f in failed[1:])
    timings: dict = {}
    for f in failed:
        timings.update(f.timings)
    return AutoMask(first.mask, first.method, first.score, problem,
                    detail="; ".join(f.detail for f in failed), timings=timings)


def _run(name: str, rgb: np.ndarray, segmenter, rembg) -> AutoMask:
    if name == "sam2":
        from app.segment.sam2_auto import sam2_mask

        return sam2_mask(rgb, segmenter)
    if name == "rembg":
        from app.segment.rembg_auto import rembg_mask

        return rembg_mask(rgb, rembg)
    from app.segment.border_model import border_model_mask

    return border_model_mask(rgb)


@dataclass(frozen=True)
class Finder:
    """What a front end finds objects with: the app's click segmenter, rembg's model (or
    None) and ``app.auto_mask`` (``find_object``'s arguments, kept together)."""

    segmenter: Any = None
    rembg: Any = None
    method: str = "auto"

    def find(self, rgb: np.ndarray) -> AutoMask:
        return find_object(rgb, self.segmenter, self.rembg, self.method)


def _check_rgb(rgb) -> None:
    if not isinstance(rgb, np.ndarray) or rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        what = (f"{rgb.dtype} array of shape {rgb.shape}" if isinstance(rgb, np.ndarray)
                else type(rgb).__name__)
        raise ValueError(f"find_object needs an (H, W, 3) uint8 RGB image, not a {what}")
    if min(rgb.shape[:2]) < 16:
        raise ValueError("find_object needs an image of at least 16 pixels a side, not "
                         f"{rgb.shape[1]}x{rgb.shape[0]}")
