"""Where a call's memory goes: its peak split into parameters, gradients, optimizer state,
activations, temporaries and other, from the figures the run has.

Each split adds up to the call's peak exactly; what no figure explains is ``other``, never
dropped. The figures, best first:

* the module-wise tracker (``track_module_mem`` / ``track_fsdp_mem``): its categories at its
  own peak instant, which sum to its total. When the call also has a CUDA allocated peak above
  that total, the difference (allocator rounding, workspaces, tensors the tracker does not see)
  is ``other`` and the bar is the CUDA peak.
* the CUDA statistics: the allocated peak is the bar; what was allocated when the call began
  (parameters, gradients and optimizer state kept between steps) is one part, the call's
  saved-tensor bytes (activations) another, and the rest of the peak is what the call made and
  freed around them (temporaries, and gradients made in the call).
* the host only (CPU runs): the RSS peak is the bar; the process before the call is one part,
  the RSS rise during the call the other. The call's saved-tensor bytes are no part of that bar
  but a figure beside it (:attr:`CallSplit.saved_apart`): the host allocator serves tensors from
  memory the process already holds, so RSS says nothing of which bytes are activations, and a
  rise of 4 KiB beside 34 MiB saved is a true pair of figures, not 4 KiB of activations.

Where the profiler ran with memory categories, each device's timeline adds one bar: the bytes
of each category at the timeline's peak (``unknown``, ``input`` and ``autograd_detail`` are other).

On a CUDA bar saved-tensor bytes are capped at the rise above the call's start: the caching
allocator serves activations from blocks it already holds without growing, and a bar must not
exceed the peak.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from memprofiler.analysis.traces.memory_categories import CategoryTimeline
from memprofiler.reporters.model.call_table import NA, CallRow, CallTable

#: The parts of a bar, in drawing order: (key, label, colour).
PARTS: tuple[tuple[str, str, str], ...] = (
    ("parameters", "parameters", "#0072B2"),
    ("gradients", "gradients", "#56B4E9"),
    ("optimizer", "optimizer state", "#009E73"),
    ("resident", "held before the call (parameters, gradients, optimizer state)", "#0072B2"),
    ("process", "the process before the call", "#999999"),
    ("activations", "activations (saved for backward)", "#E69F00"),
    ("temporaries", "temporaries", "#D55E00"),
    ("in_call", "temporaries and the rest made in the call", "#D55E00"),
    ("rise", "RSS rise during the call", "#D55E00"),
    ("other", "other", "#CC79A7"),
)
LABELS: dict[str, str] = {k: label for k, label, _ in PARTS}
COLOURS: dict[str, str] = {k: colour for k, _, colour in PARTS}
_ORDER = {k: i for i, (k, _, _) in enumerate(PARTS)}

#: The trackers' categories (``module_mem.peak.*`` / ``fsdp.peak.*``, slugged) by part.
TRACKER_PARTS: dict[str, str] = {
    "parameter": "parameters",
    "sharded_param": "parameters",
    "unsharded_param": "parameters",
    "gradient": "gradients",
    "sharded_grad": "gradients",
    "unsharded_grad": "gradients",
    "optstate": "optimizer",
    "activation": "activations",
    "temp": "temporaries",
    "all_gather": "temporaries",
    "reduce_scatter": "temporaries",
}

#: The profiler's memory categories (``torch.profiler._memory_profiler.Category``) by part.
CATEGORY_PARTS: dict[str, str] = {
    "parameter": "parameters",
    "gradient": "gradients",
    "optimizer_state": "optimizer",
    "activation": "activations",
    "temporary": "temporaries",
}


#: What a bar's peak is (:attr:`CallSplit.peak_name`), by the figure it is.
TRACKER_PEAK, CUDA_PEAK, RSS_PEAK = "tracker peak", "CUDA allocated peak", "host RSS peak"
CATEGORIES_PEAK = "memory-categories peak"


@dataclass(frozen=True)
class CallSplit:
    """One call's peak and the parts it is made of (each ``(key, bytes)``, summing to ``peak``)."""

    rank: int
    label: str
    peak: int
    peak_name: str
    """What the peak is: :data:`CUDA_PEAK`, :data:`TRACKER_PEAK`, :data:`RSS_PEAK` or (a device's
    memory-categories timeline) :data:`CATEGORIES_PEAK`."""
    parts: tuple[tuple[str, int], ...]
    source: str
    """One sentence: which figures made the split."""
    capped: int = 0
    """Saved-tensor bytes left out of a CUDA bar because the call's rise above its start was smaller."""
    saved_apart: int = 0
    """The call's bytes saved for backward where they are no part of the bar (a host RSS peak):
    a figure shown beside it."""

    def __post_init__(self) -> None:
        if sum(b for _, b in self.parts) != self.peak:
            raise ValueError(f"{self.label}: parts {self.parts} do not add up to the peak {self.peak}")


