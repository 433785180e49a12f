"""Run a fake step on CPU tensors as CUDA would dispatch it, for a CUDA target.

Where torch's CPU and CUDA code take different paths that keep different tensors, the
estimate takes CUDA's, so a laptop's answer is the GPU node's answer:

- ``F.scaled_dot_product_attention``: the kernel CUDA's selection rules pick, see
  :mod:`memprofiler.estimate.attention`.
- autocast: the casts CUDA autocast makes and CPU autocast does not, see
  :mod:`memprofiler.estimate.cuda_autocast`.
- ``F.dropout`` (training, 0 < p < 1, not in place): CUDA runs the fused ``native_dropout`` and
  keeps a one-byte mask per element for backward; the CPU multiplies by a noise tensor of the
  input's dtype and keeps that (four bytes per element in float32), so on CPU rules GPT-2's nine
  dropouts at batch 8 x 512 keep 54 MiB more than on the GPU (``aten/src/ATen/native/Dropout.cpp``,
  ``is_fused_kernel_acceptable``). In-place, alpha and feature dropout take the noise path on
  CUDA too and are left as they are.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from memprofiler.estimate import cuda_autocast
from memprofiler.estimate.attention import AttentionLog, attention
from memprofiler.estimate.target import CudaTarget

_SDPA = (F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)
_DROPOUT = (F.dropout, torch.dropout)


def _dropout(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[torch.Tensor, float] | None:
    """The input and p of a dropout CUDA would fuse, else None."""
    names = ("input", "p", "training", "inplace")
    got = {"p": 0.5, "training": True, "inplace": False, **dict(zip(names, args, strict=False)), **kwargs}
    if "train" in kwargs:  # torch.dropout(input, p, train)
        got["training"] = kwargs["train"]
    x, p = got["input"], float(got["p"])
    if not isinstance(x, torch.Tensor) or got["inplace"] or not got["training"]:
        return None
    if not (0 < p < 1) or x.numel() == 0:
        return None
    return x, p


class CudaDispatch(TorchFunctionMode):
    """Routes the calls whose CPU and CUDA paths keep different tensors to CUDA's path."""

    def __init__(self, target: CudaTarget) -> None:
        super().__init__()
        self.target = target
        self.log = AttentionLog()
        self.fused_dropouts = 0

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _SDPA:
            return attention(self.log, self.target, args, kwargs)
        if func in _DROPOUT:
            found = _dropout(args, kwargs)
            if found is not None:
                self.fused_dropouts += 1
                return torch.ops.aten.native_dropout(found[0], found[1], True)[0]
        args, kwargs = cuda_autocast.cast(func, args, kwargs)
        return func(*args, **kwargs)

    def notes(self) -> list[str]:
        out = self.log.notes(self.target)
        if self.fused_dropouts:
            out.append(
                f"dropout: {self.fused_dropouts} call(s) as CUDA's fused native_dropout (a 1-byte mask kept for "
                "backward, where the CPU keeps a noise tensor of the input's dtype)"
            )
        return out
