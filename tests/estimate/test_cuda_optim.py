"""A CUDA target steps the optimizer with torch's CUDA default (foreach), wherever the estimate runs."""

from __future__ import annotations

import torch
from torch import nn

from memprofiler.estimate import estimate_memory
from memprofiler.estimate.cuda.optim import foreach_as_on_cuda

LAYERS, D = 6, 64
LAYER = D * D * 4  # one float32 weight, 16 KiB: a multiple of the allocator's 512 B


def _model() -> nn.Module:
    return nn.Sequential(*[nn.Linear(D, D, bias=False) for _ in range(LAYERS)])


def _estimate(optimizer, **where):
    """Two steps of the model; a CUDA target (H200) unless ``where`` says otherwise."""
    where = where or {"gpu": "H200"}
    return estimate_memory(
        _model(), torch.randn(2, D), optimizer=optimizer, loss_fn=lambda m, b: m(b).sum(), **where
    )


ADAMW = lambda ps: torch.optim.AdamW(ps, lr=1e-4)  # noqa: E731


def test_foreach_keeps_every_sqrt_at_once_where_the_loop_keeps_three_layers() -> None:
    """AdamW's foreach step holds sqrt(exp_avg_sq) of all layers at once (``_foreach_sqrt``: one
    parameter set); the loop holds at most three layers' worth: this layer's sqrt and quotient,
    and the previous layer's ``denom``, still bound until the new one is assigned. At the
    optimizer peak the difference is LAYERS - 3 layers' weights, to the byte."""
    cuda_default = _estimate(lambda ps: torch.optim.AdamW(ps, lr=1e-4))
    loop = _estimate(lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=False))
    assert cuda_default.peak_phase == loop.peak_phase == "optimizer"
    assert cuda_default.peak_bytes - loop.peak_bytes == (LAYERS - 3) * LAYER
    assert any("foreach kernels, its default on CUDA" in n for n in cuda_default.notes)
    assert not any("foreach" in n for n in loop.notes)


def test_an_explicit_choice_and_optimizers_without_foreach_are_left_alone() -> None:
    params = list(_model().parameters())
    assert foreach_as_on_cuda(torch.optim.AdamW(params, foreach=False)) == 0
    assert foreach_as_on_cuda(torch.optim.AdamW(params, fused=True)) == 0
    assert foreach_as_on_cuda(torch.optim.LBFGS(params)) == 0
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    assert foreach_as_on_cuda(opt) == 1 and opt.param_groups[0]["foreach"] is True


def test_a_cpu_estimate_keeps_the_cpu_default() -> None:
    est = _estimate(ADAMW, device="cpu")
    assert not any("foreach" in n for n in est.notes)


def test_a_cuda_targets_optimizer_keeps_its_step_counts_on_the_host() -> None:
    """torch makes a non-capturable optimizer's ``step`` with ``torch.tensor(0.0)``: a CPU tensor
    in a real CUDA run. For a CUDA target the resident optimizer state is exactly the two moments
    (2 x the parameter bytes); on a CPU target the step counts (4 B each) are there too."""
    cuda = _estimate(ADAMW)
    cpu = _estimate(ADAMW, device="cpu")
    assert cuda.resident["optimizer_state"] == 2 * LAYERS * LAYER
    assert cpu.resident["optimizer_state"] == 2 * LAYERS * LAYER + LAYERS * 4
    assert any(n.startswith(f"optimizer: {LAYERS} state tensor(s) made from Python data") for n in cuda.notes)
    assert not any("from Python data" in n for n in cpu.notes)


def test_step_counts_are_not_in_a_cuda_targets_peak() -> None:
    """In the second step's backward (the peak of a model with large activations) the optimizer
    state on the device is the two moments alone; torch registers every state tensor after a
    step, the host step counts included, and those are left out."""
    est = estimate_memory(
        _model(), torch.randn(4096, D), optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-4),
        loss_fn=lambda m, b: m(b).sum(), gpu="H200",
    )  # fmt: skip
    assert (est.peak_step, est.peak_phase) == (2, "backward")
    assert est.by_category["optimizer_state"] == 2 * LAYERS * LAYER
