"""The suite gives the same results on a laptop and on a GPU node: every test names its device.

Read from the test sources (nothing is run): every ``Trainer(...)`` and ``Fabric(...)`` a test
or helper under ``tests/`` builds passes ``accelerator=`` explicitly, every ``LightningCLI`` /
``MemProfilerCLI`` gets it through ``trainer_defaults`` or ``--trainer.accelerator``, and no
test asserts that CUDA is absent without patching ``torch.cuda`` itself. Tests marked ``cuda``
(they need a GPU, and run only where one is) are exempt. On the first GPU run 19 tests failed
because they built a Trainer with the default accelerator and then expected CPU results.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).parent
SELF = Path(__file__).resolve()
BUILDERS = {"Trainer", "Fabric"}
CLIS = {"LightningCLI", "MemProfilerCLI"}
CLI_FLAG = "--trainer.accelerator"


def _sources(root: Path) -> Iterator[tuple[Path, ast.Module, str]]:
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        yield path, ast.parse(text, str(path)), text


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _is_cuda_mark(node: ast.expr) -> bool:
    """``pytest.mark.cuda`` (or ``mark.cuda``), called or not."""
    if isinstance(node, ast.Call):
        node = node.func
    return isinstance(node, ast.Attribute) and node.attr == "cuda" and _name(node.value) == "mark"


def _module_marked_cuda(tree: ast.Module) -> bool:
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(_name(t) == "pytestmark" for t in stmt.targets):
            values = stmt.value.elts if isinstance(stmt.value, (ast.List, ast.Tuple)) else [stmt.value]
            if any(_is_cuda_mark(v) for v in values):
                return True
    return False


def _scopes(tree: ast.Module) -> Iterator[tuple[ast.AST, list[ast.AST]]]:
    """Every node with the chain of functions and classes around it (outermost first)."""
    stack: list[tuple[ast.AST, list[ast.AST]]] = [(tree, [])]
    while stack:
        node, chain = stack.pop()
        yield node, chain
        inner = (
            [*chain, node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            else chain
        )
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


def _marked_cuda(chain: list[ast.AST]) -> bool:
    return any(
        _is_cuda_mark(d)
        for scope in chain
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        for d in scope.decorator_list
    )


def _dict_has(value: ast.expr, key: str) -> bool:
    """A ``{...}`` literal or ``dict(...)`` call that sets ``key``."""
    if isinstance(value, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value == key for k in value.keys)
    if isinstance(value, ast.Call) and _name(value.func) == "dict":
        return any(kw.arg == key for kw in value.keywords)
    return False


def _assigned_with(chain: list[ast.AST], tree: ast.Module, var: str, key: str) -> bool:
    """Whether ``var`` is assigned a dict setting ``key`` in the enclosing function (or module)."""
    scope: ast.AST = next((s for s in reversed(chain) if isinstance(s, ast.FunctionDef)), tree)
    for node in ast.walk(scope):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        if any(_name(t) == var for t in targets) and _dict_has(node.value, key):  # type: ignore[union-attr, arg-type]
            return True
    return False


def _builder_names_accelerator(call: ast.Call, chain: list[ast.AST], tree: ast.Module) -> bool:
    for kw in call.keywords:
        if kw.arg == "accelerator":
            return True
        if kw.arg is None and (
            _dict_has(kw.value, "accelerator")
            or (isinstance(kw.value, ast.Name) and _assigned_with(chain, tree, kw.value.id, "accelerator"))
        ):
            return True
    return False


def _cli_names_accelerator(call: ast.Call, chain: list[ast.AST], text: str) -> bool:
    for kw in call.keywords:
        if kw.arg == "trainer_defaults" and _dict_has(kw.value, "accelerator"):
            return True
    scope = next((s for s in reversed(chain) if isinstance(s, ast.FunctionDef)), call)
    return CLI_FLAG in (ast.get_source_segment(text, scope) or "")


def _local_classes(tree: ast.Module) -> set[str]:
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}


def _string_texts(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Source code written as strings (scripts a test runs in a subprocess), f-strings joined."""
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
            yield node.lineno, "".join(str(p) for p in parts)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def _script_calls(text: str) -> Iterator[tuple[ast.Call, ast.Module]]:
    """``Trainer(...)`` / ``Fabric(...)`` calls of a string that is Python source (prose is skipped)."""
    if not re.search(r"\b(?:Trainer|Fabric)\(", text):
        return
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in BUILDERS:
            yield node, tree


