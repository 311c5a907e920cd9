"""Find the one object of a photo without clicks: ``find_object(rgb, segmenter=None)``.

Kiln needs a mask, and a photo without transparency or clicks has none. Every peer
(TRELLIS, SF3D, Hunyuan3D) removes the background itself, so ``kiln run --mask auto``
(one image or a batch) and the script API's ``/generate`` with ``mask="auto"`` ask this
module for one. The front end computes it before the job is submitted; the mask is
then checked like any other (``kiln.limits.mask_problem``,
``worker.inputs.check_reconstructable``).

Two methods:

* ``border-model`` (``app.segment.border_model``; no weights, always available): an
  object on a plain or smooth background (product shots, studio photos, cut-outs
  flattened onto a colour). The background is modelled from the image border, what
  stands out seeds GrabCut, the main central piece is kept.
* ``sam2`` (``app.segment.sam2_auto``; when the app's segmenter is SAM 2 because a
  checkpoint loaded): SAM 2 prompted with a grid of points, the object chosen by size,
  centrality, the model's quality score and stability. When no candidate passes, the
  border model is tried.

Neither guesses silently: when no single object is found, ``AutoMask.problem`` says
why in plain words ("the background is not plain: ...") and the mask is empty; the
front end adds what to do instead ("click the object on the page or give --mask").
Both work on a copy of a few hundred pixels a side and scale the mask back, so the cost
(well under a second on 2 CPU cores for the border model) does not grow with the photo.

Nothing here touches CUDA (SAM 2 runs on the app's CPU, as it does for clicks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

__all__ = ["AutoMask", "find_object", "METHODS"]

METHODS = ("border-model", "sam2")


@dataclass(frozen=True, eq=False)
class AutoMask:
    """What ``find_object`` found.

    ``mask``: (H, W) bool at the input's size, True on the object; all False when
    ``problem`` is set, so that a caller who forgets to look cannot use a wrong mask.
    ``method``: the method that answered, one of ``METHODS``. ``score``: 0..1, that
    method's confidence (border model: how well its colour threshold and GrabCut agree on
    the outline, times the plain share of the border; SAM 2: the model's predicted IoU
    times the mask's stability). ``problem``: None when one object was found, else why
    not, in plain words and without the front end's advice. ``detail``: one line on how
    it was found, for logs. ``timings``: seconds per step. Compared by identity (it holds
    an array).
    """

    mask: np.ndarray
    method: str
    score: float
    problem: Optional[str] = None
    detail: str = ""
    timings: dict = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return self.problem is None

    @property
    def share(self) -> float:
        """The object's share of the image, 0..1."""
        return float(self.mask.mean()) if self.mask.size else 0.0

    @property
    def method_name(self) -> str:
        """The method as people read it: "the border model", "SAM 2"."""
        return {"border-model": "the border model", "sam2": "SAM 2"}.get(self.method, self.method)

    def describe(self) -> str:
        """One line for a person: "found by the border model (score 0.97); the object covers
        23.4 % of the image", or why nothing was."""
        if self.problem is not None:
            return f"{self.method_name} found no single object: {self.problem}"
        return (f"found by {self.method_name} (score {self.score:.2f}); the object covers "
                f"{100 * self.share:.1f} % of the image")


def find_object(rgb: np.ndarray, segmenter=None) -> AutoMask:
    """The one object of ``rgb``, an (H, W, 3) uint8 RGB image of at least 16 pixels a side.

    ``segmenter``: the app's click segmenter (``app.segment.segment.choose_segmenter``);
    a ``Sam2Segmenter`` makes SAM 2 the first method (sharing its cached embeddings and
    lock with click segmentation), None or a ``GrabCutSegmenter`` uses the border model
    alone. An image in which no single object can be told is not an error: the answer's
    ``problem`` says why. Raises ``ValueError`` for an array that is not such an image.
    """
    _check_rgb(rgb)
    from app.segment.border_model import border_model_mask

    if segmenter is None or not hasattr(segmenter, "propose"):
        return border_model_mask(rgb)
    from app.segment.sam2_auto import sam2_mask

    got = sam2_mask(rgb, segmenter)
    if got.found:
        return got
    fallback = border_model_mask(rgb)
    if fallback.found:
        return fallback
    return AutoMask(fallback.mask, "sam2", got.score,
                    f"{got.problem}; and the border model: {fallback.problem}",
                    detail=f"{got.detail}; {fallback.detail}", timings={**got.timings, **fallback.timings})


def _check_rgb(rgb) -> None:
    if not isinstance(rgb, np.ndarray) or rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        what = (f"{rgb.dtype} array of shape {rgb.shape}" if isinstance(rgb, np.ndarray)
                else type(rgb).__name__)
        raise ValueError(f"find_object needs an (H, W, 3) uint8 RGB image, not a {what}")
    if min(rgb.shape[:2]) < 16:
        raise ValueError("find_object needs an image of at least 16 pixels a side, not "
                         f"{rgb.shape[1]}x{rgb.shape[0]}")
