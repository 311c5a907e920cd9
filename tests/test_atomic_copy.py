"""kiln.atomic.atomic_copy: a copy that is whole or absent under the target name."""

import os

import pytest

from kiln.atomic import atomic_copy


def test_copy_is_whole_and_leaves_no_temporary(tmp_path):
    src = tmp_path / "job" / "model.glb"
    src.parent.mkdir()
    src.write_bytes(os.urandom(300_000))
    dst = tmp_path / "out" / "kiln-1.glb"   # the folder is made on the way
    assert atomic_copy(src, dst) == dst
    assert dst.read_bytes() == src.read_bytes()
    assert sorted(p.name for p in dst.parent.iterdir()) == ["kiln-1.glb"]
    assert oct(os.stat(dst).st_mode & 0o777) == oct(0o644)


def test_a_failed_copy_keeps_the_old_target(tmp_path):
    dst = tmp_path / "kiln-1.glb"
    dst.write_bytes(b"old")
    with pytest.raises(FileNotFoundError):
        atomic_copy(tmp_path / "missing.glb", dst)
    assert dst.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kiln-1.glb"]
