"""The per-call figures are declared once (reporters/model/figures.py) and every part of the report follows."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from memprofiler.analysis.runs.artifacts import RunArtifacts
from memprofiler.reporters.html import HtmlReporter
from memprofiler.reporters.model.figures import CALL_FIGURES, STORED, Figure
from memprofiler.reporters.model.report import CallRow, ReportModel, call_rows
from memprofiler.reporters.terminal import TerminalReporter
from memprofiler.units import format_bytes

KIB = 1024


def _one_call_with_every_metric() -> tuple[ReportModel, dict[str, int]]:
    # Each stored figure gets its own value: 1 KiB, 2 KiB, ... in declaration order.
    want = {f.attr: (i + 1) * KIB for i, f in enumerate(STORED)}
    snaps: dict[str, dict[str, int]] = {"start": {}, "end": {}}
    for f in STORED:
        assert f.metric is not None
        snaps[f.phase][f.metric] = want[f.attr]
    stats = {0: {f"0.step.1.{phase}": m for phase, m in snaps.items()}}
    run = RunArtifacts(root=Path("/run"), stats=stats)
    return ReportModel(run=run, calls=call_rows(run)), want


def test_each_declared_figure_is_read_from_its_metric_and_phase():
    # GIVEN one call whose start and end snapshots hold every declared metric
    model, want = _one_call_with_every_metric()
    # WHEN read back as a row
    [row] = model.calls
    # THEN each stored figure is its metric's value, and each computed one the difference
    for f in CALL_FIGURES:
        if f.minus is None:
            assert row.value(f) == want[f.attr], f.name
        else:
            a, b = f.minus
            assert row.value(f) == want[a] - want[b], f.name


def test_each_declared_figure_is_a_column_of_both_call_tables():
    model, _ = _one_call_with_every_metric()
    [row] = model.calls
    # WHEN rendered in the terminal and as HTML
    console = Console(record=True, width=400, file=io.StringIO())
    TerminalReporter(model).render(console)
    text = console.export_text()
    html = HtmlReporter(model).render()
    # THEN the terminal's call table has every figure as a column, in declaration order, with
    # the row's value in it
    header = next(line for line in text.splitlines() if "rank" in line and "function" in line)
    cells = [c.strip() for c in re.split(r"[┃│]", header) if c.strip()]
    shown = [f for f in CALL_FIGURES if f.in_tables]
    assert cells == ["rank", "function", "call", *[f.name for f in shown]]
    line = next(line for line in text.splitlines() if "│ step" in line)
    values = [c.strip() for c in line.split("│") if c.strip()][3:]
    assert values == [format_bytes(row.value(f)) for f in shown]
    # AND the HTML call table has the same columns, and a chart per titled figure
    for f in shown:
        assert f">{f.name}<" in html
        if f.chart:
            assert f.chart in html


def test_a_row_takes_figures_by_name_and_refuses_unknown_ones():
    row = CallRow(0, "f", 3, rss_peak=7, rss_start=2)
    assert (row.rss_peak, row.rss_start, row.rss_peak_delta, row.saved_packed) == (7, 2, 5, None)
    with pytest.raises(TypeError, match="rss_pek"):
        CallRow(0, "f", 3, rss_pek=7)


def test_a_figure_is_read_or_computed_not_both():
    with pytest.raises(ValueError, match="exactly one of `metric` and `minus`"):
        Figure("x", "x", metric="rss", minus=("rss_peak", "rss_start"))
