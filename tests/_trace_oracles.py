"""Oracles for the trace writers: our rows built plainly as dicts, and a profiler trace cycle
merged the way it was before the rows were spliced in as text (parse Kineto's trace, extend
``traceEvents``, write the tree again)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

from memprofiler.output.step_timeline import _ROWS, HOST_CATEGORY, StepTimeline
from memprofiler.output.timeline import MemoryTimeline, trace_span_ns


def memory_events(
    timeline: MemoryTimeline, pid: int | str, base_ns: int = 0, lo: int = -1, hi: int = 1 << 62
) -> list[dict[str, Any]]:
    """``timeline``'s events built plainly as dicts from its marks (a counter per value; a span
    from each end back to its call's start), for the rendered text to equal."""
    out: list[dict[str, Any]] = []
    starts: dict[tuple[str, int], Any] = {}
    for m in timeline._marks:
        if not lo <= m.t_ns <= hi:
            continue
        ts = (m.t_ns - base_ns) / 1000.0
        for track, value in m.values.items():
            c = {"ph": "C", "cat": "memprofiler", "name": track, "pid": pid, "tid": 0, "ts": ts}
            out.append({**c, "args": {"bytes": value}})
        if m.phase == "start":
            starts[(m.fn, m.call)] = m
        elif m.phase == "end" and (m.fn, m.call) in starts:
            begin = starts.pop((m.fn, m.call))
            x = {"ph": "X", "cat": "memprofiler", "name": f"{m.fn}.{m.call}", "pid": pid, "tid": 0}
            x |= {"ts": (begin.t_ns - base_ns) / 1000.0, "dur": (m.t_ns - begin.t_ns) / 1000.0}
            out.append({**x, "args": {"rank": timeline.rank, "fn": m.fn, "call": m.call, **m.values}})
    return out


def step_events(
    timeline: StepTimeline,
    pid: int | str,
    base_ns: int = 0,
    start_ns: int | None = None,
    end_ns: int | None = None,
) -> list[dict[str, Any]]:
    """The step timeline's events as its dict builder made them: spans overlapping the window,
    then host samples inside it (finite values only)."""
    lo = start_ns if start_ns is not None else 0
    hi = end_ns if end_ns is not None else 1 << 62
    out: list[dict[str, Any]] = []
    for track, name, t0, t1 in timeline.spans:
        if t1 >= lo and t0 <= hi:
            tid, cat, _ = _ROWS[track]
            out.append(
                {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid}
                | {"ts": (t0 - base_ns) / 1000.0, "dur": (t1 - t0) / 1000.0}
            )
    if timeline.host is not None:
        for t_ns, values in timeline.host.between(lo, hi):
            for name, value in values.items():
                finite = (
                    isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                )
                if finite:
                    c = {
                        "ph": "C",
                        "cat": HOST_CATEGORY,
                        "name": name,
                        "pid": pid,
                        "ts": (t_ns - base_ns) / 1000.0,
                    }
                    out.append({**c, "args": {"value": value}})
    return out


def step_trace(timeline: StepTimeline) -> dict[str, Any]:
    """The step timeline's standalone trace as its dict builder made it."""
    starts = [s[2] for s in timeline.spans]
    if timeline.host is not None:
        starts += [t for t, _ in timeline.host.between(0, 1 << 62)[:1]]
    base = (min(starts) // 1_000_000_000) * 1_000_000_000 if starts else 0
    rank = timeline.rank
    events = [
        {"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}},
        *timeline.metadata(rank),
        *step_events(timeline, rank, base),
    ]
    return {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": base,
        "traceEvents": events,
        "otherData": {"memprofiler_rank": rank, "os_pid": os.getpid()},
    }


def dict_merge(kineto: bytes, rows: Sequence[Any], pid: int | str, first: dict[str, Any]) -> dict[str, Any]:
    """A profiler trace cycle merged as dicts, the way ``ExtendedPyTorchProfiler._merged`` did
    before the splice: our events inside Kineto's span (each timeline's metadata first, nothing
    for one without events) after Kineto's, ``first``'s keys before Kineto's."""
    trace = json.loads(kineto)
    base = int(trace.get("baseTimeNanoseconds", 0) or 0)
    span = trace_span_ns(trace)
    if span is not None:
        for timeline in rows:
            if isinstance(timeline, MemoryTimeline):
                added = memory_events(timeline, pid, base, span[0], span[1])
            else:
                added = step_events(timeline, pid, base, span[0], span[1])
            if added:
                trace["traceEvents"].extend(timeline.metadata(pid) + added)
    return {**first, **{k: v for k, v in trace.items() if k not in first}}
