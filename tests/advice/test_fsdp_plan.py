"""FSDP2 as a script applies it (mixed precision, reshard_after_forward, HSDP): each advised
figure equals the estimate of the plan with FSDP2 applied that way by hand."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from advice_models import adamw, meta_stack, square_mean

from memprofiler import advise
from memprofiler.estimate import EstimatePlan, estimate_plan

pytestmark = pytest.mark.slow  # sharded estimates, a few seconds each

BATCH = torch.randn(8, 64, 128, generator=torch.Generator().manual_seed(0))


def _by_hand(world_size: int, mesh_shape: Any = None, **fully_shard_kw: Any) -> tuple[int, int]:
    from torch.distributed.fsdp import fully_shard

    def parallelize(model: torch.nn.Module, mesh: Any) -> None:
        for block in model.blocks:
            fully_shard(block, mesh=mesh, **fully_shard_kw)
        root = {k: v for k, v in fully_shard_kw.items() if k != "reshard_after_forward"}
        fully_shard(model, mesh=mesh, **root)

    plan = EstimatePlan(
        optimizer=adamw,
        loss_fn=square_mean,
        strategy="fsdp",
        world_size=world_size,
        parallelize=parallelize,
        mesh_shape=mesh_shape,
        mesh_dim_names=("replicate", "shard") if mesh_shape else None,
    )
    e = estimate_plan(meta_stack(), BATCH, plan)
    return e.peak_bytes, e.reserved_peak_bytes


def test_mixed_precision_and_resharding_are_the_plans_applied_by_hand():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    # GIVEN an FSDP2 plan over 2 ranks that keeps gathered parameters through backward
    advice = advise(
        meta_stack(),
        BATCH,
        optimizer=adamw,
        loss_fn=square_mean,
        budget="8GiB",
        strategy="fsdp",
        world_size=2,
        reshard_after_forward=False,
        progress=False,
        candidates=["fsdp-mixed-precision", "reshard-after-forward"],
    )
    rows = {r.names: r for r in advice.rows}
    # THEN the base and each change are those plans estimated
    assert (advice.base.peak_bytes, advice.base.reserved_bytes) == _by_hand(2, reshard_after_forward=False)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    row = rows[("fsdp-mixed-precision",)]
    assert (row.peak_bytes, row.reserved_bytes) == _by_hand(2, reshard_after_forward=False, mp_policy=mp)
    assert row.cost.comm_bytes < 0
    row = rows[("reshard-after-forward",)]
    assert (row.peak_bytes, row.reserved_bytes) == _by_hand(2, reshard_after_forward=True)
    assert row.cost.comm_bytes == sum(p.numel() for p in meta_stack().parameters()) * 4 // 2


def test_a_larger_shard_group_of_an_hsdp_plan_is_that_mesh_estimated():
    advice = advise(
        meta_stack(),
        BATCH,
        optimizer=adamw,
        loss_fn=square_mean,
        budget="8GiB",
        strategy="fsdp",
        world_size=8,
        mesh_shape=(4, 2),
        candidates=["larger-shard-group"],
        progress=False,
    )
    assert (advice.base.peak_bytes, advice.base.reserved_bytes) == _by_hand(8, (4, 2))
    (row,) = advice.rows
    assert (row.peak_bytes, row.reserved_bytes) == _by_hand(8, (2, 4))
    assert row.saved_bytes > 0


def test_offload_is_named_as_not_estimable():
    advice = advise(
        meta_stack(),
        BATCH,
        optimizer=adamw,
        loss_fn=square_mean,
        budget="8GiB",
        strategy="fsdp",
        world_size=2,
        candidates=["cpu-offload"],
        progress=False,
    )
    assert "pins host memory" in advice.skipped["cpu-offload"]
