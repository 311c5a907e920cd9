"""rembg without clicks: its model's mask of the one object (``rembg_mask``), with the model
loaded from Kiln's models folder and nowhere else (``load_rembg``).

rembg (PyPI, optional: ``pip install 'kiln3d[rembg]'``) runs background-removal models
through onnxruntime. Left alone it downloads its model on first use (pooch, into its home
folder ~/.u2net); Kiln never lets it. The file must already be in Kiln's models folder
(``kiln.models.rembg_model_path()``; ``kiln models fetch rembg`` puts it there), and it is
opened through rembg's "u2net_custom" session, which reads no URL: Kiln's subclass of it
answers rembg's ``download_models`` hook with that path (rembg 2.0.86 itself accepts a
custom path only inside its own home folder), so rembg's download code is never reached.
Everything else (the ONNX session, the 320 x 320 input, ImageNet normalisation, reading
the first output as the mask) is rembg's own. The session runs on onnxruntime's CPU
provider only: the app process must never start CUDA (docs/architecture.md).

rembg stretches each mask to span 0..1 (min-max), even on an empty backdrop, so it never
says "nothing here" by itself. Its answer is judged as the other methods' are: thresholded
at one half, its main piece must be one object of a sensible size that stays clear of most
of the border (``app.segment.border_model``'s limits), and rembg must be decided about most
of it (``score``); otherwise ``problem`` says why.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

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

INSTALL_HINT = "pip install 'kiln3d[rembg]'"
# rembg's session for a U^2-Net-layout model given by path
SESSION = "u2net_custom"
# rembg scales every image to 320 x 320 for the model and the mask back up; a copy of this
# side keeps the scaling back cheap for a large photo without losing outline detail
WORK_SIDE = 640
# a pixel whose mask value lies in this band is one rembg is undecided about
UNDECIDED = (0.25, 0.75)
# below this score (1 - undecided pixels / the object's pixels), rembg does not know where
# the object ends
MIN_SCORE = 0.5


class RembgLoadError(Exception):
    """rembg cannot be used here; the message says why and what to do."""


@dataclass(frozen=True)
class RembgModel:
    """A loaded rembg session and the file it came from. ``predict`` is safe to call from
    several threads (onnxruntime sessions are)."""

    session: Any   # rembg's U2netCustomSession (a subclass of it)
    path: Path

    @property
    def label(self) -> str:
        return f"rembg ({self.path.name})"

    def predict(self, rgb: np.ndarray) -> np.ndarray:
        """rembg's mask of (h, w, 3) uint8 ``rgb``: (h, w) float32 in 0..1."""
        from PIL import Image

        # a model that answers one value everywhere makes rembg's min-max divide 0 by 0;
        # the NaNs become 0 (an empty mask), which is what such an answer means
        with np.errstate(invalid="ignore", divide="ignore"):
            out = self.session.predict(Image.fromarray(rgb))[0]
        mask = np.asarray(out.convert("L"), np.float32) / 255.0
        if mask.shape != rgb.shape[:2]:
            raise ValueError(f"rembg answered a {mask.shape[1]}x{mask.shape[0]} mask for a "
                             f"{rgb.shape[1]}x{rgb.shape[0]} image")
        return mask


