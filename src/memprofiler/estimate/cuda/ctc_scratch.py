"""The scratch CUDA's CTC loss allocates inside itself, from torch's ``native/cuda/LossCTC.cu``.

``_ctc_loss`` (``ctc_loss_gpu_template``) and ``_ctc_loss_backward``
(``ctc_loss_backward_gpu_template``) each copy the target lengths, the input lengths and the
targets' batch offsets to the device (an int64 a sequence each) for the call. Backward then fills
``log_beta``, allocated like ``log_alpha`` (batch x steps x (2 x the longest target + 1)), beside
the gradient it returns. Where torch's heuristic calls the problem large (``2 T + 24 B / 10 +
2 C / 10 > 450``, over steps, batch and labels) the blanks' term is a ``logsumexp`` over every
other position of ``log_alpha + log_beta``: that sum (its last dim the longest target + 1), its
``amax`` and ``maxes.abs() == INFINITY``, then ``(self - maxes).exp_()`` and the summed result,
with the two reductions' scratch (:mod:`memprofiler.estimate.cuda.reduce_scratch`). With
``zero_infinity`` that path ends in ``at::where(nll == INFINITY, zeros({}), grad)``: a second
gradient, the size of the first, made while the first is held. The small path's kernels write
into the gradient and take nothing more.

On the CPU (``LossCTC.cpp``) the backward holds ``log_beta`` alone beside the gradient (measured
with torch 2.13's profiler); it has no large path.
"""

from __future__ import annotations

import torch

from memprofiler.estimate.cuda import reduce_scratch

_aten = torch.ops.aten
FORWARD = (_aten._ctc_loss.default, _aten._ctc_loss.Tensor)
BACKWARD = (_aten._ctc_loss_backward.default, _aten._ctc_loss_backward.Tensor)
INT64 = 8


def nbytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s elements."""
    return int(t.numel()) * t.element_size()


def lengths(log_probs: torch.Tensor) -> list[int]:
    """``tg_batch_offsets``, ``target_lengths_t`` and ``input_lengths_t`` on the device."""
    return [INT64 * int(log_probs.size(1))] * 3


def is_large(steps: int, batch: int, labels: int) -> bool:
    """torch's choice of the backward's large-problem path (``is_large``)."""
    return 2 * steps + (24 * batch) // 10 + (2 * labels) // 10 > 450


def backward_phases(
    log_probs: torch.Tensor,
    log_alpha: torch.Tensor,
    zero_infinity: bool,
    grad_bytes: int,
    device: reduce_scratch.Device,
) -> list[list[int]]:
    """Phases of scratch (each a list of blocks live together) of one CUDA CTC backward whose
    gradient takes ``grad_bytes``."""
    steps, batch, labels = (int(s) for s in log_probs.shape)
    base = [*lengths(log_probs), nbytes(log_alpha)]  # and log_beta, log_alpha's size
    if not is_large(steps, batch, labels):
        return [base]
    b, t = int(log_alpha.size(0)), int(log_alpha.size(1))
    blanks = torch.empty(b, t, int(log_alpha.size(2)) // 2 + 1, dtype=log_alpha.dtype, device="meta")
    summed, rows = nbytes(blanks), b * t * blanks.element_size()
    amax = reduce_scratch.op_scratch(_aten.amax.default, (blanks, [2], True), {}, device)
    total = reduce_scratch.op_scratch(_aten.sum.dim_IntList, (blanks, [2], True), {}, device)
    phases = [
        base,
        [*base, summed, rows, *amax],  # log_alpha + log_beta at the blanks, its max
        [*base, summed, rows, rows, b * t],  # maxes.abs() == INFINITY
        [*base, summed, rows, summed, rows, *total],  # (self - maxes).exp_() summed into the result
    ]
    if zero_infinity:
        phases.append([*base, batch, log_probs.element_size(), grad_bytes])  # the mask, zeros({}), where
    return phases
