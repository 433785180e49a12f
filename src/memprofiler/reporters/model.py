"""The figures a report shows, shaped once from a run so every reporter shows the same numbers."""

from __future__ import annotations

import heapq
import math
import statistics
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from types import MappingProxyType
from typing import Any, overload

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


# "No value" in a column (an int64 no byte count reaches).
_NA = -(2**63)
#: The figures of :class:`CallRow`, in its field order: one column each in :class:`CallTable`.
_FIGURE_FIELDS = (
    "rss_start",
    "rss_end",
    "rss_peak",
    "cuda_allocated_peak",
    "cuda_reserved_peak",
    "saved_unique",
    "saved_packed",
)


class CallTable(Sequence[CallRow]):
    """Collected calls held column by column, ordered by rank, function and call.

    A call costs 80 bytes of arrays here, where a :class:`CallRow` object with its keys and
    numbers held about 450 (100,000 calls: 45 MB). Indexing and iterating make a fresh
    :class:`CallRow` per call; breakdowns are kept only for the calls that have one.
    """

    def __init__(self) -> None:
        self.fns: list[str] = []
        """Function names; :attr:`fn` holds indexes into this list."""
        self.rank: array[int] = array("q")
        self.fn: array[int] = array("q")
        self.call: array[int] = array("q")
        self.figures: dict[str, array[int]] = {f: array("q") for f in _FIGURE_FIELDS}
        self.by_module: dict[int, Mapping[str, int]] = {}
        """Row index -> its per-module saved bytes (rows without one are left out)."""
        self.fsdp: dict[int, Mapping[str, int]] = {}
        """Row index -> its tracker peaks (see :attr:`CallRow.fsdp`)."""

    @classmethod
    def of(cls, rows: Iterable[CallRow]) -> CallTable:
        """A table of ``rows``, put in rank, function and call order."""
        t = cls()
        ix: dict[str, int] = {}
        for r in rows:
            i = t._add(r.rank, ix.setdefault(r.fn, len(ix)), r.call)
            for f, col in t.figures.items():
                col[i] = _col(getattr(r, f))
            if r.by_module:
                t.by_module[i] = r.by_module
            if r.fsdp:
                t.fsdp[i] = r.fsdp
        t.fns = list(ix)
        t._sort()
        return t

    def __len__(self) -> int:
        return len(self.call)

    def _add(self, rank: int, fn: int, call: int) -> int:
        """Append a call with no figures yet (``fn``: an index into :attr:`fns`); its row index."""
        self.rank.append(rank)
        self.fn.append(fn)
        self.call.append(call)
        for col in self.figures.values():
            col.append(_NA)
        return len(self.call) - 1

    @overload
    def __getitem__(self, i: int) -> CallRow: ...

    @overload
    def __getitem__(self, i: slice) -> list[CallRow]: ...

    def __getitem__(self, i: int | slice) -> CallRow | list[CallRow]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self.call)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        vals = [None if (v := col[i]) == _NA else v for col in self.figures.values()]
        return _row(
            self.rank[i], self.fns[self.fn[i]], self.call[i], vals, self.by_module.get(i), self.fsdp.get(i)
        )

    def __iter__(self) -> Iterator[CallRow]:
        fns, by_module, fsdp = self.fns, self.by_module, self.fsdp
        cols = zip(self.rank, self.fn, self.call, *self.figures.values(), strict=True)
        for i, (rank, fn, call, *vals) in enumerate(cols):
            yield _row(
                rank, fns[fn], call, [None if v == _NA else v for v in vals], by_module.get(i), fsdp.get(i)
            )

    def column(self, figure: str, rows: range | None = None) -> array[int]:
        """One of :data:`FIGURES` by name over ``rows`` (default all): a value per row, ``_NA``
        where a call lacks it."""
        lo, hi = (0, len(self.call)) if rows is None else (rows.start, rows.stop)
        field = _FIGURE_FIELDS_BY_NAME[figure]
        if field is not None:
            return self.figures[field][lo:hi]
        peak, start = self.figures["rss_peak"][lo:hi], self.figures["rss_start"][lo:hi]  # "peak - start"
        return array("q", (_NA if _NA in (p, s) else p - s for p, s in zip(peak, start, strict=True)))

    def has(self, figure: str) -> bool:
        """Whether any call has ``figure`` (a :data:`FIGURES` name)."""
        return any(v != _NA for v in self.column(figure))

    def groups(self) -> list[tuple[int, str, range]]:
        """``(rank, function, rows)``: each function's calls on each rank, one run of rows each."""
        out = []
        rank, fn, lo, n = self.rank, self.fn, 0, len(self.call)
        while lo < n:
            hi = lo + 1
            while hi < n and rank[hi] == rank[lo] and fn[hi] == fn[lo]:
                hi += 1
            out.append((rank[lo], self.fns[fn[lo]], range(lo, hi)))
            lo = hi
        return out

    def points(self, figure: str, rows: range) -> tuple[array[int], array[int]]:
        """Call numbers and values of ``figure`` over ``rows``, where a call has it."""
        col = self.column(figure, rows)
        calls = self.call[rows.start : rows.stop]
        xs = array("q", (c for c, v in zip(calls, col, strict=True) if v != _NA))
        return xs, array("q", (v for v in col if v != _NA))

    def label(self, i: int) -> str:
        """``rank {rank} {fn} #{call}`` of row ``i``."""
        return f"rank {self.rank[i]} {self.fns[self.fn[i]]} #{self.call[i]}"

    def _sort(self) -> None:
        """Put the rows in rank, function name and call order (they are built in file order).

        Rows go into one bucket of indexes per rank and function (8 bytes a row; sorting all
        rows with a key tuple each held 100 bytes a row at once), in which calls nearly always
        come in order already.
        """
        n = len(self.call)
        rank, fn, call = self.rank, self.fn, self.call
        buckets: dict[tuple[int, int], array[int]] = {}
        for i, group in enumerate(zip(rank, fn, strict=True)):
            rows = buckets.get(group)
            if rows is None:
                rows = buckets[group] = array("q")
            rows.append(i)
        order: array[int] = array("q")
        for group in sorted(buckets, key=lambda g: (g[0], self.fns[g[1]])):
            rows = buckets.pop(group)
            if any(call[rows[j]] > call[rows[j + 1]] for j in range(len(rows) - 1)):
                rows = array("q", sorted(rows, key=call.__getitem__))
            order.extend(rows)
        if order == array("q", range(n)):
            return
        del rank, fn, call  # one column at a time: the old one goes as its new one is made
        self.rank = array("q", map(self.rank.__getitem__, order))
        self.fn = array("q", map(self.fn.__getitem__, order))
        self.call = array("q", map(self.call.__getitem__, order))
        for f in self.figures:
            self.figures[f] = array("q", map(self.figures[f].__getitem__, order))
        if self.by_module or self.fsdp:
            new_of = array("q", bytes(8 * n))
            for new, old in enumerate(order):
                new_of[old] = new
            self.by_module = {new_of[i]: m for i, m in self.by_module.items()}
            self.fsdp = {new_of[i]: m for i, m in self.fsdp.items()}


