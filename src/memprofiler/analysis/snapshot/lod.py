"""Level of detail for the allocation timeline, computed once here so the browser never has to.

A block narrower than a pixel at the current zoom, or shorter than a pixel row at any zoom,
is not drawn on its own: its bytes join a *band* drawn on top of the stacked blocks. Level
``L`` draws the blocks that live at least ``2**L`` trace entries and are at least
``threshold`` bytes; its band holds every other live byte, as the maximum over buckets of
``2**L`` entries (one or two pixel columns at that zoom). The viewer picks ``L =
ceil(log2(entries per pixel))``, so every block it draws is at least a pixel wide, with one
band on top, at any zoom.
The bands of all levels together hold about ``2 * instants`` numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memprofiler.analysis.snapshot.replay import DeviceReplay

#: Pixel rows the threshold is cut for: a block under ``peak / ROWS`` bytes is always banded.
ROWS = 2048


@dataclass
class LevelOfDetail:
    threshold: int
    """Blocks below this many bytes are always in the band."""
    level: np.ndarray
    """Per block, int8: ``floor(log2(lifetime in entries))``, or ``-1`` when always banded."""
    band: np.ndarray
    """float32, every level's band one after the other."""
    offsets: list[int]
    """Where level ``L``'s band starts in :attr:`band` (one more entry: the end)."""


def level_of_detail(rep: DeviceReplay, peak: int, rows: int = ROWS) -> LevelOfDetail:
    """Each block's level and the band of every level for one device.

    Every sum here is of whole byte counts, added as int64 (exact: the columns refuse a trace
    whose sizes add up to 2**62 bytes), so the order in which the blocks are added (level by
    level, into one running difference) never changes a figure; a band is the float32 of its
    largest sum. (A running sum of int64 costs an eighth of one of float64, which numpy adds
    one after the other: at 1M entries 0.4 ms a level against 3.3 ms.)
    """
    m = rep.instants
    threshold = max(1, peak // rows)
    s = np.maximum(rep.start, 0)
    life = np.maximum(rep.end - s, 1)
    level = np.floor(np.log2(life)).astype(np.int8)
    level[rep.size < threshold] = -1
    top = max(0, int(np.ceil(np.log2(m))))
    # (sizes that are no integers, in a replay not read from a trace, are added as float64)
    weights = rep.size.astype(np.int64 if np.issubdtype(rep.size.dtype, np.integer) else np.float64)
    # The blocks grouped by level (-1 first): each level's are one slice.
    order = np.argsort(level, kind="stable")
    cuts = np.searchsorted(level[order], np.arange(-1, top + 2)).tolist()

    def add(diff: np.ndarray, lv: int) -> None:
        # (np.add.at: a level's few blocks, never an array of every instant)
        k = order[cuts[lv + 1] : cuts[lv + 2]]
        np.add.at(diff, s[k], weights[k])
        np.subtract.at(diff, rep.end[k], weights[k])

    diff = np.zeros(m + 1, dtype=weights.dtype)
    add(diff, -1)
    counts = np.diff(cuts[1:])
    bands: list[np.ndarray] = []
    offsets = [0]
    for lv in range(top + 1):
        buckets = -(-m // (1 << lv))
        if lv and not counts[lv - 1]:
            # No block joins the band at this level: each bucket is two of the level below
            # (the maximum of float32 values is the float32 of their maximum).
            below = bands[-1]
            if below.size % 2:
                below = np.concatenate([below, below[-1:]])
            bands.append(np.maximum(below[0::2], below[1::2]))  # (not a reduce over pairs: slow)
            offsets.append(offsets[-1] + buckets)
            continue
        if lv:
            add(diff, lv - 1)
        bands.append(_bucket_max(np.cumsum(diff[:m]), lv).astype(np.float32))
        offsets.append(offsets[-1] + buckets)
    return LevelOfDetail(threshold=threshold, level=level, band=np.concatenate(bands), offsets=offsets)


def _bucket_max(x: np.ndarray, lv: int) -> np.ndarray:
    """The maximum of each bucket of ``2**lv`` values (the last one may be shorter)."""
    width = 1 << lv
    full = x.size // width * width
    head = x[:full]
    if width > 16:
        head = head.reshape(-1, width).max(axis=1)
    else:  # (numpy reduces a short inner axis slowly: narrow buckets are halved pairwise)
        while width > 1:
            head = np.maximum(head[0::2], head[1::2])
            width >>= 1
    return np.append(head, x[full:].max()) if full < x.size else head
