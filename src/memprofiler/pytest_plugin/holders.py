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


def _owner_of_dict(d: dict[Any, Any], ignore: set[int]) -> str | None:
    """``module test_x`` or ``Foo instance`` when ``d`` is a module's or object's ``__dict__``."""
    for mod in list(sys.modules.values()):
        if getattr(mod, "__dict__", None) is d:
            return f"module {mod.__name__}"
    refs = gc.get_referrers(d)
    for ref in refs:
        if id(ref) in ignore or ref is refs or isinstance(ref, types.FrameType):
            continue
        if getattr(ref, "__dict__", None) is d:
            return f"{type(ref).__name__} instance"
    return None


def _name_in(d: dict[Any, Any], obj: Any) -> str | None:
    for k, v in d.items():
        if v is obj:
            return str(k)
    return None


def _describe(obj: Any, holder: Any, ignore: set[int], depth: int = 1) -> str | None:
    """How ``holder`` holds ``obj``; for a bare container, also who holds the container."""
    if isinstance(holder, types.ModuleType):
        name = _name_in(vars(holder), obj)
        return f"`{name}` in module {holder.__name__}" if name is not None else None
    if isinstance(holder, dict):
        name = _name_in(holder, obj)
        owner = _owner_of_dict(holder, ignore | {id(holder)})
        if owner is not None and name is not None:
            return f"`{name}` in {owner}" if owner.startswith("module") else f"attribute `{name}` of {owner}"
        return f"dict key {name!r}" if name is not None else None
    if isinstance(holder, _CONTAINERS):
        kind = type(holder).__name__
        if depth <= 0:
            return None  # only named holders of a container are worth showing
        outers = gc.get_referrers(holder)
        for outer in outers:
            if id(outer) in ignore or isinstance(outer, types.FrameType):
                continue
            named = _describe(holder, outer, ignore | {id(holder), id(outers)}, depth - 1)
            if named is not None:
                return f"{kind} {named}"
        return f"a {kind} of {len(holder)} items"
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
        ['list `kept` in module test_leak']
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
