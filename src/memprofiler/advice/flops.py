"""FLOPs of the base step's forward, per block and per op, read while the base estimate runs.

The recorder is a dispatch mode entered inside the estimate's loss function, so it sees the
forward exactly as the estimate runs it (fake tensors, the batch's known values) and costs no
extra run. Checkpointing a block recomputes its forward in backward: its recomputed FLOPs are
its forward FLOPs, less what selective checkpointing keeps (:mod:`.checkpointing`'s policy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from memprofiler.advice import checkpointing


@dataclass
class ForwardFlops:
    """One forward's FLOPs: in all, per block, and what selective checkpointing keeps per block."""

    total: int = 0
    per_block: dict[int, int] = field(default_factory=dict)
    kept_selective: dict[int, int] = field(default_factory=dict)
    recorded: bool = False

    def step(self) -> int:
        """A step's FLOPs, forward plus a backward of twice the forward (the usual ratio for matmuls)."""
        return 3 * self.total

    def recomputed(self, plan: checkpointing.Checkpoint) -> int:
        """FLOPs the checkpointed blocks run again in backward."""
        out = 0
        for i in plan.blocks:
            out += self.per_block.get(i, 0)
            if plan.selective:
                out -= self.kept_selective.get(i, 0)
        return out


class _Recorder(TorchDispatchMode):
    def __init__(self, into: ForwardFlops) -> None:
        super().__init__()
        self.into = into
        self.block: int | None = None
        self.matmuls_in_block = 0
        self.matmuls = checkpointing._ops(checkpointing._MATMULS)
        self.attention = checkpointing._ops(checkpointing._ATTENTION)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.utils.flop_counter import flop_registry

        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        if count is None:
            return out
        n = int(count(*args, **kwargs, out_val=out))
        self.into.total += n
        if self.block is not None:
            self.into.per_block[self.block] = self.into.per_block.get(self.block, 0) + n
            kept = func in self.attention
            if func in self.matmuls:
                self.matmuls_in_block += 1
                kept = self.matmuls_in_block % 2 == 1
            if kept:
                self.into.kept_selective[self.block] = self.into.kept_selective.get(self.block, 0) + n
        return out


def recording(
    loss_fn: Callable[[nn.Module, Any], torch.Tensor], into: ForwardFlops
) -> Callable[[nn.Module, Any], torch.Tensor]:
    """``loss_fn`` that records the FLOPs of its first call's forward into ``into``."""

    def run(model: nn.Module, batch: Any) -> torch.Tensor:
        if into.recorded:
            return loss_fn(model, batch)
        into.recorded = True
        rec = _Recorder(into)
        handles = []
        for i, (_, container, index) in enumerate(checkpointing.blocks(model)):
            block = list(container.children())[index]
            handles.append(block.register_forward_pre_hook(_enter(rec, i)))
            handles.append(block.register_forward_hook(_leave(rec)))
        try:
            with rec:
                return loss_fn(model, batch)
        finally:
            for h in handles:
                h.remove()

    return run


def _enter(rec: _Recorder, i: int) -> Any:
    def hook(module: nn.Module, args: Any) -> None:
        rec.block, rec.matmuls_in_block = i, 0

    return hook


def _leave(rec: _Recorder) -> Any:
    def hook(module: nn.Module, args: Any, out: Any) -> None:
        rec.block = None

    return hook
