"""Scratch CUDA attention kernels allocate inside themselves, replayed for a CUDA target (torch 2.11 rules)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memprofiler.estimate import estimate_memory
from memprofiler.estimate.allocator.caching import round_size
from memprofiler.estimate.cuda import kernel_scratch
from memprofiler.estimate.cuda.kernel_scratch import efficient_workspace

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
        monkeypatch.setattr(kernel_scratch.KernelScratch, "after", lambda self, f, a, k, out: out)
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


# --- the weight gradient of a norm over many rows and few features: two stages (torch 2.8+)


def test_gamma_beta_rows_follow_the_launch_rule():
    from memprofiler.estimate.cuda.kernel_scratch import gamma_beta_rows

    assert gamma_beta_rows(3152, 384, 132) == 0  # ViT's 16 x 197 rows: one pass
    assert gamma_beta_rows(65536, 384, 132) == 0  # M > 64 x 1024 only
    assert gamma_beta_rows(100_000, 384, 132) == min(32768 // 12, -(-100_000 // 32)) == 2730
    assert gamma_beta_rows(100_000, 4096, 132) == 0  # 128 column blocks >= 66: one pass
    assert gamma_beta_rows(100_000, 4096, 300) == min(32768 // 128, 3125) == 256


def _two_stage_peaks(norm: type[torch.nn.Module]) -> tuple[int, int, int]:
    from memprofiler.estimate import estimate_memory
    from memprofiler.estimate.allocator.caching import round_size
    from memprofiler.estimate.cuda.kernel_scratch import gamma_beta_rows, two_stage_weight_grads
    from memprofiler.estimate.cuda.reduce_scratch import Device
    from memprofiler.estimate.cuda.target import resolve_target

    m, n = 70_000, 384
    x = torch.randn(m, n)
    peaks = []
    for version in ("2.11", "2.7"):
        with torch.device("meta"):
            model = norm(n)
        sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
        est = estimate_memory(
            model, x, optimizer=sgd, loss_fn=lambda mdl, b: mdl(b).sum(), gpu="H200", torch_version=version
        )
        peaks.append(est.peak_bytes)
    t = resolve_target("H200", "2.11")
    rows = gamma_beta_rows(m, n, t.sms)
    grads = 2 if norm is torch.nn.LayerNorm else 1
    blocks = two_stage_weight_grads(rows, n, torch.empty(n), grads, Device(t.sms, t.threads_per_sm))
    return peaks[0], peaks[1], sum(round_size(b) for b in blocks)


def test_layer_norm_backward_over_many_rows_keeps_its_partial_sums():
    # GIVEN LayerNorm(384) over 70,000 rows for an H200 with torch 2.11 and with 2.7 (one pass)
    with_two_stage, one_pass, blocks = _two_stage_peaks(torch.nn.LayerNorm)
    # THEN backward (the peak) holds gamma's and beta's 2,188 x 384 float32 partial sums, their
    # .sum(0) results and that column reduction's scratch on top of what 2.7's kernel holds
    assert blocks > 2 * 2188 * 384 * 4
    assert with_two_stage - one_pass == blocks


def test_fused_rms_norm_backward_over_many_rows_sums_its_weight_gradient_in_two_stages(monkeypatch):
    from memprofiler.estimate import estimate_memory
    from memprofiler.estimate.allocator.caching import round_size
    from memprofiler.estimate.cuda import fused_norms
    from memprofiler.estimate.cuda.kernel_scratch import gamma_beta_rows
    from memprofiler.estimate.cuda.reduce_scratch import Device, op_scratch
    from memprofiler.estimate.cuda.target import resolve_target

    # GIVEN a Linear and nn.RMSNorm(384) over 70,000 rows for an H200 (torch 2.11: the fused
    # kernel), estimated as it is and with the weight gradient summed in one pass
    m, n = 70_000, 384
    x = torch.randn(m, n)

    def peak() -> int:
        with torch.device("meta"):  # the Linear makes the norm's input need a gradient
            model = torch.nn.Sequential(torch.nn.Linear(n, n, bias=False), torch.nn.RMSNorm(n))
        sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
        return estimate_memory(
            model, x, optimizer=sgd, loss_fn=lambda mdl, b: mdl(b).sum(), gpu="H200", torch_version="2.11"
        ).peak_bytes

    two_stage = peak()
    monkeypatch.setattr(fused_norms, "gamma_beta_rows", lambda *a: 0)
    one_pass = peak()
    # THEN the norm's backward (the peak: input, output gradient's copy, input gradient) also holds
    # the 2,188 x 384 float32 partial sums and the scratch of the .sum(0) over them (the weight's
    # gradient itself is the same 384 floats either way)
    t = resolve_target("H200", "2.11")
    rows = gamma_beta_rows(m, n, t.sms)
    partial = torch.empty(rows, n, device="meta")
    sums = op_scratch(torch.ops.aten.sum.dim_IntList, (partial, [0]), {}, Device(t.sms, t.threads_per_sm))
    assert rows == min(32768 // 12, -(-m // 32)) == 2188
    assert two_stage - one_pass == round_size(rows * n * 4) + sum(round_size(b) for b in sums)
