"""The figures a report shows, shaped once from a run so every reporter shows the same numbers."""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from memprofiler import layout
from memprofiler.analysis.artifacts import AllocPickle, OomRecord, RunArtifacts
from memprofiler.analysis.snapshot import SnapshotAnalysis, analyze, load_snapshot

#: CUDA ``memory_stats()`` keys shown per call (the ``end`` snapshot's peaks belong to that call).
CUDA_ALLOCATED_PEAK = "allocated_bytes.all.peak"
CUDA_RESERVED_PEAK = "reserved_bytes.all.peak"
#: Up to this many collected calls a report shows every call (a bar and a table row each);
#: beyond it, per-function bands (min / median / max) and the top calls, so the HTML stays
#: a few hundred KB at 100,000 calls.
PER_CALL_LIMIT = 200
#: Points a chart series holds at most; longer series are binned, each bin drawn min to max
#: around its median.
CHART_BINS = 300


# The breakdowns of a call that has none: one shared read-only mapping, not two empty dicts
# per row (100,000 rows held 12.8 MB of them).
_NONE: Mapping[str, int] = MappingProxyType({})


def _none() -> Mapping[str, int]:
    return _NONE


@dataclass(slots=True)
class CallRow:
    """One collected call of one function on one rank, start and end merged."""

    rank: int
    fn: str
    call: int
    rss_start: int | None = None
    rss_end: int | None = None
    rss_peak: int | None = None
    cuda_allocated_peak: int | None = None
    cuda_reserved_peak: int | None = None
    saved_unique: int | None = None
    saved_packed: int | None = None
    by_module: Mapping[str, int] = field(default_factory=_none)
    fsdp: Mapping[str, int] = field(default_factory=_none)
    """Per-category peaks the FSDP or module-wise tracker merged into the snapshot
    (``fsdp.peak.*`` / ``module_mem.peak.*``), keyed by category."""

    @property
    def label(self) -> str:
        return f"{self.fn} #{self.call}"

    @property
    def rss_peak_delta(self) -> int | None:
        """How far the host peak rose above the RSS at the call's start."""
        if self.rss_peak is None or self.rss_start is None:
            return None
        return self.rss_peak - self.rss_start


@dataclass
class SnapshotEntry:
    """An allocator pickle (history or OOM) with its analysis."""

    title: str
    path: str
    analysis: SnapshotAnalysis


