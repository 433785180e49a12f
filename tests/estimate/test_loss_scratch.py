"""The loss kernels' own memory: the 0-d loss's input-sized storage (every target) and the
temporaries CUDA's loss kernels allocate inside themselves (a CUDA target)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from cpu_allocations import measured_peak
from models import estimate_and_census
from torch import nn

from memprofiler.estimate import estimate_memory, tracker
from memprofiler.estimate.cuda import loss_scratch
from memprofiler.estimate.cuda.reduce_scratch import Device
from memprofiler.estimate.cuda.target import resolve_target
from memprofiler.estimate.fake import loss_outputs

SGD = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
B, D = 2, 1_000_000
N = B * D * 4  # one float32 tensor of the model's output size: 8,000,000 B
H200 = Device(resolve_target("H200", "2.13").sms, resolve_target("H200", "2.13").threads_per_sm)


def _without_loss_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    for op in loss_outputs.REAL_STORAGE:
        monkeypatch.delitem(tracker._STAND_INS, op)


def _without_loss_scratch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loss_scratch.LossScratch, "after", lambda self, f, a, k, out: out)


# --- every target: the reduced loss keeps a storage of the input's size


def _regression(d: int) -> nn.Module:
    return nn.Linear(4, d)


LOSSES = {
    "mse": lambda y, t: F.mse_loss(y, t),
    "mse_sum_bf16_target": lambda y, t: F.mse_loss(y, t.bfloat16(), reduction="sum"),
    "smooth_l1": lambda y, t: F.smooth_l1_loss(y, t, beta=0.5),
    "huber": lambda y, t: F.huber_loss(y, t),
    "bce": lambda y, t: F.binary_cross_entropy(torch.sigmoid(y), torch.sigmoid(t)),
    "soft_margin": lambda y, t: F.soft_margin_loss(y, t.sign()),
    "bce_logits_pos_weight": lambda y, t: F.binary_cross_entropy_with_logits(
        y, torch.sigmoid(t), pos_weight=torch.full(t.shape[-1:], 2.0)
    ),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_cpu_estimate_equals_the_real_cpu_steps_census_with_each_loss(name: str) -> None:
    # GIVEN a regression head of 100,000 outputs trained with each loss on real CPU tensors
    loss = LOSSES[name]
    target = torch.randn(2, 100_000)
    # WHEN estimated on CPU and measured (live tensors of two real steps)
    est, census = estimate_and_census(
        lambda: _regression(100_000), torch.randn(2, 4), lambda m, b: loss(m(b), target), SGD
    )
    # THEN they agree to the byte (mse, smooth L1, BCE and soft margin hold their 0-d loss in an
    # 800,000 B storage, as the real kernels do)
    assert est == census


def test_the_mse_loss_holds_the_inputs_bytes_through_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a regression of 2 x 100,000 outputs with F.mse_loss, estimated on CPU with the loss's
    # real storage and with the fake kernel's 4 B
    def peak() -> int:
        with torch.device("meta"):
            model = _regression(100_000)
        target = torch.zeros(2, 100_000)
        return estimate_memory(
            model, torch.randn(2, 4), optimizer=SGD, loss_fn=lambda m, b: F.mse_loss(m(b), target), steps=1
        ).tensor_peak_bytes

    real = peak()
    _without_loss_outputs(monkeypatch)
    fake = peak()
    # THEN the peak (in backward, with the loss held) is higher by the input's bytes less the 4 B
    assert real - fake == 2 * 100_000 * 4 - 4


# --- a CUDA target: the temporaries inside the kernels


class Fit(nn.Module):
    """A (B, D) parameter scaled by a (B, 1) batch: the output is B x D float32 (N bytes)."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.empty(B, D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.p


def _cuda(loss: Any, precision: str = "32-true") -> Any:
    with torch.device("meta"):
        model = Fit()
    batch = (torch.randn(B, 1), torch.randn(B, D))
    return estimate_memory(
        model, batch, optimizer=SGD, loss_fn=lambda m, b: loss(m(b[0]), b[1]), gpu="H200",
        torch_version="2.13", precision=precision, steps=1,
    )  # fmt: skip


def test_mse_forward_holds_the_elementwise_loss_and_its_reduction_scratch() -> None:
    # GIVEN the (B, D) fit with F.mse_loss for an H200
    est = _cuda(F.mse_loss)
    # THEN the mean's staging buffer and semaphores over 2,000,000 float32 values are 980 B + 4 B
    scratch = loss_scratch.reduction_scratch(B * D, torch.float32, 1, H200)
    assert scratch == [980, 4]
    # AND the peak is the loss's forward: the parameter, the batch (8 B + N), the output, the 0-d
    # loss in its N-byte storage, the N-byte elementwise loss and that scratch. (Its backward holds
    # the gradient where the forward held the temporary: the forward is higher by the scratch.)
    # (N is a multiple of the allocator's 512 B; each smaller block takes 512 B)
    assert est.peak_phase == "forward"
    assert est.peak_bytes == N + (512 + N) + N + N + N + 1024 + 512 == 40_002_048
    assert est.by_category["loss_scratch"] == N + sum(scratch)
    assert (
        "mse_loss: the loss's temporaries the CUDA kernel allocates inside itself replayed at each of 1 call(s), "
        f"up to {N + 984:,} B at once (torch's CUDA source)"
    ) in est.notes


