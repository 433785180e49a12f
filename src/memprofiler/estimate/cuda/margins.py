"""Margins for what an estimate cannot model, so it is never quietly under.

Each applies only when the estimate sees its cause, is one line in the output, and is added to
the "fits" decision (``MemoryEstimate.margin_bytes``):

- a custom operator (an extension's op, outside torch's own namespaces): its kernel may use
  scratch memory no fake kernel shows; margin :data:`CUSTOM_OP_FRACTION` of the modelled peak;
- ``torch.compile`` (a compiled module anywhere in the model): Inductor fuses ops and keeps other
  intermediates, and ``mode="reduce-overhead"`` records CUDA graphs with a private memory pool;
  margin :data:`COMPILE_FRACTION` of the modelled peak;
- NCCL buffers (``ddp`` / ``fsdp`` over more than one rank): NCCL allocates its own buffers with
  ``cudaMalloc``, outside the caching allocator; margin ``NCCL_BUFFSIZE`` (4 MiB by default) x 2
  directions x :data:`NCCL_CHANNELS` channels x 2 algorithms (ring, tree) = 512 MiB by default;
- cuDNN's reserve spaces (batch norm, recurrent layers) for a CUDA target: the allowances of
  :mod:`memprofiler.estimate.cuda.cudnn_state`.

These are stated upper-side allowances, not measurements; ``reserve`` adds the user's own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from memprofiler.units import format_bytes

CUSTOM_OP_FRACTION = 0.05
COMPILE_FRACTION = 0.10
NCCL_CHANNELS = 32
NCCL_DEFAULT_BUFFSIZE = 4 << 20
#: Namespaces of torch's own operators (their fake kernels allocate what the CUDA kernels do).
TORCH_NAMESPACES = frozenset(
    {
        "aten",
        "prims",
        "prim",
        "_c10d_functional",
        "_c10d_functional_autograd",
        "c10d",
        "fsdp",
        "_dtensor",
        "profiler",
    }
)


@dataclass(frozen=True)
class Margin:
    reason: str
    nbytes: int

    def line(self) -> str:
        return f"margin {format_bytes(self.nbytes)} added to the fits decision: {self.reason}"


class CustomOps(TorchDispatchMode):
    """Collects the operators from outside torch's namespaces that a step runs."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        if func.namespace not in TORCH_NAMESPACES:
            self.names.add(str(func))
        return func(*args, **(kwargs or {}))


def _compiled(model: nn.Module) -> bool:
    for m in model.modules():
        if type(m).__name__ == "OptimizedModule" or getattr(m, "_compiled_call_impl", None) is not None:
            return True
    return False


def margins(
    model: nn.Module,
    peak: int,
    strategy: str,
    world_size: int,
    custom_ops: set[str],
    env: Mapping[str, str] | None = None,
    cudnn: list[tuple[str, int]] | None = None,
) -> list[Margin]:
    """The margins that apply to this estimate (none for a plain single-device model)."""
    env = os.environ if env is None else env
    out: list[Margin] = []
    if custom_ops:
        names = ", ".join(sorted(custom_ops)[:3]) + (", ..." if len(custom_ops) > 3 else "")
        out.append(
            Margin(
                f"custom operators ({names}) may use scratch memory their fake kernels do not show "
                f"({CUSTOM_OP_FRACTION:.0%} of the modelled peak)",
                int(peak * CUSTOM_OP_FRACTION),
            )
        )
    if _compiled(model):
        out.append(
            Margin(
                "torch.compile: Inductor's fused kernels and CUDA graph pools are not modelled "
                f"({COMPILE_FRACTION:.0%} of the modelled peak)",
                int(peak * COMPILE_FRACTION),
            )
        )
    out += [Margin(reason, n) for reason, n in cudnn or [] if n > 0]
    if strategy in ("ddp", "fsdp") and world_size > 1:
        try:
            buff = int(env.get("NCCL_BUFFSIZE", NCCL_DEFAULT_BUFFSIZE))
        except ValueError:
            buff = NCCL_DEFAULT_BUFFSIZE
        out.append(
            Margin(
                f"NCCL buffers outside the caching allocator (NCCL_BUFFSIZE {format_bytes(buff)} x 2 directions "
                f"x {NCCL_CHANNELS} channels x 2 algorithms)",
                buff * 2 * NCCL_CHANNELS * 2,
            )
        )
    return out