@dataclass
class ReportModel:
    """What ``memprofiler report`` shows."""

    run: RunArtifacts
    calls: list[CallRow]
    snapshots: list[SnapshotEntry] = field(default_factory=list)
    # The terminal and the HTML report both ask; at 100,000 calls each pass costs 0.5 s.
    _functions: list[FunctionStats] | None = field(default=None, init=False, repr=False, compare=False)
    _saved_modules: list[tuple[str, int, str]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def ranks(self) -> list[int]:
        return sorted({c.rank for c in self.calls})

    @property
    def aggregated(self) -> bool:
        """Whether there are too many calls to show one by one (see :data:`PER_CALL_LIMIT`)."""
        return len(self.calls) > PER_CALL_LIMIT

    @property
    def has_cuda(self) -> bool:
        return any(c.cuda_allocated_peak is not None or c.cuda_reserved_peak is not None for c in self.calls)

    def functions(self) -> list[FunctionStats]:
        """Per rank and function: how many calls, and min / median / max of each figure."""
        if self._functions is None:
            self._functions = self._function_stats()
        return self._functions

    def _function_stats(self) -> list[FunctionStats]:
        groups: dict[tuple[int, str], list[CallRow]] = {}
        for c in self.calls:
            groups.setdefault((c.rank, c.fn), []).append(c)
        out = []
        for (rank, fn), calls in sorted(groups.items()):
            figs = {name: Band.of([v for c in calls if (v := get(c)) is not None]) for name, get in FIGURES}
            out.append(FunctionStats(rank, fn, len(calls), {k: b for k, b in figs.items() if b is not None}))
        return out

    def top_calls(self, n: int, figure: str = "rss peak") -> list[CallRow]:
        """The ``n`` calls with the largest ``figure`` (a :data:`FIGURES` name), largest first."""
        get = dict(FIGURES)[figure]
        return heapq.nlargest(n, (c for c in self.calls if get(c) is not None), key=lambda c: get(c) or 0)

    def top_saved_modules(self, n: int = 10) -> list[tuple[str, int, str]]:
        """``(module, bytes, where)``: each module's largest saved bytes over calls and ranks."""
        if self._saved_modules is None:
            self._saved_modules = self._saved_module_peaks()
        return self._saved_modules[:n]

    def _saved_module_peaks(self) -> list[tuple[str, int, str]]:
        best: dict[str, tuple[int, CallRow]] = {}
        for c in self.calls:
            for mod, b in c.by_module.items():
                held = best.get(mod)
                if held is None or b > held[0]:
                    best[mod] = (b, c)
        ranked = sorted(best.items(), key=lambda kv: (-kv[1][0], kv[0]))
        return [(mod, b, f"rank {c.rank} {c.label}") for mod, (b, c) in ranked]

    def summary_rows(self) -> list[tuple[str, str, dict[str, Any]]]:
        """``(key, metric, stats)`` from ``memory_summary.yaml``, most unbalanced first."""
        rows: list[tuple[str, str, dict[str, Any]]] = []
        snapshots = (self.run.summary or {}).get("snapshots") or {}
        for key, metrics in snapshots.items():
            if isinstance(metrics, Mapping):
                for metric, stats in metrics.items():
                    if isinstance(stats, Mapping) and "max" in stats:
                        rows.append((str(key), str(metric), dict(stats)))
        rows.sort(key=lambda r: (-_num(r[2].get("imbalance")), r[0], r[1]))
        return rows

    def fsdp_rows(self) -> tuple[list[str], list[tuple[CallRow, Mapping[str, int]]]]:
        """Categories, and per call the ``fsdp.*`` peaks merged into its ``end`` snapshot."""
        cats: list[str] = []
        rows = []
        for c in self.calls:
            if c.fsdp:
                cats.extend(k for k in c.fsdp if k not in cats)
                rows.append((c, c.fsdp))
        return cats, rows


#: The per-call figures a report shows, by name, and how to read each from a call.
FIGURES: list[tuple[str, Callable[[CallRow], int | None]]] = [
    ("rss peak", lambda c: c.rss_peak),
    ("peak - start", lambda c: c.rss_peak_delta),
    ("rss end", lambda c: c.rss_end),
    ("cuda alloc peak", lambda c: c.cuda_allocated_peak),
    ("cuda reserved peak", lambda c: c.cuda_reserved_peak),
    ("saved unique", lambda c: c.saved_unique),
]


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


def binned(points: Sequence[tuple[float, float]], bins: int = CHART_BINS) -> list[tuple[float, Band]]:
    """``(x, y)`` points in ``bins`` runs of consecutive points: ``(mean x, band of y)`` each.

    Up to ``bins`` points come back one per bin (a band of one value), so a short series is
    drawn as it is.

    Example:
        >>> binned([(0, 1), (1, 3), (2, 2), (3, 5)], bins=2)
        [(0.5, Band(lo=1.0, mid=2.0, hi=3.0)), (2.5, Band(lo=2.0, mid=3.5, hi=5.0))]
    """
    n = len(points)
    size = max(1, math.ceil(n / bins))
    out = []
    for i in range(0, n, size):
        chunk = points[i : i + size]
        band = Band.of([y for _, y in chunk])
        assert band is not None
        out.append((sum(x for x, _ in chunk) / len(chunk), band))
    return out


_TRACKER_PEAK_PREFIXES = ("fsdp.peak.", "module_mem.peak.")


def _is_finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _num(v: Any) -> float:
    return float(v) if _is_finite_number(v) else 0.0


def _int(v: Any) -> int | None:
    if type(v) is int:  # nearly always: 700,000 times for 100,000 calls
        return v
    # NaN/inf (an edited YAML) has no byte count: shown as "-" rather than a traceback.
    return int(v) if _is_finite_number(v) else None


def breakdown_rank(c: CallRow) -> tuple[int, int]:
    """Which call of a rank the report draws the per-module breakdown of: the largest
    ``saved_unique``, the earliest of equals (the largest of these keys)."""
    return (c.saved_unique or 0, -c.call)


@dataclass
class _Rows:
    calls: list[CallRow]
    module_peaks: list[tuple[str, int, str]]
    """``(module, bytes, where)``, largest first: see :meth:`ReportModel.top_saved_modules`."""


def call_rows(run: RunArtifacts) -> list[CallRow]:
    """Merge each call's ``start`` and ``end`` snapshots into one row, ordered by rank, fn, call."""
    return _call_rows(run, bounded=False).calls


def _call_rows(run: RunArtifacts, bounded: bool = True) -> _Rows:
    """:func:`call_rows`, reading the snapshots once (a streamed run a block at a time).

    ``bounded``: beyond :data:`PER_CALL_LIMIT` calls with a per-module breakdown, a row keeps
    its breakdown only while it is its rank's :func:`breakdown_rank` call. The report draws
    that one, and every module's peak is folded in as the rows are built, so 100,000 calls do
    not hold 2M entries.
    """
    rows: dict[tuple[int, str, int], CallRow] = {}
    tracked: dict[tuple[str, ...], bool] = {}  # a snapshot's keys -> whether a tracker peak is among them
    peaks: dict[str, tuple[int, tuple[int, str, int], CallRow]] = {}  # module -> bytes, row key, row
    drawn: dict[int, CallRow] = {}  # rank -> its breakdown_rank call so far
    broken_down = 0
    for key, m in run.iter_snapshots():
        rank, fn, call, phase = layout.parse_snapshot_key(key)
        row = rows.get((rank, fn, call))
        if row is None:
            row = rows[(rank, fn, call)] = CallRow(rank, fn, call)
        if phase == "start":
            row.rss_start = _int(m.get("rss"))
            continue
        row.rss_end = _int(m.get("rss"))
        row.rss_peak = _int(m.get("rss_peak"))
        row.cuda_allocated_peak = _int(m.get(CUDA_ALLOCATED_PEAK))
        row.cuda_reserved_peak = _int(m.get(CUDA_RESERVED_PEAK))
        row.saved_unique = _int(m.get("saved_tensors.unique_bytes"))
        row.saved_packed = _int(m.get("saved_tensors.packed_bytes"))
        by_mod = m.get("saved_tensors.by_module")
        if isinstance(by_mod, Mapping):
            if set(map(type, by_mod.values())) <= {int} and set(map(type, by_mod)) <= {str}:
                row.by_module = by_mod  # as loaded: shared, not copied
            else:
                row.by_module = {str(k): int(v) for k, v in by_mod.items() if _int(v) is not None}
        if row.by_module:
            order = (rank, fn, call)
            for mod, b in row.by_module.items():
                best = peaks.get(mod)
                if best is None or b > best[0] or (b == best[0] and order < best[1]):
                    peaks[mod] = (b, order, row)
            broken_down += 1
            shown = drawn.get(rank)
            if shown is None or breakdown_rank(row) > breakdown_rank(shown):
                drawn[rank], loser = row, (shown if shown is not row else None)
            else:
                loser = row
            if bounded and loser is not None and broken_down > PER_CALL_LIMIT:
                loser.by_module = _NONE  # folded into `peaks`; not the rank's drawn call
        names = tuple(m)
        tracker = tracked.get(names)
        if tracker is None:
            tracker = tracked[names] = any(k.startswith(_TRACKER_PEAK_PREFIXES) for k in names)
        if tracker:
            row.fsdp = {
                k.split(".peak.", 1)[1]: int(v)
                for k, v in m.items()
                if k.startswith(_TRACKER_PEAK_PREFIXES) and _int(v) is not None
            }
    if bounded and broken_down > PER_CALL_LIMIT:  # the rows kept before the limit was passed, too
        keep = {id(r) for r in drawn.values()}
        for row in rows.values():
            if row.by_module and id(row) not in keep:
                row.by_module = _NONE
    ranked = sorted(peaks.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return _Rows(
        [rows[k] for k in sorted(rows)],
        [(mod, b, f"rank {r.rank} {r.label}") for mod, (b, _, r) in ranked],
    )


def build_model(run: RunArtifacts, top: int = 10) -> ReportModel:
    """Shape a loaded run; load and analyse every allocator-history and OOM pickle in it.

    Raises:
        ArtifactError: a pickle is unreadable, unsafe or not an allocator snapshot.
    """
    entries = []
    items: list[AllocPickle | OomRecord] = [*run.alloc_pickles, *[o for o in run.ooms if o.pickle_path]]
    for item in items:
        path = item.path if isinstance(item, AllocPickle) else item.pickle_path
        assert path is not None
        analysis = analyze(load_snapshot(path), str(path), top=top)
        entries.append(SnapshotEntry(snapshot_title(item), str(path), analysis))
    rows = _call_rows(run)
    model = ReportModel(run=run, calls=rows.calls, snapshots=entries)
    model._saved_modules = rows.module_peaks
    return model


def snapshot_title(item: AllocPickle | OomRecord) -> str:
    if isinstance(item, AllocPickle):
        return f"rank {item.rank} {item.fn} #{item.call} {item.phase}"
    return f"rank {item.rank} OOM #{item.n}"


@dataclass
class ReportTable:
    """One table of an FSDP or module-wise report, and which of its columns hold bytes."""

    title: str
    columns: list[str]
    rows: list[list[Any]]
    byte_columns: frozenset[int] = frozenset()
    """Indexes of the columns whose numbers are bytes (the tracker categories)."""


def _is_device_snapshot(v: Any) -> bool:
    """``{device: {category: bytes}}``, as the trackers' ``peak`` / ``final`` are written."""
    return (
        isinstance(v, Mapping)
        and bool(v)
        and all(
            isinstance(c, Mapping) and all(not isinstance(x, (Mapping, list)) for x in c.values())
            for c in v.values()
        )
    )


def _is_modulewise(v: Any) -> bool:
    """``{module: {phase: [{device: {category: bytes}}, ...]}}``, the trackers' ``modules``."""
    return (
        isinstance(v, Mapping)
        and bool(v)
        and all(
            isinstance(phases, Mapping)
            and all(
                isinstance(snaps, list) and all(_is_device_snapshot(s) for s in snaps)
                for snaps in phases.values()
            )
            for phases in v.values()
        )
    )


def _categories(snapshots: list[Mapping[str, Any]]) -> list[str]:
    cats: list[str] = []
    for snap in snapshots:
        for per_dev in snap.values():
            cats.extend(str(c) for c in per_dev if str(c) not in cats)
    return cats


def report_tables(data: Any) -> list[ReportTable]:
    """Tables for an ``fsdp_mem_rank_*`` / ``module_mem_rank_*`` report's YAML.

    Scalars (``tracker``, ``rank``, ``call``, ``module_depth``, ...) form one key/value table
    shown as written, not as bytes; ``peak`` / ``final`` become a row per device; ``modules``
    becomes a row per module, phase and device; only the category columns are bytes. Empty
    lists (``notes: []``) are left out. Other shapes fall back to :func:`nested_tables`.
    """
    if not isinstance(data, Mapping):
        return [ReportTable(t, c, r) for t, c, r in nested_tables(data)]
    info: list[list[Any]] = []
    for k, v in data.items():
        if isinstance(v, list) and all(not isinstance(x, (Mapping, list)) for x in v):
            info.extend([str(k), x] for x in v)
        elif not isinstance(v, (Mapping, list)):
            info.append([str(k), v])
    out = [ReportTable("", ["key", "value"], info)] if info else []
    for k, v in data.items():
        name = str(k)
        if _is_device_snapshot(v):
            cats = _categories([v])
            rows = [[str(dev), *[per_dev.get(c) for c in cats]] for dev, per_dev in v.items()]
            out.append(ReportTable(name, ["device", *cats], rows, frozenset(range(1, len(cats) + 1))))
        elif _is_modulewise(v):
            snaps = [s for phases in v.values() for ss in phases.values() for s in ss]
            cats = _categories(snaps)
            rows = [
                [str(mod), str(phase), str(dev), *[per_dev.get(c) for c in cats]]
                for mod, phases in v.items()
                for phase, ss in phases.items()
                for s in ss
                for dev, per_dev in s.items()
            ]
            out.append(
                ReportTable(
                    name, ["module", "phase", "device", *cats], rows, frozenset(range(3, len(cats) + 3))
                )
            )
        elif isinstance(v, Mapping) or (
            isinstance(v, list) and any(isinstance(x, (Mapping, list)) for x in v)
        ):
            out.extend(ReportTable(t, c, r) for t, c, r in nested_tables(v, name))
    return out


def nested_tables(data: Any, title: str = "") -> list[tuple[str, list[str], list[list[Any]]]]:
    """Turn a report's nested YAML into ``(title, columns, rows)`` tables.

    A mapping whose values are all flat mappings becomes one table (a row per key, a column
    per inner key); a flat mapping becomes a two-column table; deeper data is split by key.
    The FSDP and module-wise reports are module -> category -> bytes, so each is one table.
    """
    if isinstance(data, Mapping) and data:
        values = list(data.values())
        if all(
            isinstance(v, Mapping) and v and all(not isinstance(x, (Mapping, list)) for x in v.values())
            for v in values
        ):
            cols: list[str] = []
            for v in values:
                cols.extend(str(c) for c in v if str(c) not in cols)
            rows = [[str(k), *[v.get(c) for c in cols]] for k, v in data.items()]
            return [(title, ["", *cols], rows)]
        if all(not isinstance(v, (Mapping, list)) for v in values):
            return [(title, ["key", "value"], [[str(k), v] for k, v in data.items()])]
        out: list[tuple[str, list[str], list[list[Any]]]] = []
        flat = [[str(k), v] for k, v in data.items() if not isinstance(v, (Mapping, list))]
        if flat:
            out.append((title, ["key", "value"], flat))
        for k, v in data.items():
            if isinstance(v, (Mapping, list)) and v:  # an empty list or mapping has no rows
                out.extend(nested_tables(v, f"{title} / {k}" if title else str(k)))
        return out
    if isinstance(data, list) and data and all(isinstance(v, Mapping) for v in data):
        cols = []
        for v in data:
            cols.extend(str(c) for c in v if str(c) not in cols)
        return [(title, cols, [[v.get(c) for c in cols] for v in data])]
    if isinstance(data, list):
        return [(title, ["value"], [[v] for v in data])]
    return [(title, ["value"], [[data]])]
