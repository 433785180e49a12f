"""Ops whose fake kernel lays an output out differently from the real CPU and CUDA kernels.

An output's strides decide what the next ops allocate: ``reshape`` of a non-contiguous tensor
copies, of a contiguous one it is a view. ``native_layer_norm_backward``'s fake kernel is its
decomposition (``torch/_decomp/decompositions.py``), which gives the input gradient the input's
strides; both real kernels (``layer_norm_backward_cpu`` in ``aten/src/ATen/native/layer_norm.cpp``,
``layer_norm_backward_cuda`` in ``native/cuda/layer_norm_kernel.cu``) make it
``empty_like(input.contiguous(), LEGACY_CONTIGUOUS_MEMORY_FORMAT)``: contiguous. Swin's patch
merging normalises a transposed tensor, so the fake gradient came out transposed and the
``view`` that followed in a real step became a copy in the estimate (``clone``, 16,384 B at each
of two calls a step: the CPU estimate was 16,384 B over the census).

:data:`REAL_LAYOUT` maps each such op to a stand-in that runs it and lays its outputs out as the
real kernels do (same sizes, dtypes and bytes; only strides differ).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_aten = torch.ops.aten
LAYER_NORM_BACKWARD = _aten.native_layer_norm_backward.default


def _contiguous_like(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` if contiguous, else a fresh contiguous tensor of its sizes and dtype (no values: fake)."""
    if t is None or t.is_contiguous():
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def layer_norm_backward(*args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
    """``native_layer_norm_backward`` with the input gradient contiguous, as both kernels make it."""
    grad_input, grad_weight, grad_bias = LAYER_NORM_BACKWARD(*args, **kwargs)
    return _contiguous_like(grad_input), grad_weight, grad_bias


#: op -> the stand-in the tracker dispatches instead, for fake operands only.
REAL_LAYOUT: dict[Any, Callable[..., Any]] = {LAYER_NORM_BACKWARD: layer_norm_backward}
