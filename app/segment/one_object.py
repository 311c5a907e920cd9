"""What the three ways to find an object without clicks share (``app.segment.automask``
chooses among them): the answer they give (``AutoMask``) and the one-object rule they
judge a mask by (``OneObjectRule``). A leaf: the border model, rembg and SAM 2 import it
and never each other, so each can be read, tuned and tested alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from app.segment.maskshape import frame_contact, spans

METHODS = ("border-model", "sam2", "rembg")
NAMES = {"border-model": "the border model", "sam2": "SAM 2", "rembg": "rembg"}


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
        return NAMES.get(self.method, self.method)

    def describe(self) -> str:
        """One line for a person: "found by the border model (score 0.97); the object covers
        23.4 % of the image", or why nothing was."""
        if self.problem is not None:
            return f"{self.method_name} found no single object: {self.problem}"
        return (f"found by {self.method_name} (score {self.score:.2f}); the object covers "
                f"{100 * self.share:.1f} % of the image")


@dataclass(frozen=True)
class OneObjectRule:
    """When a mask holds one object, the same for every method.

    Args:
        min_share: the object's least share of the image (less is specks).
        max_share: its largest share (more leaves no background around an object).
        max_frame_contact: the largest share of the image's outermost pixel ring it may touch
            (more and it runs off the image).
        second_object: another piece at least this large against the kept one makes two
            objects, not one.
        max_other_pieces: all other pieces together, against the kept one, above which the
            image is clutter.
        speck: pieces smaller than this share of the image are specks, not things.
    """

    min_share: float = 0.003
    max_share: float = 0.9
    max_frame_contact: float = 0.25
    second_object: float = 0.3
    max_other_pieces: float = 0.5
    speck: float = 0.002

    def other_pieces(self, stats: np.ndarray, main: int, pixels: int) -> tuple[int, list[float]]:
        """(how many pieces are of the main piece's size, the areas of the non-speck others),
        for ``stats`` as ``maskshape.components`` gives them (row 0 the background)."""
        main_area = float(stats[main, 4])
        others = [float(a) for i, a in enumerate(stats[1:, 4], 1) if i != main and a >= self.speck * pixels]
        return sum(a >= self.second_object * main_area for a in others), others

    def cluttered(self, others: list[float], main_area: float) -> bool:
        return sum(others) > self.max_other_pieces * main_area

    def outline_problem(self, obj: np.ndarray) -> Optional[tuple[str, Any]]:
        """Why the kept piece (h, w) bool is not one whole object in view, as (kind, figure):
        ("specks", share), ("too large", share), ("runs off", frame contact) or
        ("spans", the sides it reaches across from); None when it is one. Each method words it."""
        share = float(obj.mean())
        if share < self.min_share:
            return "specks", share
        if share > self.max_share:
            return "too large", share
        contact = frame_contact(obj)
        if contact > self.max_frame_contact:
            return "runs off", contact
        across = spans(obj)
        if across is not None:
            return "spans", across
        return None


ONE_OBJECT = OneObjectRule()
