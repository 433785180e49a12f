"""How a run is shaped for the reporters: merged call rows, summary rows, nested report tables."""

from __future__ import annotations

from pathlib import Path

from memprofiler.analysis.runs.artifacts import RunArtifacts
from memprofiler.reporters.model.report import ReportModel, call_rows, nested_tables


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
    assert row.cuda_allocated_peak == 7 and row.tracker_peaks == {"activation": 3}
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


def test_long_runs_keep_one_breakdown_per_rank_and_every_module_peak():
    # GIVEN 2 ranks x 400 calls with per-module bytes drawn from a small range (many ties),
    # listed out of call order, as a multi-rank file or a hand-edited one may be
    import random

    from memprofiler.reporters.model.report import PER_CALL_LIMIT, build_model

    rng = random.Random(7)
    stats: dict[int, dict] = {}
    for rank in (0, 1):
        calls = list(range(1, 401))
        rng.shuffle(calls)
        snaps = {}
        for call in calls:
            by_module = {m: rng.randrange(1, 6) * 1024 for m in ("enc", "dec", "head")}
            snaps[f"{rank}.training_step.{call}.end"] = {
                "saved_tensors.unique_bytes": rng.randrange(1, 4) * 4096,
                "saved_tensors.by_module": by_module,
            }
        stats[rank] = snaps
    run = RunArtifacts(root=Path("."), stats=stats)
    # WHEN shaped for the report
    model = build_model(run)
    # THEN every module's peak and where it was first reached, as over every call in order ...
    assert len(model.calls) == 800 > PER_CALL_LIMIT
    full = ReportModel(run=run, calls=call_rows(run))  # every row keeps its breakdown
    assert sum(bool(c.by_module) for c in full.calls) == 800
    assert model.top_saved_modules(10) == full.top_saved_modules(10)
    naive: dict[str, tuple[int, str]] = {}
    for c in full.calls:  # rank, then call order
        for m, b in c.by_module.items():
            if m not in naive or b > naive[m][0]:
                naive[m] = (b, f"rank {c.rank} {c.label}")
    assert sorted((m, b, w) for m, (b, w) in naive.items()) == sorted(model.top_saved_modules(10))
    # ... and one breakdown kept per rank: the call the HTML draws (most saved, earliest)
    kept = [c for c in model.calls if c.by_module]
    for rank in (0, 1):
        rows = [c for c in full.calls if c.rank == rank]
        best = max(rows, key=lambda c: (c.saved_unique or 0, -c.call))
        assert [c.call for c in kept if c.rank == rank] == [best.call]
        assert next(c for c in kept if c.rank == rank).by_module == best.by_module


def test_call_table_orders_interleaved_functions_and_reads_back_exact_rows():
    # GIVEN a rank file in call order, two functions interleaved, one call without an end
    stats = {
        1: {
            "1.validation_step.1.start": {"rss": 50},
            "1.training_step.2.start": {"rss": 10},
            "1.training_step.2.end": {"rss": 20, "rss_peak": 90, "saved_tensors.unique_bytes": 4096},
            "1.validation_step.1.end": {"rss": 60, "rss_peak": 70},
            "1.training_step.10.start": {"rss": 30},
            "1.training_step.3.end": {"rss": 7, "rss_peak": 8},  # an end before its start
            "1.training_step.3.start": {"rss": 6},
        },
        0: {"0.training_step.1.end": {"rss_peak": 2**40, "allocated_bytes.all.peak": 512}},
    }
    model = _model(stats=stats)
    # WHEN read back as rows
    rows = list(model.calls)
    # THEN rank, function name and call order; missing figures are None, not a sentinel
    assert [(r.rank, r.fn, r.call) for r in rows] == [
        (0, "training_step", 1),
        (1, "training_step", 2),
        (1, "training_step", 3),
        (1, "training_step", 10),
        (1, "validation_step", 1),
    ]
    assert (rows[0].rss_start, rows[0].rss_peak, rows[0].cuda_allocated_peak) == (None, 2**40, 512)
    assert (rows[1].rss_start, rows[1].rss_end, rows[1].rss_peak_delta, rows[1].saved_unique) == (
        10,
        20,
        80,
        4096,
    )
    assert (rows[2].rss_start, rows[2].rss_end, rows[2].rss_peak) == (6, 7, 8)
    assert (rows[3].rss_start, rows[3].rss_end, rows[3].rss_peak) == (30, None, None)
    assert model.calls[-1] == rows[4] and model.calls[1:3] == rows[1:3]
    assert model.ranks == [0, 1] and model.has_cuda
    # ... and the per-function bands and top calls come from the same numbers
    [f0, f1, f2] = model.functions()
    assert (f0.rank, f0.calls, f0.bands["cuda alloc peak"].mid) == (0, 1, 512)
    assert (f1.rank, f1.fn, f1.calls) == (1, "training_step", 3) and f1.bands["rss peak"].hi == 90
    assert f2.bands["peak - start"].lo == 20 and "cuda alloc peak" not in f2.bands
    assert [c.label for c in model.top_calls(2, "peak - start")] == ["training_step #2", "validation_step #1"]


def test_report_model_takes_a_list_of_rows():
    from memprofiler.reporters.model.report import CallRow

    run = RunArtifacts(root=Path("."), stats={})
    rows = [CallRow(0, "b", 1, rss_peak=5, by_module={"m": 3}), CallRow(0, "a", 2, rss_peak=7)]
    model = ReportModel(run=run, calls=rows)  # type: ignore[arg-type]
    assert [c.fn for c in model.calls] == ["a", "b"]
    assert model.calls[1].by_module == {"m": 3} and model.calls[0].by_module == {}
    assert model.top_saved_modules() == [("m", 3, "rank 0 b #1")]
