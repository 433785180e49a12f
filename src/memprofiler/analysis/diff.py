"""Compare two runs: per function and metric (medians over the calls both collected), or per call.

A long run's snapshot keys number in the hundreds of thousands; comparing them one by one
mostly lists calls one run collected and the other did not. :func:`diff_functions` compares
each function's calls that both runs hold and counts the rest; :func:`diff_runs` is the
per-call detail.
"""

from __future__ import annotations

import statistics
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memprofiler import layout, metrics
from memprofiler.analysis.files.gc_pause import gc_paused
from memprofiler.analysis.impossible import ImpossibleValues, possible
from memprofiler.analysis.runs.artifacts import RunArtifacts, flatten_metrics, is_number, match_any
from memprofiler.units import looks_like_bytes

_np: Any
try:  # numpy comes with torch and lightning; without it, medians sort
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None
#: Lists at least this long get numpy's median (converting costs more than sorting a short one).
_NUMPY_FROM = 2048
_EXACT = 2**52


@dataclass(frozen=True)
class DiffRow:
    """One metric of one snapshot key in both runs; a side is ``None`` where it is missing."""

    key: str
    metric: str
    a: float | None
    b: float | None

    @property
    def change(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def percent(self) -> float | None:
        """Change relative to A; ``None`` when A is 0 or missing."""
        if self.change is None or not self.a:
            return None
        return 100.0 * self.change / abs(self.a)


def diff_runs(
    a: RunArtifacts,
    b: RunArtifacts,
    metrics: Sequence[str] = (),
    keys: Sequence[str] = (),
    min_change: float = 0.0,
    include_unchanged: bool = False,
    include_missing: bool = True,
    impossible: ImpossibleValues | None = None,
) -> list[DiffRow]:
    """Every (key, metric) in either run, largest absolute change first, then one-sided rows.

    Args:
        a: the baseline run.
        b: the run compared with it.
        metrics: shell-style patterns on metric names (``rss*``, ``saved_tensors.*``); empty is all.
        keys: patterns on snapshot keys (``0.training_step.*.end``); empty is all.
        min_change: drop rows whose absolute change is smaller.
        include_unchanged: keep rows with no change.
        include_missing: keep rows present in only one run.
        impossible: where values no run writes (NaN, a negative byte count) are noted, each
            left out of its row (that side shows as missing); ``None`` compares them as read.

    Example:
        >>> rows = diff_runs(load_run("run_a"), load_run("run_b"), metrics=["rss_peak"])  # doctest: +SKIP
    """
    rows: list[DiffRow] = []

    def compare(key: str, ma: Mapping[str, Any], mb: Mapping[str, Any]) -> None:
        fa, fb = flatten_metrics(ma), flatten_metrics(mb)
        if impossible is not None:
            rank = int(key.partition(".")[0])
            fa = _screened(fa, a.stats_file(rank), key, impossible)
            fb = _screened(fb, b.stats_file(rank), key, impossible)
        for metric in set(fa) | set(fb):
            if not match_any(metric, metrics):
                continue
            row = DiffRow(key, metric, fa.get(metric), fb.get(metric))
            change = row.change
            if change is None:
                if include_missing:
                    rows.append(row)
            elif (change != 0 or include_unchanged) and abs(change) >= min_change:
                rows.append(row)

    # Both runs read side by side, a block at a time: only the rows kept (and the snapshots
    # one run lacks) are held, so `--key` narrows memory as well as output.
    only: tuple[dict[str, Mapping[str, Any]], dict[str, Mapping[str, Any]]] = ({}, {})
    for key, ma, mb in _paired(a, b, keys, only):
        compare(key, ma, mb)
    for key, ma in only[0].items():
        compare(key, ma, {})
    for key, mb in only[1].items():
        compare(key, {}, mb)
    rows.sort(key=lambda r: (r.change is None, -abs(r.change or 0), r.key, r.metric))
    return rows


def _screened(flat: dict[str, float], file: str, key: str, sink: ImpossibleValues) -> dict[str, float]:
    """``flat`` without the values no run writes, each noted in ``sink``."""
    bad = [m for m, v in flat.items() if not possible(m, v)]
    for metric in bad:
        sink.add(file, key, metric, flat.pop(metric))
    return flat


def _bad_calls(column: _Values, metric: str) -> list[int]:
    """Indexes of the values in ``column`` no run writes; an int64 column holds no NaN, and
    its minimum says at C speed whether it holds a negative."""
    if isinstance(column, array):
        if not column:
            return []
        if len(column) >= _NUMPY_FROM and _np is not None:
            lowest = int(_np.frombuffer(column, _np.int64).min())
        else:
            lowest = min(column)
        if lowest >= 0 or not looks_like_bytes(metric):
            return []
        return [i for i, v in enumerate(column) if v < 0]
    return [i for i, v in enumerate(column) if not possible(metric, v)]


def _screen(
    pairs: dict[tuple[str, str], list[_Values]], a: RunArtifacts, b: RunArtifacts, sink: ImpossibleValues
) -> None:
    """Leave out of ``pairs`` each call whose value, in either run, no run writes (noted in ``sink``)."""
    for (group, metric), pair in list(pairs.items()):
        bad = [_bad_calls(pair[0], metric), _bad_calls(pair[1], metric)]
        if not bad[0] and not bad[1]:
            continue
        prefix, _, phase = group.rpartition(".")
        where, rank = f"{prefix}.*.{phase}", int(group.partition(".")[0])
        for side, run in ((0, a), (1, b)):
            for i in bad[side]:  # one by one: NaN and a negative are two reasons
                sink.add(run.stats_file(rank), where, metric, pair[side][i])
        drop = set(bad[0]) | set(bad[1])
        kept = [[v for i, v in enumerate(col) if i not in drop] for col in pair]
        if not kept[0]:
            del pairs[(group, metric)]
            continue
        pairs[(group, metric)] = [
            array("q", k) if isinstance(col, array) else k for k, col in zip(kept, pair, strict=True)
        ]


#: Host metrics whose change is compared with the run-to-run noise.
NOISY_PREFIXES = (metrics.RSS, metrics.VMS)
NOISE_RULE = (
    "noise = the larger spread of the metric across the function's calls in either run "
    "(interquartile range; full range with 2-3 calls)"
)


@dataclass(frozen=True)
class FunctionDiffRow:
    """One metric of one function's ``start`` or ``end`` snapshots: medians over matched calls."""

    group: str
    """``{rank}.{fn}.{phase}``, the snapshot key without its call number."""
    metric: str
    calls: int
    """Calls present in both runs, over which the medians are taken."""
    a: float
    b: float
    noise: float | None
    """See :data:`NOISE_RULE`; ``None`` with one call, or for metrics not in :data:`NOISY_PREFIXES`."""

    @property
    def change(self) -> float:
        return self.b - self.a

    @property
    def percent(self) -> float | None:
        return 100.0 * self.change / abs(self.a) if self.a else None

    @property
    def within_noise(self) -> bool:
        return self.noise is not None and abs(self.change) <= self.noise


@dataclass(frozen=True)
class Unmatched:
    """Snapshot keys found in only one run, per side: ``{rank}.{fn}.{phase}`` -> call numbers."""

    only_a: dict[str, list[int]]
    only_b: dict[str, list[int]]

    def line(self, hint: str = "--per-call lists them", names: tuple[str, str] = ("A", "B")) -> str | None:
        """One line summarising them (the runs called ``names``, ending with ``hint``), or
        ``None`` when every key matched."""
        if not self.only_a and not self.only_b:
            return None

        def side(groups: dict[str, list[int]], name: str) -> str:
            n = sum(len(c) for c in groups.values())
            if not n:
                return f"0 only in {name}"
            where = "; ".join(
                f"{g} calls {min(c)}-{max(c)}" if len(c) > 1 else f"{g} call {c[0]}"
                for g, c in sorted(groups.items())[:3]
            ) + ("; ..." if len(groups) > 3 else "")
            return f"{n:,} only in {name} ({where})"

        return (
            f"not compared: snapshot keys {side(self.only_a, names[0])}, {side(self.only_b, names[1])}; "
            f"{hint}"
        )


def _array(values: list[float]) -> Any:
    """``values`` as a numpy array that holds each exactly, or ``None``.

    Float64 first (from Python ints at twice the speed of ``numpy.array``'s type inference):
    exact for floats, and for ints below 2**52, whose half-sums stay exact too; else the
    inferred int64 or float64, or ``None`` for ints beyond 64 bits.
    """
    arr = _np.fromiter(values, _np.float64, len(values))
    if max(arr.max(), -arr.min()) < _EXACT:
        return arr
    arr = _np.array(values)
    return None if arr.dtype == object else arr


def _median_spread(values: _Values, spread: bool) -> tuple[float, float | None]:
    """``statistics.median`` of ``values`` and, with ``spread``, their spread: the interquartile
    range (``statistics.quantiles``' exclusive method) from 4 values, the range from 2.

    Long lists go through numpy (a selection, not a sort: 2.4 s -> 0.2 s for the 140 lists of a
    100,000-call diff, and 1 s less for their quartiles); short ones are sorted.
    """
    n = len(values)
    if n >= _NUMPY_FROM and _np is not None:
        arr = _np.frombuffer(values, _np.int64) if isinstance(values, array) else _array(values)
        if arr is not None:
            if not spread:
                return float(_np.median(arr)), None
            q1, mid, q3 = _np.percentile(arr, [25, 50, 75], method="weibull")  # = exclusive
            return float(mid), float(q3 - q1)
    values = sorted(values)
    mid = values[n // 2]
    median = float(mid if n % 2 else (values[n // 2 - 1] + mid) / 2)
    if not spread or n < 2:
        return median, None
    if n < 4:
        return median, float(values[-1] - values[0])
    q = statistics.quantiles(values, n=4)
    return median, float(q[2] - q[0])


def _group(key: str) -> tuple[str, int]:
    rank, fn, call, phase = layout.parse_snapshot_key(key)
    return f"{rank}.{fn}.{phase}", call


#: One metric's values over calls: 8 bytes each while all are ints of 64 bits, else a list.
_Values = array | list


def _column() -> list[_Values]:
    return [array("q"), array("q")]


def _append_wide(pair: list[_Values], va: float, vb: float) -> None:
    """Append where an int64 column refused (a float, or an int beyond 64 bits): it becomes a list."""
    if len(pair[0]) == len(pair[1]):  # A's value was the one refused
        pair[0] = list(pair[0])
        pair[0].append(va)
    try:
        pair[1].append(vb)
    except (TypeError, OverflowError):
        pair[1] = list(pair[1])
        pair[1].append(vb)


def _paired(
    a: RunArtifacts,
    b: RunArtifacts,
    keys: Sequence[str],
    only: tuple[dict[str, Mapping[str, Any]], dict[str, Mapping[str, Any]]],
) -> Iterator[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    """``(key, A's metrics, B's metrics)`` for each key both runs hold, read side by side.

    Both runs are read a block at a time, one entry of each in turn; an entry waits only until
    the other run reaches its key. Two runs of one schedule list keys in the same order, so
    little waits; a key the other run never reaches ends in ``only`` (A's, B's), with its metrics.
    """
    wait_a: dict[str, Mapping[str, Any]] = {}
    wait_b: dict[str, Mapping[str, Any]] = {}
    it_a, it_b = iter(a.iter_snapshots()), iter(b.iter_snapshots())
    live = 2
    while live:
        live = 0
        for it, mine, other, a_side in ((it_a, wait_a, wait_b, True), (it_b, wait_b, wait_a, False)):
            item = next(it, None)
            if item is None:
                continue
            live += 1
            key, m = item
            if keys and not match_any(key, keys):
                continue
            theirs = other.pop(key, None)
            if theirs is None:
                mine[key] = m
            elif a_side:
                yield key, m, theirs
            else:
                yield key, theirs, m
    only[0].update(wait_a)
    only[1].update(wait_b)


def _pairs(
    triples: Iterable[tuple[str, Mapping[str, Any], Mapping[str, Any]]], metrics: Sequence[str]
) -> dict[tuple[str, str], list[_Values]]:
    """(group, metric) -> the values of A and B, call by call, over the paired ``triples``.

    A long run holds millions of values: plain numbers and the one level of nesting the
    profiler writes (``saved_tensors.by_module``) are read in place, without flattening
    each snapshot into a new dict first, and kept as int64 arrays (8 bytes a value).
    """
    wanted: dict[str, bool] = {}
    by_group: dict[str, dict[str, list[_Values]]] = {}
    nested: dict[str, dict[str, str]] = {}  # metric -> sub-key -> "metric.sub-key", built once

    def add(pairs: dict[str, list[_Values]], metric: str, va: float, vb: float) -> None:
        ok = wanted.get(metric)
        if ok is None:
            ok = wanted[metric] = match_any(metric, metrics)
        if ok:
            pair = pairs.get(metric)
            if pair is None:
                pair = pairs[metric] = _column()
            try:
                pair[0].append(va)
                pair[1].append(vb)
            except (TypeError, OverflowError):
                _append_wide(pair, va, vb)

    for key, ma, mb in triples:
        prefix, _, phase = key.rsplit(".", 2)  # `{rank}.{fn}` and the phase; the call number goes
        group = f"{prefix}.{phase}"
        pairs = by_group.get(group)
        if pairs is None:
            pairs = by_group[group] = {}
        for metric, va in ma.items():
            vb = mb.get(metric)
            if vb is None:
                continue
            ta, tb = type(va), type(vb)
            if (ta is int or ta is float) and (tb is int or tb is float):
                pair = pairs.get(metric)  # inline `add`: the common case, millions of times
                if pair is None:
                    add(pairs, metric, va, vb)
                    continue
                try:
                    pair[0].append(va)
                    pair[1].append(vb)
                except (TypeError, OverflowError):
                    _append_wide(pair, va, vb)
            elif isinstance(va, Mapping) and isinstance(vb, Mapping):
                names = nested.get(metric)
                if names is None:
                    names = nested[metric] = {}
                for sub, x in va.items():
                    y = vb.get(sub)
                    if y is None:
                        continue
                    name = names.get(sub)
                    if name is None:
                        name = names[sub] = f"{metric}.{sub}"
                    tx, ty = type(x), type(y)
                    if (tx is int or tx is float) and (ty is int or ty is float):
                        pair = pairs.get(name)
                        if pair is None:
                            add(pairs, name, x, y)
                            continue
                        try:
                            pair[0].append(x)
                            pair[1].append(y)
                        except (TypeError, OverflowError):
                            _append_wide(pair, x, y)
                    elif is_number(x) and is_number(y):
                        add(pairs, name, x, y)
                    elif isinstance(x, Mapping) and isinstance(y, Mapping):  # deeper: rare
                        fy = flatten_metrics(y, f"{name}.")
                        for deep, xx in flatten_metrics(x, f"{name}.").items():
                            if (yy := fy.get(deep)) is not None:
                                add(pairs, deep, xx, yy)
            elif is_number(va) and is_number(vb):
                add(pairs, metric, va, vb)
    return {(g, m): pair for g, pairs in by_group.items() for m, pair in pairs.items()}


def diff_functions(
    a: RunArtifacts,
    b: RunArtifacts,
    metrics: Sequence[str] = (),
    keys: Sequence[str] = (),
    min_change: float = 0.0,
    include_unchanged: bool = False,
    impossible: ImpossibleValues | None = None,
) -> tuple[list[FunctionDiffRow], Unmatched]:
    """Per function, phase and metric: the medians over the calls both runs collected.

    Keys found in one run only are not compared; they come back as :class:`Unmatched`. With
    ``impossible``, a call whose value in either run no run writes (NaN, a negative byte count)
    is left out of that metric's medians and noted there, by file.

    Args:
        a: the baseline run.
        b: the run compared with it.
        metrics: shell-style patterns on metric names; empty is all.
        keys: patterns on snapshot keys (``0.training_step.*.end``); empty is all.
        min_change: drop rows whose absolute change of medians is smaller.
        include_unchanged: keep rows with no change.

    Example:
        >>> rows, unmatched = diff_functions(load_run("run_a"), load_run("run_b"), metrics=["rss*"])  # doctest: +SKIP
    """
    only: tuple[dict[str, Mapping[str, Any]], dict[str, Mapping[str, Any]]] = ({}, {})
    rows = []
    with gc_paused():  # millions of values appended: nothing cyclic
        pairs = _pairs(_paired(a, b, keys, only), metrics)
    if impossible is not None:
        _screen(pairs, a, b, impossible)
    for (group, metric), (xa, xb) in sorted(pairs.items()):
        noisy = metric.startswith(NOISY_PREFIXES)
        (med_a, spread_a), (med_b, spread_b) = _median_spread(xa, noisy), _median_spread(xb, noisy)
        spreads = [s for s in (spread_a, spread_b) if s is not None]
        noise = max(spreads) if spreads else None
        row = FunctionDiffRow(group, metric, len(xa), med_a, med_b, noise)
        if (row.change != 0 or include_unchanged) and abs(row.change) >= min_change:
            rows.append(row)
    rows.sort(key=lambda r: (-abs(r.change), r.group, r.metric))

    def unmatched(keys_: Iterable[str]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for k in keys_:
            group, call = _group(k)
            out.setdefault(group, []).append(call)
        return {g: sorted(c) for g, c in out.items()}

    return rows, Unmatched(unmatched(only[0]), unmatched(only[1]))
