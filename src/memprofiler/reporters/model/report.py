"""The figures a report shows, shaped once from a run so every reporter shows the same numbers."""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memprofiler.analysis.runs.artifacts import RunArtifacts
from memprofiler.reporters.model.call_rows import call_rows, read_rows
from memprofiler.reporters.model.call_table import (
    NA,
    PER_CALL_LIMIT,
    CallRow,
    CallTable,
    breakdown_rank,
    num_or_zero,
)
from memprofiler.reporters.model.figures import CUDA_ALLOCATED_PEAK, CUDA_RESERVED_PEAK, FIGURES
from memprofiler.reporters.model.module_groups import SavedRollup, has_blocks
from memprofiler.reporters.model.snapshots import SnapshotEntry, snapshot_entries, snapshot_title
from memprofiler.reporters.model.yaml_tables import ReportTable, nested_tables, report_tables

#: Points a chart series holds at most; longer series are binned, each bin drawn min to max
#: around its median.
CHART_BINS = 300


@dataclass
class ReportModel:
    """What ``memprofiler report`` shows."""

    run: RunArtifacts
    calls: CallTable
    """Every collected call (a list of :class:`CallRow` given here is turned into a table)."""
    snapshots: list[SnapshotEntry] = field(default_factory=list)
    # The terminal and the HTML report both ask.
    _functions: list[FunctionStats] | None = field(default=None, init=False, repr=False, compare=False)
    _saved_modules: list[tuple[str, int, str]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.calls, CallTable):
            self.calls = CallTable.of(self.calls)

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self.calls.rank))

    @property
    def aggregated(self) -> bool:
        """Whether there are too many calls to show one by one (see :data:`PER_CALL_LIMIT`)."""
        return len(self.calls) > PER_CALL_LIMIT

    @property
    def has_cuda(self) -> bool:
        return self.calls.has("cuda alloc peak") or self.calls.has("cuda reserved peak")

    def functions(self) -> list[FunctionStats]:
        """Per rank and function: how many calls, and min / median / max of each figure."""
        if self._functions is None:
            self._functions = self._function_stats()
        return self._functions

    def _function_stats(self) -> list[FunctionStats]:
        out = []
        for rank, fn, rows in self.calls.groups():
            bands = {
                name: Band.of([v for v in self.calls.column(name, rows) if v != NA]) for name, _ in FIGURES
            }
            out.append(FunctionStats(rank, fn, len(rows), {k: b for k, b in bands.items() if b}))
        return out  # the table's groups come in rank and function order

    def top_calls(self, n: int, figure: str = "rss peak") -> list[CallRow]:
        """The ``n`` calls with the largest ``figure`` (a :data:`FIGURES` name), largest first."""
        col = self.calls.column(figure)
        best = heapq.nlargest(n, (i for i, v in enumerate(col) if v != NA), key=col.__getitem__)
        return [self.calls[i] for i in best]

    def top_saved_modules(self, n: int | None = 10) -> list[tuple[str, int, str]]:
        """``(module, bytes, where)``: each module's largest saved bytes over calls and ranks
        (the ``n`` largest; ``None``: every module)."""
        if self._saved_modules is None:
            self._saved_modules = self._saved_module_peaks()
        return self._saved_modules[:n]

    def _saved_module_peaks(self) -> list[tuple[str, int, str]]:
        best: dict[str, tuple[int, int]] = {}
        for i, by_module in sorted(self.calls.by_module.items()):
            for mod, b in by_module.items():
                held = best.get(mod)
                if held is None or b > held[0]:
                    best[mod] = (b, i)
        ranked = sorted(best.items(), key=lambda kv: (-kv[1][0], kv[0]))
        return [(mod, b, self.calls.label(i)) for mod, (b, i) in ranked]

    def saved_rollup(self) -> SavedRollup | None:
        """The call that saved the most bytes for backward, its modules rolled up by block and by
        module type (``None`` when no call has per-module bytes or no module is in a block)."""
        best: tuple[int, int] | None = None
        for i, by_module in self.calls.by_module.items():
            total = sum(by_module.values())
            if best is None or total > best[0]:
                best = (total, i)
        if best is None or not has_blocks(self.calls.by_module[best[1]]):
            return None
        return SavedRollup.of(self.calls.label(best[1]), self.calls.by_module[best[1]])

    def summary_rows(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(key, metric, stats)`` from ``memory_summary.yaml``, most unbalanced first."""
        rows: list[tuple[str, str, dict[str, Any]]] = []
        snapshots = (self.run.summary or {}).get("snapshots") or {}
        for key, metrics in snapshots.items():
            if isinstance(metrics, Mapping):
                for metric, stats in metrics.items():
                    if isinstance(stats, Mapping) and "max" in stats:
                        rows.append((str(key), str(metric), dict(stats)))
        rows.sort(key=lambda r: (-num_or_zero(r[2].get("imbalance")), r[0], r[1]))
        return rows

    def tracker_rows(self) -> tuple[list[str], list[tuple[CallRow, Mapping[str, int]]]]:
        """Categories, and per call the module-wise tracker's peaks (``fsdp.peak.*`` or
        ``module_mem.peak.*``) merged into its ``end`` snapshot."""
        cats: list[str] = []
        rows = []
        for i, peaks in sorted(self.calls.tracker_peaks.items()):
            cats.extend(k for k in peaks if k not in cats)
            rows.append((self.calls[i], peaks))
        return cats, rows


#: The trackers' names, by report kind.
TRACKERS = {"fsdp": "FSDP tracker", "module": "module tracker"}


def tracker_title(reports: Sequence[Any]) -> str:
    """The tracker peaks table's title, named for the tracker that wrote them."""
    kinds = {r.kind for r in reports}
    if kinds == {"fsdp"}:
        return "FSDP tracker peaks per category (fsdp.peak.*)"
    if kinds == {"module"}:
        return "Module tracker peaks per category (module_mem.peak.*)"
    return "Tracker peaks per category (fsdp.peak.* / module_mem.peak.*)"


