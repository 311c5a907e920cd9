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
    ("def f():\n    from worker.pool.supervisor import Supervisor\n", "pipeline/x.py",
     ["pipeline/x.py:2 imports worker.pool.supervisor"]),
    ("def f():\n    from pipeline.types import ImageInput\n", "app/x.py",
     ["app/x.py:2 imports pipeline.types"]),
    ("import importlib\nimportlib.import_module(f'app.{name}')\n", "worker/x.py",
     ["worker/x.py:2 imports app."]),
    ("from ..app import server\n", "worker/x.py", ["worker/x.py:1 imports app"]),
    ("from worker.jobs.inputs import load\nfrom kiln import settings\nfrom . import y\nimport numpy\n",
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


def _imported_modules(path: Path, root: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` a file imports: ``from a.b import c`` counts as a.b.c when
    that is a module, else as a.b; a module's own package ``__init__`` is not counted."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = imports_of_node(node, path, root)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out.update(n for n in names if n in known)
    return out


def imports_of_node(node: ast.ImportFrom, path: Path, root: Path) -> str:
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """Cycles among the modules of each layer, lazy imports included (a lazy import only
    postpones a cycle, it does not untie it). Tarjan's strongly connected components."""
    paths = {_module_name(p, root): p for layer in LAYERS for p in sorted((root / layer).rglob("*.py"))}
    known = set(paths)
    graph = {m: sorted(_imported_modules(p, root, known) - {m}) for m, p in paths.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:   # recursive: the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return cycles


def test_no_import_cycles_inside_a_layer():
    assert import_cycles() == []


@pytest.mark.parametrize("files,expected", [
    ({"worker/a.py": "from worker.b import x\n", "worker/b.py": "def f():\n    from worker.a import y\n"},
     [["worker.a", "worker.b"]]),
    ({"app/p/__init__.py": "from app.p.q import x\n", "app/p/q.py": "from app.p import r\n",
      "app/p/r.py": "from app.p import q\n"}, [["app.p.q", "app.p.r"]]),
    ({"worker/a.py": "from worker.b import x\n", "worker/b.py": "from kiln.c import y\n"}, []),
])
def test_the_cycle_scan_sees_lazy_and_package_imports(tmp_path, files, expected):
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert import_cycles(tmp_path) == expected


MAX_MODULES_SIDE_BY_SIDE = 15   # issue 35: a folder with more hides its design in file names


def test_no_folder_holds_more_than_15_modules():
    crowded = []
    for layer in LAYERS:
        for folder in [ROOT / layer, *sorted(p for p in (ROOT / layer).rglob("*") if p.is_dir())]:
            modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            if len(modules) > MAX_MODULES_SIDE_BY_SIDE:
                crowded.append(f"{folder.relative_to(ROOT)}: {len(modules)}")
    assert crowded == []
