"""One peak per page: "where memory goes" leads with the peak the device enforces and shows the
run's other figures as views of it, each with its difference."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

from memprofiler.analysis.runs.artifacts import RunArtifacts
from memprofiler.reporters.model.report import ReportModel, call_rows
from memprofiler.reporters.where import where_html

MIB = 2**20


def _model(end: dict) -> ReportModel:
    stats = {0: {"0.training_step.3.start": {"rss": 400 * MIB}, "0.training_step.3.end": end}}
    run = RunArtifacts(root=Path("."), stats=stats, summary=None)
    return ReportModel(run=run, calls=call_rows(run))


def _text(html: str) -> str:
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


def test_a_host_run_with_a_tracker_leads_with_its_rss_peak():
    # GIVEN a CPU call: RSS 400 MiB at its start, 418 MiB at its peak; the module tracker's peak
    # 13 MiB (8 MiB of activations, 5 MiB of parameters)
    model = _model(
        {
            "rss": 410 * MIB,
            "rss_peak": 418 * MIB,
            "module_mem.peak.activation": 8 * MIB,
            "module_mem.peak.parameter": 5 * MIB,
            "module_mem.peak.total": 13 * MIB,
        }
    )
    # WHEN the section is rendered
    html = where_html(model)
    lead, _, rest = html.partition("The same memory, other views.")
    # THEN it leads with the host RSS peak, split into the process before the call and the rise
    assert (
        "training_step #3 (rank 0) peaked highest: 418.00 MiB (host RSS peak): 400.00 MiB the process"
        in _text(lead)
    )
    assert "tracker peak" not in _text(lead)
    # AND the tracker's peak is a view of it, 405 MiB below, its bars folded
    views = _text(rest.split("</table>")[0])
    assert "host RSS peak (the headline peak) 418.00 MiB" in views
    assert "tracker peak 13.00 MiB -405.00 MiB (-97%) tensors the module tracker saw" in views
    assert "<details class='mp-view'><summary>tracker peak: its bars</summary>" in rest


def test_a_run_with_one_figure_has_no_views_table():
    html = where_html(_model({"rss": 410 * MIB, "rss_peak": 418 * MIB}))
    assert (
        "(host RSS peak)" in _text(html)
        and "other views" not in html
        and "<details class='mp-view'>" not in html
    )
