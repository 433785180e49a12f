"""Operator and module rows of the profiler views: host and device time, memory, calls, shapes.

:mod:`memprofiler.analysis.traces.stream` fills them: a ``[memory]`` event counts for the
innermost operator open at its time as *self* and for every enclosing operator and module as
*inclusive*; kernels reach the operator that launched them through Kineto's ``External id``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memprofiler.analysis.traces.events import MODULE_PREFIXES

#: Factory operators the memory events table names with their caller, ``caller (aten::empty)``.
FACTORIES = frozenset({"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_"})


@dataclass
class OpRow:
    """One operator name (or module, for :func:`module_rows`), summed over its calls."""

    name: str
    calls: int = 0
    host_self_us: float = 0.0
    host_total_us: float = 0.0
    device_self_us: float = 0.0
    device_total_us: float = 0.0
    self_alloc_bytes: int = 0
    alloc_bytes: int = 0
    """Bytes allocated inside it, children included (releases not subtracted)."""
    self_increase: int = 0
    increase: int = 0
    shapes: list[tuple[str, int]] = field(default_factory=list)
    """The most frequent ``Input Dims`` and their call counts (``record_shapes``)."""


def module_name(span: str) -> str:
    """``[pl][module]torch.nn.modules.linear.Linear: layer.0`` -> ``layer.0 (Linear)``."""
    for prefix in MODULE_PREFIXES:
        if span.startswith(prefix):
            rest = span[len(prefix) :]
            cls, sep, path = rest.partition(": ")
            return f"{path} ({cls.rsplit('.', 1)[-1]})" if sep else rest
    return span
