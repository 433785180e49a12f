"""The HTML page of a run (``memprofiler report``): one self-contained file, no network request.

Every style, script, chart and datum is inline. Charts are inline SVG drawn here in Python;
the only script is a few lines that filter tables. The file opens the same on an air-gapped
machine as anywhere else. Up to :data:`~memprofiler.reporters.model.report.PER_CALL_LIMIT` calls
each get a bar and a table row; longer runs are shown per function (min / median / max
bands over the calls) with the top calls, so the page stays small and its charts readable.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from memprofiler.analysis.runs.artifacts import is_number
from memprofiler.analysis.traces.memory_categories import CategoryTimeline
from memprofiler.reporters.explorer.oom import when_text
from memprofiler.reporters.explorer.page import explorer_relpath
from memprofiler.reporters.make_it_fit import advice_html
from memprofiler.reporters.model.figures import BANDED, CALL_FIGURES, table_figures
from memprofiler.reporters.model.memory_split import top_with_other
from memprofiler.reporters.model.report import (
    TRACKERS,
    CallRow,
    ReportModel,
    ReportTable,
    binned,
    breakdown_rank,
    report_tables,
    tracker_title,
)
from memprofiler.reporters.model.yaml_tables import module_deltas
from memprofiler.reporters.parts import svg
from memprofiler.reporters.parts.cells import (
    auto_cell,
    b,
    bytes_cell,
    page,
    plural,
    table,
    value_cell,
)
from memprofiler.reporters.parts.snapshot import snapshot_html
from memprofiler.reporters.where import CSS as WHERE_CSS
from memprofiler.reporters.where import where_html
from memprofiler.units import format_bytes

#: The per-call charts: title, and the figure each shows (see ``figures.CALL_FIGURES``).
_CALL_CHARTS = [(f.chart, f) for f in CALL_FIGURES if f.chart]
_SAVED_NOTE = (
    "Bytes per module are each module's own share: every saved tensor is counted once, under "
    "the innermost module running when autograd saved it, so a parent's figure leaves out its "
    "children's and the figures add up to the call's unique saved bytes."
)


#: Totals that sit on a large baseline (the process's RSS): drawn only where they differ.
_BASELINE_FIGURES = frozenset({"rss peak"})
#: Bars closer than this share of the largest look the same; their chart would say nothing.
_FLAT_SHARE = 0.1


def _flat(values: Sequence[float]) -> bool:
    """Whether bars of these values would all look equal (each within 10% of the largest)."""
    top = max(values)
    return len(values) > 1 and top > 0 and (top - min(values)) < _FLAT_SHARE * top


def _flat_note(title: str, values: Sequence[float], over: str = "in every call") -> str:
    # The host RSS peak of every call is mostly the process's baseline (the interpreter, torch,
    # the model and data): bars of ~equal length hide what each call adds, so the chart of the
    # rise above each call's start (drawn next) carries the comparison, and the totals are one line.
    lo, hi = min(values), max(values)
    span = (
        format_bytes(hi)
        if format_bytes(lo) == format_bytes(hi)
        else f"{format_bytes(lo)} to {format_bytes(hi)}"
    )
    return (
        f"<p class='muted'>{escape(title)}: {span} {over} "
        f"(within {(hi - lo) / hi:.1%} of each other, mostly the process's baseline); the rise above "
        "each call's start is charted below and the totals are in the table.</p>"
    )


def _bars(
    rows: Sequence[tuple[str, float, int]], title: str, figure: str, over: str = "in every call"
) -> str:
    """The bars of one figure, or one line of its totals where they sit on a shared baseline and
    would all look equal."""
    values = [v for _, v, _ in rows]
    if figure in _BASELINE_FIGURES and _flat(values):
        return _flat_note(title, values, over)
    return svg.hbar_chart(rows, format_bytes, title)


class HtmlReporter:
    """Renders a :class:`ReportModel` to one HTML page.

    Example:
        >>> Path("report.html").write_text(HtmlReporter(model).render())  # doctest: +SKIP
    """

    def __init__(
        self,
        model: ReportModel,
        top: int = 10,
        extra: str = "",
        categories: Sequence[tuple[str, CategoryTimeline]] = (),
        allocator: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.model = model
        self.top = top
        self.extra = extra
        """More sections (HTML), after the run's: the profiler views."""
        self.categories = categories
        """``(label, timeline)`` of the profiler's memory-categories timelines: a bar each in
        "where memory goes"."""
        self.allocator = allocator
        """``(label, peak bytes)`` of each profiler trace's allocator curve: a view of the peak."""

    def render(self) -> str:
        run = self.model.run
        sections = [
            self._header(),
            where_html(self.model, self.categories, self.allocator),
            advice_html(self.model, self.top),
            self._calls_section(),
            self._across_calls_section(),
            self._saved_section(),
            self._summary_section(),
            self._reports_section(),
            self._snapshots_section(),
            self._oom_section(),
            self.extra,
        ]
        return page(f"memprofiler report: {run.root}", "\n".join(s for s in sections if s), style=WHERE_CSS)

    # ----------------------------------------------------------------- sections
    def _header(self) -> str:
        run = self.model.run
        bits = [escape(str(run.root)), f"ranks: {escape(', '.join(map(str, run.ranks)) or '-')}"]
        bits.append(plural(len(run.files), "file"))
        manifest = run.manifest or {}
        if manifest.get("run_id") is not None:
            bits.append(f"run {escape(str(manifest['run_id']))}")
        if manifest.get("status") is not None:
            bits.append(f"status {escape(str(manifest['status']))}")
        out = [f"<h1>memprofiler report</h1><p class='muted'>{' &middot; '.join(bits)}</p>"]
        out += [f"<p class='oom'>warning: {escape(w)}</p>" for w in run.warnings]
        out += self._oom_lines()
        out += [f"<p class='oom'>note: {escape(n)}</p>" for n in run.notes]
        out += [f"<p class='oom'>warning: {escape(c.line())}</p>" for c in run.cuts]
        return "\n".join(out)

    def _calls_section(self) -> str:
        calls = self.model.calls
        head = "<h2 id='calls'>Per-call memory by rank</h2>"
        if not calls:
            line = self.model.run.nothing_collected(notes_shown=True)
            return head + f"<p>{escape(line[:1].upper() + line[1:])}.</p>"
        out = [head]
        if not self.model.aggregated:
            for title, figure in _CALL_CHARTS:
                rows = [
                    (f"{c.label} · rank {c.rank}", float(v), c.rank)
                    for c in calls
                    if (v := c.value(figure)) is not None
                ]
                if rows:
                    out.append(_bars(rows, title, figure.name))
            out.append(_calls_table(calls))
            return "\n".join(out)
        funcs = self.model.functions()
        out.append(
            f"<p>{len(calls):,} collected calls: shown per function (median, and min to max over its calls), "
            f"then the {min(self.top_calls, len(calls))} calls with the highest RSS peak.</p>"
        )
        for title, figure in _CALL_CHARTS:
            rows = [
                (f"{f.fn} · rank {f.rank} ({f.calls:,} calls)", f.bands[figure.name].mid, f.rank)
                for f in funcs
                if figure.name in f.bands
            ]
            if rows:
                out.append(_bars(rows, f"{title}, median per function", figure.name, "in every function"))
        figs = [g.name for g in BANDED if any(g.name in f.bands for f in funcs)]
        cols = ["rank", "function", "calls"] + [
            f"{fig} {s}" for fig in figs for s in ("min", "median", "max")
        ]
        body: list[list[Any]] = []
        for f in funcs:
            row: list[Any] = [str(f.rank), f.fn, f"{f.calls:,}"]
            for fig in figs:
                band = f.bands.get(fig)
                row += (
                    [bytes_cell(band.lo), bytes_cell(band.mid), bytes_cell(band.hi)] if band else ["", "", ""]
                )
            body.append(row)
        out.append(table(cols, body, filterable=True))
        out.append(f"<h3>Top {min(self.top_calls, len(calls))} calls by host RSS peak</h3>")
        out.append(_calls_table(self.model.top_calls(self.top_calls)))
        return "\n".join(out)

    @property
    def top_calls(self) -> int:
        return max(self.top, 20)

    def _across_calls_section(self) -> str:
        present = [
            (title, fig)
            for title, fig in ((f.across, f.name) for f in CALL_FIGURES if f.across)
            if self.model.calls.has(fig)
        ]
        if not present:
            return ""
        host = any(fig == "rss peak" for _, fig in present)
        cuda = any(fig.startswith("cuda") for _, fig in present)
        what = "Host and CUDA figures" if host and cuda else "CUDA figures" if cuda else "Host figures"
        out = [
            f"<h2 id='across'>{what} across calls</h2>",
            "<p class='muted'>One line per function, by its call number"
            + (
                "; where calls are binned, the line is each bin's median and the shading its min to max"
                if self.model.aggregated
                else ""
            )
            + ". RSS at a call's end is in the table; it never exceeds the call's peak.</p>",
        ]
        groups = self.model.calls.groups()
        for rank in self.model.ranks:
            for title, fig in present:
                lines = [(fn, self.model.calls.points(fig, rows)) for r, fn, rows in groups if r == rank]
                # A device's memory from zero: the height above zero is what has to fit.
                chart = _function_lines(lines, f"rank {rank}: {title}", from_zero=fig.startswith("cuda"))
                if chart:
                    out.append(chart)
        return "\n".join(out)

    def _saved_section(self) -> str:
        out = ["<h2 id='saved'>Saved tensors by module</h2>", f"<p class='muted'>{_SAVED_NOTE}</p>"]
        table_ = self.model.calls
        for rank in self.model.ranks:
            calls = [table_[i] for i in sorted(table_.by_module) if table_.rank[i] == rank]
            if not calls:
                continue
            worst = max(calls, key=breakdown_rank)
            mods = top_with_other(worst.by_module, 15)  # the rest in one row: the bars add up
            out.append(
                svg.hbar_chart(
                    [(m, float(b), rank) for m, b in mods],
                    format_bytes,
                    f"rank {rank}, {worst.label}: {format_bytes(worst.saved_unique)} saved for backward",
                )
            )
        top = self.model.top_saved_modules(self.top)
        if top:
            out.append(
                table(
                    ["module", "saved bytes", "largest in"],
                    [[m, bytes_cell(b), w] for m, b, w in top],
                )
            )
            every = len(self.model.top_saved_modules(None))
            if every > len(top):
                # Each row is a module's largest figure over the calls: these do not add up, so
                # the rest is counted, not summed into an "other" row.
                out.append(
                    f"<p class='muted'>The {len(top)} modules that saved the most in some call, of "
                    f"{every:,}; each at its largest over the calls (figures from different calls "
                    "do not add up).</p>"
                )
        return "\n".join(out) if len(out) > 2 else ""

    def _summary_section(self) -> str:
        rows = self.model.summary_rows()
        if not rows:
            return ""
        body = []
        for key, metric, s in rows:
            imb = s.get("imbalance")
            body.append(
                [
                    key,
                    metric,
                    value_cell(metric, s.get("min")),
                    value_cell(metric, s.get("mean")),
                    value_cell(metric, s.get("max")),
                    str(s.get("argmax_rank", "-")),
                    f"{imb:.3f}" if isinstance(imb, (int, float)) else "-",
                ]
            )
        return "<h2 id='summary'>Across ranks</h2>" + table(
            ["key", "metric", "min", "mean", "max", "max on rank", "max / mean"], body, filterable=True
        )

    def _reports_section(self) -> str:
        reps = self.model.run.reports
        cats, fsdp = self.model.tracker_rows()
        if not reps and not fsdp:
            return ""
        out = ["<h2 id='modules'>FSDP and module-wise memory</h2>"]
        if fsdp:
            out.append(f"<h3>{escape(tracker_title(reps))}</h3>")
            out.append(
                table(
                    ["rank", "function", "call", *cats],
                    [
                        [str(c.rank), c.fn, str(c.call), *[bytes_cell(p.get(k)) for k in cats]]
                        for c, p in fsdp
                    ],
                )
            )
        if reps:
            out.append(
                "<p class='muted'>Each report: what each module added (the tracker's snapshots at the "
                "module's boundaries, later minus earlier, children included), then the snapshots "
                "themselves, folded: those are the whole device's memory at each boundary, the same "
                "totals on every module's rows, not per-module figures.</p>"
            )
        for rep in reps:
            body = []
            if rep.data is not None:
                deltas = module_deltas(rep.data)
                if deltas is not None:
                    body.append(_report_table(deltas))
                raw = "".join(
                    (f"<p class='muted'>{escape(t.title)}</p>" if t.title else "") + _report_table(t)
                    for t in report_tables(rep.data)
                )
                body.append(
                    f"<details><summary>the tracker's snapshots (whole-device totals)</summary>{raw}</details>"
                )
            if rep.log_path is not None:
                try:
                    text = rep.log_path.read_text(errors="replace")
                except OSError:
                    text = "(unreadable)"
                body.append(
                    f"<details><summary>{escape(rep.log_path.name)}</summary><pre>{escape(text)}</pre></details>"
                )
            title = (
                f"{escape(TRACKERS.get(rep.kind, rep.kind))} · rank {rep.rank} · {escape(rep.fn)} #{rep.call}"
            )
            out.append(f"<details class='mp-report'><summary>{title}</summary>{''.join(body)}</details>")
        return "\n".join(out)

    def _snapshots_section(self) -> str:
        if not self.model.snapshots:
            return ""
        out = ["<h2 id='snapshots'>Allocator history</h2>"]
        for k, entry in enumerate(self.model.snapshots):
            href = escape(explorer_relpath(k, entry.path), quote=True)
            out.append(snapshot_html(entry, self.top))
            out.append(f"<p><a class='explorer' href='{href}'>Open in the allocation explorer</a></p>")
        return "\n".join(out)

    def _oom_lines(self) -> list[str]:
        """One line per OOM record at the top of the page, linking its explorer (which opens on
        the failure): the failed size, free and total memory and the step, from its YAML."""
        pages = {entry.path: explorer_relpath(k, entry.path) for k, entry in enumerate(self.model.snapshots)}
        out = []
        for o in self.model.run.ooms:
            info = o.info or {}
            asked = info.get("requested_bytes") or info.get("failed_alloc_bytes")
            bits = [f"{b(asked)} requested" if is_number(asked) else "size not recorded"]
            free, total = info.get("device_free_bytes"), info.get("device_total_bytes")
            if is_number(free):
                bits.append(f"{b(free)} free" + (f" of {b(total)} total" if is_number(total) else ""))
            calls = info.get("calls")
            calls = {str(k): v for k, v in calls.items() if type(v) is int} if isinstance(calls, dict) else {}
            step = info.get("step")
            if calls or type(step) is int:
                bits.append(escape(when_text(step if type(step) is int else None, calls), quote=False))
            href = pages.get(str(o.pickle_path)) if o.pickle_path else None
            link = (
                f" <a class='oom-explorer' href='{escape(href, quote=True)}'>Open it in the allocation explorer</a>"
                if href
                else ""
            )
            why = escape(str(info.get("reason", "OOM")))
            out.append(
                f"<p class='oom mp-oom-line'>Out of memory (rank {o.rank}, record {o.n}, {why}): "
                f"{', '.join(bits)}.{link}</p>"
            )
        return out

    def _oom_section(self) -> str:
        ooms = [o for o in self.model.run.ooms if o.info]
        if not ooms:
            return ""
        out = ["<h2 id='oom'>OOM dumps</h2>"]
        for o in ooms:
            flat = [
                [str(k), auto_cell(str(k), v)]
                for k, v in (o.info or {}).items()
                if not isinstance(v, (dict, list))
            ]
            out.append(f"<h3 class='oom'>rank {o.rank} OOM #{o.n}</h3>" + table(["field", "value"], flat))
        return "\n".join(out)


