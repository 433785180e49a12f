"""The compiled pack hook: built wherever the install found a C compiler, and as safe as the Python one."""

from __future__ import annotations

import gc
import shutil
import sysconfig
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from memprofiler.collectors import saved_tensors
from memprofiler.collectors.saved_tensors import SavedTensorsCollector

F32 = 4


def test_the_pack_hook_is_compiled_where_a_compiler_is():
    cc = (sysconfig.get_config_var("CC") or "").split()
    if not cc or shutil.which(cc[0]) is None:
        pytest.skip("no C compiler here: the Python pack hook runs, with the same figures")
    assert saved_tensors._CPacker is not None, (
        "memprofiler._packer was not built although a C compiler is here: "
        "reinstall with `pip install -e .` and read the compiler's error"
    )
    assert type(SavedTensorsCollector()._p) is saved_tensors._CPacker
    assert type(SavedTensorsCollector(compiled=False)._p) is saved_tensors._PyPacker


def _mlp() -> tuple[nn.Module, torch.Tensor, SimpleNamespace]:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return (
        mlp,
        torch.randn(2, 8),
        SimpleNamespace(module=mlp, closes_window=False, fn_name="step", scratch={}),
    )


@pytest.mark.usefixtures("packer")
def test_a_packer_whose_state_is_broken_warns_once_and_training_goes_on():
    # GIVEN a collected call whose packer state is replaced by something it cannot read
    mlp, x, ctx = _mlp()
    warnings: list[str] = []
    coll = SavedTensorsCollector(warn=warnings.append)
    expected = torch.autograd.grad(mlp(x).pow(2).mean(), mlp[0].weight)[0]
    coll.start(ctx)
    coll._p.held = None  # type: ignore[assignment]
    loss = mlp(x).pow(2).mean()
    out = coll.end(ctx, True)
    # THEN no saved-tensor figures, one warning naming the hook, and exact gradients
    assert out == {}
    assert len(warnings) == 1 and "`saved_tensors` pack hook raised" in warnings[0]
    assert torch.equal(torch.autograd.grad(loss, mlp[0].weight)[0], expected)


@pytest.mark.usefixtures("packer")
def test_a_graph_kept_past_the_call_and_the_collector_is_still_exact():
    # GIVEN a graph built in a collected call and kept after the collector is gone
    mlp, x, ctx = _mlp()
    coll = SavedTensorsCollector()
    expected = torch.autograd.grad(mlp(x).pow(2).mean(), mlp[2].weight)[0]
    coll.start(ctx)
    loss = mlp(x).pow(2).mean()
    out = coll.end(ctx, True)
    del coll
    gc.collect()
    # THEN its figures are the analytic ones and backward later gives the same gradients
    assert out["saved_tensors.unique_bytes"] == F32 * (2 * 8 + 2 * 16 + 2 * 4)
    assert torch.equal(torch.autograd.grad(loss, mlp[2].weight)[0], expected)
    del loss
    gc.collect()
