"""Margins for what an estimate cannot model, so it is never quietly under.

Each applies only when the estimate sees its cause, is one line in the output, and is added to
the "fits" decision (``MemoryEstimate.margin_bytes``):

- a custom operator (an extension's op, outside torch's own namespaces): its kernel may use
  scratch memory no fake kernel shows; margin :data:`CUSTOM_OP_FRACTION` of the modelled peak;
- ``torch.compile`` (a compiled module anywhere in the model): Inductor fuses ops and keeps other
  intermediates, and ``mode="reduce-overhead"`` records CUDA graphs with a private memory pool;
  margin :data:`COMPILE_FRACTION` of the modelled peak;
- NCCL buffers (``ddp``, ``fsdp``, ``tp`` or a pipeline over more than one rank): NCCL allocates its own buffers with
  ``cudaMalloc``, outside the caching allocator; margin ``NCCL_BUFFSIZE`` (4 MiB by default) x 2
  directions x :data:`NCCL_CHANNELS` channels x 2 algorithms (ring, tree) = 512 MiB by default;
- cuDNN's reserve spaces (batch norm, recurrent layers) for a CUDA target: the allowances of
  :mod:`memprofiler.estimate.cuda.cudnn_state`.

These are stated upper-side allowances, not measurements; ``reserve`` adds the user's own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from memprofiler.estimate.cuda.ops import OpHook
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


class CustomOps(OpHook):
    """Collects the operators from outside torch's namespaces that a step runs."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def before(self, func: Any) -> None:
        if func.namespace not in TORCH_NAMESPACES:
            self.names.add(str(func))


def compiled_modules(*models: nn.Module) -> list[str]:
    """Names of the modules of ``models`` that ``torch.compile`` runs, whatever wraps them.

    A module compiled as ``torch.compile(block)`` is an ``OptimizedModule`` (FSDP2's
    ``fully_shard`` swaps its class for a subclass, ``FSDPOptimizedModule``); one compiled in place
    with ``block.compile()`` keeps its class and holds ``_compiled_call_impl`` (which a deep copy
    drops, so the caller's model is looked at as well as the copy the estimate runs); a
    ``module.forward = torch.compile(module.forward)`` leaves dynamo's wrapper on the instance.
    """
    from torch._dynamo.eval_frame import OptimizedModule

    names: dict[str, None] = {}
    for model in models:
        for name, m in model.named_modules():
            forward = vars(m).get("forward")
            if (
                isinstance(m, OptimizedModule)
                or getattr(m, "_compiled_call_impl", None) is not None
                or getattr(forward, "_torchdynamo_orig_callable", None) is not None
            ):
                names[name.replace("._orig_mod", "") or "(the model)"] = None
    return list(names)


def float8_modules(*models: nn.Module) -> list[str]:
    """Names of float8 training modules (torchao's ``Float8Linear`` and kin) or float8 parameters."""
    names: dict[str, None] = {}
    for model in models:
        for name, m in model.named_modules():
            cls = type(m)
            own = [p for p in m.parameters(recurse=False) if "float8" in str(p.dtype)]
            if cls.__name__.startswith("Float8") or ".float8" in cls.__module__ or own:
                names[name or "(the model)"] = None
    return list(names)


#: The note for float8 modules: what the estimate counts in their place.
FLOAT8_NOTE = (
    "float8 training ({names}): not modelled; their fp8 casts, scales, fp8 saved activations and fp8 "
    "all-gather are counted as the ops the step runs on fake tensors, which may differ from the fp8 kernels'"
)


def _names(found: list[str]) -> str:
    return ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")


def nccl_buffsize(env: Mapping[str, str]) -> tuple[int, str]:
    """``NCCL_BUFFSIZE`` as NCCL reads it (``strtoll`` base 0: ``4194304``, ``0x400000``), with the
    note for a value it does not take; the default where the variable is unset or not a positive size."""
    raw = env.get("NCCL_BUFFSIZE")
    if raw is None or not raw.strip():
        return NCCL_DEFAULT_BUFFSIZE, ""
    found = re.match(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)", raw)
    value = 0
    if found:
        digits = found.group(2)
        base = 16 if digits[:2].lower() == "0x" else 8 if digits.startswith("0") and len(digits) > 1 else 10
        value = int(digits, base) * (-1 if found.group(1) == "-" else 1)
    if value <= 0 or value >= 1 << 63:
        return NCCL_DEFAULT_BUFFSIZE, (
            f"NCCL_BUFFSIZE={raw!r} is not a positive size as NCCL reads it (strtoll); the margin keeps "
            f"NCCL's default {format_bytes(NCCL_DEFAULT_BUFFSIZE)}"
        )
    return value, ""


def margins(
    model: nn.Module | Sequence[nn.Module],
    peak: int,
    strategy: str,
    world_size: int,
    custom_ops: set[str],
    env: Mapping[str, str] | None = None,
    cudnn: list[tuple[str, int]] | None = None,
) -> list[Margin]:
    """The margins that apply to this estimate (none for a plain single-device model).

    ``model``: the model the step ran, or several (the caller's and the estimate's copy): a
    compiled module in any of them gets the compile margin.
    """
    env = os.environ if env is None else env
    models = [model] if isinstance(model, nn.Module) else list(model)
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
    compiled = compiled_modules(*models)
    if compiled:
        out.append(
            Margin(
                f"torch.compile ({_names(compiled)}): Inductor's fused kernels and CUDA graph pools are not "
                f"modelled ({COMPILE_FRACTION:.0%} of the modelled peak)",
                int(peak * COMPILE_FRACTION),
            )
        )
    out += [Margin(reason, n) for reason, n in cudnn or [] if n > 0]
    if strategy in ("ddp", "fsdp", "tp", "pipeline") and world_size > 1:
        buff, bad = nccl_buffsize(env)
        out.append(
            Margin(
                f"NCCL buffers outside the caching allocator (NCCL_BUFFSIZE {format_bytes(buff)} x 2 directions "
                f"x {NCCL_CHANNELS} channels x 2 algorithms)" + (f"; {bad}" if bad else ""),
                buff * 2 * NCCL_CHANNELS * 2,
            )
        )
    return out
