"""kiln.atomic: the one atomic writer every output, status file and cache entry uses."""

import os

import pytest

from kiln.atomic import atomic_write


def test_writes_are_atomic(tmp_path):
    target = tmp_path / "model.glb"
    target.write_bytes(b"old contents")

    def explode(f):
        f.write(b"half a file")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write(target, explode)
    assert target.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.glb"]
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.glb"]
    assert oct(os.stat(target).st_mode & 0o777) == oct(0o644)   # served files are readable
