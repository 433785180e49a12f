"""Every profiler view of a set of traces, shaped once for the terminal and the HTML report.

For each ``*.pt.trace.json[.gz]``: the memory view per device (curve, allocation pairs,
per-operator statistics and, for the page's range selection, the events in compact form),
the memory-by-category timeline written beside it, operators, modules and the step
breakdown. Across ranks: computation, communication and overlap, and the slowest rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memprofiler import layout
from memprofiler.analysis.runs.ids import check_one_run, profiler_trace_run_id
from memprofiler.analysis.traces.events import checked_header, find_traces, is_trace_file
from memprofiler.analysis.traces.memory import DeviceMemory, MemPair, MemStat
from memprofiler.analysis.traces.memory_categories import (
    CategoryTimeline,
    category_timelines,
    read_category_doc,
)
from memprofiler.analysis.traces.ops import OpRow
from memprofiler.analysis.traces.peak_gap import PeakGap, explain, trace_device
from memprofiler.analysis.traces.steps import RankRow, StepRow
from memprofiler.analysis.traces.stream import summarise
from memprofiler.errors import ArtifactError


@dataclass
class DeviceView:
    memory: DeviceMemory
    pairs: list[MemPair]
    stats: list[MemStat]
    range_data: dict[str, Any] | None
    """Compact events (or, past :data:`~memprofiler.analysis.traces.stream.RANGE_KEPT` events,
    bins of events) for the page's range selection; ``None`` when too many to carry."""
    pair_count: int = -1
    """How many allocation / release pairs the device has: ``pairs`` holds the
    :data:`~memprofiler.analysis.traces.stream.PAIRS_KEPT` largest."""

    def __post_init__(self) -> None:
        if self.pair_count < 0:
            self.pair_count = len(self.pairs)


@dataclass
class TraceView:
    """The views of one trace file."""

    path: Path
    rank: int | None
    events: int
    devices: list[DeviceView]
    ops: list[OpRow]
    modules: list[OpRow]
    steps: list[StepRow]
    categories: list[CategoryTimeline]
    has_device_time: bool
    rank_row: RankRow | None = None
    peak_gaps: list[PeakGap] = field(default_factory=list)
    """Per device with memory by category: its two peaks and one sentence on why they differ."""
    wrapper_calls: int = 0
    """Dispatch-mode wrapper spans (a module tracker's) left out of the operator views."""
    wrapper_self_us: float = 0.0
    """Their host time outside the operators they wrap: the tracker's own work."""

    @property
    def wrapper_note(self) -> str:
        """One sentence on the wrappers left out, or ``""`` when there are none."""
        if not self.wrapper_calls:
            return ""
        return (
            f"{self.wrapper_calls:,} PythonDispatchMode span{'s' if self.wrapper_calls != 1 else ''} (a module tracker's dispatch mode, e.g. "
            f"`track_module_mem`) are left out of the operator views: {self.wrapper_self_us / 1000:,.3f} ms "
            "of host time of their own, not counted as any operator's"
        )

    notes: list[str] = field(default_factory=list)
    """One line per event field the reader converted or could not read (see
    :attr:`~memprofiler.analysis.traces.stream.Summary.notes`)."""

    @property
    def title(self) -> str:
        return self.path.name


@dataclass
class ProfilerViews:
    """The views of every trace of a run (or given on the command line)."""

    traces: list[TraceView] = field(default_factory=list)
    ranks: list[RankRow] = field(default_factory=list)
    """One row per rank, when traces of two or more ranks are present."""

    @property
    def slowest(self) -> RankRow | None:
        return max(self.ranks, key=lambda r: (r.step_us, -r.rank)) if len(self.ranks) > 1 else None


#: The categories file's times are whole µs (truncated); a probe just before the next µs reads
#: every trace event of the same µs.
_TRUNCATED_US = 0.999


def categories_path(trace_path: Path) -> Path:
    """``x.pt.trace.json[.gz]`` -> ``x.memory_categories.json[.gz]`` beside it (the gzipped
    name when only that one exists)."""
    name = trace_path.name.removesuffix(".gz").removesuffix(".pt.trace.json")
    plain = trace_path.with_name(name + layout.PROFILER_MEMORY_CATEGORIES_JSON.rsplit("}", 1)[-1])
    gzipped = plain.with_name(plain.name + ".gz")
    return gzipped if not plain.exists() and gzipped.exists() else plain


