"""Pieces every memprofiler HTML page shares: style, the filter script, the page shell, cells, tables."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from html import escape
from typing import Any

from memprofiler.analysis.runs.artifacts import is_number
from memprofiler.units import format_bytes, format_value

STYLE = """
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
.scroll{max-height:420px;overflow:auto;display:inline-block}.scroll thead th{position:sticky;top:0}
"""

# Adds a filter box above every table marked `filterable`; no other behaviour depends on JS.
SCRIPT = """
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


def page(title: str, body: str, style: str = "", script: str = SCRIPT) -> str:
    """A whole page: inline style and script, and a policy that forbids every request.

    Args:
        title: the page title (escaped here).
        body: the body's HTML.
        style: CSS of this page, after the shared :data:`STYLE`.
        script: the page's script; by default the table filter.
    """
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        # No external request of any kind may leave this page.
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">"
        f"<title>{escape(title)}</title><style>{STYLE}{style}</style></head><body>\n"
        f"{body}\n<script>{script}</script></body></html>"
    )


def json_script(obj: Any) -> str:
    """``obj`` as compact JSON that cannot close the ``<script>`` element holding it."""
    return json.dumps(obj, separators=(",", ":")).replace("</", "<\\/")


def plural(n: int, word: str) -> str:
    """``1 file``, ``3 files``."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


class Cell:
    """Pre-escaped HTML for a table cell, with a CSS class."""

    def __init__(self, html: str, cls: str = "") -> None:
        self.html = html
        self.cls = cls


def b(n: int | float | None) -> str:
    """Human bytes with the exact count as a tooltip; NaN/inf (an edited file) as written."""
    if n is None:
        return "-"
    if not math.isfinite(n):
        return escape(str(n))
    return f"<span title='{int(n):,} bytes'>{escape(format_bytes(n))}</span>"


def bytes_cell(n: int | float | None) -> Cell:
    return Cell(b(n), "n")


def value_cell(metric: str, v: Any) -> Cell:
    if is_number(v):
        return Cell(escape(format_value(metric, v)), "n")
    return Cell(escape("-" if v is None else str(v)))


def auto_cell(col: str, v: Any) -> Any:
    if is_number(v):
        return Cell(escape(format_value(col, v) if col else str(v)), "n")
    return v


def table(
    cols: Sequence[str], rows: Sequence[Sequence[Any]], filterable: bool = False, stack_col: int = -1
) -> str:
    head = "".join(f"<th>{escape(str(c))}</th>" for c in cols)
    body = []
    for r in rows:
        cells = []
        for j, v in enumerate(r):
            if isinstance(v, Cell):
                cls = f" class='{v.cls}'" if v.cls else ""
                cells.append(f"<td{cls}>{v.html}</td>")
            else:
                cls = " class='stack'" if j == stack_col else ""
                cells.append(f"<td{cls}>{escape('' if v is None else str(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    klass = " class='filterable'" if filterable else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
