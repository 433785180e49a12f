"""Gradients merged in autograd's input buffers: in place as torch does it without a mode."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from memprofiler.estimate import estimate_memory

MiB = 1 << 20


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def _merge_in_place(mode: bool) -> bool:
    """Whether the gradient reaching ``h`` from two branches is one of the branches' own storages."""
    pre, a, b = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
    h = pre(torch.randn(4, 8))
    ya, yb = a(h), b(h)
    loss = ya.sum() + yb.sum()
    incoming: list[int] = []
    merged: list[int] = []
    # AddmmBackward0's outputs: (bias, mat1 = h, mat2); only data pointers are kept, no tensor
    ya.grad_fn.register_hook(lambda gi, go: incoming.append(gi[1].data_ptr()))
    yb.grad_fn.register_hook(lambda gi, go: incoming.append(gi[1].data_ptr()))
    h.grad_fn.register_prehook(lambda go: merged.append(go[0].data_ptr()))
    if mode:
        with _Passthrough():
            loss.backward()
    else:
        loss.backward()
    assert len(incoming) == 2 and len(merged) == 1
    return merged[0] in incoming


def test_torch_merges_gradients_in_place_only_without_a_dispatch_mode() -> None:
    # InputBuffer::accumulate: old.add_(new) when nothing else holds old, unless a mode is active
    assert _merge_in_place(mode=False)
    assert not _merge_in_place(mode=True)


class Merge(nn.Module):
    """``h`` (1 MiB) used by two branches whose backward saves nothing of it: the peak is at the merge."""

    def __init__(self) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.ones(256))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * self.s
        return (h * 2).sum() + (h * 3).sum()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_merge_adds_no_gradient_sized_tensor(device: str) -> None:
    x = torch.randn(1024, 256)  # 1 MiB of float32
    est = estimate_memory(
        Merge(), x, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), device=device, steps=1
    )
    # Backward: the branches' gradients g2, g3 (1 MiB each) merge into g2's storage (in place),
    # g3 is freed; MulBackward then makes g * x (1 MiB) and its column sum (1 KiB) for s's
    # gradient. Live at that peak: x, g, g * x, the sum: 3 MiB + 1 KiB of temporaries and input,
    # s (1 KiB) and two 4-byte scalars of the forward. Out of place the merge held g2, g3 and
    # g2 + g3 at once: 4 MiB + 1 KiB + 8 B.
    assert est.by_category["temporaries"] == 2 * MiB + 1024
    assert est.by_category["inputs"] == MiB
    if device == "cpu":
        assert est.peak_bytes == 3 * MiB + 1024 + 1024 + 8
    else:  # the caching allocator's 512-byte blocks: s 1 KiB, the sum 1 KiB, each scalar 512 B,
        # and the column sum's staging buffer and semaphores inside the CUDA reduction kernel
        assert est.peak_bytes == 3 * MiB + 1024 + 1024 + 2 * 512 + _column_sum_scratch()
    assert est.peak_phase == "backward"


def _column_sum_scratch() -> int:
    from memprofiler.estimate.allocator.caching import round_size
    from memprofiler.estimate.cuda.reduce_scratch import Device, op_scratch
    from memprofiler.estimate.cuda.target import DEFAULT_GPU, resolve_target

    t = resolve_target(DEFAULT_GPU)
    g = torch.empty(1024, 256, device="meta")
    blocks = op_scratch(torch.ops.aten.sum.dim_IntList, (g, [0], True), {}, Device(t.sms, t.threads_per_sm))
    assert blocks  # 256 outputs over 1,024 rows: the kernel reduces across blocks through memory
    return sum(round_size(b) for b in blocks)


class Tied(nn.Module):
    """One Linear applied twice: its weight's two gradients merge before AccumulateGrad."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.lin(x)).sum()


def test_estimate_still_runs_with_checkpointing_and_tied_weights() -> None:
    from models import Checkpointed

    for model, x in ((Checkpointed(32, 4), torch.randn(2, 8, 32)), (Tied(), torch.randn(8, 64))):
        est = estimate_memory(model, x, optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), device="cpu")
        assert est.peak_bytes > 0


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return LlamaForCausalLM(cfg)


def _real_in_place_merges(model: nn.Module, batch: torch.Tensor, loss_fn: Any) -> int:
    """``aten::add_`` calls in a real backward with no dispatch mode: the engine's in-place merges."""
    from torch.profiler import ProfilerActivity, profile

    loss = loss_fn(model, batch)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loss.backward()
    return sum(1 for e in prof.events() if e.name == "aten::add_")


@pytest.mark.parametrize("arch", ["demo", "llama"])
def test_merges_counted_in_place_are_those_a_real_backward_does_in_place(arch: str, monkeypatch) -> None:
    from models import Checkpointed, hf_loss, square_mean

    from memprofiler.estimate import tracker

    if arch == "demo":  # two residual blocks under checkpointing: 3 merges, all in place
        make, batch, loss_fn = (lambda: Checkpointed(32, 4)), torch.randn(2, 8, 32), square_mean
    else:  # 23 merges; 4 out of place in torch too (their gradient's storage is shared)
        make, batch, loss_fn = _llama, torch.randint(0, 64, (2, 16)), hf_loss
    torch.manual_seed(0)
    expected = _real_in_place_merges(make(), batch, loss_fn)
    ledgers: list[tracker.Ledger] = []
    init = tracker.Ledger.__init__

    def keep(self: tracker.Ledger, *args: Any) -> None:
        init(self, *args)
        ledgers.append(self)

    monkeypatch.setattr(tracker.Ledger, "__init__", keep)
    estimate_memory(
        make(),
        batch,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        loss_fn=loss_fn,
        device="cpu",
        steps=1,
    )
    assert expected == {"demo": 3, "llama": 19}[arch]
    assert ledgers[0].merged_in_place == expected


def test_fsdp_merge_counts_in_place_too() -> None:
    x = torch.randn(1024, 256)
    est = estimate_memory(
        Merge(),
        x,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        device="cpu",
        steps=1,
        strategy="fsdp",
        world_size=2,
    )
    # The merge no longer tops the step (out of place it did: 4 MiB + 1,544 B in backward). The
    # peak is the forward's x, h and h * 2 (3 MiB) with two 4-byte sums, s's all-gather buffer
    # and unsharded copy (1 KiB each) and its shard (512 B).
    assert est.peak_bytes == 3 * MiB + 8 + 1024 + 1024 + 512
    assert est.peak_phase == "forward"
