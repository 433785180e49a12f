"""Per-module bytes rolled up the way a model is built: by block and by module type across blocks.

A transformer's modules are ``layers.0.mlp.up_proj``, ``layers.1.mlp.up_proj``...: a table of
leaves lists dozens of rows of a few percent each. The first numbered part of a path is the
block (``layers.0``); the part after it is the module type (``layers.*.mlp``: every block's
MLP). Modules outside any numbered list (``embed_tokens``, ``lm_head``) stay as they are.
Summing is right for figures that belong to one module each (the saved-tensor bytes a module
saved itself), not for figures that hold their children's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ModuleGroup:
    """Modules rolled up under one name."""

    name: str
    bytes: int
    modules: int
    """How many modules it sums."""
    blocks: int
    """How many blocks they are in (0 outside any block)."""


def _index(parts: list[str]) -> int:
    """Position of the first numbered part (a ``ModuleList`` / ``Sequential`` index), or -1."""
    return next((i for i, p in enumerate(parts) if p.isdigit()), -1)


def block_of(path: str) -> str:
    """``model.layers.3.mlp.up_proj`` -> ``model.layers.3``; a path with no index is itself.

    Example:
        >>> block_of("model.layers.3.mlp.up_proj"), block_of("lm_head")
        ('model.layers.3', 'lm_head')
    """
    parts = path.split(".")
    i = _index(parts)
    return path if i < 0 else ".".join(parts[: i + 1])


def type_of(path: str) -> str:
    """``model.layers.3.mlp.up_proj`` -> ``model.layers.*.mlp``: the block's child, in every block.

    Example:
        >>> type_of("model.layers.3.mlp.up_proj"), type_of("model.layers.3"), type_of("lm_head")
        ('model.layers.*.mlp', 'model.layers.*', 'lm_head')
    """
    parts = path.split(".")
    i = _index(parts)
    return path if i < 0 else ".".join([*parts[:i], "*", *parts[i + 1 : i + 2]])


def has_blocks(paths: Mapping[str, int]) -> bool:
    """Whether any module sits in a numbered list (else a roll-up is the leaves themselves)."""
    return any(_index(p.split(".")) >= 0 for p in paths)


def rolled_up(by_module: Mapping[str, int], key: Callable[[str], str]) -> list[ModuleGroup]:
    """``by_module`` summed by ``key`` (:func:`block_of` or :func:`type_of`), largest first.

    Example:
        >>> [(g.name, g.bytes, g.blocks) for g in rolled_up({"h.0.mlp": 4, "h.1.mlp": 4, "h.0.attn": 2}, type_of)]
        [('h.*.mlp', 8, 2), ('h.*.attn', 2, 1)]
    """
    sums: dict[str, list[int]] = {}
    blocks: dict[str, set[str]] = {}
    for path, n in by_module.items():
        k = key(path)
        s = sums.setdefault(k, [0, 0])
        s[0] += n
        s[1] += 1
        if _index(path.split(".")) >= 0:
            blocks.setdefault(k, set()).add(block_of(path))
    groups = [ModuleGroup(k, s[0], s[1], len(blocks.get(k, ()))) for k, s in sums.items()]
    return sorted(groups, key=lambda g: (-g.bytes, g.name))


def top_groups(groups: list[ModuleGroup], n: int) -> list[ModuleGroup]:
    """The ``n`` largest, then one ``other (k more)`` group for the rest (rows add up to the whole)."""
    if len(groups) <= n + 1:
        return groups
    rest = groups[n:]
    name = f"other ({len(rest)} more)"
    return [*groups[:n], ModuleGroup(name, sum(g.bytes for g in rest), sum(g.modules for g in rest), 0)]


@dataclass(frozen=True)
class SavedRollup:
    """One call's saved-tensor bytes per module, rolled up."""

    label: str
    """The call, as the tables name it (``rank 0 training_step #3``)."""
    total: int
    modules: int
    by_block: list[ModuleGroup]
    by_type: list[ModuleGroup]

    @classmethod
    def of(cls, label: str, by_module: Mapping[str, int]) -> SavedRollup:
        return cls(
            label,
            sum(by_module.values()),
            len(by_module),
            rolled_up(by_module, block_of),
            rolled_up(by_module, type_of),
        )