def peak_of(tracker_total: int | None, cuda_peak: int | None, rss_peak: int | None) -> tuple[str, int] | None:
    """``(what the peak is, bytes)`` of a call with these figures: the bar :func:`split_call`
    draws and :func:`top_calls` ranks by, decided here alone."""
    if tracker_total:
        if cuda_peak is not None and cuda_peak > tracker_total:
            return CUDA_PEAK, cuda_peak
        return TRACKER_PEAK, tracker_total
    if cuda_peak is not None:
        return CUDA_PEAK, cuda_peak
    if rss_peak is not None:
        return RSS_PEAK, rss_peak
    return None


def split_call(c: CallRow) -> CallSplit | None:
    """The split of one call, or ``None`` when it has no peak to split."""
    total = c.tracker_peaks.get("total") if c.tracker_peaks else None
    found = peak_of(total, c.cuda_allocated_peak, c.rss_peak)
    if found is None:
        return None
    name, peak = found
    if total:  # the tracker's categories split whichever peak the bar is
        return _tracker_split(c, c.tracker_peaks, name, peak)
    if name == CUDA_PEAK:
        return _rise_split(c, peak, c.cuda_allocated_start, name, "resident")
    return _rise_split(c, peak, c.rss_start, name, "process")


def device_split(c: CallRow, name: str) -> CallSplit | None:
    """The call's :data:`CUDA_PEAK` or :data:`RSS_PEAK` split from the allocator's or the host's
    figures alone (the peak a device enforces, whatever figure :func:`split_call` chose), or
    ``None`` when the call lacks that peak."""
    if name == CUDA_PEAK and c.cuda_allocated_peak is not None:
        return _rise_split(c, c.cuda_allocated_peak, c.cuda_allocated_start, CUDA_PEAK, "resident")
    if name == RSS_PEAK and c.rss_peak is not None:
        return _rise_split(c, c.rss_peak, c.rss_start, RSS_PEAK, "process")
    return None


def top_calls(calls: CallTable, n: int) -> tuple[list[int], dict[str, int]]:
    """Row indexes of the ``n`` calls with the highest peak of each kind, in table order, and
    how many calls each kind has: read from the table's columns, so a run of 100,000 calls
    splits only the ones it draws."""
    cuda, rss = calls.column("cuda alloc peak"), calls.column("rss peak")
    kinds: dict[str, list[tuple[int, int]]] = {}
    for i in range(len(cuda)):
        tp = calls.tracker_peaks.get(i)
        found = peak_of(
            tp.get("total") if tp else None,
            None if cuda[i] == NA else cuda[i],
            None if rss[i] == NA else rss[i],
        )
        if found is not None:
            kinds.setdefault(found[0], []).append((found[1], -i))
    chosen = sorted(-i for rows in kinds.values() for _, i in heapq.nlargest(n, rows))
    return chosen, {k: len(v) for k, v in kinds.items()}


