"""Host RSS peaks that all look equal are one line, not bars; peaks that differ keep their chart."""

from __future__ import annotations

from pathlib import Path

from memprofiler.analysis.runs.artifacts import RunArtifacts
from memprofiler.reporters.html import HtmlReporter
from memprofiler.reporters.model.call_table import CallRow
from memprofiler.reporters.model.report import ReportModel

MIB = 1024**2


def _html(peaks: list[int]) -> str:
    calls = [CallRow(0, "training_step", k, rss_start=p - MIB, rss_peak=p) for k, p in enumerate(peaks)]
    return HtmlReporter(ReportModel(run=RunArtifacts(root=Path("/run")), calls=calls)).render()


def test_peaks_on_one_baseline_are_a_line_and_the_rise_is_charted():
    # GIVEN three calls peaking at 490, 495 and 500 MiB (a ~490 MiB process, 2% apart)
    html = _html([490 * MIB, 495 * MIB, 500 * MIB])
    # THEN no bar chart of the totals, one line with their range, and the rise's chart
    assert 'aria-label="host RSS peak"' not in html
    assert "host RSS peak: 490.00 MiB to 500.00 MiB in every call (within 2.0% of each other" in html
    assert 'aria-label="host RSS peak above call start"' in html


def test_peaks_that_differ_keep_their_bars():
    html = _html([100 * MIB, 500 * MIB])
    assert 'aria-label="host RSS peak"' in html and "in every call (within" not in html
