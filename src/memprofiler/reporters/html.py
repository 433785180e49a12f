"""One self-contained HTML file: every style, script, chart and datum inline, no network request.

Charts are inline SVG drawn here in Python; the only script is a few lines that filter
tables. The file opens the same on an air-gapped machine as anywhere else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

from memprofiler.analysis.snapshot import SnapshotAnalysis
from memprofiler.reporters import svg
from memprofiler.reporters.model import CallRow, ReportModel, SnapshotEntry, report_tables
from memprofiler.units import format_bytes, format_value

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}th,td{border:1px solid #ddd;padding:3px 8px}
th{background:#f4f4f4;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
td.stack{font-family:ui-monospace,Menlo,monospace;font-size:12px;white-space:pre}
.plot{display:block;margin:8px 0;background:#fff}.plot .ttl{font-weight:600;font-size:13px}
.plot .lbl,.plot .val,.plot .tick{font-size:11px;fill:#333}.plot .frame{fill:none;stroke:#999}
.plot .grid{stroke:#eee}.plot .peak{fill:#D55E00}.plot .peaklbl{font-size:11px;fill:#D55E00;font-weight:600}
.muted{color:#666}.oom{color:#b00;font-weight:600}input.filter{margin:4px 0;padding:3px 6px;width:260px}
pre{background:#f8f8f8;padding:8px;overflow:auto;font-size:12px}
"""

# Adds a filter box above every table marked `filterable`; no other behaviour depends on JS.
_SCRIPT = """
document.querySelectorAll("table.filterable").forEach(function (table) {
  var box = document.createElement("input");
  box.className = "filter";
  box.placeholder = "filter rows";
  box.addEventListener("input", function () {
    var q = box.value.toLowerCase();
    table.querySelectorAll("tbody tr").forEach(function (tr) {
      tr.style.display = tr.textContent.toLowerCase().indexOf(q) >= 0 ? "" : "none";
    });
  });
  table.parentNode.insertBefore(box, table);
});
"""


