"""Terminal tables (rich) for ``memprofiler report`` and ``memprofiler snapshot``."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memprofiler.analysis.diff import NOISE_RULE, DiffRow, FunctionDiffRow, Unmatched
from memprofiler.analysis.snapshot.summary import SnapshotAnalysis
from memprofiler.reporters.model.figures import BANDED, table_figures
from memprofiler.reporters.model.module_groups import SavedRollup, top_groups
from memprofiler.reporters.model.report import TRACKERS, CallRow, ReportModel, tracker_title
from memprofiler.reporters.run_advice import advise_run
from memprofiler.units import format_bytes, format_value


def make_console() -> Console:
    """A console for command output; piped output (CI logs) gets wide lines instead of 80 columns."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    return console


def _time(us: int | None) -> str:
    return "-" if us is None else f"t={us / 1e6:.6f}s"


def _at(index: int, us: int | None) -> str:
    where = "before the first entry" if index < 0 else f"entry {index:,}"
    return f"{where}, {_time(us)}" if us is not None else where


class TerminalReporter:
    """Prints a run's calls, saved-tensor modules, cross-rank summary and allocator snapshots.

    Example:
        >>> TerminalReporter(build_model(load_run("run"))).render(Console())  # doctest: +SKIP
    """

    def __init__(self, model: ReportModel, top: int = 10) -> None:
        self.model = model
        self.top = top

    def render(self, console: Console) -> None:
        run = self.model.run
        for line in run.warnings:  # first: a run that ended without finishing, files that disagree
            console.print(f"[yellow]warning:[/yellow] {escape(line)}")
        console.print(
            f"[bold]memprofiler run[/bold] {escape(str(run.root))}  ranks: {', '.join(map(str, run.ranks)) or '-'}"
        )
        for note in run.notes:
            console.print(f"[yellow]note:[/yellow] {escape(note)}")
        if self.model.aggregated:
            self._functions(console)
        else:
            self._calls(console)
        self._modules(console)
        self._advice(console)
        self._tracker_peaks(console)
        self._summary(console)
        self._reports(console)
        for entry in self.model.snapshots:
            render_snapshot(entry.analysis, console, title=entry.title, top=min(self.top, 5), segments=0)

    def _functions(self, console: Console) -> None:
        funcs = self.model.functions()
        figs = [g.name for g in BANDED if g.band_in_terminal and any(g.name in f.bands for f in funcs)]
        t = Table(title=f"{len(self.model.calls):,} collected calls per function: median (min - max)")
        for col in ("rank", "function", "calls", *figs):
            t.add_column(col, justify="left" if col == "function" else "right")
        for f in funcs:
            cells = []
            for fig in figs:
                band = f.bands.get(fig)
                cells.append(
                    "-"
                    if band is None
                    else f"{format_bytes(band.mid)} ({format_bytes(band.lo)} - {format_bytes(band.hi)})"
                )
            t.add_row(str(f.rank), escape(f.fn), f"{f.calls:,}", *cells)
        console.print(t)
        n = self.top
        self._calls(console, self.model.top_calls(n), f"Top {n} calls by rss peak")

    def _calls(self, console: Console, calls: Sequence[CallRow] | None = None, title: str = "") -> None:
        calls = self.model.calls if calls is None else calls
        if not calls:
            console.print(escape(self.model.run.nothing_collected(notes_shown=True)))
            return
        t = Table(title=title or "Collected calls (peaks that matter)")
        for col in ("rank", "function", "call"):
            t.add_column(col, justify="left" if col == "function" else "right")
        figs = table_figures(calls)
        for fig in figs:
            t.add_column(fig.name, justify="right")
        for c in calls:
            t.add_row(str(c.rank), escape(c.fn), str(c.call), *[format_bytes(c.value(fig)) for fig in figs])
        console.print(t)

    def _modules(self, console: Console) -> None:
        rollup = self.model.saved_rollup()
        if rollup is not None:
            self._rollup(console, rollup)
            return
        top = self.model.top_saved_modules(self.top)
        if not top:
            return
        t = Table(title=f"Top {len(top)} modules by saved-tensor bytes")
        t.add_column("module")
        t.add_column("saved bytes", justify="right")
        t.add_column("largest in")
        for mod, b, where in top:
            t.add_row(escape(mod), format_bytes(b), escape(where))
        console.print(t)

    def _rollup(self, console: Console, r: SavedRollup) -> None:
        """Saved-tensor bytes of the call that saved the most, by block and by module type."""
        console.print(
            f"Saved-tensor bytes of {escape(r.label)}, the call that saved the most: "
            f"{format_bytes(r.total)} in {r.modules:,} modules"
        )
        for title, groups, count in (
            ("by block", r.by_block, "modules"),
            ("by module type across blocks", r.by_type, "blocks"),
        ):
            t = Table(title=title)
            for col in ("block" if count == "modules" else "module type", "saved", "share", count):
                t.add_column(col, justify="left" if col in ("block", "module type") else "right")
            for g in top_groups(groups, self.top):
                n = g.modules if count == "modules" else g.blocks
                share = f"{g.bytes / r.total:.1%}" if r.total else "-"
                t.add_row(escape(g.name), format_bytes(g.bytes), share, f"{n:,}" if n else "-")
            console.print(t)

    def _advice(self, console: Console) -> None:
        """Make it fit: the blocks to checkpoint first, each with what it takes off the peak at most."""
        advice = advise_run(self.model, top=self.top)
        if advice is None or not advice.proposals:
            return
        what = "blocks" if advice.blocks else "modules"
        t = Table(
            title=f"Make it fit: checkpoint the {what} that saved the most in {escape(advice.call)} "
            f"({escape(advice.peak_name)} {format_bytes(advice.peak)}), each row with the ones above"
        )
        for col in (what[:-1], "saved", "off the peak (at most)", "peak after (at least)"):
            t.add_column(col, justify="left" if col == what[:-1] else "right")
        for p in advice.proposals:
            t.add_row(
                escape(p.module), format_bytes(p.saved), format_bytes(p.at_peak), format_bytes(p.peak_after)
            )
        console.print(t)
        console.print("the change (the first k lines for row k):")
        for line in advice.patch():
            console.print(f"    {line}", markup=False, highlight=False)

    def _tracker_peaks(self, console: Console) -> None:
        cats, rows = self.model.tracker_rows()
        if not rows:
            return
        t = Table(title=tracker_title(self.model.run.reports))
        for col in ("rank", "function", "call", *cats):
            t.add_column(escape(col), justify="left" if col == "function" else "right")
        for c, peaks in rows:
            t.add_row(str(c.rank), escape(c.fn), str(c.call), *[format_bytes(peaks.get(k)) for k in cats])
        console.print(t)

    def _summary(self, console: Console) -> None:
        rows = self.model.summary_rows()
        if not rows:
            return
        t = Table(title="Across ranks (memory_summary.yaml), most unbalanced first")
        for col in ("key", "metric", "min", "mean", "max", "max on rank", "max/mean"):
            t.add_column(col, justify="left" if col in ("key", "metric") else "right")
        for key, metric, s in rows[: self.top]:
            imb = s.get("imbalance")
            t.add_row(
                escape(key),
                escape(metric),
                format_value(metric, s.get("min")),
                format_value(metric, s.get("mean")),
                format_value(metric, s.get("max")),
                escape(str(_max_rank(s))),
                f"{imb:.3f}" if isinstance(imb, (int, float)) else "-",
            )
        console.print(t)

    def _reports(self, console: Console) -> None:
        reps = self.model.run.reports
        if reps:
            kinds = ", ".join(
                f"{sum(r.kind == k for r in reps)} of the {TRACKERS.get(k, k)}"
                for k in sorted({r.kind for r in reps})
            )
            console.print(f"module-wise reports: {kinds} (tables in the HTML report)")
        for oom in self.model.run.ooms:
            info = oom.info or {}
            bits = [
                escape(f"{k}={format_value(str(k), v)}")
                for k, v in info.items()
                if isinstance(v, (int, float))
            ]
            again = oom.repeated_by
            same = (
                f" (record #{again.n} is the exception handler's record of this OOM: "
                f"{escape(str((again.info or {}).get('exception', '')))})"
                if again is not None
                else ""
            )
            console.print(
                f"[red]OOM dump[/red] rank {oom.rank} #{oom.n}: " + (", ".join(bits) or "no yaml") + same
            )


