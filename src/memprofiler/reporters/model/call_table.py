"""Collected calls held column by column (:class:`CallTable`), and one call read back (:class:`CallRow`)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, overload

from memprofiler.reporters.model.figures import BY_NAME, CALL_FIGURES, STORED, Figure

#: Up to this many collected calls a report shows every call (a bar and a table row each);
#: beyond it, per-function bands (min / median / max) and the top calls, so the HTML stays
#: a few hundred KB at 100,000 calls.
PER_CALL_LIMIT = 200

# The breakdowns of a call that has none: one shared read-only mapping, not two empty dicts
# per row (100,000 rows held 12.8 MB of them).
_NONE: Mapping[str, int] = MappingProxyType({})


class CallRow:
    """One collected call of one function on one rank, start and end merged.

    Each figure of :data:`~memprofiler.reporters.model.figures.CALL_FIGURES` is an attribute
    (``row.rss_peak``), ``None`` where the call lacks it; computed ones (``rss_peak_delta``, how
    far the host peak rose above the RSS at the call's start) too. :attr:`by_module` holds the
    per-module saved bytes, :attr:`tracker_peaks` the per-category peaks the module-wise tracker
    (``track_fsdp_mem`` or ``track_module_mem``, one per run) merged into the ``end`` snapshot
    (``fsdp.peak.*`` / ``module_mem.peak.*``), keyed by category.
    """

    __slots__ = ("by_module", "call", "fn", "rank", "tracker_peaks", "values")

    def __init__(
        self,
        rank: int,
        fn: str,
        call: int,
        values: Sequence[int | None] | None = None,
        by_module: Mapping[str, int] | None = None,
        tracker_peaks: Mapping[str, int] | None = None,
        **figures: int | None,
    ) -> None:
        self.rank = rank
        self.fn = fn
        self.call = call
        self.values: tuple[int | None, ...] = (
            tuple(values) if values is not None else tuple(figures.pop(f.attr, None) for f in STORED)
        )
        if figures:
            raise TypeError(f"CallRow got unknown figures: {', '.join(figures)}")
        self.by_module: Mapping[str, int] = by_module or _NONE
        self.tracker_peaks: Mapping[str, int] = tracker_peaks or _NONE

    if TYPE_CHECKING:  # the figures' attributes are properties made from the declarations below

        def __getattr__(self, name: str) -> int | None: ...

    def value(self, figure: Figure) -> int | None:
        """The call's ``figure``, ``None`` where it lacks it."""
        return getattr(self, figure.attr)

    @property
    def label(self) -> str:
        return f"{self.fn} #{self.call}"

    def _key(self) -> tuple[Any, ...]:
        return (self.rank, self.fn, self.call, self.values, dict(self.by_module), dict(self.tracker_peaks))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CallRow) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        figs = ", ".join(f"{f.attr}={v!r}" for f, v in zip(STORED, self.values, strict=True))
        return f"CallRow(rank={self.rank!r}, fn={self.fn!r}, call={self.call!r}, {figs})"


def _stored(i: int) -> property:
    return property(lambda row: row.values[i])


def _computed(a: str, b: str) -> property:
    def get(row: CallRow) -> int | None:
        x, y = getattr(row, a), getattr(row, b)
        return None if x is None or y is None else x - y

    return property(get)


for _i, _f in enumerate(STORED):
    setattr(CallRow, _f.attr, _stored(_i))
for _f in CALL_FIGURES:
    if _f.minus is not None:
        setattr(CallRow, _f.attr, _computed(*_f.minus))