class HtmlReporter:
    """Renders a :class:`ReportModel` to one HTML page.

    Example:
        >>> Path("report.html").write_text(HtmlReporter(model).render())  # doctest: +SKIP
    """

    def __init__(self, model: ReportModel, top: int = 10) -> None:
        self.model = model
        self.top = top

    def render(self) -> str:
        run = self.model.run
        parts = [
            "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
            # No external request of any kind may leave this page.
            "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">",
            f"<title>memprofiler report: {escape(str(run.root))}</title><style>{_STYLE}</style></head><body>",
            f"<h1>memprofiler report</h1><p class='muted'>{escape(str(run.root))} &middot; "
            f"ranks: {escape(', '.join(map(str, run.ranks)) or '-')} &middot; {len(run.files)} files</p>",
            self._calls_section(),
            self._across_calls_section(),
            self._saved_section(),
            self._summary_section(),
            self._reports_section(),
            self._snapshots_section(),
            self._oom_section(),
            f"<script>{_SCRIPT}</script></body></html>",
        ]
        return "\n".join(p for p in parts if p)

    # ----------------------------------------------------------------- sections
    def _calls_section(self) -> str:
        calls = self.model.calls
        if not calls:
            return (
                "<h2 id='calls'>Per-call memory by rank</h2><p>No collected calls in the per-rank stats.</p>"
            )
        out = ["<h2 id='calls'>Per-call memory by rank</h2>"]
        metrics: list[tuple[str, Any]] = [
            ("host RSS peak", lambda c: c.rss_peak),
            ("host RSS peak above call start", lambda c: c.rss_peak_delta),
            ("CUDA allocated peak", lambda c: c.cuda_allocated_peak),
            ("CUDA reserved peak", lambda c: c.cuda_reserved_peak),
            ("saved-tensor bytes (unique)", lambda c: c.saved_unique),
        ]
        for title, get in metrics:
            rows = [
                (f"{c.label} · rank {c.rank}", float(get(c)), c.rank) for c in calls if get(c) is not None
            ]
            if rows:
                out.append(svg.hbar_chart(rows, format_bytes, title))
        out.append(_calls_table(calls))
        return "\n".join(out)

    def _across_calls_section(self) -> str:
        out = ["<h2 id='across'>Host and CUDA figures across calls</h2>"]
        for rank in self.model.ranks:
            calls = [c for c in self.model.calls if c.rank == rank]
            series = []
            for name, get in (
                ("rss start", lambda c: c.rss_start),
                ("rss end", lambda c: c.rss_end),
                ("rss peak", lambda c: c.rss_peak),
                ("cuda alloc peak", lambda c: c.cuda_allocated_peak),
                ("cuda reserved peak", lambda c: c.cuda_reserved_peak),
            ):
                pts = [(float(i), float(get(c))) for i, c in enumerate(calls) if get(c) is not None]
                if pts:
                    series.append((name, pts))
            if series:
                out.append(
                    svg.line_chart(series, format_bytes, f"rank {rank}", x_labels=[c.label for c in calls])
                )
        return "\n".join(out) if len(out) > 1 else ""

    def _saved_section(self) -> str:
        out = ["<h2 id='saved'>Saved tensors by module</h2>"]
        for rank in self.model.ranks:
            calls = [c for c in self.model.calls if c.rank == rank and c.by_module]
            if not calls:
                continue
            worst = max(calls, key=lambda c: (c.saved_unique or 0, -c.call))
            mods = sorted(worst.by_module.items(), key=lambda kv: (-kv[1], kv[0]))[:15]
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
                _table(
                    ["module", "saved bytes", "largest in"],
                    [[m, _bytes_cell(b), w] for m, b, w in top],
                )
            )
        return "\n".join(out) if len(out) > 1 else ""

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
                    _value_cell(metric, s.get("min")),
                    _value_cell(metric, s.get("mean")),
                    _value_cell(metric, s.get("max")),
                    str(s.get("argmax_rank", "-")),
                    f"{imb:.3f}" if isinstance(imb, (int, float)) else "-",
                ]
            )
        return "<h2 id='summary'>Across ranks</h2>" + _table(
            ["key", "metric", "min", "mean", "max", "max on rank", "max / mean"], body, filterable=True
        )

    def _reports_section(self) -> str:
        reps = self.model.run.reports
        cats, fsdp = self.model.fsdp_rows()
        if not reps and not fsdp:
            return ""
        out = ["<h2 id='modules'>FSDP and module-wise memory</h2>"]
        if fsdp:
            out.append("<h3>FSDP peaks per category</h3>")
            out.append(
                _table(
                    ["rank", "function", "call", *cats],
                    [
                        [str(c.rank), c.fn, str(c.call), *[_bytes_cell(p.get(k)) for k in cats]]
                        for c, p in fsdp
                    ],
                )
            )
        for rep in reps:
            out.append(f"<h3>{escape(rep.kind)} · rank {rep.rank} · {escape(rep.fn)} #{rep.call}</h3>")
            if rep.data is not None:
                for table in report_tables(rep.data):
                    if table.title:
                        out.append(f"<p class='muted'>{escape(table.title)}</p>")
                    # Only the tracker categories (Parameter, Activation, ...) are bytes; rank,
                    # call and module_depth are shown as written.
                    out.append(
                        _table(
                            table.columns,
                            [
                                [
                                    _bytes_cell(v) if j in table.byte_columns and _is_num(v) else v
                                    for j, v in enumerate(r)
                                ]
                                for r in table.rows
                            ],
                            filterable=True,
                        )
                    )
            if rep.log_path is not None:
                try:
                    text = rep.log_path.read_text(errors="replace")
                except OSError:
                    text = "(unreadable)"
                out.append(
                    f"<details><summary>{escape(rep.log_path.name)}</summary><pre>{escape(text)}</pre></details>"
                )
        return "\n".join(out)

    def _snapshots_section(self) -> str:
        if not self.model.snapshots:
            return ""
        out = ["<h2 id='snapshots'>Allocator history</h2>"]
        for entry in self.model.snapshots:
            out.append(snapshot_html(entry, self.top))
        return "\n".join(out)

    def _oom_section(self) -> str:
        ooms = [o for o in self.model.run.ooms if o.info]
        if not ooms:
            return ""
        out = ["<h2 id='oom'>OOM dumps</h2>"]
        for o in ooms:
            flat = [
                [str(k), _auto_cell(str(k), v)]
                for k, v in (o.info or {}).items()
                if not isinstance(v, (dict, list))
            ]
            out.append(f"<h3 class='oom'>rank {o.rank} OOM #{o.n}</h3>" + _table(["field", "value"], flat))
        return "\n".join(out)


