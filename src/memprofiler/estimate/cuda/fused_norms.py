"""``F.rms_norm`` as CUDA runs it, for a CUDA target estimated on fake CPU tensors.

On CUDA, torch's ``rms_norm`` calls ``_fused_rms_norm``: one kernel writes the output (the input's
dtype) and ``rstd`` (float32, one per row), and autograd keeps the input, the weight and
``rstd`` for ``_fused_rms_norm_backward``, which writes the input's and the weight's gradients
(``aten/src/ATen/native/layer_norm.cpp``, ``rms_norm_symint``; the CUDA kernels are layer norm's,
with the mean left out). On the CPU ``_fused_rms_norm`` has no kernel and decomposes into
``pow``, ``mean``, ``rsqrt`` and two ``mul``: autograd then keeps the normalised input as well
(float32 for a half-precision input, with the upcast input beside it), one more tensor the size
of the activation per norm, or two. Its backward sums the weight's gradient in two stages where
layer norm's does (:func:`memprofiler.estimate.kernel_scratch.gamma_beta_rows`).
``torch.nn.RMSNorm`` (torchtitan's LLaMA, for one) goes through ``F.rms_norm``; transformers' own
``*RMSNorm`` modules compute it with plain ops on both devices and are left alone.

The fused kernel came with torch 2.8 (pytorch/pytorch#153666); a target of an earlier torch keeps
the composite. CUDA keeps the composite path for a channels-last or complex input and where the
weight's dtype is not the input's; so does this. Under CUDA autocast ``rms_norm`` runs in float32
(:mod:`memprofiler.estimate.cuda.autocast` casts first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from memprofiler.estimate.cuda.kernel_scratch import gamma_beta_rows


class _FusedRMSNorm(torch.autograd.Function):
    """The fused kernel's outputs and saved tensors; the values are not computed (fake tensors)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, dims: int, sms: int) -> torch.Tensor:
        stat_shape = list(x.shape[: x.dim() - dims]) + [1] * dims
        y = torch.empty_like(x, memory_format=torch.contiguous_format)
        rstd = x.new_empty(stat_shape, dtype=torch.float32)
        ctx.save_for_backward(x, weight, rstd)
        ctx.dims, ctx.sms = dims, sms
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        x, weight, _rstd = ctx.saved_tensors
        # the kernels read the input and the output gradient contiguous: a copy of each that is not
        # (``sum``'s gradient is an expanded scalar), alive until the gradients are written
        copies = (x.contiguous(), grad.contiguous())
        dx = torch.empty_like(x, memory_format=torch.contiguous_format) if ctx.needs_input_grad[0] else None
        dw = None
        if weight is not None and ctx.needs_input_grad[1]:
            n = weight.numel()
            rows = gamma_beta_rows(x.numel() // max(n, 1), n, ctx.sms)
            if rows:  # layer norm's two-stage pass: rows of partial sums, then .sum(0) over them
                dw = x.new_empty(rows, n, dtype=weight.dtype).sum(0).view(weight.shape)
            else:
                dw = torch.empty_like(weight, memory_format=torch.contiguous_format)
        del copies
        return dx, dw, None, None


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


#: The first torch release whose CUDA ``rms_norm`` runs the fused kernel.
FUSED_SINCE = (2, 8)


def fused_rms_norm(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    torch_version: tuple[int, int] = FUSED_SINCE,
    sms: int = 132,
) -> torch.Tensor | None:
    """``F.rms_norm(input, normalized_shape, weight, eps)`` by CUDA's fused kernel, or None where
    CUDA too takes the composite path (or the tensors are real: their values are needed)."""
    if torch_version < FUSED_SINCE:
        return None
    names = ("input", "normalized_shape", "weight", "eps")
    got = {"weight": None, "eps": None, **dict(zip(names, args, strict=False)), **kwargs}
    x, weight = got["input"], got["weight"]
    shape: Sequence[int] = (
        (got["normalized_shape"],) if isinstance(got["normalized_shape"], int) else got["normalized_shape"]
    )
    if not isinstance(x, torch.Tensor) or not _is_fake(x) or x.is_complex():
        return None
    if (
        x.dim() in (4, 5)
        and not x.is_contiguous()
        and x.is_contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    ):
        return None  # suggest_memory_format() is channels-last: composite on CUDA too
    if weight is not None and weight.dtype != x.dtype:
        return None
    result: torch.Tensor = _FusedRMSNorm.apply(x, weight, len(shape), sms)
    return result
