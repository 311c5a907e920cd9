"""What passes the entry checks passes the stages (issue 24 item 4): each size rule of a photo,
at its limit, one under and one over, ends in a finished GLB or an entry refusal, never in a
stage refusing its input. A 20000x100 strip under the pixel limit once failed in reconstruct
("source camera image size 20000x100 is outside 1..8192")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from kiln.limits import MIN_IMAGE_SIDE
from kiln.settings import Settings
from worker.child.inprocess import run_in_process
from worker.jobs.inputs import InputProblem, RunItem, load
from worker_helpers import small_settings

# a small pixel limit, so the cases at it stay quick
MAX_PIXELS = 400_000


def _strip(path: Path, width: int, height: int) -> Path:
    """An RGBA photo: a red object in the middle third (its transparency is the mask)."""
    rgb = np.full((height, width, 3), 210, np.uint8)
    alpha = np.zeros((height, width), np.uint8)
    y0, y1 = height // 4, height - height // 4
    x0, x1 = width // 3, width - width // 3
    rgb[y0:y1, x0:x1] = (200, 60, 50)
    alpha[y0:y1, x0:x1] = 255
    Image.fromarray(np.dstack([rgb, alpha]), "RGBA").save(path)
    return path


@pytest.mark.parametrize("width,height,admitted", [
    (20000, 100, True),                          # the strip that once failed in reconstruct
    # at both limits at once: admitted by size, refused at entry by the reconstruction's own
    # check (an object 8 px tall over 25000 px leaves too few grid cells), never by a stage
    (MAX_PIXELS // MIN_IMAGE_SIDE, MIN_IMAGE_SIDE, False),
    (MAX_PIXELS // MIN_IMAGE_SIDE + 1, MIN_IMAGE_SIDE, False),   # one pixel column over the limit
    (400, MIN_IMAGE_SIDE, True),                 # the shortest side allowed
    (400, MIN_IMAGE_SIDE - 1, False),            # one under it
    (632, 632, True),                            # a square just under the pixel limit
    (633, 633, False),                           # just over
])
def test_each_size_rule_ends_in_a_glb_or_an_entry_refusal(tmp_path, width, height, admitted):
    photo = _strip(tmp_path / "photo.png", width, height)
    # the default working resolution: the strip's object is thin, as a real one would be
    settings = small_settings(reconstruct__resolution=Settings().reconstruct.resolution)
    # the strip is 2 MP: under the default limit, which is the one it met
    max_pixels = settings.app.max_pixels if width == 20000 else MAX_PIXELS
    try:
        got = load(RunItem(photo, None, tmp_path / "out.glb"), max_pixels, settings.reconstruct)
    except InputProblem as e:
        assert not admitted, f"{width}x{height} refused at entry: {e}"
        assert "photo.png" in str(e) and "Traceback" not in str(e)
        return
    assert admitted, f"{width}x{height} passed the entry checks but should not have"
    res = run_in_process(got.rgb, got.mask, settings, tmp_path / "out.glb")
    assert (tmp_path / "out.glb").stat().st_size > 1000
    assert res["stats"].faces > 0
