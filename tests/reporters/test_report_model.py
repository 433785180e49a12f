"""How a run is shaped for the reporters: merged call rows, summary rows, nested report tables."""

from __future__ import annotations

from pathlib import Path

from memprofiler.analysis.artifacts import RunArtifacts
from memprofiler.reporters.model import ReportModel, call_rows, nested_tables


def _model(stats=None, summary=None) -> ReportModel:
    run = RunArtifacts(root=Path("."), stats=stats or {}, summary=summary)
    return ReportModel(run=run, calls=call_rows(run))


def test_call_rows_merge_start_and_end():
    model = _model(
        stats={
            0: {
                "0.model.encode.2.start": {"rss": 100},
                "0.model.encode.2.end": {
                    "rss": 150,
                    "rss_peak": 400,
                    "allocated_bytes.all.peak": 7,
                    "saved_tensors.by_module": {"a": 5, "b": 9},
                    "fsdp.peak.activation": 3,
                },
            }
        }
    )
    [row] = model.calls
    assert (row.rank, row.fn, row.call) == (0, "model.encode", 2)  # dotted function names survive
    assert (row.rss_start, row.rss_end, row.rss_peak, row.rss_peak_delta) == (100, 150, 400, 300)
    assert row.cuda_allocated_peak == 7 and row.fsdp == {"activation": 3}
    assert model.top_saved_modules(1) == [("b", 9, "rank 0 model.encode #2")]


def test_summary_rows_read_the_written_layout_and_sort_by_imbalance():
    from memprofiler.core.summary import summarize

    per_rank = {
        0: {"0.training_step.2.end": {"rss_peak": 100}, "0.training_step.3.end": {"rss_peak": 200}},
        1: {"1.training_step.2.end": {"rss_peak": 300}, "1.training_step.3.end": {"rss_peak": 200}},
    }
    rows = _model(summary=summarize(per_rank)).summary_rows()
    assert [(k, m) for k, m, _ in rows] == [
        ("training_step.2.end", "rss_peak"),
        ("training_step.3.end", "rss_peak"),
    ]
    stats = rows[0][2]
    assert (stats["min"], stats["max"], stats["mean"], stats["argmax_rank"]) == (100, 300, 200, 1)
    assert stats["imbalance"] == 1.5


def test_nested_tables():
    data = {
        "peak": {"Parameter": 4, "Activation": 8},
        "modules": {"root": {"Parameter": 4, "Activation": 8}, "root.enc": {"Parameter": 1}},
    }
    assert nested_tables(data) == [
        ("peak", ["key", "value"], [["Parameter", 4], ["Activation", 8]]),
        ("modules", ["", "Parameter", "Activation"], [["root", 4, 8], ["root.enc", 1, None]]),
    ]
    assert nested_tables([{"a": 1}, {"b": 2}]) == [("", ["a", "b"], [[1, None], [None, 2]])]