def _asserts_no_cuda(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Assert) and isinstance(node.test, ast.UnaryOp)):
        return False
    call = node.test.operand
    return (
        isinstance(node.test.op, ast.Not)
        and isinstance(call, ast.Call)
        and _name(call.func) == "is_available"
        and isinstance(call.func, ast.Attribute)
        and _name(call.func.value) == "cuda"
    )


def _patches_cuda(chain: list[ast.AST], text: str) -> bool:
    scope = next((s for s in reversed(chain) if isinstance(s, ast.FunctionDef)), None)
    source = ast.get_source_segment(text, scope) if scope is not None else ""
    return bool(source) and bool(re.search(r"setattr\(\s*torch\.cuda\b|patch\(\s*[\"']torch\.cuda\.", source))


def unnamed_devices(root: Path = TESTS) -> list[str]:
    """``file:line: what`` for every place a test under ``root`` leaves the device to the machine."""
    found: list[str] = []
    for path, tree, text in _sources(root):
        where = path.relative_to(root.parent)
        if _module_marked_cuda(tree):
            continue
        local = _local_classes(tree)
        for node, chain in _scopes(tree):
            if _marked_cuda(chain):
                continue
            if isinstance(node, ast.Call):
                name = _name(node.func)
                if name in BUILDERS and not (isinstance(node.func, ast.Name) and name in local):
                    if not _builder_names_accelerator(node, chain, tree):
                        found.append(f"{where}:{node.lineno}: {name}(...) without accelerator=")
                elif name in CLIS and not _cli_names_accelerator(node, chain, text):
                    found.append(
                        f"{where}:{node.lineno}: {name}(...) without trainer_defaults "
                        f"accelerator or {CLI_FLAG}"
                    )
            elif _asserts_no_cuda(node) and not _patches_cuda(chain, text):
                found.append(f"{where}:{node.lineno}: asserts CUDA is absent without patching torch.cuda")
        if path.resolve() == SELF:
            continue  # the examples below are this lint's own test data
        for lineno, string in _string_texts(tree):
            for call, script in _script_calls(string):
                if not _builder_names_accelerator(call, [], script):
                    found.append(
                        f"{where}:{lineno}: {_name(call.func)}(...) in a script string without accelerator="
                    )
    return sorted(found, key=_line_order)


def _line_order(entry: str) -> tuple[str, int]:
    file, line, _ = entry.split(":", 2)
    return file, int(line)


def test_every_trainer_fabric_and_cli_names_its_accelerator():
    offenders = unnamed_devices()
    assert offenders == [], (
        "pass accelerator='cpu' where the test checks CPU behaviour, mark it `cuda` where it "
        "needs a GPU, or patch torch.cuda where it checks the no-GPU path:\n" + "\n".join(offenders)
    )


def test_the_lint_sees_what_it_forbids(tmp_path):
    # GIVEN sources that leave the device to the machine, and their fixed forms
    bad = """
import pytest, torch
import lightning.pytorch as pl
from lightning.fabric import Fabric
def helper(**kw):
    opts = dict(max_steps=1)
    return pl.Trainer(**opts)
def test_a():
    pl.Trainer(max_steps=1)
    Fabric(devices=1)
    MemProfilerCLI(Model, args=["fit"])
    assert not torch.cuda.is_available()
    script = f"pl.Trainer(max_steps={1})"
"""
    good = """
import pytest, torch
import lightning.pytorch as pl
from lightning.fabric import Fabric
def helper(**kw):
    opts = dict(max_steps=1, accelerator="cpu")
    return pl.Trainer(**opts)
def test_a(monkeypatch):
    pl.Trainer(max_steps=1, accelerator="cpu")
    Fabric(devices=1, accelerator="cpu")
    MemProfilerCLI(Model, args=["fit", "--trainer.accelerator=cpu"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not torch.cuda.is_available()
    script = f"pl.Trainer(max_steps={1}, accelerator='cpu')"
@pytest.mark.cuda
def test_gpu():
    pl.Trainer(max_steps=1)
"""
    for name, src in (("test_bad.py", bad), ("test_good.py", good)):
        (tmp_path / name).write_text(src)
    found = unnamed_devices(tmp_path)
    # THEN every bad line is found, and nothing of the good file
    assert [f.split(": ", 1)[0].rsplit("/", 1)[-1] for f in found] == [
        "test_bad.py:7",
        "test_bad.py:9",
        "test_bad.py:10",
        "test_bad.py:11",
        "test_bad.py:12",
        "test_bad.py:13",
    ]
