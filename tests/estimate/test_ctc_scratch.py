"""CUDA's CTC loss scratch (``LossCTC.cu``): log_beta, the large problem's logsumexp, zero_infinity's
second gradient; the CPU kernel's log_beta measured."""

from __future__ import annotations

import torch
from cpu_allocations import measured_peak

from memprofiler.estimate.cuda import ctc_scratch
from memprofiler.estimate.cuda.reduce_scratch import Device
from memprofiler.estimate.cuda.target import resolve_target

_aten = torch.ops.aten
_T = resolve_target("H200", "2.13")
H200 = Device(_T.sms, _T.threads_per_sm)


def test_ctc_backward_holds_log_beta_the_size_of_log_alpha_as_the_real_cpu_kernel_does() -> None:
    # GIVEN a real CTC forward over 300 steps, 8 sequences, 50 labels, targets of 40
    t, b, c, s = 300, 8, 50, 40
    log_probs = torch.randn(t, b, c).log_softmax(2)
    targets = torch.randint(1, c, (b, s))
    nll, log_alpha = _aten._ctc_loss.default(log_probs, targets, [t] * b, [s] * b, 0, False)
    assert log_alpha.shape == (b, t, 2 * s + 1)
    # WHEN its backward runs on the CPU, allocations recorded
    args = (torch.ones(b), log_probs, targets, [t] * b, [s] * b, nll, log_alpha, 0, False)
    grad, peak = measured_peak(_aten._ctc_loss_backward.default, args)
    # THEN it holds the gradient and log_beta (log_alpha's 777,600 B), nothing more
    assert peak - grad.untyped_storage().nbytes() == log_alpha.untyped_storage().nbytes() == 777_600


def test_ctc_backward_phases_on_cuda() -> None:
    t, b, c, s = 400, 8, 1000, 60
    log_probs = torch.empty(t, b, c, device="meta")
    log_alpha = torch.empty(b, t, 2 * s + 1, device="meta")
    grad = t * b * c * 4
    base = [8 * b] * 3 + [b * t * (2 * s + 1) * 4]  # the lengths and offsets on the device; log_beta
    assert ctc_scratch.is_large(t, b, c) and not ctc_scratch.is_large(50, 4, 20)
    # GIVEN a large problem: log_beta, then the blanks' logsumexp (b x t x 61 float32: 780,800 B)
    found = ctc_scratch.backward_phases(log_probs, log_alpha, False, grad, H200)
    assert found[0] == base
    assert found[3][:8] == [*base, b * t * 61 * 4, b * t * 4, b * t * 61 * 4, b * t * 4]
    # AND with zero_infinity at::where makes a second gradient (12,800,000 B) beside the first
    assert ctc_scratch.backward_phases(log_probs, log_alpha, True, grad, H200)[-1] == [*base, b, 4, grad]
    # AND a small problem takes log_beta alone
    small = ctc_scratch.backward_phases(
        torch.empty(50, 4, 20, device="meta"), torch.empty(4, 50, 21, device="meta"), True, 0, H200
    )
    assert small == [[32] * 3 + [4 * 50 * 21 * 4]]
