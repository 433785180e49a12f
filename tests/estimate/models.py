"""The panel of models the estimate is checked against (shared by tests and the benchmark).

Each entry builds a module and a batch, and names the loss the measured run uses, so the
estimate and the real CPU step run exactly the same code.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the census
from demo import Block

from census import census_peak

__all__ = ["census_peak"]


class Net(nn.Module):
    """Odd dims so that FSDP shards are padded; two layers in a ModuleList (sharded apart)."""

    SHAPES = [(33, 10), (33,), (7, 33), (7,)]

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(10, 33), nn.Linear(33, 7)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[1](torch.relu(self.layers[0](x)))


def meta_net() -> nn.Module:
    with torch.device("meta"):
        return Net()


class Checkpointed(nn.Module):
    """Two transformer blocks, each under non-reentrant activation checkpointing."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(d, heads), Block(d, heads)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False)
        return x


def square_mean(model: nn.Module, batch: Any) -> torch.Tensor:
    return model(batch).pow(2).mean()


def hf_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    return model(input_ids=batch, labels=batch).loss


def _hf_decoder() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def panel() -> dict[
    str, tuple[Callable[[], nn.Module], Callable[[], Any], Callable[[nn.Module, Any], torch.Tensor]]
]:
    """name -> (build the model, build the batch, the loss)."""
    b, t, d = 4, 16, 32
    return {
        "mlp": (
            lambda: nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)),
            lambda: torch.randn(16, 64),
            square_mean,
        ),
        "conv": (
            lambda: nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(8 * 4 * 4, 5),
            ),
            lambda: torch.randn(2, 3, 8, 8),
            square_mean,
        ),
        "transformer_block": (lambda: Block(d, 4), lambda: torch.randn(b, t, d), square_mean),
        "checkpointed": (lambda: Checkpointed(d, 4), lambda: torch.randn(b, t, d), square_mean),
        "hf_llama": (_hf_decoder, lambda: torch.randint(0, 256, (2, 32)), hf_loss),
    }


def estimate_and_census(
    build: Callable[[], nn.Module],
    batch: Any,
    loss_fn: Any,
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    steps: int = 2,
) -> tuple[int, int]:
    """(the CPU estimate's tensor peak of ``build()`` made on the meta device, :func:`census_peak` of
    the same real CPU steps), both from the same seed."""
    from memprofiler import estimate_memory

    make_opt = optimizer or (lambda ps: torch.optim.AdamW(ps, lr=1e-4))
    torch.manual_seed(0)
    with torch.device("meta"):
        meta = build()
    meta.train()
    est = estimate_memory(meta, batch, optimizer=make_opt, loss_fn=loss_fn, device="cpu", steps=steps)
    torch.manual_seed(0)
    model = build()
    model.train()
    return est.tensor_peak_bytes, census_peak(
        model, batch, make_opt(model.parameters()), loss_fn, steps=steps
    )
