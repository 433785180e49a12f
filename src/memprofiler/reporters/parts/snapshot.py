"""The HTML of one allocator snapshot: in a run's report, and the summary tables under its explorer."""

from __future__ import annotations

from html import escape

from memprofiler.analysis.snapshot.summary import SnapshotAnalysis
from memprofiler.reporters.model.report import SnapshotEntry
from memprofiler.reporters.parts import svg
from memprofiler.reporters.parts.cells import b, bytes_cell, table
from memprofiler.units import format_bytes


def snapshot_html(entry: SnapshotEntry, top: int = 10) -> str:
    """One allocator snapshot: peaks, the active-memory timeline and the stacks live at the peak."""
    a: SnapshotAnalysis = entry.analysis
    out = [
        f"<h3>{escape(entry.title)}</h3><p class='muted'>{escape(entry.path)}</p>",
        f"<p>now: {len(a.segments)} segments, reserved {b(a.total_reserved)}, allocated "
        f"{b(a.total_allocated)} in rounded blocks, {b(a.total_requested)} requested</p>",
    ]
    for d in a.devices:
        when = (
            "before the first trace entry"
            if d.peak_allocated_index < 0
            else f"at entry {d.peak_allocated_index:,}"
        )
        if d.peak_allocated_time_us is not None:
            when += f" (t={d.peak_allocated_time_us / 1e6:.6f} s)"
        rwhen = (
            "before the first trace entry"
            if d.peak_reserved_index < 0
            else f"at entry {d.peak_reserved_index:,}"
        )
        out.append(
            f"<p>device {d.device}: {d.entries:,} trace entries. "
            f"<b>Peak active {b(d.peak_allocated)} requested</b> {when}; "
            f"<b>peak reserved {b(d.peak_reserved)}</b> {rwhen}. "
            f"Active before the trace: {b(d.baseline_allocated)}; at the end: {b(d.end_allocated)}. "
            "<span class='muted'>Active = bytes requested by blocks not yet free_completed, as "
            "memory_viz's active memory timeline; the allocator's allocated_bytes counts rounded "
            "blocks.</span></p>"
        )
        if d.timeline:
            marker = None
            if d.peak_allocated_index >= 0:
                marker = (
                    float(d.peak_allocated_index),
                    float(d.peak_allocated),
                    f"peak {format_bytes(d.peak_allocated)}",
                )
            out.append(
                svg.line_chart(
                    [
                        ("active (requested)", [(float(i), float(v)) for i, v, _ in d.timeline]),
                        ("reserved", [(float(i), float(r)) for i, _, r in d.timeline]),
                    ],
                    format_bytes,
                    f"device {d.device}: active memory over trace entries",
                    marker=marker,
                    from_zero=True,
                )
            )
        if d.top_stacks:
            out.append(
                f"<p>Live at the peak: {d.live_blocks_at_peak:,} blocks, by allocating stack (top {len(d.top_stacks)}):</p>"
            )
            rows = [[bytes_cell(g.bytes), f"{g.count:,}", "\n".join(g.frames)] for g in d.top_stacks[:top]]
            out.append(table(["requested bytes", "blocks", "stack (innermost first)"], rows, stack_col=2))
        for o in d.ooms:
            free = b(o.device_free) if o.device_free is not None else "?"
            out.append(
                f"<p class='oom'>OOM at entry {o.index:,}: {b(o.size)} requested, {free} free on the device; "
                f"at {escape(o.frames[0] if o.frames else 'no stack')}</p>"
            )
    if a.segments:
        worst = sorted(a.segments, key=lambda s: (-s.free, s.address))[:top]
        rows = [
            [
                str(s.device),
                hex(s.address),
                bytes_cell(s.total_size),
                bytes_cell(s.allocated),
                bytes_cell(s.free),
                bytes_cell(s.largest_free),
                f"{s.fragmentation:.1%}",
            ]
            for s in worst
        ]
        out.append(f"<p>Segments with the most free bytes ({len(worst)} of {len(a.segments)}):</p>")
        out.append(
            table(["device", "address", "size", "allocated", "free", "largest free", "fragmentation"], rows)
        )
    return "\n".join(out)
