"""Per-step time breakdown of one trace, and computation / communication per rank.

Each ``ProfilerStep#N`` span's wall time is split into kernel, memcpy, memset, runtime,
data loading, host compute and other, counted in that order of priority: time already
counted under an earlier category is not counted again, so the parts add up to the step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from memprofiler.analysis.profiler_ops import annotation_spans
from memprofiler.analysis.trace_events import KERNEL, LIGHTNING_ACTION_PREFIX, MEMCPY, MEMSET, OP, STEP, Trace

#: Categories of the step breakdown, in priority order.
STEP_PARTS = ("kernel", "memcpy", "memset", "runtime", "data loading", "host compute", "other")
#: Annotation names of data loading: torch's DataLoader iterator and Lightning's fetch.
#: (Lightning's name: checked against ``memprofiler.lightning._compat`` by ``tests/lightning/test_compat.py``.)
DATA_LOADING = (
    "enumerate(DataLoader)",
    LIGHTNING_ACTION_PREFIX + "[_TrainingEpochLoop].train_dataloader_next",
)
#: Host operators of a collective (gloo/NCCL process groups, c10d functional collectives).
_COMM_OPS = ("c10d::", "gloo:", "nccl:", "record_param_comms", "_c10d_functional::")

Interval = tuple[float, float]


def union(spans: Iterable[Interval]) -> list[Interval]:
    """Sorted, merged ``spans``."""
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(spans: Iterable[Interval]) -> float:
    return sum(e - s for s, e in spans)


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The overlap of two merged interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """``a`` less ``b`` (both merged)."""
    out: list[Interval] = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


@dataclass
class StepRow:
    """One profiler step: its wall time (µs) split into :data:`STEP_PARTS`."""

    step: str
    total_us: float
    parts: dict[str, float]


def steps(trace: Trace) -> list[StepRow]:
    """The breakdown of every ``ProfilerStep#N`` (the whole trace as one step when there is none)."""
    h, d = trace.host, trace.device
    windows = [
        (trace.names[h.name[i]], h.ts[i], h.ts[i] + h.dur[i]) for i in range(len(h.ts)) if h.kind[i] == STEP
    ]
    if not windows:
        ends = [h.ts[i] + h.dur[i] for i in range(len(h.ts))] + [d.ts[k] + d.dur[k] for k in range(len(d.ts))]
        windows = [("whole trace", trace.start, max(ends, default=trace.start))]
    sources = [
        union((d.ts[k], d.ts[k] + d.dur[k]) for k in range(len(d.ts)) if d.kind[k] == KERNEL),
        union((d.ts[k], d.ts[k] + d.dur[k]) for k in range(len(d.ts)) if d.kind[k] == MEMCPY),
        union((d.ts[k], d.ts[k] + d.dur[k]) for k in range(len(d.ts)) if d.kind[k] == MEMSET),
        union((t, t + du) for t, du in zip(*trace.runtime, strict=False)),
        union(annotation_spans(trace, DATA_LOADING)),
        union((h.ts[i], h.ts[i] + h.dur[i]) for i in range(len(h.ts)) if h.kind[i] == OP),
    ]
    out = []
    for name, s, e in sorted(windows, key=lambda w: w[1]):
        left = [(s, e)]
        parts: dict[str, float] = {}
        for part, spans in zip(STEP_PARTS, sources, strict=False):
            mine = intersect(left, spans)
            parts[part] = length(mine)
            left = subtract(left, mine)
        parts["other"] = length(left)
        out.append(StepRow(name, e - s, parts))
    return out


@dataclass
class RankRow:
    """Computation, communication and their overlap on one rank (µs), over its profiled steps."""

    rank: int
    source: str
    """``device`` (kernels) or ``host`` (operators, for CPU-only runs)."""
    step_us: float
    computation_us: float
    """Computation not overlapped by communication."""
    communication_us: float
    """Communication not overlapped by computation."""
    overlap_us: float
    other_us: float


def rank_row(rank: int, trace: Trace, step_rows: list[StepRow]) -> RankRow:
    """Computation / communication split of one rank's trace."""
    h, d = trace.host, trace.device
    if len(d.ts):
        source = "device"
        comp = union(
            (d.ts[k], d.ts[k] + d.dur[k]) for k in range(len(d.ts)) if d.kind[k] == KERNEL and not d.comm[k]
        )
        comm = union((d.ts[k], d.ts[k] + d.dur[k]) for k in range(len(d.ts)) if d.comm[k])
    else:
        source = "host"
        is_comm = [trace.names[h.name[i]].startswith(_COMM_OPS) for i in range(len(h.ts))]
        ops = [i for i in range(len(h.ts)) if h.kind[i] == OP]
        comm = union((h.ts[i], h.ts[i] + h.dur[i]) for i in ops if is_comm[i])
        # An operator inside a collective on the same thread is part of it, not computation;
        # computation on another thread while a collective runs is overlap.
        comp_parts: list[Interval] = []
        for thread in {h.thread[i] for i in ops}:
            mine = [i for i in ops if h.thread[i] == thread]
            comp_parts += subtract(
                union((h.ts[i], h.ts[i] + h.dur[i]) for i in mine if not is_comm[i]),
                union((h.ts[i], h.ts[i] + h.dur[i]) for i in mine if is_comm[i]),
            )
        comp = union(comp_parts)
    windows = union((h.ts[i], h.ts[i] + h.dur[i]) for i in range(len(h.ts)) if h.kind[i] == STEP) or [
        (trace.start, trace.start + sum(r.total_us for r in step_rows))
    ]
    comp, comm = intersect(comp, windows), intersect(comm, windows)
    both = intersect(comp, comm)
    step_us = length(windows)
    c, m, o = length(comp), length(comm), length(both)
    return RankRow(rank, source, step_us, c - o, m - o, o, max(0.0, step_us - (c + m - o)))
