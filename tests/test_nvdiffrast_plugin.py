"""nvdiffrast's plugin is importable by name under torch >= 2.11 (pybind11 3), on CPU.

diffrp-nvdiffrast 0.3.3.1 JIT-builds its plugin with ``torch.utils.cpp_extension.load`` and
then imports it by name; pybind11 3 no longer leaves the built module in ``sys.modules``.
Kiln puts the plugin's build folder on ``sys.path`` where it makes its context. These tests
run nvdiffrast's own loader (with torch's compile step stood in for) to check that Kiln
computes the folder nvdiffrast and torch use, and that the import then succeeds."""

from __future__ import annotations

import sys

import pytest

from pipeline.raster import nvdiffrast_plugin as P

nvdiffrast = pytest.importorskip("nvdiffrast", reason="diffrp-nvdiffrast is not installed (test extra)")


@pytest.fixture
def fresh_loader(tmp_path, monkeypatch):
    """nvdiffrast's loader with an empty plugin cache, building into ``tmp_path``; the
    real compile (nvcc, minutes, CUDA only) is replaced by a recorder."""
    import nvdiffrast.torch.ops as ops
    import torch.utils.cpp_extension as cpp

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setattr(ops, "_cached_plugin", {})
    monkeypatch.setattr(sys, "path", list(sys.path))
    calls = []

    def never_built(name, path, is_python_module):
        raise ImportError(f"{name} is not built yet")

    def record_load(name, sources, **kwargs):
        calls.append((name, cpp._get_build_directory(name, False)))
        # what a pybind11-3 build leaves: the module file in its folder, not in sys.modules
        folder = cpp._get_build_directory(name, False)
        with open(f"{folder}/{name}.py", "w") as f:
            f.write("BUILT = True\n")

    monkeypatch.setattr(cpp, "_import_module_from_library", never_built)
    monkeypatch.setattr(cpp, "load", record_load)
    yield ops, calls
    for name in [m for m in sys.modules if m.startswith("nvdiffrast_plugin_")]:
        del sys.modules[name]


def test_kiln_computes_the_folder_nvdiffrast_builds_its_plugin_in(fresh_loader):
    import torch

    ops, calls = fresh_loader
    with pytest.raises(ModuleNotFoundError):   # the bug: built, but not importable by name
        ops._get_plugin()
    [(name, folder)] = calls
    assert name == P.plugin_name(nvdiffrast.__version__, torch.__version__)
    assert str(P.plugin_dir()) == folder


def test_with_the_folder_on_sys_path_the_built_plugin_imports(fresh_loader):
    ops, calls = fresh_loader
    folder = P.ensure_importable()
    assert sys.path[0] == str(folder) and folder.is_dir()
    assert P.ensure_importable() == folder and sys.path.count(str(folder)) == 1   # once
    assert ops._get_plugin().BUILT is True
    assert len(calls) == 1


def test_plugin_name_is_an_identifier():
    assert P.plugin_name("0.3.3.1", "2.11.0+cu130") == "nvdiffrast_plugin_0_3_3_1_torch2_11_0_cu130"
    assert P.plugin_name("0.3.3.1", "2.11.0+cu130").isidentifier()