def snapshot_html(entry: SnapshotEntry, top: int = 10) -> str:
    """One allocator snapshot: peaks, the active-memory timeline and the stacks live at the peak."""
    a: SnapshotAnalysis = entry.analysis
    out = [
        f"<h3>{escape(entry.title)}</h3><p class='muted'>{escape(entry.path)}</p>",
        f"<p>now: {len(a.segments)} segments, reserved {_b(a.total_reserved)}, allocated "
        f"{_b(a.total_allocated)} in rounded blocks, {_b(a.total_requested)} requested</p>",
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
            f"<b>Peak active {_b(d.peak_allocated)} requested</b> {when}; "
            f"<b>peak reserved {_b(d.peak_reserved)}</b> {rwhen}. "
            f"Active before the trace: {_b(d.baseline_allocated)}; at the end: {_b(d.end_allocated)}. "
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
                )
            )
        if d.top_stacks:
            out.append(
                f"<p>Live at the peak: {d.live_blocks_at_peak:,} blocks, by allocating stack (top {len(d.top_stacks)}):</p>"
            )
            rows = [[_bytes_cell(g.bytes), f"{g.count:,}", "\n".join(g.frames)] for g in d.top_stacks[:top]]
            out.append(_table(["requested bytes", "blocks", "stack (innermost first)"], rows, stack_col=2))
        for o in d.ooms:
            free = _b(o.device_free) if o.device_free is not None else "?"
            out.append(
                f"<p class='oom'>OOM at entry {o.index:,}: {_b(o.size)} requested, {free} free on the device; "
                f"at {escape(o.frames[0] if o.frames else 'no stack')}</p>"
            )
    if a.segments:
        worst = sorted(a.segments, key=lambda s: (-s.free, s.address))[:top]
        rows = [
            [
                str(s.device),
                hex(s.address),
                _bytes_cell(s.total_size),
                _bytes_cell(s.allocated),
                _bytes_cell(s.free),
                _bytes_cell(s.largest_free),
                f"{s.fragmentation:.1%}",
            ]
            for s in worst
        ]
        out.append(f"<p>Segments with the most free bytes ({len(worst)} of {len(a.segments)}):</p>")
        out.append(
            _table(["device", "address", "size", "allocated", "free", "largest free", "fragmentation"], rows)
        )
    return "\n".join(out)


def render_snapshot_page(entry: SnapshotEntry, top: int = 10) -> str:
    """A standalone page for ``memprofiler snapshot --html``."""
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
        f"<title>allocator snapshot: {escape(entry.path)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>Allocator snapshot</h1>{snapshot_html(entry, top)}<script>{_SCRIPT}</script></body></html>"
    )


# --------------------------------------------------------------------- cells and tables
class _Cell:
    """Pre-escaped HTML for a table cell, with a CSS class."""

    def __init__(self, html: str, cls: str = "") -> None:
        self.html = html
        self.cls = cls


def _b(n: int | float | None) -> str:
    """Human bytes with the exact count as a tooltip; NaN/inf (an edited file) as written."""
    if n is None:
        return "-"
    if not math.isfinite(n):
        return escape(str(n))
    return f"<span title='{int(n):,} bytes'>{escape(format_bytes(n))}</span>"


def _bytes_cell(n: int | float | None) -> _Cell:
    return _Cell(_b(n), "n")


def _value_cell(metric: str, v: Any) -> _Cell:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return _Cell(escape(format_value(metric, v)), "n")
    return _Cell(escape("-" if v is None else str(v)))


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _auto_cell(col: str, v: Any) -> Any:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return _Cell(escape(format_value(col, v) if col else str(v)), "n")
    return v


def _calls_table(calls: Sequence[CallRow]) -> str:
    has_cuda = any(c.cuda_allocated_peak is not None for c in calls)
    cols = ["rank", "function", "call", "rss start", "rss end", "rss peak", "peak - start"]
    if has_cuda:
        cols += ["cuda alloc peak", "cuda reserved peak"]
    cols += ["saved unique", "saved packed"]
    rows = []
    for c in calls:
        row: list[Any] = [
            str(c.rank),
            c.fn,
            str(c.call),
            _bytes_cell(c.rss_start),
            _bytes_cell(c.rss_end),
            _bytes_cell(c.rss_peak),
            _bytes_cell(c.rss_peak_delta),
        ]
        if has_cuda:
            row += [_bytes_cell(c.cuda_allocated_peak), _bytes_cell(c.cuda_reserved_peak)]
        row += [_bytes_cell(c.saved_unique), _bytes_cell(c.saved_packed)]
        rows.append(row)
    return _table(cols, rows, filterable=True)


def _table(
    cols: Sequence[str], rows: Sequence[Sequence[Any]], filterable: bool = False, stack_col: int = -1
) -> str:
    head = "".join(f"<th>{escape(str(c))}</th>" for c in cols)
    body = []
    for r in rows:
        cells = []
        for j, v in enumerate(r):
            if isinstance(v, _Cell):
                cls = f" class='{v.cls}'" if v.cls else ""
                cells.append(f"<td{cls}>{v.html}</td>")
            else:
                cls = " class='stack'" if j == stack_col else ""
                cells.append(f"<td{cls}>{escape('' if v is None else str(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    klass = " class='filterable'" if filterable else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
