"""Input rules live in one place (kiln.limits) and every front end and stage applies the
same values: a 40-pixel mask, once refused by the page and passed by the CLI, is refused
by both and by the reconstruction."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from kiln import limits

ROOT = Path(__file__).resolve().parent.parent
RULES = ("MIN_IMAGE_SIDE", "MAX_INPUT_PIXELS", "MAX_WORK_SIDE", "MAX_RASTER_SIDE", "MAX_TOTAL_PIXELS",
         "MIN_MASK_PIXELS", "MAX_FACES", "MIN_TEXTURE_SIZE", "MAX_IMAGE_SIDE", "MIN_SIDE",
         "MAX_EXPORT_FACES", "DEPTH_REL_TOL", "MAX_SLOPE")


def _mask(pixels: int, shape=(256, 256)) -> np.ndarray:
    m = np.zeros(shape, bool)
    m.flat[np.arange(pixels) * 7 % m.size] = True
    return m


def test_each_rule_is_assigned_in_one_module():
    homes: dict[str, list[str]] = {}
    for folder in ("app", "worker", "pipeline", "kiln"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Assign):
                    for t in node.targets:
                        if isinstance(t, ast.Name) and t.id in RULES:
                            homes.setdefault(t.id, []).append(str(path.relative_to(ROOT)))
    assert {k: v for k, v in homes.items() if len(v) > 1} == {}
    assert all(v == ["kiln/limits.py"] for k, v in homes.items() if k not in ("DEPTH_REL_TOL", "MAX_SLOPE"))
    assert homes["DEPTH_REL_TOL"] == homes["MAX_SLOPE"] == ["pipeline/texture/visibility.py"]


@pytest.mark.parametrize("pixels,word", [(0, "is empty"), (256 * 256, "covers the whole image"),
                                         (40, "only 40 object pixel(s)"), (63, "only 63")])
def test_mask_problem(pixels, word):
    assert word in limits.mask_problem(_mask(pixels))


def test_enough_pixels_pass():
    assert limits.mask_problem(_mask(limits.MIN_MASK_PIXELS)) is None


def test_a_40_pixel_mask_is_refused_by_the_page_the_cli_and_the_stage():
    from app.web.photo.selection import assess_mask
    from kiln.settings import load
    from pipeline.recon.reconstruct import require_usable_mask
    from pipeline.validate import StageInputError
    from worker.jobs.inputs import InputProblem, check_reconstructable

    mask = _mask(40)
    assert assess_mask(mask).speck                                     # the page
    with pytest.raises(InputProblem, match="only 40 object pixel"):   # the CLI and the API's checks
        check_reconstructable(np.zeros(mask.shape + (3,), np.uint8), mask, load().reconstruct)
    with pytest.raises(StageInputError, match="only 40 object pixel"):  # the stage itself
        require_usable_mask(mask)


def test_image_size_problem_names_the_image():
    assert limits.image_size_problem(15, 100, "image a.png") == \
        "image a.png is only 15x100 pixels; use one at least 16 pixels on each side"
    assert limits.image_size_problem(16, 16) is None
