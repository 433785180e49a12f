"""The temporaries CUDA's fused loss kernels allocate inside themselves, which no fake kernel shows.

A loss op that reduces (``mean`` or ``sum``) computes the elementwise loss into a temporary the
size of its input and reduces that; the fake kernel allocates the 0-d loss alone. From torch's
source (``aten/src/ATen/native/Loss.cpp``, ``native/cuda/Loss.cu``; for the first five items the
CPU kernels are the same code, and their allocations, measured on real CPU tensors with torch 2.13,
are these):

- ``mse_loss``, ``smooth_l1_loss``: ``Tensor loss`` built as a binary op of input and target (their
  broadcast shape and common dtype), then ``at::mean_out`` / ``at::sum_out`` over it into the
  output (``F.smooth_l1_loss`` with ``beta=0`` calls ``l1_loss``, a composite).
- ``huber_loss``: ``at::empty_like(input)``, then ``loss.mean()`` / ``loss.sum()``, whose result is
  the output.
- ``binary_cross_entropy``, ``soft_margin_loss``: the loss is computed in the output's own storage
  (:mod:`memprofiler.estimate.fake.loss_outputs` gives it the input's size); the reduced value is
  a new 0-d tensor copied back.
- ``soft_margin_loss_backward`` (every reduction): ``z = at::exp(-target * input)`` holds ``-target``,
  the product and ``z`` at once, before the gradient exists; the gradient is then written beside
  ``z``. The three are replayed as the first two beside the gradient, which has ``z``'s size.
- ``binary_cross_entropy_with_logits`` (a composite: its ops do not reach a dispatch mode):
  ``at::log_sigmoid(input)`` (CUDA's keeps no buffer; CPU's holds one more input-sized buffer
  briefly), with ``pos_weight`` ``(pos_weight - 1).mul(target)`` beside it, then
  ``(1 - target).mul_(input).sub_(...)`` and its reduction; with ``none`` that last tensor is the
  output.
- ``nll_loss_forward`` / ``nll_loss_backward`` (``native/cuda/Loss.cu``): contiguous copies
  (``expect_contiguous``) of the input, the target, the weight and, in backward, of the output
  gradient, where they are not contiguous; ``nll_loss2d_forward`` (``LossNLL2d.cu``) copies the
  input and the target where it reduces, its backward the target; the weight always. None for
  ``cross_entropy``, whose log-softmax output is contiguous.
- ``multi_margin_loss`` / ``multilabel_margin_loss`` (``LossMultiMargin.cu``,
  ``LossMultiLabelMargin.cu``): contiguous copies of the input, the target and the weight; where a
  2-D input reduces, a per-row loss (one value a row) summed into the output. Their backward
  kernels copy the input, the target, the output gradient and ``is_target`` where not contiguous.
- ``_ctc_loss`` / ``_ctc_loss_backward``: :mod:`memprofiler.estimate.cuda.ctc_scratch`.

Each reduction also takes the staging buffer and semaphores of CUDA's reduction kernel over the
temporary (:mod:`memprofiler.estimate.cuda.reduce_scratch`). ``mse_loss_backward``,
``smooth_l1_loss_backward``, ``huber_loss_backward`` and ``binary_cross_entropy_backward``
write their gradient through one TensorIterator and take nothing more; ``l1_loss``, ``kl_div``,
``poisson_nll_loss``, the margin ranking, hinge and cosine embedding losses and ``cross_entropy``
with probabilities are composites whose ops the fake step already sees. Each transient is freed when the op returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from memprofiler.estimate.cuda import ctc_scratch, reduce_scratch
from memprofiler.estimate.cuda.ctc_scratch import nbytes
from memprofiler.estimate.cuda.kernel_scratch import ScratchLog
from memprofiler.estimate.cuda.ops import OpHook
from memprofiler.estimate.cuda.target import CudaTarget
from memprofiler.estimate.fake import loss_outputs
from memprofiler.estimate.fake.loss_outputs import NONE, arg, binary_elements
from memprofiler.estimate.part import Part

_aten = torch.ops.aten
HUBER = _aten.huber_loss.default
SOFT_MARGIN_BWD = _aten.soft_margin_loss_backward.default
BCE_LOGITS = _aten.binary_cross_entropy_with_logits.default
NLL = _aten.nll_loss_forward.default
NLL_BWD = _aten.nll_loss_backward.default
NLL2D = _aten.nll_loss2d_forward.default
NLL2D_BWD = _aten.nll_loss2d_backward.default
CATEGORY = "loss"


def reduction_scratch(n: int, dtype: torch.dtype, reduction: int, device: reduce_scratch.Device) -> list[int]:
    """The staging buffer and semaphores of ``mean`` (``reduction`` 1) or ``sum`` (2) over ``n`` values."""
    op = _aten.mean.default if reduction == 1 else _aten.sum.default
    return reduce_scratch.op_scratch(op, (torch.empty(n, dtype=dtype, device="meta"),), {}, device)


def _beside_output(blocks: list[int], out: int) -> list[int]:
    """Blocks live before the op's output exists, as scratch beside it: the output takes the place
    of the last block of its size (all are kept where none has it: over by less than the output)."""
    for i in range(len(blocks) - 1, -1, -1):
        if blocks[i] == out:
            return blocks[:i] + blocks[i + 1 :]
    return blocks


@dataclass(frozen=True)
class _Call:
    """One loss call as a rule sees it."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    out: Any
    device: reduce_scratch.Device

    def reduction(self, at: int) -> int:
        return int(arg(self.args, self.kwargs, at, "reduction", 1))