@dataclass(frozen=True)
class Band:
    """Min, median and max of one figure over calls."""

    lo: float
    mid: float
    hi: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Band | None:
        if not values:
            return None
        return cls(float(min(values)), float(statistics.median(values)), float(max(values)))


@dataclass
class FunctionStats:
    """One function's calls on one rank, summarised."""

    rank: int
    fn: str
    calls: int
    bands: dict[str, Band]
    """Figure name (see :data:`FIGURES`) -> its band over the calls that have it."""


def binned(xs: Sequence[float], ys: Sequence[float], bins: int = CHART_BINS) -> list[tuple[float, Band]]:
    """Points ``(xs[i], ys[i])`` in ``bins`` runs of consecutive points: ``(mean x, band of y)`` each.

    Up to ``bins`` points come back one per bin (a band of one value), so a short series is
    drawn as it is.

    Example:
        >>> binned([0, 1, 2, 3], [1, 3, 2, 5], bins=2)
        [(0.5, Band(lo=1.0, mid=2.0, hi=3.0)), (2.5, Band(lo=2.0, mid=3.5, hi=5.0))]
    """
    n = len(xs)
    size = max(1, math.ceil(n / bins))
    out = []
    for i in range(0, n, size):
        band = Band.of(ys[i : i + size])
        assert band is not None
        x = xs[i : i + size]
        out.append((sum(x) / len(x), band))
    return out


def build_model(run: RunArtifacts, top: int = 10) -> ReportModel:
    """Shape a loaded run; load and analyse every allocator-history and OOM pickle in it.

    Raises:
        ArtifactError: a pickle is unreadable, unsafe or not an allocator snapshot.
    """
    rows = read_rows(run)
    run.warnings += rows.impossible
    model = ReportModel(run=run, calls=rows.calls, snapshots=snapshot_entries(run, top))
    model._saved_modules = rows.module_peaks
    return model


__all__ = [
    "CHART_BINS",
    "CUDA_ALLOCATED_PEAK",
    "CUDA_RESERVED_PEAK",
    "FIGURES",
    "PER_CALL_LIMIT",
    "Band",
    "CallRow",
    "CallTable",
    "FunctionStats",
    "ReportModel",
    "ReportTable",
    "SnapshotEntry",
    "binned",
    "breakdown_rank",
    "build_model",
    "call_rows",
    "nested_tables",
    "report_tables",
    "snapshot_title",
]
