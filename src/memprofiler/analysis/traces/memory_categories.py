"""Read a ``*.memory_categories.json`` (memory by category over a profiler cycle) and find its peak.

The file is written at run time by :mod:`memprofiler.lightning.memory_categories`; this side
reads it without torch: the stacked series per category, the peak of their sum, and the
tensors live at the peak.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memprofiler import layout
from memprofiler.analysis.files.compressed import GZIP_MAGIC, read_at_most
from memprofiler.errors import ArtifactError

FORMAT = layout.MEMORY_CATEGORIES_FORMAT
#: Points a stacked chart keeps at most; a longer series keeps each bin's highest total.
SERIES_POINTS = 600
#: Tensors listed as live at the peak, largest first.
LIVE_AT_PEAK = 25
#: The most (decompressed) bytes a categories file may hold. A cycle's file is a few MB (about
#: 40 bytes per allocation event); a gzip'd file expanding past this (a gzip bomb: 2 MB that
#: expand to 2.2 GB) is refused after reading this much, in bounded memory.
MAX_FILE_BYTES = 256 << 20


@dataclass
class CategoryTimeline:
    """Memory by category on one device over one cycle."""

    source: Path
    device: str
    categories: list[str]
    times_ms: list[float]
    """Milliseconds from ``t0_us`` (pre-existing tensors at 0)."""
    stacks: list[list[int]]
    """``stacks[k][c]``: bytes of category ``c`` live after the events at ``times_ms[k]``."""
    peak_bytes: int
    peak_ms: float
    peak_by_category: dict[str, int]
    live_at_peak: list[tuple[int, int, str, int]]
    """``(tensor id, version, category, bytes)`` of the largest tensors live at the peak."""
    t0_us: float
    origins: dict[int, TensorOrigin] = field(default_factory=dict)
    """What made each tensor of :attr:`live_at_peak` (files that record it: memprofiler 0.x+)."""
    preexisting_at_peak: int = 0
    """Bytes live at the peak of tensors that existed before the cycle (``t_us`` -1)."""


@dataclass(frozen=True)
class TensorOrigin:
    """The operator and module that allocated a tensor, and its shape (``""`` when not seen)."""

    operator: str
    module: str
    shape: str


def read_category_file(path: str | Path, t0_us: float | None = None) -> list[CategoryTimeline]:
    """One :class:`CategoryTimeline` per device in ``path``.

    Args:
        path: a ``*.memory_categories.json``.
        t0_us: time zero on the trace's clock (the trace's first event), so times match the
            trace's memory view; default the file's earliest event.

    Raises:
        ArtifactError: the file is unreadable or not in the expected format.
    """
    return category_timelines(read_category_doc(path), path, t0_us)


def read_category_doc(path: str | Path) -> dict[str, Any]:
    """The checked content of a ``*.memory_categories.json``, for :func:`category_timelines`
    (to build timelines on two clocks from one read).

    Raises:
        ArtifactError: the file is unreadable or not in the expected format.
    """
    p = Path(path)
    try:
        doc = json.loads(_read_capped(p))
    except RecursionError:
        raise ArtifactError(
            f"{p}: nested deeper than a memory categories file (4 levels) can be; not one"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError, EOFError, zlib.error) as err:
        raise ArtifactError(f"{p}: not a readable memory categories file ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("devices"), dict):
        raise ArtifactError(
            f"{p}: not a {FORMAT} file; it is written by memprofiler's ExtendedPyTorchProfiler"
        )
    categories = doc.get("categories", [])
    if not isinstance(categories, list):
        raise ArtifactError(f"{p}: 'categories' is not a list; not a {FORMAT} file")
    return doc


def category_timelines(
    doc: dict[str, Any], path: str | Path, t0_us: float | None = None
) -> list[CategoryTimeline]:
    """:func:`read_category_file` of a document :func:`read_category_doc` read from ``path``.

    Raises:
        ArtifactError: a device's events are malformed.
    """
    p = Path(path)
    cats = [str(c) for c in doc.get("categories", [])]
    tensors = doc.get("tensors")
    out = [_timeline(p, str(dev), cats, rows, t0_us) for dev, rows in sorted(doc["devices"].items()) if rows]
    if isinstance(tensors, dict):
        for tl in out:
            tl.origins = {
                t: o for t, *_ in tl.live_at_peak if (o := _origin(tensors.get(str(t)))) is not None
            }
    return out


def _origin(row: Any) -> TensorOrigin | None:
    if not isinstance(row, list) or len(row) < 4:
        return None
    op, module, sizes, dtype = row[:4]
    shape = ""
    if isinstance(sizes, list) and all(isinstance(x, int) for x in sizes):
        shape = (
            "[" + ", ".join(map(str, sizes)) + "]" + (f" {dtype}" if isinstance(dtype, str) and dtype else "")
        )
    return TensorOrigin(str(op or ""), str(module or ""), shape)


def _read_capped(p: Path) -> bytes:
    """The content of ``p`` (gunzipped when gzip), at most :data:`MAX_FILE_BYTES` of it read.

    Raises:
        ArtifactError: it holds more.
    """
    data = read_at_most(p, MAX_FILE_BYTES)
    if len(data) > MAX_FILE_BYTES:
        with open(p, "rb") as raw:
            what = "expands to" if raw.read(2) == GZIP_MAGIC else "holds"
        raise ArtifactError(
            f"{p}: {what} more than {MAX_FILE_BYTES >> 20} MiB, the most memprofiler reads "
            "from a memory categories file (a cycle's file is a few MB); not read"
        )
    return data


def _timeline(p: Path, device: str, cats: list[str], rows: Any, t0_us: float | None) -> CategoryTimeline:
    try:
        events = sorted(
            ((int(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows), key=lambda e: e[0]
        )
    except (TypeError, ValueError, IndexError, KeyError, OverflowError):
        raise ArtifactError(f"{p}: device {device}: malformed event row") from None
    real = [e[0] for e in events if e[0] >= 0]
    t0 = t0_us if t0_us is not None else (min(real) if real else 0.0)
    sizes = [0] * len(cats)
    times: list[float] = []
    stacks: list[list[int]] = []
    for t, delta, _tid, _ver, cat in events:
        when = 0.0 if t < 0 else round((t - t0) / 1000.0, 6)
        if not times or when != times[-1]:
            times.append(when)
            stacks.append(list(sizes))
        if 0 <= cat < len(cats):
            sizes[cat] += delta
        stacks[-1] = list(sizes)
    totals = [sum(s) for s in stacks]
    peak_k = max(range(len(totals)), key=lambda k: (totals[k], -k)) if totals else 0
    peak = totals[peak_k] if totals else 0
    peak_at = times[peak_k] if times else 0.0
    live, pre = _live_at(events, t0, peak_at, cats)
    return CategoryTimeline(
        source=p,
        device=device,
        categories=cats,
        times_ms=times,
        stacks=stacks,
        peak_bytes=max(peak, 0),
        peak_ms=peak_at,
        peak_by_category={c: stacks[peak_k][i] for i, c in enumerate(cats)} if stacks else {},
        live_at_peak=live,
        t0_us=t0,
        preexisting_at_peak=pre,
    )


def _live_at(
    events: list[tuple[int, int, int, int, int]], t0: float, at_ms: float, cats: list[str]
) -> tuple[list[tuple[int, int, str, int]], int]:
    """The largest tensors live at ``at_ms``, and the bytes live then of those from before the cycle."""
    live: dict[tuple[int, int], tuple[int, int]] = {}
    before: set[int] = set()  # tensors from before the cycle (their later versions too)
    for t, delta, tid, ver, cat in events:
        when = 0.0 if t < 0 else round((t - t0) / 1000.0, 6)
        if when > at_ms:
            break
        if t < 0:
            before.add(tid)
        if delta > 0:
            live[(tid, ver)] = (cat, delta)
        else:
            live.pop((tid, ver), None)
    rows = [
        (tid, ver, cats[c] if 0 <= c < len(cats) else "unknown", b) for (tid, ver), (c, b) in live.items()
    ]
    pre = sum(b for (tid, _), (_, b) in live.items() if tid in before)
    return sorted(rows, key=lambda r: (-r[3], r[0], r[1]))[:LIVE_AT_PEAK], pre


def thinned(tl: CategoryTimeline, points: int = SERIES_POINTS) -> tuple[list[float], list[list[int]]]:
    """At most ``points`` of ``tl``'s series, each bin represented by its highest total (the peak kept)."""
    n = len(tl.times_ms)
    if n <= points:
        return tl.times_ms, tl.stacks
    size = -(-n // points)
    keep = [max(range(k, min(k + size, n)), key=lambda i: sum(tl.stacks[i])) for k in range(0, n, size)]
    return [tl.times_ms[i] for i in keep], [tl.stacks[i] for i in keep]
