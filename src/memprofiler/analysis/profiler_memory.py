"""The memory view of one profiler trace, per device: the allocated and reserved curve, the
allocation / release pairs, and per-operator memory statistics over any time range.

Times are milliseconds from the trace's first event. An allocation and its release are paired
by address on the same device; an allocation still live at the end has no release time, and a
release of a block allocated before profiling started has no allocation time.
"""

from __future__ import annotations

from dataclasses import dataclass

from memprofiler.analysis.profiler_ops import Nesting, op_label
from memprofiler.analysis.trace_events import OP, Trace

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
    streamed (:mod:`memprofiler.analysis.trace_stream`), only while the device has at most
    :data:`~memprofiler.analysis.trace_stream.RANGE_KEPT` of them (else empty)."""
    event_count: int = -1
    """How many memory events the device has (``len(events)`` when not given)."""

    def __post_init__(self) -> None:
        if self.event_count < 0:
            self.event_count = len(self.events)


def ms(trace: Trace, ts: float) -> float:
    """A trace timestamp (µs) as milliseconds from the trace's first event."""
    return round((ts - trace.start) / 1000.0, 6)


def device_memory(trace: Trace) -> list[DeviceMemory]:
    """The curve and events of every device with ``[memory]`` events, in order of appearance."""
    m = trace.memory
    out = []
    for dev, label in enumerate(trace.devices):
        idx = sorted((j for j in range(len(m.ts)) if m.device[j] == dev), key=lambda j: (m.ts[j], j))
        pts = [(ms(trace, m.ts[j]), m.allocated[j], m.reserved[j]) for j in idx]
        peak = max(range(len(pts)), key=lambda k: (pts[k][1], -k))
        out.append(
            DeviceMemory(
                device=label,
                curve=_thin(pts),
                peak_allocated=pts[peak][1],
                peak_ms=pts[peak][0],
                peak_reserved=max(p[2] for p in pts),
                events=[(ms(trace, m.ts[j]), m.nbytes[j], j) for j in idx],
            )
        )
    return out


def _thin(pts: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
    if len(pts) <= CURVE_POINTS:
        return pts
    size = -(-len(pts) // CURVE_POINTS)
    return [max(pts[k : k + size], key=lambda p: p[1]) for k in range(0, len(pts), size)]


def pairs(trace: Trace, nesting: Nesting, dm: DeviceMemory) -> list[MemPair]:
    """Allocation / release pairs of one device, by allocation time (unpaired releases last)."""
    m = trace.memory
    open_: dict[int, tuple[int, float]] = {}
    out: list[MemPair] = []
    for t, b, j in dm.events:
        if b > 0:
            if m.addr[j] in open_:  # an address reused without a release in between: keep both
                k, a = open_.pop(m.addr[j])
                out.append(MemPair(op_label(trace, nesting, nesting.mem_op[k]), m.nbytes[k], a, None))
            open_[m.addr[j]] = (j, t)
        else:
            got = open_.pop(m.addr[j], None)
            if got is None:
                out.append(MemPair(op_label(trace, nesting, nesting.mem_op[j]), -b, None, t))
            else:
                k, a = got
                out.append(MemPair(op_label(trace, nesting, nesting.mem_op[k]), m.nbytes[k], a, t))
    for k, a in open_.values():
        out.append(MemPair(op_label(trace, nesting, nesting.mem_op[k]), m.nbytes[k], a, None))
    return sorted(out, key=lambda p: (p.alloc_ms is None, p.alloc_ms or 0.0, p.release_ms or 0.0))


def pairs_in(all_pairs: list[MemPair], lo: float, hi: float) -> list[MemPair]:
    """The pairs whose allocation or release lies in ``[lo, hi]`` ms."""
    return [
        p
        for p in all_pairs
        if (p.alloc_ms is not None and lo <= p.alloc_ms <= hi)
        or (p.release_ms is not None and lo <= p.release_ms <= hi)
    ]


def memory_stats(
    trace: Trace, nesting: Nesting, dm: DeviceMemory, lo: float = float("-inf"), hi: float = float("inf")
) -> list[MemStat]:
    """Per-operator memory statistics of one device over ``[lo, hi]`` ms, by size increase.

    An operator is listed when a memory event inside it lies in the range; its ``calls`` are
    its calls that start in the range.
    """
    h, _m = trace.host, trace.memory
    rows: dict[int, MemStat] = {}
    for t, b, j in dm.events:
        if not lo <= t <= hi:
            continue
        for k, name in enumerate(dict.fromkeys(h.name[s] for s in nesting.mem_ops[j])):
            r = rows.get(name)
            if r is None:
                r = rows[name] = MemStat(trace.names[name])
            r.increase += b
            if b > 0:
                r.alloc_count += 1
                r.alloc_size += b
            if k == 0:
                r.self_increase += b
                if b > 0:
                    r.self_alloc_count += 1
                    r.self_alloc_size += b
    for i in range(len(h.ts)):
        r = rows.get(h.name[i])
        if r is not None and h.kind[i] == OP and lo <= ms(trace, h.ts[i]) <= hi:
            r.calls += 1
    return sorted(rows.values(), key=lambda r: (-r.increase, -r.alloc_size, r.name))
