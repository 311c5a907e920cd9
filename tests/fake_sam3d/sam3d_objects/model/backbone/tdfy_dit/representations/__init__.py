"""SAM 3D's real ``Gaussian`` and ``MeshExtractResult``, loaded from the ``sam3d`` PyPI package.

``sam3d`` (0.1.2, a test-only dependency: the ``test`` extra) vendors SAM 3D Objects under
``sam3d/third_party/meta/sam3d_objects``; its ``representations/gaussian`` and
``representations/mesh`` files are byte-identical to facebookresearch/sam-3d-objects at
``UPSTREAM_COMMIT`` (``UPSTREAM_BLOBS`` holds upstream's git blob ids; a test checks them).
Nothing of upstream is copied here: the files are executed from the installed package
under a private package name (``_kiln_sam3d_upstream``) so they cannot clash with this
stand-in ``sam3d_objects``.

Two things stop a plain import on a CPU machine, and only those are worked around:

* ``representations/__init__`` and ``mesh/cube2mesh.py`` import training-time machinery
  (spconv's ``SparseTensor``, kaolin's ``FlexiCubes``, ``easydict``) that neither class
  uses; those names are bound to placeholders that fail if anything calls them.
* ``Gaussian.setup_functions`` moves its biases to CUDA unconditionally; ``cpu_tensors()``
  makes ``Tensor.cuda`` a no-op while one is constructed on a machine without CUDA.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from pathlib import Path

UPSTREAM_COMMIT = "cf066761706cd02b07e2fc6274570ec8cdafb683"
_TDFY = "sam3d_objects/model/backbone/tdfy_dit"
UPSTREAM_BLOBS = {
    f"{_TDFY}/representations/gaussian/gaussian_model.py": "e288730f26a9d49441ab3800728b5a52b657a2f8",
    f"{_TDFY}/representations/gaussian/general_utils.py": "58e9fb8c295abcf39bcf404a96994de32925c971",
    f"{_TDFY}/representations/mesh/cube2mesh.py": "f9580ca69a316394ad28f402d5c268363b3a1f94",
    f"{_TDFY}/representations/mesh/utils_cube.py": "d84d7c4de1d2f1f9b5917d47f3f8904d50ef59f7",
}
ALIAS = "_kiln_sam3d_upstream"


def vendored_root() -> Path:
    """The ``sam3d`` package's vendored tree (holds ``sam3d_objects/``), without importing
    ``sam3d`` itself (its __init__ pulls in its service layer)."""
    spec = importlib.util.find_spec("sam3d")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the sam3d package (PyPI, test extra) is not installed: "
                          "pip install 'sam3d==0.1.2' (or pip install -e .[test])")
    root = Path(list(spec.submodule_search_locations)[0]) / "third_party" / "meta"
    if not (root / _TDFY).is_dir():
        raise ImportError(f"the sam3d package at {root.parent.parent} has no vendored {_TDFY}")
    return root


def _placeholder(name: str):
    class Placeholder:
        def __init__(self, *a, **k):
            raise RuntimeError(f"{name} is a test placeholder: SAM 3D's training-time "
                               "mesh extraction is not available here")
    Placeholder.__name__ = name
    return Placeholder


def _package(name: str, path: Path | None) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)] if path is not None else []
    sys.modules[name] = mod
    return mod


def _load_upstream():
    if f"{ALIAS}.representations.mesh" in sys.modules:
        g = sys.modules[f"{ALIAS}.representations.gaussian"]
        m = sys.modules[f"{ALIAS}.representations.mesh"]
        return g.Gaussian, m.MeshExtractResult
    tdfy = vendored_root() / _TDFY
    _package(ALIAS, tdfy)
    _package(f"{ALIAS}.representations", tdfy / "representations")   # skip its __init__
    _package(f"{ALIAS}.modules", None)
    sparse = types.ModuleType(f"{ALIAS}.modules.sparse")
    sparse.SparseTensor = _placeholder("SparseTensor")
    sys.modules[sparse.__name__] = sparse
    _package(f"{ALIAS}.representations.mesh.flexicubes", tdfy / "representations/mesh/flexicubes")
    flexi = types.ModuleType(f"{ALIAS}.representations.mesh.flexicubes.flexicubes")
    flexi.FlexiCubes = _placeholder("FlexiCubes")
    sys.modules[flexi.__name__] = flexi
    if importlib.util.find_spec("easydict") is None:
        easydict = types.ModuleType("easydict")
        easydict.EasyDict = dict
        sys.modules["easydict"] = easydict
    import importlib as _il

    gaussian = _il.import_module(f"{ALIAS}.representations.gaussian")
    mesh = _il.import_module(f"{ALIAS}.representations.mesh")
    return gaussian.Gaussian, mesh.MeshExtractResult


@contextlib.contextmanager
def cpu_tensors():
    """Let upstream code that calls ``.cuda()`` run on a machine without CUDA."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.cuda = original


Gaussian, MeshExtractResult = _load_upstream()
