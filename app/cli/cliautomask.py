"""``kiln run --mask auto``: the object of each image without transparency found before any
worker starts (``app.segment.automask``), then checked like a mask file by ``worker.jobs.inputs``.

A batch reads every image twice (all of them up front, so a bad one stops the run before
anything starts; then each in its turn), so what was found is kept, packed to a bit a
pixel, and not searched for again. SAM 2 is loaded on first use, only when a checkpoint is
there (``app.segment.segment.choose_segmenter``), and rembg only when it is installed and
its model file is in the models folder (``app.segment.rembg_auto``); otherwise the border
model needs no weights. ``app.auto_mask`` naming one method that cannot run here is
refused before any image is read.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np

from worker.jobs.inputs import InputProblem

from app.cli.clirunner import CliError

if TYPE_CHECKING:
    from app.segment.automask import Finder


class AutoMasker:
    """A ``worker.jobs.inputs.FindMask``: (rgb, image path) -> (mask, note), or InputProblem
    saying why no single object was found and what to do instead. ``batch``: the hint
    names the --mask-dir folder rather than --mask."""

    def __init__(self, app_settings, batch: bool = False):
        self._app_settings = app_settings
        self._batch = batch
        self._method: str = app_settings.auto_mask
        self._finder: Optional[Finder] = None
        self._found: dict[str, tuple[np.ndarray, tuple[int, int], str]] = {}
        self._refuse_what_cannot_run()

    def _refuse_what_cannot_run(self) -> None:
        """Cheap checks (no model loaded) for a method asked for by name."""
        if self._method == "rembg":
            from app.segment.rembg_auto import rembg_problem

            problem = rembg_problem()
            if problem is not None:
                raise CliError(f"app.auto_mask is rembg, but {problem}")
        elif self._method == "sam2":
            from kiln.checkpoints import models_dir, resolve_checkpoint

            if resolve_checkpoint(self._app_settings) is None:
                raise CliError(f"app.auto_mask is sam2, but no SAM 2 checkpoint is configured or found in "
                               f"{models_dir()}/ (kiln models fetch tiny)")

    def finder(self) -> Finder:
        """The ``app.segment.automask.Finder``, its models loaded on first use. A model that
        is there but cannot be used is said once on stderr, or refused when it was asked for
        by name."""
        if self._finder is None:
            from app.segment.automask import Finder

            segmenter = self._sam2() if self._method in ("auto", "sam2") else None
            rembg = self._rembg() if self._method in ("auto", "rembg") else None
            self._finder = Finder(segmenter, rembg, self._method)
        return self._finder

    def _sam2(self):
        from app.segment.segment import Sam2Segmenter, choose_segmenter

        choice = choose_segmenter(self._app_settings)
        if isinstance(choice.segmenter, Sam2Segmenter):
            return choice.segmenter
        if self._method == "sam2":
            raise CliError(f"app.auto_mask is sam2, but SAM 2 cannot be used: {choice.reason}")
        if choice.reason and not choice.reason.startswith("no SAM2 checkpoint"):
            print(f"kiln: --mask auto goes without SAM 2: {choice.reason}", file=sys.stderr)
        return None

    def _rembg(self):
        from app.segment.rembg_auto import choose_rembg

        choice = choose_rembg()
        if choice.model is None and self._method == "rembg":
            raise CliError(f"app.auto_mask is rembg, but rembg cannot be used: {choice.reason}")
        if choice.reason:
            print(f"kiln: --mask auto goes without rembg: {choice.reason}", file=sys.stderr)
        return choice.model

    def __call__(self, rgb: np.ndarray, image: Path) -> tuple[np.ndarray, str]:
        from app.segment.segment import image_key

        key = image_key(rgb)
        if key not in self._found:
            got = self.finder().find(rgb)
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