def _binary(c: _Call) -> list[list[int]]:
    """``mse_loss`` / ``smooth_l1_loss``: the elementwise loss, then its reduction into the output."""
    reduction = c.reduction(2)
    if reduction == NONE:
        return []
    n = binary_elements(c.args)
    dtype = torch.result_type(c.args[0], c.args[1])
    return [[n * dtype.itemsize, *reduction_scratch(n, dtype, reduction, c.device)]]


def _huber(c: _Call) -> list[list[int]]:
    reduction = c.reduction(2)
    if reduction == NONE:
        return []
    x = c.args[0]
    return [[nbytes(x), *reduction_scratch(x.numel(), x.dtype, reduction, c.device)]]


def _reduced_in_place(at: int) -> Callable[[_Call], list[list[int]]]:
    """``binary_cross_entropy`` / ``soft_margin_loss``: the 0-d reduced value and the reduction's
    scratch (the elementwise loss is in the output)."""

    def phases(c: _Call) -> list[list[int]]:
        reduction = c.reduction(at)
        if reduction == NONE:
            return []
        x = c.args[0]
        return [[x.element_size(), *reduction_scratch(x.numel(), x.dtype, reduction, c.device)]]

    return phases


def _soft_margin_backward(c: _Call) -> list[list[int]]:
    x, target = c.args[1], c.args[2]
    prod = binary_elements((target, x)) * torch.result_type(target, x).itemsize
    out = nbytes(c.out)
    return [_beside_output([nbytes(target), prod, prod], out), [prod]]


def _bce_with_logits(c: _Call) -> list[list[int]]:
    x, target = c.args[0], c.args[1]
    pos_weight = arg(c.args, c.kwargs, 3, "pos_weight")
    reduction = c.reduction(4)
    lsi = nbytes(x)
    phases = []
    if pos_weight is not None:
        log_weight = binary_elements((pos_weight, target)) * torch.result_type(pos_weight, target).itemsize
        first = [lsi, nbytes(pos_weight), log_weight]
        phases.append(_beside_output(first, nbytes(c.out)) if reduction == NONE else first)
    if reduction == NONE:
        return [*phases, [lsi]]  # the loss is the output
    loss = nbytes(target)
    return [*phases, [lsi, loss, *reduction_scratch(target.numel(), target.dtype, reduction, c.device)]]


def _copies(*tensors: Any) -> list[int]:
    """What ``expect_contiguous()`` allocates for each of ``tensors`` (nothing for a contiguous one)."""
    return [nbytes(t) for t in tensors if isinstance(t, torch.Tensor) and not t.is_contiguous()]


def _nll(c: _Call) -> list[list[int]]:
    copies = _copies(c.args[0], c.args[1], arg(c.args, c.kwargs, 2, "weight"))
    return [copies] if copies else []


def _nll_backward(c: _Call) -> list[list[int]]:
    grad_output, x, target = c.args[:3]
    copies = _copies(target, x, grad_output, arg(c.args, c.kwargs, 3, "weight"))
    return [copies] if copies else []


def _nll2d(c: _Call) -> list[list[int]]:
    weight = arg(c.args, c.kwargs, 2, "weight")
    reduces = c.reduction(3) != NONE
    copies = _copies(*((c.args[0], c.args[1]) if reduces else ()), weight)
    return [copies] if copies else []


def _nll2d_backward(c: _Call) -> list[list[int]]:
    weight = arg(c.args, c.kwargs, 3, "weight")
    reduces = c.reduction(4) != NONE
    copies = _copies(*((c.args[2],) if reduces else ()), weight)
    return [copies] if copies else []


def _per_row(x: torch.Tensor, reduction: int, device: reduce_scratch.Device) -> list[int]:
    """A 2-D margin loss's per-row values and the sum over them (``at::sum_out``), where it reduces."""
    if reduction == NONE or x.dim() != 2:
        return []
    rows = int(x.size(0))
    return [rows * x.element_size(), *reduction_scratch(rows, x.dtype, 2, device)]


