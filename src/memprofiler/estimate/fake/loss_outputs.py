"""Loss ops whose real kernels return the reduced loss in a storage the size of the input.

With reduction ``mean`` or ``sum`` four loss ops allocate their output at the input's size,
compute the elementwise loss or the reduction into it, and then resize it to a 0-d tensor, which
keeps the storage (``resize_`` never shrinks one). The fake kernels allocate the 0-d output alone
(4 B in float32), so the estimate missed the input's size for as long as the loss lives, which in
a training step is through backward and the optimizer step. From torch's source, the same code on
CPU and CUDA (``aten/src/ATen/native/Loss.cpp``, ``native/cuda/Loss.cu``):

- ``mse_loss`` and ``smooth_l1_loss``: structured kernels whose meta function builds the output as
  a binary op of input and target (their broadcast shape, their common dtype), then resizes it
  to ``{}`` (``TORCH_META_FUNC``);
- ``binary_cross_entropy``: ``loss = at::empty_like(input)``, the elementwise loss written into it,
  then ``loss.resize_as_(loss_reduced).copy_(loss_reduced)``;
- ``soft_margin_loss``: ``at::neg_out(output, input)`` sizes the output as the input, the loss is
  computed in place, then ``output.resize_({})``.

Measured on real CPU tensors (torch 2.13): the 0-d loss of each holds ``input.numel() x
element size`` bytes; ``huber_loss``, ``binary_cross_entropy_with_logits``, ``l1_loss`` and
``kl_div`` return a storage of their own size. :data:`REAL_STORAGE` maps each op to a stand-in
that returns the same 0-d loss in a storage of the real size (fake operands only: a real
kernel's output already has it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

_aten = torch.ops.aten
MSE = _aten.mse_loss.default
SMOOTH_L1 = _aten.smooth_l1_loss.default
BCE = _aten.binary_cross_entropy.default
SOFT_MARGIN = _aten.soft_margin_loss.default
#: ``at::Reduction::None``; ``Mean`` (1) is every op's default.
NONE = 0


def arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, key: str, default: Any = None) -> Any:
    """Argument ``i`` of an op's call, given by position or as ``key``."""
    return args[i] if len(args) > i else kwargs.get(key, default)


def binary_elements(args: tuple[Any, ...]) -> int:
    """Elements of a binary op's output over the first two arguments (their broadcast shape)."""
    return math.prod(int(s) for s in torch.broadcast_shapes(args[0].shape, args[1].shape))


def _input_elements(args: tuple[Any, ...]) -> int:
    return int(args[0].numel())


class _InputSized:
    """Runs a loss op and, when it reduces, returns its 0-d loss in a storage of ``elements``'s size."""

    def __init__(self, op: Any, reduction_at: int, elements: Callable[[tuple[Any, ...]], int]) -> None:
        self.op = op
        self.reduction_at = reduction_at
        self.elements = elements

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.op(*args, **kwargs)
        if arg(args, kwargs, self.reduction_at, "reduction", 1) == NONE:
            return out
        n = self.elements(args)  # in the output's dtype: the op's common dtype
        if n * out.element_size() <= out.untyped_storage().nbytes():
            return out
        held = torch.empty(n, dtype=out.dtype, device=out.device)
        return held.resize_(out.shape)


#: Each loss op whose real kernels keep the input's size under the 0-d loss -> its stand-in.
REAL_STORAGE: dict[Any, Any] = {
    MSE: _InputSized(MSE, 2, binary_elements),
    SMOOTH_L1: _InputSized(SMOOTH_L1, 2, binary_elements),
    BCE: _InputSized(BCE, 3, _input_elements),
    SOFT_MARGIN: _InputSized(SOFT_MARGIN, 2, _input_elements),
}