def _max_rank(stats: dict[str, object]) -> object:
    return stats.get("argmax_rank", "-")


def render_snapshot(
    analysis: SnapshotAnalysis, console: Console, title: str = "", top: int = 10, segments: int = 10
) -> None:
    """Peaks, top stacks at the peak, OOM entries and (``segments`` > 0) the most fragmented segments.

    Trace figures are active requested bytes (memory_viz's active memory), not the allocator's
    rounded ``allocated_bytes``; the ``now`` line gives both for the snapshot's end state.
    """
    console.print(f"[bold]Allocator snapshot[/bold] {escape(title or analysis.source)}")
    console.print(
        f"  now: {len(analysis.segments)} segments, reserved {format_bytes(analysis.total_reserved)}, "
        f"allocated {format_bytes(analysis.total_allocated)} in rounded blocks, "
        f"{format_bytes(analysis.total_requested)} requested"
    )
    for d in analysis.devices:
        console.print(
            f"  device {d.device}: {d.entries:,} trace entries; "
            f"peak active {format_bytes(d.peak_allocated)} requested "
            f"({_at(d.peak_allocated_index, d.peak_allocated_time_us)}); "
            f"peak reserved {format_bytes(d.peak_reserved)} ({_at(d.peak_reserved_index, d.peak_reserved_time_us)})"
        )
        # With an OOM, what held the memory when the allocation failed is the question, not the
        # peak before it (a step earlier, the peak's blocks may all be gone).
        stacks, blocks = (
            (d.oom_stacks, d.live_blocks_at_oom) if d.ooms else (d.top_stacks, d.live_blocks_at_peak)
        )
        if stacks:
            when = (
                f"live at the OOM (entry {d.ooms[-1].index:,}, {format_bytes(d.allocated_at_oom)} active)"
                if d.ooms
                else "live at the active peak"
            )
            t = Table(title=f"device {d.device}: {when} by stack ({blocks:,} blocks)")
            t.add_column("requested bytes", justify="right")
            t.add_column("blocks", justify="right")
            t.add_column("stack (innermost first)")
            for g in stacks[:top]:
                t.add_row(format_bytes(g.bytes), f"{g.count:,}", escape("\n".join(g.frames)))
            console.print(t)
        for o in d.ooms:
            free = format_bytes(o.device_free) if o.device_free is not None else "?"
            where = escape(o.frames[0]) if o.frames else "no stack"
            console.print(
                f"  [red]OOM[/red] device {o.device} entry {o.index:,} {_time(o.time_us)}: "
                f"{format_bytes(o.size)} requested, {free} free; at {where}"
            )
    if segments and analysis.segments:
        worst = sorted(analysis.segments, key=lambda s: (-s.free, s.address))[:segments]
        t = Table(title=f"Segments with the most free bytes ({len(worst)} of {len(analysis.segments)})")
        for col in ("device", "address", "size", "allocated", "free", "largest free", "fragmentation"):
            t.add_column(col, justify="right")
        for s in worst:
            t.add_row(
                str(s.device),
                hex(s.address),
                format_bytes(s.total_size),
                format_bytes(s.allocated),
                format_bytes(s.free),
                format_bytes(s.largest_free),
                f"{s.fragmentation:.1%}",
            )
        console.print(t)


