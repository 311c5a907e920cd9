"""Where nvdiffrast's JIT-built plugin lives, and making it importable.

diffrp-nvdiffrast 0.3.3.1 builds its CUDA plugin with ``torch.utils.cpp_extension.load``
under the name ``nvdiffrast_plugin_<nvdiffrast version>_torch<torch version>`` (made a
valid identifier), then imports that name with ``importlib.import_module``. Up to torch
2.10 the loader left the module in ``sys.modules``; torch 2.11 bundles pybind11 3, whose
loader does not, so the import by name fails (``ModuleNotFoundError:
nvdiffrast_plugin_0_3_3_1_torch2_11_0_cu130``) in every process although the build
succeeded. The cure is to have the build folder on ``sys.path`` before nvdiffrast first
loads its plugin; ``ensure_importable`` does that where Kiln makes its context.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def plugin_name(nvdiffrast_version: str, torch_version: str) -> str:
    """The module name nvdiffrast gives its (non-GL) CUDA plugin for these versions."""
    raw = f"nvdiffrast_plugin_{nvdiffrast_version}_torch{torch_version}"
    # a Python identifier: every non-word character, and a leading digit, become '_'
    return re.sub(r"\W|^(?=\d)", "_", raw)


def plugin_dir() -> Path:
    """The folder torch's cpp_extension builds (and looks for) the installed nvdiffrast's
    plugin in: ``$TORCH_EXTENSIONS_DIR`` (or torch's default root), its py/cu subfolder,
    then the plugin's name. Created if missing, as torch would."""
    import nvdiffrast
    import torch
    import torch.utils.cpp_extension as cpp

    name = plugin_name(nvdiffrast.__version__, torch.__version__)
    return Path(cpp._get_build_directory(name, verbose=False))


def ensure_importable() -> Path:
    """Put the plugin's build folder first on ``sys.path`` (once); returns it."""
    folder = plugin_dir()
    entry = str(folder)
    if entry not in sys.path:
        sys.path.insert(0, entry)
    return folder
