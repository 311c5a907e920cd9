"""A mesh is checked once where it enters, then trusted: ``Mesh.validate`` scans the arrays
the first time and remembers them; a new array (a stage's output, a replaced field) is
scanned again. A whole job scans each distinct mesh once (16 scans before)."""

from __future__ import annotations

import dataclasses
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pipeline import types
from pipeline.validate import StageInputError


def _mesh():
    v = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], np.float32)
    return types.Mesh(v, np.array([[0, 1, 2]], np.int32), uvs=np.zeros((3, 2), np.float32))


@pytest.fixture
def scans(monkeypatch):
    seen = Counter()
    real = types.check_finite

    def counting(name, a):
        seen[name.split(".")[-1]] += 1
        return real(name, a)

    monkeypatch.setattr(types, "check_finite", counting)
    return seen


def test_a_checked_mesh_is_not_scanned_again(scans):
    m = _mesh()
    m.validate()
    m.validate("again")
    assert scans == {"vertices": 1, "uvs": 1}
    with pytest.raises(StageInputError, match="more than the limit 0"):   # cheap bounds still hold
        m.validate(max_faces=0)


def test_new_arrays_are_scanned(scans):
    m = _mesh().validate()
    bad = dataclasses.replace(m, uvs=np.full((3, 2), np.nan, np.float32))
    with pytest.raises(StageInputError, match="uvs"):
        bad.validate()
    m.vertices = m.vertices.copy()
    m.vertices[0, 0] = np.inf
    with pytest.raises(StageInputError, match="vertices"):
        m.validate()


@pytest.mark.slow
def test_a_job_scans_each_mesh_once(scans):
    from kiln.examples import draw_object
    from kiln.settings import load
    from pipeline.run import run_pipeline

    rgb, mask = draw_object(256)
    s = load(None, {"views.count": 4, "views.resolution": 128, "bake.texture_size": 512,
                    "bake.steps": 10, "reconstruct.resolution": 64})
    with tempfile.TemporaryDirectory() as d:
        run_pipeline(types.ImageInput(rgb, mask), s, Path(d))
    # the reconstruction, the cleaned, the simplified and the unwrapped mesh: once each
    assert scans["vertices"] == 4 and scans["uvs"] == 1, scans
