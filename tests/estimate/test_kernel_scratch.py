"""Scratch CUDA attention kernels allocate inside themselves, replayed for a CUDA target (torch 2.11 rules)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memprofiler.estimate import estimate_memory, kernel_scratch
from memprofiler.estimate.allocator import round_size
from memprofiler.estimate.kernel_scratch import efficient_workspace

B, H, M, K = 2, 4, 100, 64
SGD = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731


class Attention(nn.Module):
    """q = k = v = a parameter viewed as heads; the output summed (its gradient is an expanded scalar)."""

    def __init__(self) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.empty(B, M, H * K))

    def forward(self, _: torch.Tensor) -> torch.Tensor:
        q = self.x.view(B, M, H, K).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q).sum()


def _estimate(precision: str, scratch: bool, monkeypatch: pytest.MonkeyPatch) -> object:
    if not scratch:
        monkeypatch.setattr(
            kernel_scratch.KernelScratch,
            "__torch_dispatch__",
            lambda self, f, t, a=(), k=None: f(*a, **(k or {})),
        )
    est = estimate_memory(
        Attention(), torch.zeros(1), optimizer=SGD, loss_fn=lambda m, b: m(b), precision=precision,
        gpu="H200", torch_version="2.11", steps=1,
    )  # fmt: skip
    monkeypatch.undo()
    return est


def test_memory_efficient_backward_scratch_is_torchs_float32_delta_and_dq_workspace(monkeypatch):
    # GIVEN float32 attention (memory-efficient on an H200), estimated with and without the scratch
    with_scratch = _estimate("32-true", True, monkeypatch)
    without = _estimate("32-true", False, monkeypatch)
    # THEN the peak grows by the larger phase of _efficient_attention_backward, each block rounded:
    # the output gradient is an expanded scalar, so grad_out.contiguous() copies it (B*M*H*K*4);
    # delta = (grad_out * out).sum(-1).transpose(-2, -1).contiguous() holds the product, the sum
    # and delta (B*H*M*4) together; then delta and the workspace: per (batch, head) ceil(100/64)
    # query blocks x 1 column block of (16 + 4*64*64) bytes
    grad = B * M * H * K * 4
    delta = B * H * M * 4
    workspace = B * H * 2 * (16 + 4 * 64 * 64)
    assert workspace == efficient_workspace(B, H, M, M, K, K, half=False) == 262_400
    phase1 = [grad, grad, B * M * H * 4, delta]
    phase2 = [grad, delta, workspace]
    grown = max(sum(round_size(n) for n in p) for p in (phase1, phase2))
    assert with_scratch.peak_bytes - without.peak_bytes == grown == 471_040
    assert any(
        "memory-efficient attention backward: scratch" in n and "470,400 B" in n for n in with_scratch.notes
    )


def test_flash_backward_scratch_is_softmax_d_and_dq_accum(monkeypatch):
    # GIVEN the same attention under bf16-mixed (flash on an H200)
    with_scratch = _estimate("bf16-mixed", True, monkeypatch)
    without = _estimate("bf16-mixed", False, monkeypatch)
    # THEN mha_bwd's scratch: the expanded gradient copied (bfloat16), softmax_d (float32,
    # B x H x queries rounded to 128) and dq_accum (float32, B x 128 x H x 64)
    sizes = [B * M * H * K * 2, B * H * 128 * 4, B * 128 * H * 64 * 4]
    assert with_scratch.peak_bytes - without.peak_bytes == sum(round_size(n) for n in sizes) == 368_640
    assert any("flash attention backward: scratch" in n for n in with_scratch.notes)


def test_memory_efficient_seed_and_offset_stay_on_the_host(monkeypatch):
    # GIVEN attention estimated for a CUDA target, with the seed/offset rule and without it
    est = _estimate("32-true", True, monkeypatch)
    saved = dict(est.by_category)
    # THEN the two int64 scalars the forward returns (CPU tensors in CUDA's eager mode) are not
    # on the device: the activations are the output, the log-sum-exp (queries padded to a multiple
    # of 32: 128) and two float32 scalars (the loss and the gradient backward starts from)
    lse = B * H * 128 * 4
    assert saved["activations"] == B * M * H * K * 4 + lse + 2 * 4
    assert any("2 philox seed/offset scalar(s) kept on the host" in n for n in est.notes)
