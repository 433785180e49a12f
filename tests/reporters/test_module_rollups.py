"""Per-module tables a user can read: saved-tensor bytes rolled up by block and by module type,
and the tracker's peaks named for the tracker that wrote them."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from memprofiler.analysis.runs.artifacts import ModuleReport, RunArtifacts
from memprofiler.reporters.model.module_groups import block_of, rolled_up, type_of
from memprofiler.reporters.model.report import ReportModel, call_rows
from memprofiler.reporters.terminal import TerminalReporter
from memprofiler.reporters.where import where_html

KIB = 1024
#: A two-layer Llama-style model: what each module saved for backward itself, in KiB.
SAVED = {
    "model.embed_tokens": 8,
    "model.layers.0.self_attn": 64,
    "model.layers.0.self_attn.q_proj": 16,
    "model.layers.0.mlp.up_proj": 32,
    "model.layers.0.mlp.down_proj": 96,
    "model.layers.1.self_attn": 64,
    "model.layers.1.self_attn.q_proj": 16,
    "model.layers.1.mlp.up_proj": 32,
    "model.layers.1.mlp.down_proj": 96,
    "lm_head": 128,
}


def _model(by_module, extra=None, reports=()) -> ReportModel:
    end = {"rss": 200 * 2**20, "rss_peak": 300 * 2**20, "saved_tensors.by_module": by_module, **(extra or {})}
    stats = {0: {"0.training_step.3.start": {"rss": 100 * 2**20}, "0.training_step.3.end": end}}
    run = RunArtifacts(root=Path("."), stats=stats, summary=None)
    run.reports = list(reports)
    return ReportModel(run=run, calls=call_rows(run))


def _lines(model: ReportModel) -> list[str]:
    out = io.StringIO()
    TerminalReporter(model).render(Console(file=out, width=120))
    return [ln.rstrip() for ln in out.getvalue().splitlines()]


def test_paths_roll_up_by_block_and_by_module_type_with_analytic_sums():
    by_module = {k: v * KIB for k, v in SAVED.items()}
    assert block_of("model.layers.1.mlp.up_proj") == "model.layers.1"
    assert type_of("model.layers.1.mlp.up_proj") == "model.layers.*.mlp"
    blocks = {g.name: (g.bytes // KIB, g.modules) for g in rolled_up(by_module, block_of)}
    assert blocks == {
        "model.layers.0": (208, 4),
        "model.layers.1": (208, 4),
        "lm_head": (128, 1),
        "model.embed_tokens": (8, 1),
    }
    types = [(g.name, g.bytes // KIB, g.blocks) for g in rolled_up(by_module, type_of)]
    assert types == [
        ("model.layers.*.mlp", 256, 2),
        ("model.layers.*.self_attn", 160, 2),
        ("lm_head", 128, 0),
        ("model.embed_tokens", 8, 0),
    ]


def test_the_terminal_rolls_saved_bytes_up_instead_of_listing_leaves():
    # GIVEN one call whose modules saved 552 KiB in all
    model = _model({k: v * KIB for k, v in SAVED.items()})
    # WHEN the terminal report is printed
    lines = _lines(model)
    # THEN the call's bytes are given by block and by module type, each row a sum of modules
    start = lines.index(
        "Saved-tensor bytes of rank 0 training_step #3, the call that saved the most: 552.00 KiB in 10 modules"
    )
    assert lines[start + 1 : start + 10] == [
        "                      by block",
        "┏━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━┓",
        "┃ block              ┃      saved ┃ share ┃ modules ┃",
        "┡━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━┩",
        "│ model.layers.0     │ 208.00 KiB │ 37.7% │       4 │",
        "│ model.layers.1     │ 208.00 KiB │ 37.7% │       4 │",
        "│ lm_head            │ 128.00 KiB │ 23.2% │       1 │",
        "│ model.embed_tokens │   8.00 KiB │  1.4% │       1 │",
        "└────────────────────┴────────────┴───────┴─────────┘",
    ]
    assert "│ model.layers.*.mlp       │ 256.00 KiB │ 46.4% │      2 │" in lines
    assert "│ model.layers.*.self_attn │ 160.00 KiB │ 29.0% │      2 │" in lines
    # AND no leaf is listed on its own
    assert not [ln for ln in lines if "up_proj" in ln]


def test_the_page_rolls_the_top_modules_up_too():
    model = _model({k: v * KIB for k, v in SAVED.items()})
    html = where_html(model)
    assert "by block and by module type across blocks" in html
    assert "<td>model.layers.*.mlp</td>" in html and "up_proj" not in html


def test_a_non_fsdp_tracker_table_is_not_called_fsdp():
    # GIVEN a run of the module tracker (track_module_mem), its peaks in the end snapshot
    report = ModuleReport(kind="module", rank=0, fn="training_step", call=3)
    model = _model(
        {}, {"module_mem.peak.activation": 4 * 2**20, "module_mem.peak.total": 6 * 2**20}, [report]
    )
    # WHEN printed THEN the table names the module tracker
    lines = _lines(model)
    assert "Module tracker peaks per category (module_mem.peak.*)" in [ln.strip() for ln in lines]
    assert lines[-1] == "module-wise reports: 1 of the module tracker (tables in the HTML report)"
    assert not [ln for ln in lines if "FSDP" in ln]


def _snap(total):
    return [{"cpu": {"Activation": total - 100, "Parameter": 100, "Total": total}}]


def test_module_wise_rows_show_what_each_module_added_not_the_global_totals():
    # GIVEN a module tracker's report: at each module's boundaries the whole device's memory
    data = {
        "tracker": "MemTracker",
        "modules": {
            "Net": {"Pre-Forward": _snap(1000), "Post-Forward": _snap(1600), "Peak-Forward": _snap(1900),
                    "Pre-Backward": _snap(1600), "Peak-Backward": _snap(2400)},
            "Net.mlp": {"Pre-Forward": _snap(1200), "Post-Forward": _snap(1500), "Peak-Forward": _snap(1700),
                        "Pre-Backward": _snap(1700), "Peak-Backward": _snap(2000)},
        },
    }  # fmt: skip
    report = ModuleReport(kind="module", rank=0, fn="training_step", call=3, data=data)
    # WHEN the HTML report renders it
    from memprofiler.reporters.html import HtmlReporter
    from memprofiler.reporters.model.yaml_tables import module_deltas

    deltas = module_deltas(data)
    html = HtmlReporter(_model({}, {"module_mem.peak.total": 2400}, [report])).render()
    # THEN each module's row is its own differences: Net's forward left 600 B, peaked 900 B above
    # its start, its backward 800 B; Net.mlp's 300 B, 500 B and 300 B
    assert deltas is not None and deltas.rows == [
        ["Net", "cpu", 600, 900, 800],
        ["Net.mlp", "cpu", 300, 500, 300],
    ]
    assert "<summary>module tracker · rank 0 · training_step #3</summary>" in html
    assert html.index("forward peak above its start") < html.index(
        "the tracker's snapshots (whole-device totals)"
    )
    assert "<summary>the tracker's snapshots (whole-device totals)</summary>" in html
    # AND the tracker's peaks are named for the module tracker
    assert (
        "<h3>Module tracker peaks per category (module_mem.peak.*)</h3>" in html and "FSDP peaks" not in html
    )