def _report_table(t: ReportTable) -> str:
    """A report's table: only the tracker categories (Parameter, Activation, ...) and the
    module deltas are bytes; rank, call and module_depth are shown as written."""
    rows = [
        [bytes_cell(v) if j in t.byte_columns and is_number(v) else v for j, v in enumerate(r)]
        for r in t.rows
    ]
    return table(t.columns, rows, filterable=True)


def _function_lines(
    lines: Sequence[tuple[str, tuple[Sequence[int], Sequence[int]]]], title: str, from_zero: bool = False
) -> str:
    """One line per function through its call numbers and values (binned into bands when long)."""
    lines = [(fn, (xs, ys)) for fn, (xs, ys) in lines if xs]
    if lines and all(len(xs) < svg.MIN_POINTS for _, (xs, _) in lines):
        # A line through one or two points shows less than the numbers do (and its axis
        # has nothing to tick): the same figures as a table.
        rows = [
            [escape(fn), f"{int(x):,}", bytes_cell(int(y))]
            for fn, (xs, ys) in lines
            for x, y in zip(xs, ys, strict=True)
        ]
        return f"<p><b>{escape(title)}</b></p>" + table(["function", "call", "bytes"], rows)
    series, bands = [], []
    for fn, (xs, ys) in lines:
        bins = binned(xs, ys)
        series.append((fn, [(x, band.mid) for x, band in bins]))
        bands.append([(x, band.lo, band.hi) for x, band in bins])
    if not series:
        return ""
    return svg.line_chart(series, format_bytes, title, bands=bands, integer_x=True, from_zero=from_zero)


def _calls_table(calls: Sequence[CallRow]) -> str:
    figs = table_figures(calls)
    cols = ["rank", "function", "call", *[fig.name for fig in figs]]
    rows = []
    for c in calls:
        row: list[Any] = [str(c.rank), c.fn, str(c.call), *[bytes_cell(c.value(fig)) for fig in figs]]
        rows.append(row)
    return table(cols, rows, filterable=True)