def trace_view(path: Path) -> TraceView:
    """Read and summarise one trace (and its memory categories file, if any) with the one
    trace reader (:func:`memprofiler.analysis.traces.stream.summarise`: bounded memory, any
    order of events).

    Raises:
        ArtifactError: the trace or its categories file is unreadable.
    """
    cats = categories_path(path)
    # The categories' peak instants, on the trace's clock: where to read the allocator's count.
    probes: dict[str, list[float]] = {}
    base_ns = checked_header(path)[1]
    doc = read_category_doc(cats) if cats.is_file() and base_ns else None
    if doc is not None:
        for tl in category_timelines(doc, cats, 0.0):
            if (dev := trace_device(tl.device)) is not None:
                probes.setdefault(dev, []).append(tl.peak_ms * 1000 + _TRUNCATED_US - base_ns / 1000)
    s = summarise(path, probes)
    wall = s.start + s.base_ns / 1000 if s.base_ns else None
    if doc is None and cats.is_file():  # without a base time it is read only now, after the trace
        doc = read_category_doc(cats)
    categories = category_timelines(doc, cats, wall) if doc is not None else []
    gaps = []
    for tl in categories:
        dev = trace_device(tl.device)
        dv = next((d for d in s.devices if d[0].device == dev), None)
        if dv is not None:
            at = next((v for (d, _), v in s.allocated_at.items() if d == dev), None) if base_ns else None
            gaps.append(explain(dv[0], tl, at))
    return TraceView(
        path=path,
        rank=s.rank,
        events=s.events,
        devices=[DeviceView(dm, ps, st, rd, n) for dm, ps, n, st, rd in s.devices],
        ops=s.ops,
        modules=s.modules,
        steps=s.steps,
        categories=categories,
        has_device_time=s.has_device_time,
        rank_row=s.rank_row,
        peak_gaps=gaps,
        wrapper_calls=s.wrapper_calls,
        wrapper_self_us=s.wrapper_self_us,
        notes=s.notes,
    )


def traces_in(paths: Iterable[Path]) -> list[Path]:
    """The trace files among ``paths`` and under the directories among them, each once, in order."""
    out: list[Path] = []
    for p in paths:
        found = find_traces(p) if p.is_dir() else [p] if is_trace_file(p) else []
        out += [f for f in found if f not in out]
    return out


def one_run_traces(paths: Iterable[Path], run_ids: Mapping[str, str | None] | None = None) -> list[Path]:
    """:func:`traces_in`, refused when the traces (with the files of ``run_ids``, a run
    directory's) come from two runs: their views would be summed in silently.

    Raises:
        ArtifactError: files of two runs (:func:`~memprofiler.analysis.runs.ids.check_one_run`).
    """
    files = traces_in(paths)
    check_one_run([*(run_ids or {}).items(), *((str(f), profiler_trace_run_id(f)) for f in files)])
    return files


def build_views(paths: Sequence[Path]) -> ProfilerViews | None:
    """The views of every trace in ``paths`` (files, or directories searched recursively);
    ``None`` when there is none.

    Raises:
        ArtifactError: a trace is unreadable.
    """
    files = traces_in(paths)
    if not files:
        return None
    views = ProfilerViews([trace_view(f) for f in files])
    by_rank: dict[int, list[TraceView]] = {}
    for i, v in enumerate(views.traces):
        by_rank.setdefault(v.rank if v.rank is not None else i, []).append(v)
    if len(by_rank) > 1:
        views.ranks = [_sum_ranks(r, vs) for r, vs in sorted(by_rank.items())]
    return views


def _sum_ranks(rank: int, views: list[TraceView]) -> RankRow:
    rows = [v.rank_row for v in views if v.rank_row is not None]
    if not rows:
        raise ArtifactError(f"rank {rank}: no trace summarised")
    return RankRow(
        rank=rank,
        source=rows[0].source,
        step_us=sum(r.step_us for r in rows),
        computation_us=sum(r.computation_us for r in rows),
        communication_us=sum(r.communication_us for r in rows),
        overlap_us=sum(r.overlap_us for r in rows),
        other_us=sum(r.other_us for r in rows),
    )


def merged_rows(views: Iterable[TraceView], modules: bool = False) -> dict[str, OpRow]:
    """Operator (or module) rows of several traces summed by name (for ``diff``)."""
    out: dict[str, OpRow] = {}
    for v in views:
        for r in v.modules if modules else v.ops:
            m = out.setdefault(r.name, OpRow(r.name))
            m.calls += r.calls
            m.host_self_us += r.host_self_us
            m.host_total_us += r.host_total_us
            m.device_self_us += r.device_self_us
            m.device_total_us += r.device_total_us
            m.self_alloc_bytes += r.self_alloc_bytes
            m.alloc_bytes += r.alloc_bytes
            m.self_increase += r.self_increase
            m.increase += r.increase
    return out