# "No value" in a column (an int64 no byte count reaches).
NA = -(2**63)


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
        self.figures: dict[str, array[int]] = {f.attr: array("q") for f in STORED}
        self.by_module: dict[int, Mapping[str, int]] = {}
        """Row index -> its per-module saved bytes (rows without one are left out)."""
        self.tracker_peaks: dict[int, Mapping[str, int]] = {}
        """Row index -> its tracker peaks (see :attr:`CallRow.tracker_peaks`)."""

    @classmethod
    def of(cls, rows: Iterable[CallRow]) -> CallTable:
        """A table of ``rows``, put in rank, function and call order."""
        t = cls()
        ix: dict[str, int] = {}
        for r in rows:
            i = t._add(r.rank, ix.setdefault(r.fn, len(ix)), r.call)
            for f, v in zip(STORED, r.values, strict=True):
                t.figures[f.attr][i] = column_value(v)
            if r.by_module:
                t.by_module[i] = r.by_module
            if r.tracker_peaks:
                t.tracker_peaks[i] = r.tracker_peaks
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
            col.append(NA)
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
        vals = [None if (v := col[i]) == NA else v for col in self.figures.values()]
        return _row(
            self.rank[i],
            self.fns[self.fn[i]],
            self.call[i],
            vals,
            self.by_module.get(i),
            self.tracker_peaks.get(i),
        )

    def __iter__(self) -> Iterator[CallRow]:
        fns, by_module, tracker_peaks = self.fns, self.by_module, self.tracker_peaks
        cols = zip(self.rank, self.fn, self.call, *self.figures.values(), strict=True)
        for i, (rank, fn, call, *vals) in enumerate(cols):
            yield _row(
                rank,
                fns[fn],
                call,
                [None if v == NA else v for v in vals],
                by_module.get(i),
                tracker_peaks.get(i),
            )

    def column(self, figure: str, rows: range | None = None) -> array[int]:
        """A figure by :attr:`~memprofiler.reporters.model.figures.Figure.name` over ``rows`` (default
        all): a value per row, ``NA`` where a call lacks it."""
        lo, hi = (0, len(self.call)) if rows is None else (rows.start, rows.stop)
        fig = BY_NAME[figure]
        if fig.minus is None:
            return self.figures[fig.attr][lo:hi]
        a, b = (self.figures[f][lo:hi] for f in fig.minus)
        return array("q", (NA if NA in (x, y) else x - y for x, y in zip(a, b, strict=True)))

    def has(self, figure: str) -> bool:
        """Whether any call has ``figure`` (a :attr:`~memprofiler.reporters.model.figures.Figure.name`)."""
        return any(v != NA for v in self.column(figure))

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
        xs = array("q", (c for c, v in zip(calls, col, strict=True) if v != NA))
        return xs, array("q", (v for v in col if v != NA))

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
        if self.by_module or self.tracker_peaks:
            new_of = array("q", bytes(8 * n))
            for new, old in enumerate(order):
                new_of[old] = new
            self.by_module = {new_of[i]: m for i, m in self.by_module.items()}
            self.tracker_peaks = {new_of[i]: m for i, m in self.tracker_peaks.items()}


def _row(
    rank: int,
    fn: str,
    call: int,
    v: list[int | None],
    by_module: Mapping[str, int] | None,
    tracker_peaks: Mapping[str, int] | None,
) -> CallRow:
    """A :class:`CallRow` of :class:`CallTable` columns (``v``: the figures, in :data:`STORED` order)."""
    row = object.__new__(CallRow)  # not through __init__: a row per call read, 100,000 of them
    row.rank, row.fn, row.call, row.values = rank, fn, call, tuple(v)
    row.by_module, row.tracker_peaks = by_module or _NONE, tracker_peaks or _NONE
    return row


def _is_finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def num_or_zero(v: Any) -> float:
    return float(v) if _is_finite_number(v) else 0.0


def int_or_none(v: Any) -> int | None:
    if type(v) is int:  # nearly always: 700,000 times for 100,000 calls
        return v
    # NaN/inf (an edited YAML) has no byte count: shown as "-" rather than a traceback.
    return int(v) if _is_finite_number(v) else None


def breakdown_rank(c: CallRow) -> tuple[int, int]:
    """Which call of a rank the report draws the per-module breakdown of: the largest
    ``saved_unique``, the earliest of equals (the largest of these keys)."""
    return breakdown_key(c.saved_unique, c.call)


def breakdown_key(saved_unique: int | None, call: int) -> tuple[int, int]:
    return (saved_unique or 0, -call)


def column_value(v: Any) -> int:
    """A snapshot value as a column entry: its byte count, or ``NA``."""
    i = int_or_none(v)
    return NA if i is None or not -(2**63) < i < 2**63 else i
