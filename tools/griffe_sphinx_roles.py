"""A Griffe extension for the API page: Sphinx roles in docstrings become Markdown.

The docstrings cross-reference with Sphinx roles (``:class:`~memprofiler.MemProfiler```,
``:meth:`bind```), which mkdocstrings prints as they are. This rewrites each role as code, and as
a link where the target is an object the API page shows (under one of its ``::: identifier``
lines, public and with a docstring), so a link never points at a missing anchor.
Loaded by ``mkdocs.yml`` (``extensions:`` of the python handler).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from griffe import Alias, Extension, GriffeLoader, Object

ROOT = Path(__file__).resolve().parents[1]
API_PAGE = ROOT / "docs" / "reference" / "api.md"

#: ``:class:`x```, ``:py:meth:`~a.b.c```: the roles the docstrings use.
ROLE = re.compile(
    r":(?:py:)?(?:class|mod|func|meth|data|attr|exc|obj|const):`(?P<tilde>~?)(?P<target>[^`]+)`"
)
_IDENT = re.compile(r"^::: (\S+)\s*$", re.MULTILINE)


def documented_roots(page: Path = API_PAGE) -> tuple[str, ...]:
    """The identifiers the API page renders (its ``::: identifier`` lines)."""
    return tuple(_IDENT.findall(page.read_text(encoding="utf-8")))


def _lookup(scope: Object | Alias, path: str) -> Object | Alias | None:
    try:
        return scope[path]  # type: ignore[no-any-return]
    except Exception:  # not there, or an alias the loader cannot resolve
        return None


def _resolve(obj: Object, target: str) -> Object | Alias | None:
    """What ``target`` names, seen from ``obj`` as Sphinx would: its own scopes, then absolute."""
    scope: Object | None = obj
    while scope is not None:
        found = _lookup(scope, target)
        if found is not None:
            return found
        scope = scope.parent
    head, _, rest = target.partition(".")
    package = obj.package
    if head == package.name:
        return package if not rest else _lookup(package, rest)
    return None


def _shown(found: Object | Alias, roots: tuple[str, ...]) -> str | None:
    """``found``'s path on the API page, or None when the page does not render it."""
    try:
        final = found.final_target if isinstance(found, Alias) else found
        path = final.path
        has_doc = final.docstring is not None
    except Exception:  # an alias into a package the loader did not load
        return None
    for root in roots:
        if path == root:
            return path
        if path.startswith(root + ".") and has_doc:
            rest = path[len(root) + 1 :].split(".")
            if all(not part.startswith("_") for part in rest):
                return path
    return None


def rewrite(text: str, obj: Object, roots: tuple[str, ...]) -> str:
    """``text`` with each Sphinx role as inline code, linked where the API page shows the target."""

    def one(m: re.Match[str]) -> str:
        target = m["target"].strip()
        label = target.rsplit(".", 1)[-1] if m["tilde"] else target
        found = _resolve(obj, target)
        path = _shown(found, roots) if found is not None else None
        return f"[`{label}`][{path}]" if path else f"`{label}`"

    return ROLE.sub(one, text)


class SphinxRoles(Extension):
    """Rewrite the Sphinx roles of every loaded docstring once the package is loaded."""

    def __init__(self, **_: Any) -> None:
        super().__init__()
        self.roots = documented_roots()

    def on_package(self, *, pkg: Object, loader: GriffeLoader, **kwargs: Any) -> None:
        self._walk(pkg, set())

    def _walk(self, obj: Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = rewrite(obj.docstring.value, obj, self.roots)
        for member in obj.members.values():
            if not isinstance(member, Alias):
                self._walk(member, seen)
