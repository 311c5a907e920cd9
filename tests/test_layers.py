"""Imports run one way: app/ -> worker/ -> pipeline/ -> kiln/ (docs/architecture.md, "Layers").

Every module of the four packages is parsed (not imported) and every import in it is
checked: top-level ones and the lazy ones inside functions, ``from . import x`` resolved
against the module's package, and ``importlib.import_module`` / ``__import__`` calls whose
module name is written out (an f-string counts by its literal start, e.g. f"pipeline.{m}").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# what each layer may import besides itself (and the standard library / third parties)
ALLOWED = {
    "app": {"worker", "kiln"},        # front ends: the web UI and the CLI
    "worker": {"pipeline", "kiln"},   # process boundary, probes, doctor, input checks
    "pipeline": {"kiln"},             # the stages
    "kiln": set(),                    # settings, image IO, atomic files: the shared base
}
LAYERS = tuple(ALLOWED)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _literal_prefix(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return None


def imports_of(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import anywhere in the file."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
        elif isinstance(node, ast.Call) and node.args:
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if called in ("import_module", "__import__"):
                name = _literal_prefix(node.args[0])
                if name:
                    found.append((node.lineno, name))
    return found


def layer_violations(root: Path = ROOT) -> list[str]:
    bad = []
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            for line, name in imports_of(path, root):
                top = name.split(".")[0]
                if top in ALLOWED and top != layer and top not in ALLOWED[layer]:
                    bad.append(f"{path.relative_to(root)}:{line} imports {name} ({layer}/ may import "
                               f"{', '.join(sorted(ALLOWED[layer])) or 'none of ' + '/'.join(LAYERS[:-1])})")
    return bad


def test_imports_run_one_way():
    assert layer_violations() == []


def test_every_layer_has_modules():
    """The scan would pass vacuously on a moved tree."""
    for layer in LAYERS:
        assert len(list((ROOT / layer).rglob("*.py"))) >= 3, layer


@pytest.mark.parametrize("source,where,expected", [
    ("import pipeline.run\n", "kiln/x.py", ["kiln/x.py:1 imports pipeline.run"]),
    ("def f():\n    from worker.supervisor import Supervisor\n", "pipeline/x.py",
     ["pipeline/x.py:2 imports worker.supervisor"]),
    ("def f():\n    from pipeline.types import ImageInput\n", "app/x.py",
     ["app/x.py:2 imports pipeline.types"]),
    ("import importlib\nimportlib.import_module(f'app.{name}')\n", "worker/x.py",
     ["worker/x.py:2 imports app."]),
    ("from ..app import server\n", "worker/x.py", ["worker/x.py:1 imports app"]),
    ("from worker.inputs import load\nfrom kiln import settings\nfrom . import y\nimport numpy\n",
     "app/x.py", []),
    ("from pipeline import run\nfrom kiln.glb import GLBError\n", "worker/x.py", []),
])
def test_the_scan_sees_each_kind_of_import(tmp_path, source, where, expected):
    """Each kind of import the scan claims to read, written into a throwaway tree."""
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
    (tmp_path / where).write_text(source)
    got = layer_violations(tmp_path)
    assert [g.split(" (")[0] for g in got] == expected


MAX_FUNCTION_LINES = 150   # issue 25: a function longer than this is several ideas


def test_no_function_is_longer_than_150_lines():
    too_long = []
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert too_long == []


def test_each_layer_has_its_folders():
    """The folders the architecture names (docs/architecture.md, "Layers") are there."""
    for folder in ("app/web", "app/cli", "app/segment", "worker/checks", "pipeline/recon", "pipeline/views",
                   "pipeline/meshing", "pipeline/unwrap", "pipeline/texture", "pipeline/camera",
                   "pipeline/raster", "pipeline/io"):
        assert (ROOT / folder / "__init__.py").is_file(), folder