def _row(
    rank: int,
    fn: str,
    call: int,
    v: list[int | None],
    by_module: Mapping[str, int] | None,
    fsdp: Mapping[str, int] | None,
) -> CallRow:
    """A :class:`CallRow` of :class:`CallTable` columns (``v``: the figures, in field order)."""
    return CallRow(
        rank, fn, call, v[0], v[1], v[2], v[3], v[4], v[5], v[6], by_module or _NONE, fsdp or _NONE
    )


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
                name: Band.of([v for v in self.calls.column(name, rows) if v != _NA]) for name, _ in FIGURES
            }
            out.append(FunctionStats(rank, fn, len(rows), {k: b for k, b in bands.items() if b}))
        return out  # the table's groups come in rank and function order

    def top_calls(self, n: int, figure: str = "rss peak") -> list[CallRow]:
        """The ``n`` calls with the largest ``figure`` (a :data:`FIGURES` name), largest first."""
        col = self.calls.column(figure)
        best = heapq.nlargest(n, (i for i, v in enumerate(col) if v != _NA), key=col.__getitem__)
        return [self.calls[i] for i in best]

    def top_saved_modules(self, n: int = 10) -> list[tuple[str, int, str]]:
        """``(module, bytes, where)``: each module's largest saved bytes over calls and ranks."""
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
        for i, peaks in sorted(self.calls.fsdp.items()):
            cats.extend(k for k in peaks if k not in cats)
            rows.append((self.calls[i], peaks))
        return cats, rows