def category_split(tl: CategoryTimeline, label: str) -> CallSplit:
    """The memory-categories timeline of one device at its peak, as a bar (``rank`` is -1: the
    timeline's trace names its rank in ``label``)."""
    sums: dict[str, int] = {}
    for cat, b in tl.peak_by_category.items():
        part = CATEGORY_PARTS.get(cat, "other")
        sums[part] = sums.get(part, 0) + int(b)
    sums["other"] = sums.get("other", 0) + tl.peak_bytes - sum(sums.values())
    source = "the profiler's memory categories at the timeline's peak (unknown, input and autograd detail are other)"
    return CallSplit(-1, label, tl.peak_bytes, CATEGORIES_PEAK, _parts(sums), source + ".")


def _tracker_split(c: CallRow, peaks: Mapping[str, int], name: str, peak: int) -> CallSplit:
    total = int(peaks["total"])
    sums: dict[str, int] = {}
    for cat, b in peaks.items():
        if cat != "total":
            part = TRACKER_PARTS.get(cat, "other")
            sums[part] = sums.get(part, 0) + int(b)
    # The tracker's categories sum to its total; anything they miss is other, not lost.
    sums["other"] = sums.get("other", 0) + total - sum(sums.values())
    source = "the module-wise tracker's categories at its peak"
    if name == CUDA_PEAK:  # a CUDA peak above the tracker's total
        sums["other"] += peak - total
        source += (
            "; other includes the CUDA peak above the tracker's total (allocator rounding, "
            "workspaces, tensors the tracker does not see)"
        )
    return CallSplit(c.rank, c.label, peak, name, _parts(sums), source + ".")


def _rise_split(c: CallRow, peak: int, start: int | None, name: str, before: str) -> CallSplit:
    held = min(max(start, 0), peak) if start is not None else 0
    saved = max(c.saved_unique or 0, 0)
    if before == "process":
        return _host_split(c, peak, start, held, saved)
    acts = min(saved, peak - held)
    rest = "in_call" if start is not None else "other"
    sums = {before: held, "activations": acts, rest: peak - held - acts}
    source = "the CUDA statistics at the call's start and peak" + (
        ", and its saved-tensor bytes" if saved else ""
    )
    if start is None:
        source += " (no figure at the call's start: all of the peak but the activations is other)"
    return CallSplit(c.rank, c.label, peak, name, _parts(sums), source + ".", capped=saved - acts)


def _host_split(c: CallRow, peak: int, start: int | None, held: int, saved: int) -> CallSplit:
    """The RSS peak as the process before the call and the rise during it; the saved bytes apart."""
    sums = {"process": held, "rise" if start is not None else "other": peak - held}
    source = "host RSS at the call's start and peak"
    if start is None:
        source += " (no figure at the call's start: all of the peak is other)"
    return CallSplit(c.rank, c.label, peak, RSS_PEAK, _parts(sums), source + ".", saved_apart=saved)


def _parts(sums: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(((k, b) for k, b in sums.items() if b > 0), key=lambda kv: _ORDER[kv[0]]))


def top_with_other(items: Mapping[str, int], n: int) -> list[tuple[str, int]]:
    """The ``n`` largest ``(name, bytes)``, then one ``other (k more)`` row for the rest, so the
    rows always add up to the whole.

    Example:
        >>> top_with_other({"a": 5, "b": 3, "c": 2, "d": 1}, 2)
        [('a', 5), ('b', 3), ('other (2 more)', 3)]
    """
    ranked = sorted(items.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(ranked) <= n + 1:  # an "other" row of one would only hide its name
        return ranked
    rest = ranked[n:]
    return [*ranked[:n], (f"other ({len(rest)} more)", sum(b for _, b in rest))]


def splits(calls: Sequence[CallRow]) -> list[CallSplit]:
    """The split of every call that has a peak, in the calls' order."""
    return [s for c in calls if (s := split_call(c)) is not None]
