"""Which private torch names a source tree uses, read from its code (nothing is imported).

Three kinds: a name imported or reached by an attribute chain from ``torch`` (or a name
imported from it) with a private part (``torch._C._foo``, ``torch.utils._pytree.tree_map``); a
private method a class overrides in a torch base class; a private attribute such a class reads
from its torch base (``self._mod_tracker``).
"""

from __future__ import annotations

import ast
from pathlib import Path


def private(dotted: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in dotted.split("."))


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None when the chain does not start at a plain name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the torch dotted name it stands for."""
    out = {"torch": "torch"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    out[a.asname or "torch"] = a.name if a.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _class_uses(cls: ast.ClassDef, base: str) -> set[str]:
    """``base.<_name>`` for each private method ``cls`` defines and private ``self.`` attribute it
    reads without setting it."""
    own = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    out = {f"{base}.{m}" for m in own if private(m)}
    stored = {
        n.attr
        for n in ast.walk(cls)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and _chain(n) == ["self", n.attr]
    }
    for n in ast.walk(cls):
        read = isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and _chain(n) == ["self", n.attr]
        if read and private(n.attr) and n.attr not in own and n.attr not in stored:
            out.add(f"{base}.{n.attr}")
    return out


def used_names(root: Path) -> dict[str, set[str]]:
    """Private torch name -> the files under ``root`` that use it."""
    found: dict[str, set[str]] = {}
    for file in sorted(root.rglob("*.py")):
        tree = ast.parse(file.read_text(encoding="utf-8"))
        aliases = _aliases(tree)
        names = {v for v in aliases.values() if private(v)}
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and id(node) not in inner:  # a whole chain
                chain = _chain(node)
                if chain and chain[0] in aliases:
                    names.add(".".join([aliases[chain[0]], *chain[1:]]))
            elif isinstance(node, ast.ClassDef):
                for b in node.bases:
                    chain = _chain(b)
                    if chain and chain[0] in aliases and chain != ["torch"]:
                        names |= _class_uses(node, ".".join([aliases[chain[0]], *chain[1:]]))
        for name in names:
            if private(name):
                found.setdefault(name, set()).add(str(file.relative_to(root)))
    return found
