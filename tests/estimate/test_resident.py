"""Parameters, gradients and optimizer state equal their analytic bytes, for every world size."""

from __future__ import annotations

import math

import pytest
import torch
from models import Net, meta_net
from torch import nn

from memprofiler.errors import ConfigError
from memprofiler.estimate import estimate_memory
from memprofiler.estimate.parallel.strategies import ddp_buckets

ADAM = lambda ps: torch.optim.Adam(ps, lr=1e-3)  # noqa: E731
F32 = 4


SHAPES = Net.SHAPES
TOTAL = F32 * sum(math.prod(s) for s in SHAPES)


def rank0_shard_bytes(ws: int) -> tuple[int, int]:
    """(padded shard bytes, rank 0's unpadded local bytes), as FSDP2 splits dim 0."""
    padded = local = 0
    for shape in SHAPES:
        rows = math.ceil(shape[0] / ws)
        per_row = math.prod(shape[1:]) * F32
        padded += rows * per_row
        local += min(rows, shape[0]) * per_row
    return padded, local


@pytest.mark.parametrize("strategy,ws", [("single", 1), ("ddp", 2), ("ddp", 8)])
def test_replicated_strategies_hold_the_full_model(strategy, ws):
    est = estimate_memory(meta_net(), torch.randn(4, 10), optimizer=ADAM, strategy=strategy, world_size=ws)
    assert est.resident == {
        "parameters": TOTAL,
        "buffers": 0,
        "gradients": TOTAL,
        "optimizer_state": 2 * TOTAL,  # Adam's step counts stay on the host (CUDA target)
    }
    assert est.world_size == ws


def test_ddp_adds_gradient_buckets_of_every_gradient():
    # GIVEN DDP's bucket rule: first bucket 1 MiB, later 25 MiB, reverse parameter order
    est = estimate_memory(meta_net(), torch.randn(4, 10), optimizer=ADAM, strategy="ddp", world_size=2)
    # THEN the buckets (one here: the model is under 1 MiB) hold every gradient once
    assert est.by_category["ddp_buckets"] == TOTAL
    with torch.device("meta"):
        big = nn.Sequential(nn.Linear(1024, 512), nn.Linear(512, 1024))
    w2, b2, w1, b1 = 1024 * 512 * F32, 1024 * F32, 512 * 1024 * F32, 512 * F32
    # reversed: bias2 + weight2 passes 1 MiB and closes bucket 1; the rest goes in bucket 2
    assert ddp_buckets(big) == [b2 + w2, b1 + w1]


@pytest.mark.parametrize("ws", [1, 2, 8, 1024])
def test_fsdp_shards_are_the_padded_dim0_chunks(ws):
    padded, local = rank0_shard_bytes(ws)
    est = estimate_memory(meta_net(), torch.randn(4, 10), optimizer=ADAM, strategy="fsdp", world_size=ws)
    # THEN parameters and gradients take the padded shard, Adam's state the unpadded local
    # shard twice plus one float32 step per parameter
    assert est.resident == {
        "parameters": padded,
        "buffers": 0,
        "gradients": padded,
        "optimizer_state": 2 * local,  # the step counts stay on the host
    }


def test_unsupported_strategy_says_so_in_one_line():
    with pytest.raises(
        ConfigError, match=r"^`strategy`: got 'pp'; .*pipeline parallelism is `EstimatePlan\(pipeline=...\)`"
    ):
        estimate_memory(meta_net(), torch.randn(4, 10), optimizer=ADAM, strategy="pp")
    # tensor parallelism needs the model's own plan, which estimate_plan takes
    with pytest.raises(ConfigError, match=r"^`parallelize`: strategy 'tp' needs"):
        estimate_memory(meta_net(), torch.randn(4, 10), optimizer=ADAM, strategy="tp", world_size=2)


def test_single_with_many_ranks_is_rejected():
    with pytest.raises(ConfigError, match=r"^`world_size`: got 8 with strategy 'single'"):
        estimate_memory(meta_net(), torch.randn(4, 10), optimizer=ADAM, world_size=8)


def test_the_callers_model_is_not_touched():
    net = Net()
    before = [p.detach().clone() for p in net.parameters()]
    estimate_memory(net, torch.randn(4, 10), optimizer=ADAM)
    assert all(torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))
    assert all(p.grad is None for p in net.parameters())


def test_fsdp_first_estimate_in_a_process_equals_the_next():
    # GIVEN shapes no other test shards (DTensor caches its sharding inference per process)
    def once() -> dict[str, int]:
        with torch.device("meta"):
            net = nn.Sequential(nn.Linear(13, 29), nn.Linear(29, 3))
        est = estimate_memory(net, torch.randn(1, 13), optimizer=ADAM, strategy="fsdp", world_size=3, steps=1)
        return {"peak": est.tensor_peak_bytes, **est.by_category}

    # THEN the first estimate counts no tensors of DTensor's one-off sharding inference
    assert once() == once()