def rembg_problem(folder: Optional[Path] = None) -> Optional[str]:
    """None when rembg can be tried (its model file is in the models folder and rembg and
    onnxruntime are installed), else why not, with what to do. Cheap: nothing is imported."""
    from kiln.models import rembg_model_path

    path = rembg_model_path(folder)
    if not path.is_file():
        return f"no rembg model at {path} (kiln models fetch rembg)"
    for module in ("rembg", "onnxruntime"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed ({INSTALL_HINT})"
    return None


def load_rembg(folder: Optional[Path] = None) -> RembgModel:
    """rembg's session on the model file in ``folder`` (default: ``kiln.models.models_dir()``),
    on the CPU. RembgLoadError saying why when it cannot be had; nothing is downloaded."""
    from kiln.models import rembg_model_path

    problem = rembg_problem(folder)
    if problem is not None:
        raise RembgLoadError(problem)
    path = rembg_model_path(folder).resolve()
    try:
        # onnxruntime first: rembg's own import calls sys.exit when it is missing
        import onnxruntime as ort
        from rembg.sessions.u2net_custom import U2netCustomSession
    except ImportError as e:
        raise RembgLoadError(f"rembg cannot be imported ({e}; {INSTALL_HINT})") from None

    class KilnFileSession(U2netCustomSession):
        @classmethod
        def download_models(cls, *args, **kwargs):
            return str(path)

    try:
        session = KilnFileSession(SESSION, ort.SessionOptions(), model_path=str(path),
                                  providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types for a bad file
        raise RembgLoadError(f"rembg cannot open {path}: {type(e).__name__}: {e} (a damaged file? "
                             "check it with kiln models list; fetch it again with kiln models fetch rembg)") from None
    return RembgModel(session, path)


@dataclass(frozen=True)
class RembgChoice:
    """What ``choose_rembg`` found: the model, or None and why (empty when its file is absent,
    which needs no saying: rembg is optional)."""

    model: Optional[RembgModel]
    reason: str = ""


def choose_rembg(folder: Optional[Path] = None) -> RembgChoice:
    """rembg when its model file is present and it loads; never raises."""
    from kiln.models import rembg_model_path

    if not rembg_model_path(folder).is_file():
        return RembgChoice(None)
    try:
        return RembgChoice(load_rembg(folder))
    except RembgLoadError as e:
        return RembgChoice(None, str(e))


def one_object(mask: np.ndarray) -> tuple[np.ndarray, Optional[str]]:
    """(the main piece of (h, w) bool ``mask`` with its small holes filled, None) when it is
    one object as ``app.segment.border_model`` judges one; else (an empty mask, why not)."""
    h, w = mask.shape
    empty = np.zeros((h, w), bool)
    labels, stats = components(mask)
    if len(stats) < 2:
        return empty, "rembg's mask is empty: nothing stands out from the rest of the image"
    main = 1 + int(np.argmax(piece_weights(labels, stats)))
    similar, others = ONE_OBJECT.other_pieces(stats, main, h * w)
    if similar:
        return empty, f"rembg's mask holds {similar + 1} separate things of similar size, not one object"
    if ONE_OBJECT.cluttered(others, float(stats[main, 4])):
        return empty, f"rembg's mask is cluttered ({len(others) + 1} separate things)"
    obj = fill_holes(labels == main, labels == main)   # only tiny holes: larger ones show background
    problem = ONE_OBJECT.outline_problem(obj)
    if problem is not None:
        kind, figure = problem
        why = {"specks": lambda f: f"rembg's mask holds only specks ({100 * f:.2f} % of the image)",
               "too large": lambda f: f"rembg's mask covers {100 * f:.0f} % of the image: no background is left "
                                      "around an object",
               "runs off": lambda f: f"rembg's object runs off the image along {100 * f:.0f} % of its border",
               "spans": lambda f: f"rembg's mask reaches across the image from {f}, which is not one object"}
        return empty, why[kind](figure)
    return obj, None


def rembg_mask(rgb: np.ndarray, model: RembgModel, side: int = WORK_SIDE) -> AutoMask:
    """The object of (H, W, 3) uint8 ``rgb`` by rembg through ``model``; ``problem`` set
    when its mask is not one object (the module's docstring)."""
    t0 = time.perf_counter()
    H, W = rgb.shape[:2]
    small = work_copy(rgb, side)
    soft = model.predict(small)
    t1 = time.perf_counter()
    obj, problem = one_object(open_specks(soft >= 0.5))
    undecided = int(((soft > UNDECIDED[0]) & (soft < UNDECIDED[1])).sum())
    score = max(0.0, 1.0 - undecided / max(1, int(obj.sum()))) if problem is None else 0.0
    detail = f"rembg ({model.path.name}) on a {small.shape[1]}x{small.shape[0]} copy"
    if problem is None and score < MIN_SCORE:
        problem = (f"rembg is unsure where the object ends (undecided about {undecided:,} pixels, "
                   f"{100 * undecided / max(1, int(obj.sum())):.0f} % of the object's area)")
    timings = {"rembg_s": t1 - t0, "total_s": time.perf_counter() - t0}
    if problem is not None:
        return AutoMask(np.zeros((H, W), bool), "rembg", round(score, 4), problem, detail, timings)
    return AutoMask(to_size(obj, (H, W)), "rembg", round(score, 4), None, detail, timings)
