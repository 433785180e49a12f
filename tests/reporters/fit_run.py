"""A run whose saved bytes per block are known exactly: four MLP blocks of different widths.

Block ``i`` is ``Linear(D, H[i]) -> ReLU -> Linear(H[i], D)``. In a step on a batch of ``B`` rows,
its first Linear saves the block's input (``B x D``, the previous block's output, saved by nothing
before it) and its ReLU saves its output (``B x H[i]``, which the second Linear saves again: one
storage, counted once); the Linears' transposed weights are parameters, not counted. So block
``i`` saves ``4 * B * (D + H[i])`` bytes, and checkpointed it keeps only its input: ``4 * B * D``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memprofiler import MemProfiler

D, B = 32, 64
H = (256, 64, 512, 128)
F32 = 4


def block_saved(i: int) -> int:
    """Bytes block ``i`` saves for backward (its input and its hidden activation)."""
    return F32 * B * (D + H[i])


def block_input() -> int:
    """Bytes a checkpointed block still saves: its input."""
    return F32 * B * D


class Mlps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(D, h), nn.ReLU(), nn.Linear(h, D)) for h in H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return x


def collect(net: nn.Module, out: Path) -> dict[str, Any]:
    """One profiled CPU training step of ``net`` written under ``out``; its ``end`` snapshot."""
    x = torch.randn(B, D, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no CUDA here: said once, and not what is tested
        prof = MemProfiler({"schedule": {"warmup": 0, "active": 1}}, save_dir=out, rank=0).setup(net)
        with prof.profile("training_step", module=net):
            net(x).pow(2).mean().backward()
        prof.teardown()
    return dict(prof.snapshots["0.training_step.1.end"])


def mlps() -> nn.Module:
    torch.manual_seed(0)
    return Mlps()
