"""What the CPU allocator held during one op call, from torch's profiler (every allocation and free)."""

from __future__ import annotations

from typing import Any

from torch.profiler import ProfilerActivity, profile


def measured_peak(op: Any, args: tuple[Any, ...]) -> tuple[Any, int]:
    """``op(*args)`` and the most bytes the CPU allocator held during the call, above its start."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = op(*args)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        held += e.nbytes()
        peak = max(peak, held)
    return out, peak
