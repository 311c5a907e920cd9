"""``kiln run --mask auto``: the object of each image without transparency found before any
worker starts (``app.segment.automask``), then checked like a mask file by ``worker.inputs``.

A batch reads every image twice (all of them up front, so a bad one stops the run before
anything starts; then each in its turn), so what was found is kept, packed to a bit a
pixel, and not searched for again. SAM 2 is loaded on first use, only when a checkpoint is
there (``app.segment.segment.choose_segmenter``); otherwise the border model needs no
weights.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import numpy as np

from worker.inputs import InputProblem


class AutoMasker:
    """A ``worker.inputs.FindMask``: (rgb, image path) -> (mask, note), or InputProblem
    saying why no single object was found and what to do instead. ``batch``: the hint
    names the --mask-dir folder rather than --mask."""

    def __init__(self, app_settings, batch: bool = False):
        self._app_settings = app_settings
        self._batch = batch
        self._segmenter: Optional[object] = None
        self._chosen = False
        self._found: dict[str, tuple[np.ndarray, tuple[int, int], str]] = {}

    def segmenter(self):
        """SAM 2 when a checkpoint loads, else None (the border model); loaded once. A
        checkpoint that is there but cannot be used is said once, on stderr."""
        if not self._chosen:
            from app.segment.segment import Sam2Segmenter, choose_segmenter

            choice = choose_segmenter(self._app_settings)
            self._chosen = True
            if isinstance(choice.segmenter, Sam2Segmenter):
                self._segmenter = choice.segmenter
            elif choice.reason and not choice.reason.startswith("no SAM2 checkpoint"):
                print(f"kiln: --mask auto uses the border model: {choice.reason}", file=sys.stderr)
        return self._segmenter

    def __call__(self, rgb: np.ndarray, image: Path) -> tuple[np.ndarray, str]:
        from app.segment.automask import find_object
        from app.segment.segment import image_key

        key = image_key(rgb)
        if key not in self._found:
            got = find_object(rgb, self.segmenter())
            if not got.found:
                instead = ("put its mask in the --mask-dir folder" if self._batch
                           else "give --mask MASK.png (white = object)")
                raise InputProblem(f"{image}: no single object found automatically: {got.problem}; "
                                   f"click the object on the page (kiln serve) or {instead}")
            note = (f"the object of {image.name} was found automatically by {got.method_name} "
                    f"(score {got.score:.2f}); it covers {100 * got.share:.1f} % of the image")
            self._found[key] = (np.packbits(got.mask, axis=None), got.mask.shape, note)
        packed, shape, note = self._found[key]
        mask = np.unpackbits(packed, count=shape[0] * shape[1]).reshape(shape).astype(bool)
        return mask, note