def test_mse_without_reduction_takes_nothing_more(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN F.mse_loss(reduction="none") (its output is the elementwise loss), then a mean
    loss = lambda y, t: F.mse_loss(y, t, reduction="none").mean()  # noqa: E731
    modelled = _cuda(loss)
    _without_loss_scratch(monkeypatch)
    _without_loss_outputs(monkeypatch)
    bare = _cuda(loss)
    # THEN the estimate is the same to the byte, with no note
    assert (modelled.peak_bytes, modelled.tensor_peak_bytes) == (bare.peak_bytes, bare.tensor_peak_bytes)
    assert not any("mse_loss" in n for n in modelled.notes)


def test_soft_margin_backward_holds_three_input_sized_temporaries(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN F.soft_margin_loss for an H200, estimated with and without the kernels' temporaries
    with_scratch = _cuda(F.soft_margin_loss)
    _without_loss_scratch(monkeypatch)
    without = _cuda(F.soft_margin_loss)
    # THEN backward's peak rises by two input-sized blocks: exp(-target * input) holds -target, the
    # product and z before the gradient exists (three N-byte blocks where the fake kernel has one)
    assert with_scratch.peak_bytes - without.peak_bytes == 2 * N
    assert with_scratch.by_category["loss_scratch"] == 2 * N
    assert with_scratch.peak_phase == "backward"


def test_bf16_mse_temporary_is_in_the_operands_dtype() -> None:
    # GIVEN bfloat16 input and target (bf16-true): the elementwise loss is bfloat16
    x = torch.empty(B, D, dtype=torch.bfloat16, device="meta")
    call = loss_scratch._Call((x, x), {}, None, H200)
    scratch = loss_scratch.reduction_scratch(B * D, torch.bfloat16, 1, H200)
    # THEN the temporary is 2 B a value, and the reduction's scratch is the mean's over it
    assert loss_scratch._binary(call) == [[B * D * 2, *scratch]]
    # AND reduction none (0) takes nothing
    assert loss_scratch._binary(loss_scratch._Call((x, x, 0), {}, None, H200)) == []


def test_bce_with_logits_phases_follow_torchs_composite() -> None:
    x = torch.empty(B, D, device="meta")
    pw = torch.empty(D, device="meta")
    out = torch.empty((), device="meta")
    mean = loss_scratch.reduction_scratch(B * D, torch.float32, 1, H200)
    # GIVEN pos_weight and reduction mean: log_sigmoid(input), pos_weight - 1 and the broadcast
    # log weight; then log_sigmoid(input), the loss and its reduction
    call = loss_scratch._Call((x, x, None, pw, 1), {}, out, H200)
    assert loss_scratch._bce_with_logits(call) == [[N, D * 4, N], [N, N, *mean]]
    # AND with reduction none the loss is the output: the first phase's log weight is where the
    # output will be, and log_sigmoid(input) is beside it
    full = torch.empty(B, D, device="meta")
    call = loss_scratch._Call((x, x, None, pw, 0), {}, full, H200)
    assert loss_scratch._bce_with_logits(call) == [[N, D * 4], [N]]


def test_nll_copies_only_what_is_not_contiguous() -> None:
    logp = torch.empty(B, 1000, device="meta")
    target = torch.zeros(B, dtype=torch.long, device="meta")
    # GIVEN log-probabilities as cross_entropy passes them (contiguous): no copy
    assert loss_scratch._nll(loss_scratch._Call((logp, target, None, 1, -100), {}, None, H200)) == []
    # AND transposed ones: the forward copies them, the backward them and nothing else contiguous-less
    t = torch.empty(1000, B, device="meta").t()
    call = loss_scratch._Call((t, target, None, 1, -100), {}, None, H200)
    assert loss_scratch._nll(call) == [[B * 1000 * 4]]
    grad = torch.empty((), device="meta")
    call = loss_scratch._Call((grad, t, target, None, 1, -100, grad), {}, None, H200)
    assert loss_scratch._nll_backward(call) == [[B * 1000 * 4]]


def test_nll2d_copies_a_channels_last_input_where_it_reduces() -> None:
    # GIVEN 2-D log-probabilities (B, C, H, W) in channels-last order and their (B, H, W) targets
    logp = torch.empty(B, 8, 16, 16, device="meta").to(memory_format=torch.channels_last)
    target = torch.zeros(B, 16, 16, dtype=torch.long, device="meta")
    # THEN the forward copies the input where it reduces (mean), not with reduction none
    mean = loss_scratch._Call((logp, target, None, 1, -100), {}, None, H200)
    none = loss_scratch._Call((logp, target, None, 0, -100), {}, None, H200)
    assert loss_scratch._nll2d(mean) == [[B * 8 * 16 * 16 * 4]]
    assert loss_scratch._nll2d(none) == []


def test_multi_margin_sums_one_value_a_row_and_copies_what_is_not_contiguous() -> None:
    x = torch.empty(64, 1000, device="meta")
    target = torch.zeros(64, dtype=torch.long, device="meta")
    row_sum = loss_scratch.reduction_scratch(64, torch.float32, 2, H200)
    # GIVEN a contiguous (64, 1000) input, reduced: 64 per-row losses and their sum's scratch
    call = loss_scratch._Call((x, target, 1, 1.0, None, 1), {}, None, H200)
    assert loss_scratch._multi_margin(call) == [[64 * 4, *row_sum]]
    # AND a transposed one is copied first; with reduction none the kernel writes the output
    xt = torch.empty(1000, 64, device="meta").t()
    call = loss_scratch._Call((xt, target, 1, 1.0, None, 0), {}, None, H200)
    assert loss_scratch._multi_margin(call) == [[64 * 1000 * 4]]


def test_mixed_precision_mse_runs_in_float32_as_cuda_autocast_runs_it() -> None:
    # GIVEN a Linear whose output is bfloat16 under bf16-mixed; CUDA autocast runs mse_loss in float32
    with torch.device("meta"):
        model = nn.Linear(4, D, bias=False)
    est = estimate_memory(
        model, (torch.randn(B, 4), torch.randn(B, D)), optimizer=SGD,
        loss_fn=lambda m, b: F.mse_loss(m(b[0]), b[1]), gpu="H200", torch_version="2.13",
        precision="bf16-mixed", steps=1,
    )  # fmt: skip
    # THEN the elementwise loss is float32 (4 B a value, not the output's 2 B)
    line = next(n for n in est.notes if n.startswith("mse_loss: the loss's temporaries"))
    assert f"up to {N + 984:,} B at once" in line


# --- the rules against the real CPU kernels (the same code as CUDA's, but for the reduction's scratch)

_aten = torch.ops.aten
_X, _T, _P = torch.randn(4, 10_000), torch.rand(4, 10_000), torch.rand(10_000)
CPU_CALLS = {
    "mse": (_aten.mse_loss.default, (_X, _T, 1)),
    "mse_sum": (_aten.mse_loss.default, (_X, _T, 2)),
    "mse_none": (_aten.mse_loss.default, (_X, _T, 0)),
    "smooth_l1": (_aten.smooth_l1_loss.default, (_X, _T, 1, 0.5)),
    "huber": (_aten.huber_loss.default, (_X, _T, 1, 1.0)),
    "bce": (_aten.binary_cross_entropy.default, (_T, _T, None, 1)),
    "soft_margin": (_aten.soft_margin_loss.default, (_X, _T, 1)),
    "soft_margin_backward": (_aten.soft_margin_loss_backward.default, (torch.ones(()), _X, _T, 1)),
    "bce_logits": (_aten.binary_cross_entropy_with_logits.default, (_X, _T, None, None, 1)),
    "bce_logits_pos_weight": (_aten.binary_cross_entropy_with_logits.default, (_X, _T, None, _P, 1)),
    "bce_logits_pos_weight_none": (_aten.binary_cross_entropy_with_logits.default, (_X, _T, None, _P, 0)),
}


@pytest.mark.parametrize("name", sorted(CPU_CALLS))
def test_rules_hold_what_the_real_cpu_kernel_allocates(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a loss op run on real CPU tensors of 4 x 10,000 float32 (160,000 B), its allocations
    # recorded; the rule without CUDA's reduction scratch (CPU's reduction takes none that size)
    op, args = CPU_CALLS[name]
    out, peak = measured_peak(op, args)
    monkeypatch.setattr(loss_scratch, "reduction_scratch", lambda *a: [])
    phases = loss_scratch.RULES[op][1](loss_scratch._Call(args, {}, out, H200))
    # THEN the output's storage and the rule's largest phase are the kernel's peak, to the 12 B of
    # scalars CPU's mean and sum allocate (8 B + 4 B)
    expected = out.untyped_storage().nbytes() + max((sum(p) for p in phases), default=0)
    assert 0 <= peak - expected <= 12
