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
    """Each block's level and the band of every level for one device."""
    m = rep.instants
    threshold = max(1, peak // rows)
    s = np.maximum(rep.start, 0)
    life = np.maximum(rep.end - s, 1)
    level = np.floor(np.log2(life)).astype(np.int8)
    level[rep.size < threshold] = -1
    top = max(0, int(np.ceil(np.log2(m))))
    weights = rep.size.astype(np.float64)

    def step(mask: np.ndarray) -> np.ndarray:
        # (bincount of nothing is an integer array: start from floats)
        d = np.zeros(m + 1)
        d += np.bincount(s[mask], weights=weights[mask], minlength=m + 1)[: m + 1]
        d -= np.bincount(rep.end[mask], weights=weights[mask], minlength=m + 1)[: m + 1]
        return d

    diff = step(level < 0)
    counts = np.bincount(level[level >= 0], minlength=top + 1) if level.size else np.zeros(top + 1, int)
    bands: list[np.ndarray] = []
    offsets = [0]
    for lv in range(top + 1):
        width = 1 << lv
        buckets = -(-m // width)
        if lv and not counts[lv - 1]:
            # No block joins the band at this level: each bucket is two of the level below
            # (the maximum of float32 values is the float32 of their maximum).
            below = bands[-1]
            if below.size % 2:
                below = np.concatenate([below, below[-1:]])
            bands.append(below.reshape(buckets, 2).max(axis=1))
            offsets.append(offsets[-1] + buckets)
            continue
        if lv:
            diff += step(level == lv - 1)
        banded = np.cumsum(diff[:m])
        pad = buckets * width - m
        if pad:
            banded = np.concatenate([banded, np.full(pad, banded[-1])])
        bands.append(banded.reshape(buckets, width).max(axis=1).astype(np.float32))
        offsets.append(offsets[-1] + buckets)
    return LevelOfDetail(threshold=threshold, level=level, band=np.concatenate(bands), offsets=offsets)