# The CallRow field of each figure a report shows: the column it is read from ("peak - start"
# is computed).
_FIGURE_FIELDS_BY_NAME: dict[str, str | None] = {
    "rss peak": "rss_peak",
    "peak - start": None,
    "rss end": "rss_end",
    "cuda alloc peak": "cuda_allocated_peak",
    "cuda reserved peak": "cuda_reserved_peak",
    "saved unique": "saved_unique",
}
#: The per-call figures a report shows, by name, and how to read each from a call.
FIGURES: list[tuple[str, Callable[[CallRow], int | None]]] = [
    (name, attrgetter(f or "rss_peak_delta")) for name, f in _FIGURE_FIELDS_BY_NAME.items()
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
    return _breakdown_key(c.saved_unique, c.call)


def _breakdown_key(saved_unique: int | None, call: int) -> tuple[int, int]:
    return (saved_unique or 0, -call)


@dataclass
class _Rows:
    calls: CallTable
    module_peaks: list[tuple[str, int, str]]
    """``(module, bytes, where)``, largest first: see :meth:`ReportModel.top_saved_modules`."""


def call_rows(run: RunArtifacts) -> CallTable:
    """Merge each call's ``start`` and ``end`` snapshots into one row, ordered by rank, fn, call."""
    return _call_rows(run, bounded=False).calls


def _call_rows(run: RunArtifacts, bounded: bool = True) -> _Rows:
    """:func:`call_rows`, reading the snapshots once (a streamed run a block at a time).

    ``bounded``: beyond :data:`PER_CALL_LIMIT` calls with a per-module breakdown, a row keeps
    its breakdown only while it is its rank's :func:`breakdown_rank` call. The report draws
    that one, and every module's peak is folded in as the rows are built, so 100,000 calls do
    not hold 2M entries.
    """
    t = CallTable()
    fn_ix: dict[str, int] = {}
    index: dict[tuple[int, int, int], int] = {}  # call seen in one phase so far -> its row
    figs = [t.figures[f] for f in _FIGURE_FIELDS]
    rss_start = t.figures["rss_start"]
    tracked: dict[tuple[str, ...], bool] = {}  # a snapshot's keys -> whether a tracker peak is among them
    peaks: dict[str, tuple[int, tuple[int, str, int], int]] = {}  # module -> bytes, (rank, fn, call), row
    drawn: dict[int, tuple[tuple[int, int], int]] = {}  # rank -> breakdown_rank and row of its drawn call
    broken_down = 0
    for key, m in run.iter_snapshots():
        rank, fn, call, phase = layout.parse_snapshot_key(key)
        f = fn_ix.setdefault(fn, len(fn_ix))
        # A key is written once per file, so a call has one start and one end: its index entry
        # goes when the second arrives, and only calls still missing one are held.
        k = (rank, f, call)
        i = index.pop(k, None)
        if i is None:
            i = index[k] = t._add(rank, f, call)
        if phase == "start":
            rss_start[i] = _col(m.get("rss"))
            continue
        ends = (
            m.get("rss"),
            m.get("rss_peak"),
            m.get(CUDA_ALLOCATED_PEAK),
            m.get(CUDA_RESERVED_PEAK),
            m.get("saved_tensors.unique_bytes"),
            m.get("saved_tensors.packed_bytes"),
        )
        for col, v in zip(figs[1:], ends, strict=True):
            col[i] = _col(v)
        by_mod = m.get("saved_tensors.by_module")
        if isinstance(by_mod, Mapping) and by_mod:
            if not (set(map(type, by_mod.values())) <= {int} and set(map(type, by_mod)) <= {str}):
                by_mod = {str(k): int(v) for k, v in by_mod.items() if _int(v) is not None}
        else:
            by_mod = None
        if by_mod:  # as loaded: shared, not copied
            t.by_module[i] = by_mod
            order = (rank, fn, call)
            for mod, b in by_mod.items():
                best = peaks.get(mod)
                if best is None or b > best[0] or (b == best[0] and order < best[1]):
                    peaks[mod] = (b, order, i)
            broken_down += 1
            saved = t.figures["saved_unique"][i]
            mine = _breakdown_key(None if saved == _NA else saved, call)
            shown = drawn.get(rank)
            if shown is None or mine > shown[0]:
                drawn[rank], loser = (mine, i), (shown[1] if shown is not None and shown[1] != i else None)
            else:
                loser = i
            if bounded and loser is not None and broken_down > PER_CALL_LIMIT:
                t.by_module.pop(loser, None)  # folded into `peaks`; not the rank's drawn call
        names = tuple(m)
        tracker = tracked.get(names)
        if tracker is None:
            tracker = tracked[names] = any(k.startswith(_TRACKER_PEAK_PREFIXES) for k in names)
        if tracker:
            t.fsdp[i] = {
                k.split(".peak.", 1)[1]: int(v)
                for k, v in m.items()
                if k.startswith(_TRACKER_PEAK_PREFIXES) and _int(v) is not None
            }
    del index
    if bounded and broken_down > PER_CALL_LIMIT:  # the rows kept before the limit was passed, too
        keep = {i for _, i in drawn.values()}
        t.by_module = {i: b for i, b in t.by_module.items() if i in keep}
    t.fns = list(fn_ix)
    ranked = sorted(peaks.items(), key=lambda kv: (-kv[1][0], kv[0]))
    where = [(mod, b, t.label(i)) for mod, (b, _, i) in ranked]
    t._sort()
    return _Rows(t, where)


def _col(v: Any) -> int:
    """A snapshot value as a column entry: its byte count, or ``_NA``."""
    i = _int(v)
    return _NA if i is None or not -(2**63) < i < 2**63 else i


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
