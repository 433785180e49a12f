"""A run's snapshots merged into a :class:`~memprofiler.reporters.model.call_table.CallTable`, a call a row."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memprofiler import layout, metrics
from memprofiler.analysis.runs.artifacts import RunArtifacts
from memprofiler.reporters.model.call_table import (
    NA,
    PER_CALL_LIMIT,
    CallTable,
    breakdown_key,
    column_value,
    int_or_none,
)
from memprofiler.reporters.model.figures import CUDA_ALLOCATED_PEAK, CUDA_RESERVED_PEAK, STORED

__all__ = ["CUDA_ALLOCATED_PEAK", "CUDA_RESERVED_PEAK", "call_rows"]

_TRACKER_PEAK_PREFIXES = metrics.TRACKER_PEAK_PREFIXES


@dataclass
class _Rows:
    calls: CallTable
    module_peaks: list[tuple[str, int, str]]
    """``(module, bytes, where)``, largest first: see :meth:`ReportModel.top_saved_modules`."""
    impossible: list[str] = field(default_factory=list)
    """One line per call with a figure no run can have (negative, NaN, infinite, past int64):
    the figure is left out of the report (shown as ``-``) and the call named here."""


def call_rows(run: RunArtifacts) -> CallTable:
    """Merge each call's ``start`` and ``end`` snapshots into one row, ordered by rank, fn, call."""
    return read_rows(run, bounded=False).calls


def read_rows(run: RunArtifacts, bounded: bool = True) -> _Rows:
    """:func:`call_rows`, reading the snapshots once (a streamed run a block at a time).

    ``bounded``: beyond :data:`PER_CALL_LIMIT` calls with a per-module breakdown, a row keeps
    its breakdown only while it is its rank's :func:`breakdown_rank` call. The report draws
    that one, and every module's peak is folded in as the rows are built, so 100,000 calls do
    not hold 2M entries.
    """
    t = CallTable()
    fn_ix: dict[str, int] = {}
    index: dict[tuple[int, int, int], int] = {}  # call seen in one phase so far -> its row
    reads = {
        phase: [(t.figures[f.attr], f.metric) for f in STORED if f.phase == phase and f.metric is not None]
        for phase in ("start", "end")
    }
    breakdowns = _Breakdowns(t, bounded)
    trackers = _TrackerPeaks()
    impossible: dict[tuple[int, str, int], list[str]] = {}
    for key, m in run.iter_snapshots():
        rank, fn, call, phase = layout.parse_snapshot_key(key)
        f = fn_ix.setdefault(fn, len(fn_ix))
        # A key is written once per file, so a call has one start and one end: its index entry
        # goes when the second arrives, and only calls still missing one are held.
        k = (rank, f, call)
        i = index.pop(k, None)
        if i is None:
            i = index[k] = t._add(rank, f, call)
        for col, metric in reads[phase]:
            v = m.get(metric)
            c = col[i] = column_value(v)
            if c < 0 and v is not None:  # NA (not a number, NaN, past int64) or negative
                col[i] = NA
                impossible.setdefault((rank, fn, call), []).append(f"`{metric}` at its {phase} is {v!r}")
        if phase == "start":
            continue
        by_mod = _by_module(m.get(metrics.SAVED_BY_MODULE))
        if by_mod:
            breakdowns.add(i, rank, fn, call, by_mod)
        peaks = trackers.of(m)
        if peaks is not None:
            bad = {k: v for k, v in peaks.items() if v < 0}
            if bad:
                impossible.setdefault((rank, fn, call), []).extend(
                    f"the tracker's `{k}` peak is {v!r}" for k, v in bad.items()
                )
                peaks = {k: v for k, v in peaks.items() if v >= 0}
            t.tracker_peaks[i] = peaks
    del index
    breakdowns.finish()
    t.fns = list(fn_ix)
    where = breakdowns.module_peaks()
    t._sort()
    lines = [
        f"rank {rank} {fn} #{call}: impossible figures, left out (shown as -): {'; '.join(what)}; "
        "the run's files were edited or damaged"
        for (rank, fn, call), what in sorted(impossible.items())
    ]
    return _Rows(t, where, lines)


