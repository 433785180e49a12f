"""Terminal tables that stay quick however many rows a long run gives them."""

from __future__ import annotations

import io

from rich.console import Console

from memprofiler.analysis.diff import DiffRow
from memprofiler.reporters.terminal import RICH_TABLE_ROWS, render_diff


def _render(rows):
    out = io.StringIO()
    render_diff(rows, Console(file=out, width=200), total=len(rows) + 3)
    return out.getvalue()


def test_a_long_per_call_diff_is_printed_as_plain_aligned_columns():
    # GIVEN more rows than rich lays out quickly, one of them one-sided, one with markup-like text
    rows = [DiffRow(f"0.training_step.{c}.end", "rss_peak", 2**30, 2**30 + c * 2**20) for c in range(1, 601)]
    rows.append(DiffRow("0.training_step.601.end", "saved_tensors.by_module.[bold]x", 4096, None))
    # WHEN rendered
    lines = _render(rows).splitlines()
    # THEN a title, a header, a rule and one line per row, every figure right-aligned under its header
    assert (
        lines[0] == "Differences, largest absolute change first (601 of 604 rows)"
        and len(rows) > RICH_TABLE_ROWS
    )
    assert lines[1].split() == ["key", "metric", "A", "B", "change", "%"]
    assert len(lines) == 3 + len(rows)
    assert lines[3].split() == [
        "0.training_step.1.end",
        "rss_peak",
        "1.00",
        "GiB",
        "1.00",
        "GiB",
        "+1.00",
        "MiB",
        "+0.1%",
    ]
    assert lines[-1].split() == [
        "0.training_step.601.end",
        "saved_tensors.by_module.[bold]x",
        "4.00",
        "KiB",
        "(missing)",
        "-",
        "-",
    ]
    ends = {len(line) for line in lines[3:-1]}
    assert len(ends) == 1  # right-aligned: every full row ends in the same column


def test_a_short_diff_keeps_the_rich_table():
    text = _render([DiffRow("0.f.1.end", "rss", 1, 2)])
    assert "┃ key" in text and "0.f.1.end" in text
