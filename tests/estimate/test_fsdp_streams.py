"""FSDP2's streams in the allocator model: each block in the pool of the stream it was allocated on.

The block lifetimes below are derived by hand from torch's FSDP2 source
(``torch/distributed/fsdp/_fully_shard/``, see ``estimate/parallel/fsdp_streams.py``) for a
model of two ``Linear(1024, 1024, bias=False)`` blocks, each ``fully_shard``-ed, on 2 ranks:

- forward: each block's all-gather output (the whole weight, 4 MiB in float32) is allocated
  on the all-gather copy-in stream (``foreach_all_gather``); the first is freed at the second
  block's copy-out (``wait_for_unshard`` drops ``comm_ctx.all_gather_state``), the second when
  the root's post-forward drops it;
- backward: block 1's pre-backward all-gathers (allocated, copied out, freed), then prefetches
  block 0 (allocated), freed at block 0's copy-out;
- each post-backward allocates the reduce-scatter output (the 2 MiB shard of the gradient) on
  the reduce-scatter stream (``foreach_reduce``); the sharded gradients are views of it and
  live until ``zero_grad``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from memprofiler.estimate import EstimatePlan, estimate_plan
from memprofiler.estimate.allocator.caching import AllocatorReplay
from memprofiler.estimate.parallel.fsdp_streams import stream_names
from memprofiler.estimate.probe import Probe

MiB = 1 << 20


class TwoBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(1024, 1024, bias=False) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


class Pools(Probe):
    """Keeps the tracker and the prepared model to read the allocator's pools after the steps."""

    def steps_start(self, model: nn.Module, optimizer: torch.optim.Optimizer, tracker: Any) -> None:
        self.model, self.tracker = model, tracker

    def by_name(self) -> dict[str, Any]:
        names = stream_names(self.model, self.tracker.streams)
        return {names[s]: f for s, f in self.tracker.ledger.allocator.by_stream.items()}


def _estimate(**options: Any) -> tuple[Any, dict[str, Any]]:
    with torch.device("meta"):
        model = TwoBlocks()
    plan = EstimatePlan(
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        loss_fn=lambda m, b: m(b).sum(),
        strategy="fsdp",
        world_size=2,
        device="cuda",
        gpu="H100",
        **options,
    )
    probe = Pools()
    est = estimate_plan(model, torch.randn(4, 1024), plan, probe=probe)
    return est, probe.by_name()


def _replay(events: list[tuple[str, int, int]], stream: int) -> AllocatorReplay:
    """The hand-derived (action, key, bytes) lifetimes, all on ``stream``."""
    r = AllocatorReplay()
    for action, key, n in events:
        if action == "alloc":
            r.alloc(key, n, stream)
        else:
            r.free(key)
    return r


def _copy_in_events(gathered: int, cast: int = 0) -> list[tuple[str, int, int]]:
    """Two steps of the all-gather copy-in stream: ``gathered`` bytes per block's output and, with
    a mixed-precision ``param_dtype``, a ``cast`` copy of the shard freed once copied in."""
    out: list[tuple[str, int, int]] = []
    key = 0

    def gather() -> int:
        nonlocal key
        key += 1
        if cast:
            out.append(("alloc", 1000 + key, cast))
        out.append(("alloc", key, gathered))
        if cast:
            out.append(("free", 1000 + key, 0))
        return key

    for _ in range(2):
        fw0 = gather()
        fw1 = gather()  # block 1's unshard, before its copy-out frees block 0's output
        out.append(("free", fw0, 0))
        out.append(("free", fw1, 0))  # the root's post-forward
        bw1 = gather()
        out.append(("free", bw1, 0))  # copied out in backward: freed at once
        bw0 = gather()  # prefetched by block 1's pre-backward
        out.append(("free", bw0, 0))
    return out


def _reduce_scatter_events(shard: int) -> list[tuple[str, int, int]]:
    out: list[tuple[str, int, int]] = []
    for step in range(2):
        out += [("alloc", 10 * step + 1, shard), ("alloc", 10 * step + 2, shard)]
        out += [("free", 10 * step + 1, 0), ("free", 10 * step + 2, 0)]  # zero_grad
    return out


def test_a_block_freed_in_one_streams_pool_is_not_reused_by_another():
    # GIVEN a 4 MiB block allocated and freed on stream 1
    r = AllocatorReplay()
    r.alloc(1, 4 * MiB, stream=1)
    r.free(1)
    # WHEN the default stream asks for the same size
    r.alloc(2, 4 * MiB, stream=0)
    # THEN it gets a segment of its own, and stream 1 keeps its cached one
    assert r.reserved == 40 * MiB
    assert (r.by_stream[0].reserved, r.by_stream[1].reserved) == (20 * MiB, 20 * MiB)
    assert (r.by_stream[0].allocated, r.by_stream[1].allocated) == (4 * MiB, 0)
    # WHEN stream 1 asks again THEN its own cached block serves it
    r.alloc(3, 4 * MiB, stream=1)
    assert r.reserved == 40 * MiB and r.by_stream[1].peak_allocated == 4 * MiB


@pytest.mark.parametrize(
    ("options", "gathered", "cast", "shard"),
    [
        ({}, 4 * MiB, 0, 2 * MiB),
        # bf16 all-gather: a 2 MiB output per block, after a 1 MiB cast of the shard (small pool);
        # fp32 reduce: the 2 MiB float32 shard of the gradient
        ({"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32}, 2 * MiB, 1 * MiB, 2 * MiB),
    ],
    ids=["fp32", "bf16-params-fp32-reduce"],
)
def test_fsdp2_side_streams_hold_the_hand_derived_blocks(options, gathered, cast, shard):
    # GIVEN two fully_shard-ed blocks on 2 ranks, estimated for a CUDA target
    est, pools = _estimate(**options)
    # WHEN the hand-derived lifetimes of FSDP2's side streams are replayed on their own
    copy_in = _replay(_copy_in_events(gathered, cast), stream=1)
    reduce_scatter = _replay(_reduce_scatter_events(shard), stream=2)
    # THEN the estimate's pools of those streams hold exactly those blocks
    for name, want in (("all-gather copy-in", copy_in), ("reduce-scatter", reduce_scatter)):
        got = pools[name]
        assert (got.peak_allocated, got.peak_reserved) == (want.peak_allocated, want.peak_reserved), name
    assert pools["all-gather copy-in"].peak_allocated == 2 * gathered + cast
    assert pools["reduce-scatter"].peak_reserved == 20 * MiB  # one large segment, never shared
    # AND the reserved peak is the sum of every stream's own segments (none released)
    assert est.reserved_peak_bytes == sum(f.peak_reserved for f in pools.values())
    assert set(pools) == {"default", "all-gather copy-in", "reduce-scatter"}


def test_a_single_device_estimate_has_one_pool():
    # GIVEN the same model without FSDP WHEN estimated THEN every block is on the default stream
    with torch.device("meta"):
        model = TwoBlocks()
    probe = Pools()
    plan = EstimatePlan(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), device="cuda", gpu="H100")
    est = estimate_plan(model, torch.randn(4, 1024), plan, probe=probe)
    assert list(probe.by_name()) == ["default"]
    assert est.reserved_peak_bytes == probe.by_name()["default"].peak_reserved
