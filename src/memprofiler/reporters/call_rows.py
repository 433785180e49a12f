"""A run's snapshots merged into a :class:`~memprofiler.reporters.call_table.CallTable`, a call a row."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from memprofiler import layout
from memprofiler.analysis.artifacts import RunArtifacts
from memprofiler.reporters.call_table import (
    _FIGURE_FIELDS,
    _NA,
    PER_CALL_LIMIT,
    CallTable,
    _breakdown_key,
    _col,
    _int,
)

#: CUDA ``memory_stats()`` keys shown per call (the ``end`` snapshot's peaks belong to that call).
CUDA_ALLOCATED_PEAK = "allocated_bytes.all.peak"
CUDA_RESERVED_PEAK = "reserved_bytes.all.peak"

_TRACKER_PEAK_PREFIXES = ("fsdp.peak.", "module_mem.peak.")


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
