"""Why the profiler views show two peaks for one device: the allocator's (the trace's
``[memory]`` events) and memory by category (torch's memory profiler), in one sentence.

The two count different things. The allocator counts every block it handed out, tensors or
not (cuBLAS and cuDNN workspaces, rounding to block sizes); on the CPU only what was
allocated while the profiler ran. Memory by category counts the tensors torch's memory
profiler followed, from before the cycle too (parameters, optimizer state), each live until
the last use it saw. And the two peaks may fall at different instants.
"""

from __future__ import annotations

from dataclasses import dataclass

from memprofiler.analysis.traces.memory import DeviceMemory
from memprofiler.analysis.traces.memory_categories import CategoryTimeline
from memprofiler.units import format_bytes

#: A gap under this share of the larger peak (and under 64 KiB) is no gap.
_SAME = 0.01


@dataclass(frozen=True)
class PeakGap:
    """The two peaks of one device and why they differ."""

    device: str
    """The trace's label: ``CPU``, ``GPU0``."""
    allocated_peak: int
    allocated_peak_ms: float
    category_peak: int
    category_peak_ms: float
    allocated_at_category_peak: int | None
    """The allocator's count at the category peak; ``None`` when the trace gives no base time
    to put the two clocks together."""
    preexisting: int
    """Bytes live at the category peak of tensors from before the cycle."""
    unknown: int
    """Bytes of the ``unknown`` category at the category peak."""
    reason: str


def _close(a: int, b: int) -> bool:
    return abs(a - b) <= max(64 * 1024, _SAME * max(a, b))


def trace_device(category_device: str) -> str | None:
    """A memory categories file's device (``cpu``, ``cuda:0``) as the trace names it (``CPU``, ``GPU0``)."""
    d = category_device.lower()
    if d == "cpu":
        return "CPU"
    if d.startswith("cuda"):
        return "GPU" + (d.partition(":")[2] or "0")
    return None


def explain(dm: DeviceMemory, tl: CategoryTimeline, allocated_at: int | None) -> PeakGap:
    """The gap between ``dm``'s peak and ``tl``'s, and one sentence on why."""
    cat, alloc = tl.peak_bytes, dm.peak_allocated
    unknown = tl.peak_by_category.get("unknown", 0)

    def b(n: int) -> str:
        return format_bytes(n)

    head = (
        f"The allocator peaks at {b(alloc)} ({dm.peak_ms:,.3f} ms), memory by category at {b(cat)} "
        f"({tl.peak_ms:,.3f} ms)"
    )
    if allocated_at is None:
        reason = (
            f"{head}; the trace gives no baseTimeNanoseconds, so the two clocks cannot be put together "
            "and the two are not comparable at one instant."
        )
    else:
        gap = cat - allocated_at
        at = f"at {tl.peak_ms:,.3f} ms the allocator counts {b(allocated_at)}"
        if _close(cat, allocated_at) and _close(alloc, allocated_at):
            why = (
                f"the categories' {b(gap)} more are tensors from before the profiler started, which the "
                "allocator's count leaves out"
                if gap > 0 and tl.preexisting_at_peak >= gap / 2
                else f"the two differ by {b(abs(gap))}"
            )
            reason = f"{head}: the same memory ({at}; {why})."
        elif _close(cat, allocated_at):
            reason = (
                f"{head}: two instants of the same memory ({at}, as the categories do); the allocator's "
                "own peak is another instant."
            )
        elif gap > 0 and tl.preexisting_at_peak >= gap / 2:
            reason = (
                f"{head}; {at}, {b(gap)} less: memory by category includes {b(tl.preexisting_at_peak)} of "
                "tensors that existed before the profiler started (parameters, optimizer state), which "
                "the allocator's count in the trace leaves out (it counts only what was allocated while "
                "profiling)."
            )
        elif gap > 0:
            reason = (
                f"{head}; {at}, {b(gap)} less: torch's memory profiler keeps a tensor live until the last "
                "use it saw, which can be after the allocator released its block, and counts tensors "
                "from before the cycle the allocator's count leaves out."
            )
        else:
            extra = (
                f"; 'unknown' ({b(unknown)}) is tensors the profiler saw but could not classify"
                if unknown and unknown == max(tl.peak_by_category.values(), default=0)
                else ""
            )
            reason = (
                f"{head}; {at}, {b(-gap)} more: the allocator counts memory no tensor the profiler "
                "followed holds (cuBLAS and cuDNN workspaces, rounding to its block sizes, blocks from "
                f"before the cycle){extra}."
            )
    return PeakGap(
        device=dm.device,
        allocated_peak=alloc,
        allocated_peak_ms=dm.peak_ms,
        category_peak=cat,
        category_peak_ms=tl.peak_ms,
        allocated_at_category_peak=allocated_at,
        preexisting=tl.preexisting_at_peak,
        unknown=unknown,
        reason=reason,
    )