def _multi_margin(c: _Call) -> list[list[int]]:
    x = c.args[0]
    found = [
        *_copies(x, c.args[1], arg(c.args, c.kwargs, 4, "weight")),
        *_per_row(x, c.reduction(5), c.device),
    ]
    return [found] if found else []


def _multi_margin_backward(c: _Call) -> list[list[int]]:
    copies = _copies(c.args[1], c.args[0], c.args[2], arg(c.args, c.kwargs, 5, "weight"))
    return [copies] if copies else []


def _multilabel_margin(c: _Call) -> list[list[int]]:
    x = c.args[0]
    found = [*_copies(x, c.args[1]), *_per_row(x, c.reduction(2), c.device)]
    return [found] if found else []


def _multilabel_margin_backward(c: _Call) -> list[list[int]]:
    copies = _copies(c.args[1], c.args[2], arg(c.args, c.kwargs, 4, "is_target"), c.args[0])
    return [copies] if copies else []


def _ctc_backward(c: _Call) -> list[list[int]]:
    zero_infinity = bool(arg(c.args, c.kwargs, 8, "zero_infinity", False))
    return ctc_scratch.backward_phases(c.args[1], c.args[6], zero_infinity, nbytes(c.out), c.device)


#: Each loss op whose CUDA kernel allocates temporaries inside itself -> (its name, its phases).
RULES: dict[Any, tuple[str, Callable[[_Call], list[list[int]]]]] = {
    loss_outputs.MSE: ("mse_loss", _binary),
    loss_outputs.SMOOTH_L1: ("smooth_l1_loss", _binary),
    HUBER: ("huber_loss", _huber),
    loss_outputs.BCE: ("binary_cross_entropy", _reduced_in_place(3)),
    loss_outputs.SOFT_MARGIN: ("soft_margin_loss", _reduced_in_place(2)),
    SOFT_MARGIN_BWD: ("soft_margin_loss backward", _soft_margin_backward),
    BCE_LOGITS: ("binary_cross_entropy_with_logits", _bce_with_logits),
    NLL: ("nll_loss", _nll),
    NLL_BWD: ("nll_loss backward", _nll_backward),
    NLL2D: ("nll_loss2d", _nll2d),
    NLL2D_BWD: ("nll_loss2d backward", _nll2d_backward),
    _aten.multi_margin_loss.default: ("multi_margin_loss", _multi_margin),
    _aten.multi_margin_loss_backward.default: ("multi_margin_loss backward", _multi_margin_backward),
    _aten.multilabel_margin_loss_forward.default: ("multilabel_margin_loss", _multilabel_margin),
    _aten.multilabel_margin_loss_backward.default: (
        "multilabel_margin_loss backward",
        _multilabel_margin_backward,
    ),
    **{op: ("ctc_loss", lambda c: [ctc_scratch.lengths(c.args[0])]) for op in ctc_scratch.FORWARD},
    **{op: ("ctc_loss backward", _ctc_backward) for op in ctc_scratch.BACKWARD},
}


class LossLog(ScratchLog):
    """Per loss op: calls with scratch and the most one call held at once, for the notes."""

    def notes(self) -> list[str]:
        return [
            f"{name}: the loss's temporaries the CUDA kernel allocates inside itself replayed at each of "
            f"{self.calls[name]} call(s), up to {self.largest[name]:,} B at once (torch's CUDA source)"
            for name in sorted(self.calls)
        ]


class LossScratch(OpHook):
    """Calls ``phases("loss", [[bytes, ...], ...])`` for each loss op of :data:`RULES` that takes
    temporaries on ``target``, and logs it for the notes."""

    def __init__(self, phases: Callable[[str, list[list[int]]], None], target: CudaTarget) -> None:
        self.phases = phases
        self.log = LossLog()
        self.device = reduce_scratch.Device(target.sms, target.threads_per_sm)

    def after(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        rule = RULES.get(func)
        if rule is None or getattr(args[0], "to_local", None) is not None:
            return out  # a DTensor's local op comes back on its own
        first = next(iter(tree_leaves(out)), None)
        found = rule[1](_Call(args, kwargs, first, self.device))
        found = [p for p in found if p]
        if found:
            self.log.add(rule[0], max(sum(p) for p in found))
            self.phases(CATEGORY, found)
        return out


class LossTemporaries(Part):
    """What the loss kernels allocate inside themselves (:class:`LossScratch`)."""

    def __init__(self, target: CudaTarget, tracker: Any) -> None:
        self.scratch = LossScratch(tracker.phases, target)

    def hook(self) -> OpHook | None:
        return self.scratch

    def notes(self, notes: list[str]) -> list[str]:
        return notes + self.scratch.log.notes()
