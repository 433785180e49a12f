"""The memory statistics of a time range, computed in Python from a device's range data (the
same data the page's script reads): the oracle the browser and view tests check the page
against, now that one reader computes only whole-trace tables."""

from __future__ import annotations

from typing import Any

from memprofiler.analysis.traces.memory import MemPair, MemStat


def range_stats(rd: dict[str, Any], lo: float = float("-inf"), hi: float = float("inf")) -> list[MemStat]:
    """Per-operator statistics of the events in ``[lo, hi]`` ms, by size increase: an operator
    is listed when a memory event inside it lies in the range; its calls are those starting in it."""
    rows: dict[int, MemStat] = {}
    for t, b, sid in rd["events"]:
        if not lo <= t <= hi:
            continue
        for k, n in enumerate(rd["stacks"][sid]):
            r = rows.setdefault(n, MemStat(rd["names"][n]))
            r.increase += b
            if b > 0:
                r.alloc_count += 1
                r.alloc_size += b
            if k == 0:
                r.self_increase += b
                if b > 0:
                    r.self_alloc_count += 1
                    r.self_alloc_size += b
    for n, r in rows.items():
        r.calls = sum(1 for t in rd["calls"][n] if lo <= t <= hi)
    return sorted(rows.values(), key=lambda r: (-r.increase, -r.alloc_size, r.name))


def pairs_in(all_pairs: list[MemPair], lo: float, hi: float) -> list[MemPair]:
    """The pairs whose allocation or release lies in ``[lo, hi]`` ms."""
    return [
        p
        for p in all_pairs
        if (p.alloc_ms is not None and lo <= p.alloc_ms <= hi)
        or (p.release_ms is not None and lo <= p.release_ms <= hi)
    ]
