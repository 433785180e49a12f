"""Small models for the advise tests: a stack of transformer blocks, and the by-hand changes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo import Block


class Stack(nn.Module):
    """Four pre-norm transformer blocks in a ModuleList, then a head."""

    def __init__(self, d: int = 128, n: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.blocks = nn.ModuleList([Block(d, 4) for _ in range(n)])
        self.head = nn.Linear(d, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def square_mean(model: nn.Module, batch: Any) -> torch.Tensor:
    return model(batch).pow(2).mean()


def adamw(ps: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(ps, lr=1e-3)


def meta_stack(d: int = 128, n: int = 4) -> nn.Module:
    with torch.device("meta"):
        return Stack(d, n)


def wrap_by_hand(model: nn.Module, container: str, indices: list[int], **kwargs: Any) -> nn.Module:
    """``checkpoint_wrapper`` on ``model.<container>[i]``, as a training script writes it."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    items = model.get_submodule(container)
    for i in indices:
        items[i] = checkpoint_wrapper(items[i], **kwargs)  # type: ignore[index]
    return model


class EverySecondStep(torch.optim.AdamW):
    """AdamW stepping and zeroing on every second call: two micro-batches per optimizer step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps = self.zeros = 0

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        self.steps += 1
        return super().step(closure) if self.steps % 2 == 0 else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.zeros += 1
        if self.zeros % 2 == 0:
            super().zero_grad(set_to_none)
