"""Who holds a leaked object: the global, attribute or container that keeps it alive.

Only Python references can be named (``gc.get_referrers``); a tensor kept by an autograd graph
or by C++ code has no Python holder and gets none. Runs only when a leak is found.
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterable
from typing import Any

_CONTAINERS = (list, tuple, set, frozenset, dict)


def _owner_of_dict(d: dict[Any, Any], ignore: set[int]) -> tuple[str, str] | None:
    """(kind, name) when ``d`` is a namespace: ``("module", "helpers")``, ``("class", "TestHeld")``
    or ``("instance", "Foo")``; ``None`` for a plain dict."""
    for mod in list(sys.modules.values()):
        if getattr(mod, "__dict__", None) is d:
            return "module", mod.__name__
    refs = gc.get_referrers(d)
    for ref in refs:
        if id(ref) in ignore or ref is refs or isinstance(ref, types.FrameType):
            continue
        if isinstance(ref, type):
            # A class's ``__dict__`` is a read-only proxy of this dict: the class refers to it.
            if any(inner is d for inner in gc.get_referents(ref)):
                return "class", ref.__qualname__
        elif getattr(ref, "__dict__", None) is d:
            return "instance", type(ref).__name__
    return None


def _name_in(d: dict[Any, Any], obj: Any) -> str | None:
    for k, v in d.items():
        if v is obj:
            return str(k)
    return None


def _in_namespace(owner: tuple[str, str], name: str) -> str:
    kind, owner_name = owner
    if kind == "module":
        return f"`{owner_name}.{name}`"
    if kind == "class":
        return f"`{owner_name}.{name}` (class attribute)"
    return f"attribute `{name}` of {owner_name} instance"


def _held_by_name(holder: Any, ignore: set[int], depth: int) -> str | None:
    """The named holder of a bare container (a global, an attribute), if any."""
    if depth <= 0:
        return None  # only named holders of a container are worth showing
    outers = gc.get_referrers(holder)
    found: list[str] = []
    for outer in outers:
        if id(outer) in ignore or isinstance(outer, types.FrameType):
            continue
        named = _describe(holder, outer, ignore | {id(holder), id(outers)}, depth - 1)
        if named is not None:
            found.append(named)
    # A global or a class attribute is what the user wrote; an instance attribute may be a
    # framework's passing reference (pytest's hook recorder holds every collected attribute).
    return min(found, key=lambda n: (not n.startswith("`"), n)) if found else None


def _describe(obj: Any, holder: Any, ignore: set[int], depth: int = 1) -> str | None:
    """How ``holder`` holds ``obj``; for a bare container, also who holds the container."""
    if isinstance(holder, types.ModuleType):
        name = _name_in(vars(holder), obj)
        return f"`{holder.__name__}.{name}`" if name is not None else None
    if isinstance(holder, dict):
        name = _name_in(holder, obj)
        if name is None:
            return None
        owner = _owner_of_dict(holder, ignore | {id(holder)})
        if owner is not None:
            return _in_namespace(owner, name)
        named = _held_by_name(holder, ignore, depth)
        return f"dict {named}, key {name!r}" if named is not None else f"dict key {name!r}"
    if isinstance(holder, _CONTAINERS):
        kind = type(holder).__name__
        if depth <= 0:
            return None
        named = _held_by_name(holder, ignore, depth)
        return f"{kind} {named}" if named is not None else f"a {kind} of {len(holder)} items"
    # Python 3.11+ keeps an instance's attributes inline: the instance itself is the referrer.
    attrs = getattr(holder, "__dict__", None)
    if isinstance(attrs, dict) and not isinstance(holder, type):
        name = _name_in(attrs, obj)
        if name is not None:
            return f"attribute `{name}` of {type(holder).__name__} instance"
    return None


def holders(objs: Iterable[Any], limit: int = 3, exclude: Iterable[Any] = ()) -> list[str]:
    """Up to ``limit`` distinct descriptions of what holds ``objs``, most objects first.

    Args:
        objs: the leaked objects.
        limit: how many descriptions at most.
        exclude: the caller's own containers of them, not to be named as holders.

    Example:
        >>> kept = [object()]
        >>> holders(kept)  # doctest: +SKIP
        ['list `test_leak.kept`']
    """
    given = objs
    objs = list(objs)
    ignore = {id(objs), id(given), *(id(e) for e in exclude)}
    counts: dict[str, int] = {}
    for obj in objs:
        found = set()
        referrers = gc.get_referrers(obj)
        for holder in referrers:
            if id(holder) in ignore or isinstance(holder, types.FrameType):
                continue
            text = _describe(obj, holder, ignore | {id(obj), id(referrers)})
            if text is not None:
                found.add(text)
        for text in found:
            counts[text] = counts.get(text, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [text for text, _ in ranked[:limit]]
