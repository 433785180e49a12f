"""The layout is the architecture: no import circle, and the torch-free packages stay torch-free.

Imports are read from the source (``TYPE_CHECKING`` and function-level imports included), so
a circle closed only for the type checker still fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "memprofiler"
#: Packages the `memprofiler` command runs on: they must not need torch or the training side.
TORCH_FREE = ("config", "analysis", "reporters", "commands")
FORBIDDEN = ("torch", "memprofiler.core", "memprofiler.collectors", "memprofiler.lightning")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module ``path`` imports by name, anywhere in the file."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{alias.name}" for alias in node.names}
            out.update(subs & modules.keys())  # `from memprofiler import layout` imports a module
            if subs - modules.keys():  # ... and names defined in the package itself
                out.add(node.module)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m in _imports(path, modules) if m in modules} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), or a self-import."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
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
            if len(comp) > 1 or v in graph[v]:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_anywhere():
    assert _cycles(_graph()) == []


def test_the_torch_free_packages_import_no_torch_and_no_training_side():
    modules = _modules()
    offending = []
    for name, path in sorted(modules.items()):
        if name.split(".")[1:2] and name.split(".")[1] in TORCH_FREE:
            for imported in sorted(_imports(path, modules)):
                if imported.startswith(FORBIDDEN):
                    offending.append(f"{name} imports {imported}")
    assert offending == []


def test_every_package_says_what_it_is_in_one_docstring():
    for init in PKG.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.relative_to(SRC)} has no docstring"


def test_collectors_see_the_profiler_only_through_its_view():
    modules = _modules()
    for name, path in modules.items():
        if name.startswith("memprofiler.collectors"):
            assert not {
                m
                for m in _imports(path, modules)
                if m.startswith(("memprofiler.core", "memprofiler.lightning"))
            }, name


#: The estimate's rooms below its engine: the engine (``estimate/engine.py``, ``api.py``) loops
#: over their parts; none of them reaches back up to it.
ESTIMATE_ROOMS = ("allocator", "cuda", "fake", "parallel")
ESTIMATE_ENGINE = ("memprofiler.estimate.engine", "memprofiler.estimate.api", "memprofiler.estimate.tracker")


def test_the_estimates_rooms_never_import_its_engine():
    modules = _modules()
    offending = []
    for name, path in sorted(modules.items()):
        parts = name.split(".")
        if parts[1:2] == ["estimate"] and parts[2:3] and parts[2] in ESTIMATE_ROOMS:
            offending += [
                f"{name} imports {m}" for m in sorted(_imports(path, modules)) if m in ESTIMATE_ENGINE
            ]
    assert offending == []


def test_the_allocator_model_is_plain_python():
    # GIVEN the caching allocator's model: bookkeeping over integers, replayable anywhere
    modules = _modules()
    for name, path in sorted(modules.items()):
        if name.startswith("memprofiler.estimate.allocator"):
            imported = _imports(path, modules) | {
                alias.name
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Import)
                for alias in node.names
            }
            # THEN it needs neither torch nor another room of the estimate (errors are everyone's)
            assert not {m for m in imported if m.startswith("torch")}, name
            assert not {
                m
                for m in imported
                if m.startswith("memprofiler")
                and not m.startswith(("memprofiler.estimate.allocator", "memprofiler.errors"))
            }, name


def test_no_private_name_is_imported_from_another_module():
    # A name another module needs is a public name of its owner (a private *module*, such as
    # lightning/_compat.py, is imported by its name).
    modules = _modules()
    offending = []
    for name, path in sorted(modules.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("memprofiler"):
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and f"{node.module}.{alias.name}" not in modules:
                        offending.append(f"{name} imports {node.module}.{alias.name}")
    assert offending == []