def _by_module(v: Any) -> Mapping[str, int] | None:
    """A snapshot's ``saved_tensors.by_module`` as ``{module: bytes}``; ``None`` if it has none."""
    if not isinstance(v, Mapping) or not v:
        return None
    if set(map(type, v.values())) <= {int} and set(map(type, v)) <= {str}:
        return v  # as loaded: shared, not copied
    return {str(k): int(x) for k, x in v.items() if int_or_none(x) is not None}


class _Breakdowns:
    """Folds every call's per-module saved bytes into each module's peak as the rows are read.

    Beyond :data:`PER_CALL_LIMIT` calls with a breakdown (when ``bounded``), a row keeps its
    breakdown only while it is its rank's drawn call, the largest :func:`breakdown_rank`.
    """

    def __init__(self, table: CallTable, bounded: bool) -> None:
        self.t = table
        self.bounded = bounded
        self.peaks: dict[
            str, tuple[int, tuple[int, str, int], int]
        ] = {}  # module -> bytes, (rank, fn, call), row
        self.drawn: dict[
            int, tuple[tuple[int, int], int]
        ] = {}  # rank -> breakdown_rank and row of its drawn call
        self.count = 0

    def add(self, i: int, rank: int, fn: str, call: int, by_mod: Mapping[str, int]) -> None:
        t = self.t
        t.by_module[i] = by_mod
        order = (rank, fn, call)
        peaks = self.peaks
        for mod, b in by_mod.items():
            best = peaks.get(mod)
            if best is None or b > best[0] or (b == best[0] and order < best[1]):
                peaks[mod] = (b, order, i)
        self.count += 1
        saved = t.figures["saved_unique"][i]
        mine = breakdown_key(None if saved == NA else saved, call)
        shown = self.drawn.get(rank)
        if shown is None or mine > shown[0]:
            self.drawn[rank], loser = (mine, i), (shown[1] if shown is not None and shown[1] != i else None)
        else:
            loser = i
        if self.bounded and loser is not None and self.count > PER_CALL_LIMIT:
            t.by_module.pop(loser, None)  # folded into `peaks`; not the rank's drawn call

    def finish(self) -> None:
        """Drop the breakdowns kept before the limit was passed, too (only the drawn ones stay)."""
        if self.bounded and self.count > PER_CALL_LIMIT:
            keep = {i for _, i in self.drawn.values()}
            self.t.by_module = {i: b for i, b in self.t.by_module.items() if i in keep}

    def module_peaks(self) -> list[tuple[str, int, str]]:
        """``(module, bytes, where)``, largest first (call before the table is sorted)."""
        ranked = sorted(self.peaks.items(), key=lambda kv: (-kv[1][0], kv[0]))
        return [(mod, b, self.t.label(i)) for mod, (b, _, i) in ranked]


class _TrackerPeaks:
    """The FSDP or module-wise tracker's ``*.peak.<category>`` values of a snapshot."""

    def __init__(self) -> None:
        self.tracked: dict[
            tuple[str, ...], bool
        ] = {}  # a snapshot's keys -> whether a tracker peak is among them

    def of(self, m: Mapping[str, Any]) -> dict[str, int] | None:
        names = tuple(m)
        tracker = self.tracked.get(names)
        if tracker is None:
            tracker = self.tracked[names] = any(k.startswith(_TRACKER_PEAK_PREFIXES) for k in names)
        if not tracker:
            return None
        return {
            k.split(".peak.", 1)[1]: column_value(v)
            for k, v in m.items()
            if k.startswith(_TRACKER_PEAK_PREFIXES) and v is not None
        }
