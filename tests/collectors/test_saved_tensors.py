"""Saved-tensor bytes against analytic truth: each storage once, parameters excluded."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import checkpoint

from memprofiler import MemProfiler

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo import Block

# Each test runs with the compiled pack hook and with the Python one.
pytestmark = pytest.mark.usefixtures("packer")

F32 = 4


def collect(module: nn.Module, step: Callable[[], torch.Tensor], tmp_path: Path) -> dict:
    prof = MemProfiler({"schedule": {"warmup": 0, "active": 1}}, save_dir=tmp_path, rank=0).setup(module)
    with prof.profile("training_step", module=module):
        step()
    return prof.snapshots["0.training_step.1.end"]


def test_two_layer_mlp(tmp_path):
    # GIVEN x (no grad) -> Linear(D,H) -> ReLU -> Linear(H,O) -> pow(2).mean()
    b, d, h, o = 16, 64, 128, 8
    mlp = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, o))
    x = torch.randn(b, d)
    # WHEN collected
    m = collect(mlp, lambda: mlp(x).pow(2).mean(), tmp_path)
    # THEN: linear1 saves x; relu saves its output, which linear2 saves again (same storage,
    # counted once); linear2's weight.t() is a parameter view (excluded); pow saves the output.
    assert m["saved_tensors.unique_bytes"] == F32 * (b * d + b * h + b * o)
    assert m["saved_tensors.by_module"] == {
        "0": F32 * b * d,
        "1": F32 * b * h,
        "(outside forward)": F32 * b * o,
    }
    # packed (the ancestor's npp) counts the relu output twice and the weight view once
    assert m["saved_tensors.packed_bytes"] == F32 * (b * d + 2 * b * h + h * o + b * o)
    assert m["saved_tensors.count"] == 5


def test_one_input_shared_by_two_linears(tmp_path):
    b, d, o = 8, 32, 16
    l1, l2 = nn.Linear(d, o), nn.Linear(d, o)
    mod = nn.ModuleDict({"l1": l1, "l2": l2})
    x = torch.randn(b, d)
    m = collect(mod, lambda: (l1(x) + l2(x)).pow(2).mean(), tmp_path)
    # x is saved by both Linears but is one storage; the sum is saved by pow
    assert m["saved_tensors.unique_bytes"] == F32 * (b * d + b * o)
    assert m["saved_tensors.by_module"] == {"l1": F32 * b * d, "(outside forward)": F32 * b * o}
    assert m["saved_tensors.packed_bytes"] == F32 * (2 * b * d + b * o)


def test_small_conv_net(tmp_path):
    n, c, hw, k = 2, 3, 8, 8
    net = nn.Sequential(
        nn.Conv2d(c, k, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(k * 4 * 4, 5)
    )
    x = torch.randn(n, c, hw, hw)
    m = collect(net, lambda: net(x).pow(2).mean(), tmp_path)
    conv_in = F32 * n * c * hw * hw  # conv saves its input (its weight is excluded)
    relu_out = F32 * n * k * hw * hw  # relu saves its output; maxpool saves it again
    pool_idx = 8 * n * k * (hw // 2) ** 2  # maxpool's int64 indices
    pool_out = F32 * n * k * (hw // 2) ** 2  # the Linear saves the flattened pool output
    out = F32 * n * 5  # pow
    assert m["saved_tensors.unique_bytes"] == conv_in + relu_out + pool_idx + pool_out + out
    assert m["saved_tensors.by_module"] == {
        "0": conv_in,
        "1": relu_out,
        "2": pool_idx,
        "4": pool_out,
        "(outside forward)": out,
    }


def _block_truth(b: int, t: int, d: int, heads: int) -> int:
    act = F32 * b * t * d
    stats = F32 * b * t  # layer-norm mean and rstd, each
    return (
        (act + 2 * stats)  # ln1: input, mean, rstd
        + act  # qkv: ln1 output
        + 3 * act  # sdpa: q, k, v are views of one qkv output storage, counted once
        + F32 * b * heads * t  # sdpa: logsumexp
        + act  # sdpa output, also saved by proj (same storage)
        + (act + 2 * stats)  # ln2: input, mean, rstd
        + act  # mlp.0: ln2 output
        + 4 * act  # gelu: mlp.0 output
        + 4 * act  # mlp.2: gelu output
        + act  # pow: block output
    )


def test_transformer_block(tmp_path):
    torch.manual_seed(0)
    b, t, d, heads = 2, 6, 16, 2
    blk = Block(d, heads)
    x = torch.randn(b, t, d)
    m = collect(blk, lambda: blk(x).pow(2).mean(), tmp_path)
    assert m["saved_tensors.unique_bytes"] == _block_truth(b, t, d, heads)
    assert sum(m["saved_tensors.by_module"].values()) == m["saved_tensors.unique_bytes"]
    assert m["saved_tensors.by_module"]["mlp.1"] == 4 * F32 * b * t * d


def test_transformer_block_non_reentrant_checkpoint_saves_only_its_input(tmp_path):
    torch.manual_seed(0)
    b, t, d, heads = 2, 6, 16, 2
    blk = Block(d, heads)
    x = torch.randn(b, t, d)
    m = collect(blk, lambda: checkpoint(blk, x, use_reentrant=False).pow(2).mean(), tmp_path)
    # checkpoint keeps its input for recomputation; pow saves the block output
    assert m["saved_tensors.unique_bytes"] == 2 * F32 * b * t * d


def test_hooks_do_not_change_gradients_or_checkpoint_recompute(tmp_path):
    torch.manual_seed(0)
    blk = Block(16, 2)
    x = torch.randn(2, 6, 16)

    def grads(profiled: bool) -> list[torch.Tensor]:
        blk.zero_grad()
        if profiled:
            prof = MemProfiler({"schedule": {"warmup": 0, "active": 1}}, save_dir=tmp_path, rank=0).setup(blk)
            with prof.profile("training_step", module=blk):
                loss = checkpoint(blk, x, use_reentrant=False).pow(2).mean()
        else:
            loss = checkpoint(blk, x, use_reentrant=False).pow(2).mean()
        loss.backward()
        return [p.grad.clone() for p in blk.parameters()]

    for a, b in zip(grads(False), grads(True), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_saved_activations_are_freed_when_the_graph_dies(tmp_path):
    # A pack hook that returned the output tensor itself would keep it alive through a
    # reference cycle with its own grad_fn.
    x = torch.randn(256, 256, requires_grad=True)
    lin = nn.Linear(256, 256)
    holder: dict[str, StorageWeakRef] = {}

    def step() -> torch.Tensor:
        y = torch.relu(lin(x))
        holder["ref"] = StorageWeakRef(y.untyped_storage())
        return y

    out = {}
    prof = MemProfiler({"schedule": {"warmup": 0, "active": 1}}, save_dir=tmp_path, rank=0).setup(lin)
    with prof.profile("training_step", module=lin):
        out["y"] = step()
    del out["y"]
    assert holder["ref"].expired()


def test_every_save_of_one_op_goes_to_its_module(tmp_path):
    # GIVEN LayerNorm (one op saving its input, mean and rstd: three new storages) then GELU
    b, d = 8, 32
    net = nn.Sequential(nn.LayerNorm(d), nn.GELU())
    x = torch.randn(b, d)
    m = collect(net, lambda: net(x).pow(2).mean(), tmp_path)
    # THEN all three belong to the LayerNorm, GELU's input to GELU, pow's to no module
    assert m["saved_tensors.by_module"] == {
        "0": F32 * (b * d + 2 * b),
        "1": F32 * b * d,
        "(outside forward)": F32 * b * d,
    }


class _SavesOutputsAroundInput(torch.autograd.Function):
    """Saves two of its outputs with its input between them (a custom Function's own order)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o1, o2 = a * 2, a * 3
        ctx.save_for_backward(o1, a, o2)
        return o1, o2

    @staticmethod
    def backward(ctx: Any, g1: torch.Tensor, g2: torch.Tensor) -> torch.Tensor:
        return g1 * 2 + g2 * 3


def _inplace_on_view(y: torch.Tensor) -> list[torch.Tensor]:
    y = y.clone()
    y[1:3].sigmoid_()  # saves its output, a view of y, through CopySlices
    return [y]


@pytest.mark.parametrize(
    "ops",
    [
        pytest.param(lambda y: [y.sigmoid()], id="output-saved"),
        pytest.param(lambda y: [y.tanh().tanh()], id="output-then-input"),
        pytest.param(lambda y: [y.clone().relu_()], id="inplace"),
        pytest.param(_inplace_on_view, id="inplace-on-view"),
        pytest.param(lambda y: list(_SavesOutputsAroundInput.apply(y)), id="custom-function"),
        pytest.param(lambda y: [nn.functional.layer_norm(y, (256,)).softmax(-1)], id="norm-softmax"),
    ],
)
def test_outputs_saved_by_their_own_node_are_freed_with_the_graph(tmp_path, ops):
    # GIVEN ops that save their own outputs: the holder must not keep the output itself, whose
    # grad_fn is the saving node (a reference cycle the garbage collector cannot see)
    x = torch.randn(64, 256, requires_grad=True)
    lin = nn.Linear(256, 256)
    refs: list[StorageWeakRef] = []
    out: dict[str, list[torch.Tensor]] = {}
    prof = MemProfiler({"schedule": {"warmup": 0, "active": 1}}, save_dir=tmp_path, rank=0).setup(lin)
    with prof.profile("training_step", module=lin):
        out["y"] = ops(lin(x))
        refs = [StorageWeakRef(t.untyped_storage()) for t in out["y"]]
    # WHEN the caller drops what the call returned, THEN every saved output is freed
    del out["y"]
    gc.collect()
    assert all(r.expired() for r in refs)


def test_custom_function_saves_are_counted_once_each(tmp_path):
    # GIVEN a custom Function saving (output, input, output) of one Linear's output
    b, d = 16, 32
    lin = nn.Linear(d, d)
    x = torch.randn(b, d)
    m = collect(lin, lambda: sum(o.sum() for o in _SavesOutputsAroundInput.apply(lin(x))), tmp_path)
    # THEN: lin saves x (not weight.t(): x needs no grad); the Function saves its input (lin's
    # output) and its two outputs, three storages
    assert m["saved_tensors.unique_bytes"] == F32 * (b * d + 3 * b * d)
    assert m["saved_tensors.count"] == 1 + 3


@pytest.mark.parametrize("enabled", [True, False])
def test_switch_turns_saved_tensor_keys_on_and_off(tmp_path, enabled):
    lin = nn.Linear(4, 4)
    prof = MemProfiler(
        {"schedule": {"warmup": 0, "active": 1}, "enable_saved_tensors_hooks": enabled},
        save_dir=tmp_path,
        rank=0,
    ).setup(lin)
    with prof.profile("training_step", module=lin):
        lin(torch.randn(2, 4)).sum()
    assert ("saved_tensors.unique_bytes" in prof.snapshots["0.training_step.1.end"]) is enabled


def _mlp_truth(b: int, d: int, h: int, o: int) -> dict[str, int]:
    return {"0": F32 * b * d, "1": F32 * b * h, "(outside forward)": F32 * b * o}


def test_graph_dropped_inside_the_call_adds_nothing(tmp_path):
    # GIVEN a call that builds a graph on a bigger batch and drops it, then builds the one it keeps
    b, d, h, o = 16, 64, 128, 8
    mlp = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, o))
    big, x = torch.randn(4 * b, d), torch.randn(b, d)
    kept: dict[str, torch.Tensor] = {}

    def step() -> None:
        mlp(big).pow(2).mean()  # built and dropped: nothing of it is held for backward
        kept["loss"] = mlp(x).pow(2).mean()

    # WHEN collected
    m = collect(mlp, step, tmp_path)
    # THEN only the kept graph counts (the dropped one's input is still alive, but not saved)
    assert m["saved_tensors.by_module"] == _mlp_truth(b, d, h, o)
    assert m["saved_tensors.unique_bytes"] == F32 * (b * d + b * h + b * o)
    # packed bytes still sum every save of both graphs
    assert m["saved_tensors.packed_bytes"] == F32 * (5 * (b * d + 2 * b * h + b * o) + 2 * h * o)


def test_graph_run_backward_inside_the_call_counts_in_full(tmp_path):
    # GIVEN manual optimization: the call runs backward on the graph it built
    b, d, h, o = 16, 64, 128, 8
    mlp = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, o))
    x = torch.randn(b, d)
    # WHEN collected
    m = collect(mlp, lambda: mlp(x).pow(2).mean().backward(), tmp_path)
    # THEN what the forward saved for that backward counts
    assert m["saved_tensors.by_module"] == _mlp_truth(b, d, h, o)
    assert m["saved_tensors.unique_bytes"] == F32 * (b * d + b * h + b * o)
