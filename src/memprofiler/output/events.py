"""The typed record of one snapshot, as listeners (timeline, loggers) receive it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

#: ``start`` / ``end`` of a collected call, or ``step_end``: metrics that step-long collectors
#: (module-wise trackers) add to the call's ``end`` snapshot after backward and the optimizer step.
Phase = Literal["start", "end", "step_end"]


@dataclass(frozen=True)
class SnapshotEvent:
    """One snapshot recorded by the profiler; built once from the call's typed context."""

    key: str
    """Its key in the stats file, ``{rank}.{fn}.{call}.{phase}`` (``.end`` for ``step_end``)."""
    rank: int
    fn_name: str
    call: int
    phase: Phase
    t_ns: int
    """``time.time_ns()`` when the snapshot was taken (the call's own end for ``end``)."""
    metrics: Mapping[str, Any]
    """The metrics recorded now; for ``step_end`` only the late ones."""


#: A snapshot listener: ``MemProfiler.add_listener(fn)``.
Listener = Callable[[SnapshotEvent], None]
