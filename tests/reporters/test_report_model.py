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


def test_long_runs_keep_one_breakdown_per_rank_and_every_module_peak():
    # GIVEN 2 ranks x 400 calls with per-module bytes drawn from a small range (many ties),
    # listed out of call order, as a multi-rank file or a hand-edited one may be
    import random

    from memprofiler.reporters.model import PER_CALL_LIMIT, build_model

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
