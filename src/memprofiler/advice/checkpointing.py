"""Activation checkpointing as ``advise`` applies it: the model's blocks, and which of them to wrap.

Blocks are the items of the model's repeated containers: every ``nn.ModuleList`` (or
``nn.Sequential`` of two or more modules of one class) whose items hold parameters, outside
another block. A decoder's layers, an encoder-decoder's two stacks, a ResNet's stages' blocks.
Each chosen block is wrapped with torch's ``checkpoint_wrapper`` (non-reentrant), as a training
script does; ``selective`` passes torchtitan's per-op policy as its ``context_fn``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memprofiler.errors import ConfigError
from memprofiler.estimate.named import caching_configs


@dataclass(frozen=True)
class Checkpoint:
    """Which blocks (indices into :func:`blocks`' list) are checkpointed, and how."""

    blocks: tuple[int, ...]
    selective: bool = False
    """Save the output of every other matrix product and of attention; recompute the rest."""


def _wrapped(module: nn.Module) -> bool:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return isinstance(module, CheckpointWrapper)


def _repeated(container: nn.Module) -> bool:
    items = list(container.children())
    if isinstance(container, nn.ModuleList):
        return bool(items) and all(any(True for _ in m.parameters()) for m in items)
    if type(container) is nn.Sequential:
        kinds = {type(m) for m in items}
        return len(items) >= 2 and len(kinds) == 1 and all(any(True for _ in m.parameters()) for m in items)
    return False


def blocks(model: nn.Module) -> list[tuple[str, nn.Module, int]]:
    """``(qualified name of the container, the container, index)`` of every block, in model order."""
    found: list[tuple[str, nn.Module, int]] = []
    inside: list[str] = []
    for name, mod in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in inside):
            continue
        if _repeated(mod):
            found.extend((name, mod, i) for i in range(len(list(mod.children()))))
            inside.append(name)
    return found


def checkpointed_already(model: nn.Module) -> bool:
    """Whether the model already checkpoints (a ``checkpoint_wrapper`` or transformers' switch)."""
    return any(_wrapped(m) or getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def need_blocks(model: nn.Module, key: str) -> int:
    """The number of blocks; one line naming ``key`` when the model has none."""
    n = len(blocks(model))
    if n == 0:
        raise ConfigError(
            key,
            f"{type(model).__name__} has no blocks to checkpoint (no nn.ModuleList, nor an nn.Sequential "
            "of repeated modules, holds its layers); leave activation checkpointing out of `candidates`",
        )
    return n


#: The ops whose outputs selective checkpointing keeps (torchtitan's per-op policy): matrix products
#: (every other one) and attention.
_MATMULS = ("mm", "addmm")
_ATTENTION = (
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)


def _ops(names: tuple[str, ...]) -> set[Any]:
    return {getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n)}


def selective_context() -> Any:
    """A fresh pair of selective-checkpoint contexts: each call counts its own matrix products."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    matmuls, attention = _ops(_MATMULS), _ops(_ATTENTION)
    counts: dict[bool, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func in matmuls:
            counts[ctx.is_recompute] += 1
            keep = counts[ctx.is_recompute] % 2 == 1
        else:
            keep = func in attention
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply(model: nn.Module, plan: Checkpoint) -> None:
    """Wrap the chosen blocks of ``model`` (a copy) in place."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    found = blocks(model)
    # a cache filled in forward differs in the recomputation: transformers turns it off too
    for _, config in caching_configs(model):
        config.use_cache = False
    kwargs: dict[str, Any] = {"context_fn": selective_context} if plan.selective else {}
    for i in plan.blocks:
        _, container, index = found[i]
        items: Any = container
        items[index] = checkpoint_wrapper(items[index], **kwargs)


def pick(n_blocks: int, count: int) -> tuple[int, ...]:
    """The first ``count`` blocks: their activations are held longest, from forward to the end of backward."""
    return tuple(range(min(count, n_blocks)))


def every(n_blocks: int, k: int) -> tuple[int, ...]:
    """Every ``k``-th block, starting with the first."""
    return tuple(range(0, n_blocks, k))