#: Beyond this many rows a table is printed as plain aligned columns: rich lays out each row
#: at about 7 ms, so the 9,000 rows of a per-call diff over 3,000 calls took a minute.
RICH_TABLE_ROWS = 500


def _plain_table(console: Console, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """``rows`` under ``columns`` in aligned plain text: text columns left, figures right."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    left = {0, 1}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = [title, line(columns), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]
    console.file.write("\n".join(ln.rstrip() for ln in out) + "\n")


def render_diff(rows: Sequence[DiffRow], console: Console, total: int | None = None) -> None:
    """The ``memprofiler diff --per-call`` table: key, metric, A, B, change, percentage."""
    if not rows:
        console.print("no differences")
        return
    shown = f"{len(rows)} of {total}" if total is not None and total != len(rows) else f"{len(rows)}"
    columns = ("key", "metric", "A", "B", "change", "%")
    cells = []
    for r in rows:
        change = r.change
        pct = r.percent
        sign = "+" if change is not None and change > 0 else ""
        cells.append(
            (
                r.key,
                r.metric,
                format_value(r.metric, r.a) if r.a is not None else "(missing)",
                format_value(r.metric, r.b) if r.b is not None else "(missing)",
                "-" if change is None else sign + format_value(r.metric, change),
                "-" if pct is None else f"{pct:+.1f}%",
            )
        )
    title = f"Differences, largest absolute change first ({shown} rows)"
    if len(cells) > RICH_TABLE_ROWS:
        _plain_table(console, title, columns, cells)
        return
    t = Table(title=title)
    for col in columns:
        t.add_column(col, justify="left" if col in ("key", "metric") else "right")
    for key, metric, *figures in cells:
        t.add_row(escape(key), escape(metric), *figures)
    console.print(t)


def render_function_diff(
    rows: Sequence[FunctionDiffRow], unmatched: Unmatched, console: Console, total: int | None = None
) -> None:
    """The default ``memprofiler diff`` table: per function and metric, medians over matched calls."""
    if not rows:
        console.print("no differences")
    else:
        shown = f"{len(rows)} of {total}" if total is not None and total != len(rows) else f"{len(rows)}"
        t = Table(title=f"Differences per function, medians over the calls both runs hold ({shown} rows)")
        for col in ("function", "metric", "calls", "A", "B", "change", "%", "noise"):
            t.add_column(col, justify="left" if col in ("function", "metric") else "right")
        for r in rows:
            pct = r.percent
            sign = "+" if r.change > 0 else ""
            t.add_row(
                escape(r.group),
                escape(r.metric),
                f"{r.calls:,}",
                format_value(r.metric, r.a),
                format_value(r.metric, r.b),
                sign + format_value(r.metric, r.change),
                "-" if pct is None else f"{pct:+.1f}%",
                "-"
                if r.noise is None
                else format_value(r.metric, r.noise) + (" (within)" if r.within_noise else ""),
            )
        console.print(t)
        if any(r.noise is not None for r in rows):
            console.print(f"{NOISE_RULE}; a change marked (within) is no larger than it", markup=False)
    line = unmatched.line()
    if line:
        console.print(line, markup=False, highlight=False)
