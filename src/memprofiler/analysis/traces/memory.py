"""The memory view of one profiler trace, per device: the allocated and reserved curve, the
allocation / release pairs, and per-operator memory statistics (filled by
:mod:`memprofiler.analysis.traces.stream`; the page recomputes the statistics over a range).

Times are milliseconds from the trace's first event. An allocation and its release are paired
by address on the same device; an allocation still live at the end has no release time, and a
release of a block allocated before profiling started has no allocation time.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Points a memory curve keeps at most; a longer curve keeps each bin's highest point.
CURVE_POINTS = 2000


@dataclass(frozen=True)
class MemPair:
    """An allocation and its release (either may lie outside the trace)."""

    op: str
    size: int
    alloc_ms: float | None
    release_ms: float | None

    @property
    def duration_ms(self) -> float | None:
        if self.alloc_ms is None or self.release_ms is None:
            return None
        return self.release_ms - self.alloc_ms


@dataclass
class MemStat:
    """One operator's memory over a range (``self_*``: the operator alone, not its children)."""

    name: str
    calls: int = 0
    increase: int = 0
    self_increase: int = 0
    alloc_count: int = 0
    self_alloc_count: int = 0
    alloc_size: int = 0
    self_alloc_size: int = 0


@dataclass
class DeviceMemory:
    """What the memory view shows for one device."""

    device: str
    curve: list[tuple[float, int, int]]
    """``(ms, allocated, reserved)``, at most :data:`CURVE_POINTS` points."""
    peak_allocated: int
    peak_ms: float
    peak_reserved: int
    events: list[tuple[float, int, int]]
    """``(ms, bytes, event index)`` of every memory event, in time order; when the trace was
    streamed (:mod:`memprofiler.analysis.traces.stream`), only while the device has at most
    :data:`~memprofiler.analysis.traces.stream.RANGE_KEPT` of them (else empty)."""
    event_count: int = -1
    """How many memory events the device has (``len(events)`` when not given)."""

    def __post_init__(self) -> None:
        if self.event_count < 0:
            self.event_count = len(self.events)
