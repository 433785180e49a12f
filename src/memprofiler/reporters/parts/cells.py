"""Pieces every memprofiler HTML page shares: style, the filter script, the page shell, cells, tables."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from html import escape
from typing import Any

from memprofiler.analysis.runs.artifacts import is_number
from memprofiler.reporters.parts.assets import asset
from memprofiler.units import format_bytes, format_value

STYLE = asset("page.css")

# Adds a filter box above every table marked `filterable`; no other behaviour depends on JS.
SCRIPT = asset("page.js")


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
