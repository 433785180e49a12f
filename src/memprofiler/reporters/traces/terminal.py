"""Terminal sections of the profiler views: steps, memory per device, memory by category,
operators, modules and ranks (``memprofiler report``), and the operator / module diff
(``memprofiler diff``)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memprofiler.analysis.traces.diff import OpDelta
from memprofiler.analysis.traces.ops import OpRow
from memprofiler.analysis.traces.steps import STEP_PARTS
from memprofiler.analysis.traces.views import ProfilerViews, TraceView
from memprofiler.units import format_bytes


def _ms(us: float) -> str:
    return f"{us / 1000:,.3f}"


def _table(title: str, cols: Sequence[str]) -> Table:
    t = Table(title=title)
    for i, c in enumerate(cols):
        t.add_column(c, justify="left" if i == 0 else "right")
    return t


class ProfilerTerminalReporter:
    """Prints the profiler views of every trace, then the per-rank split.

    Example:
        >>> ProfilerTerminalReporter(build_views([Path("logs")])).render(Console())  # doctest: +SKIP
    """

    def __init__(self, views: ProfilerViews, top: int = 10) -> None:
        self.views = views
        self.top = top

    def render(self, console: Console) -> None:
        for tv in self.views.traces:
            self._trace(tv, console)
        if self.views.ranks:
            t = _table(
                "Computation and communication per rank (ms)",
                ["rank", "from", "steps", "computation", "overlap", "communication", "other"],
            )
            for r in self.views.ranks:
                t.add_row(str(r.rank), r.source, *(_ms(v) for v in (r.step_us, r.computation_us, r.overlap_us, r.communication_us, r.other_us)))  # fmt: skip
            console.print(t)
            if (slow := self.views.slowest) is not None:
                console.print(f"slowest rank: {slow.rank} ({_ms(slow.step_us)} ms of profiled steps)")

    def _trace(self, tv: TraceView, console: Console) -> None:
        rank = "" if tv.rank is None else f"  rank {tv.rank}"
        console.print(f"[bold]profiler trace[/bold] {escape(str(tv.path))}{rank}  {tv.events:,} events")
        for note in tv.notes:
            console.print(f"[yellow]warning:[/yellow] {escape(note)}")
        t = _table("Step time breakdown (ms)", ["step", "total", *STEP_PARTS])
        for s in tv.steps:
            t.add_row(escape(s.step), _ms(s.total_us), *(_ms(s.parts[p]) for p in STEP_PARTS))
        console.print(t)
        for dv in tv.devices:
            dm = dv.memory
            console.print(
                f"{dm.device}: peak allocated {format_bytes(dm.peak_allocated)} at {dm.peak_ms:.3f} ms, "
                f"peak reserved {format_bytes(dm.peak_reserved)}, {dv.pair_count:,} allocations and releases"
            )
            m = _table(f"{dm.device}: memory per operator (top {self.top} by size increase)",
                       ["operator", "calls", "size increase", "self increase", "allocs", "self allocs", "alloc size", "self alloc size"])  # fmt: skip
            for st in dv.stats[: self.top]:
                m.add_row(escape(st.name), f"{st.calls:,}", format_bytes(st.increase), format_bytes(st.self_increase),
                          f"{st.alloc_count:,}", f"{st.self_alloc_count:,}", format_bytes(st.alloc_size), format_bytes(st.self_alloc_size))  # fmt: skip
            console.print(m)
        for tl in tv.categories:
            parts = ", ".join(
                f"{c} {format_bytes(b)}"
                for c, b in sorted(tl.peak_by_category.items(), key=lambda kv: -kv[1])
                if b
            )
            console.print(
                f"{tl.device}: memory by category, peak {format_bytes(tl.peak_bytes)} at {tl.peak_ms:.3f} ms: {parts}"
            )
        for gap in tv.peak_gaps:
            console.print(f"{gap.device}: {escape(gap.reason)}")
        self._ops(console, tv.ops, "operator", tv.has_device_time, "Operators by host self time")
        if tv.wrapper_note:
            console.print(escape(tv.wrapper_note))
        if tv.modules:
            self._ops(console, tv.modules, "module", tv.has_device_time, "Modules by host total time")

    def _ops(self, console: Console, rows: list[OpRow], what: str, device: bool, title: str) -> None:
        cols = [what, "calls", "host self", "host total"] + (
            ["device self", "device total"] if device else []
        )
        t = _table(
            f"{title} (top {min(self.top, len(rows))} of {len(rows):,}; ms)",
            [*cols, "allocated (incl.)", "self allocated"],
        )
        for r in rows[: self.top]:
            cells = [escape(r.name), f"{r.calls:,}", _ms(r.host_self_us), _ms(r.host_total_us)]
            if device:
                cells += [_ms(r.device_self_us), _ms(r.device_total_us)]
            t.add_row(*cells, format_bytes(r.alloc_bytes), format_bytes(r.self_alloc_bytes))
        console.print(t)


def render_profiler_diff(rows: Sequence[OpDelta], what: str, console: Console, total: int) -> None:
    """The operator (or module) diff table: A, B and the change of each figure."""
    t = _table(f"{what.capitalize()}s: run B - run A ({len(rows)} of {total:,}, largest time change first)",
               [what, "calls A", "calls B", "host self A", "host self B", "Δ host self (ms)", "Δ host total (ms)",
                "Δ device total (ms)", "Δ allocated (incl.)"])  # fmt: skip
    for d in rows:
        t.add_row(
            escape(d.name), str(d.a.calls if d.a else "-"), str(d.b.calls if d.b else "-"),
            _ms(d.a.host_self_us) if d.a else "-", _ms(d.b.host_self_us) if d.b else "-",
            f"{d.host_self_us / 1000:+,.3f}", f"{d.host_total_us / 1000:+,.3f}",
            f"{d.device_total_us / 1000:+,.3f}", ("+" if d.alloc_bytes > 0 else "") + format_bytes(d.alloc_bytes),
        )  # fmt: skip
    console.print(t)
