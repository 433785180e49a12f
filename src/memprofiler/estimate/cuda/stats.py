"""The statistics normalization layers keep for backward, in the dtype CUDA keeps them.

For float16 / bfloat16 inputs the CUDA kernels keep their per-row statistics in float32 (their
accumulate type, ``at::toAccumulateType(dtype, /*is_cuda=*/true)``), where the CPU kernels keep
them in the input's dtype:

- ``native_layer_norm`` (``layer_norm_cuda`` in ``aten/src/ATen/native/cuda/layer_norm_kernel.cu``):
  mean and rstd, one each per normalized row;
- ``native_batch_norm`` / ``_native_batch_norm_legit`` in training (``batch_norm_cuda`` in
  ``aten/src/ATen/native/cuda/Normalization.cu``, the path half inputs take where cuDNN is not
  used): save_mean and save_invstd, one each per channel.

``native_group_norm`` takes its statistics' dtype from the parameters on both devices and is left
alone. Under mixed precision CUDA autocast runs layer norm in float32 already; this matters for
``bf16-true`` / ``16-true`` steps.
"""

from __future__ import annotations

from typing import Any

import torch

from memprofiler.estimate.cuda.ops import OpHook

_aten = torch.ops.aten
HALF = (torch.float16, torch.bfloat16)
#: op -> the positions of the statistics among its outputs
STATS = {
    _aten.native_layer_norm.default: (1, 2),
    _aten.native_batch_norm.default: (1, 2),
    _aten._native_batch_norm_legit.default: (1, 2),
    _aten._native_batch_norm_legit.no_stats: (1, 2),
}


class FloatStats(OpHook):
    """Returns float32 statistics from the normalization ops above for half-precision inputs."""

    def __init__(self) -> None:
        self.calls = 0
        self.extra = 0

    def after(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        where = STATS.get(func)
        if where is None or not isinstance(args[0], torch.Tensor) or args[0].dtype not in HALF:
            return out
        outs = list(out)
        for i in where:
            stat = outs[i]
            if isinstance(stat, torch.Tensor) and stat.dtype in HALF and stat.numel():
                outs[i] = stat.float()
                self.extra += stat.numel() * 2
        self.calls += 1
        return tuple(outs)

    def note(self) -> str | None:
        if not self.calls:
            return None
        return (
            f"normalization: {self.calls} layer/batch norm call(s) on half-precision inputs keep float32 "
            f"statistics for backward, as CUDA's kernels do ({self.extra:,} B more than the CPU's)"
        )
