"""The profiler views in headless Chromium: offline, no console error, figures equal the analysis,
and a range selected on the memory curve recomputes the tables as the analysis does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import lightning.pytorch as pl

from _range_stats import range_stats
from _tiny_lightning import TinyModel
from browser import BROWSER_MARKS, open_page
from memprofiler import ExtendedPyTorchProfiler
from memprofiler.__main__ import main
from memprofiler.analysis.traces.views import build_views

pytestmark = BROWSER_MARKS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

_TABLES = """
(() => {
  const rows = (sel) => Array.from(document.querySelectorAll(sel + " tbody tr")).map(
    (tr) => Array.from(tr.cells).map((td) => td.dataset.v !== undefined ? td.dataset.v : td.textContent));
  return JSON.stringify({
    stats: Array.from(document.querySelectorAll("div.memview")).map((v) => rows("#" + v.id + " table[data-kind=stats]")),
    ranks: rows("table[data-kind=ranks]"),
    catpeak: rows("table[data-kind=catpeak]"),
    text: document.body.innerText,
    plots: Array.from(document.querySelectorAll("svg.plot, div.plot-table")).map((s) => s.getAttribute("aria-label")),
  });
})()
"""


def _stat_cells(stats):
    return [
        [s.name, *map(str, (s.calls, s.increase, s.self_increase, s.alloc_count, s.self_alloc_count, s.alloc_size, s.self_alloc_size))]
        for s in stats
    ]  # fmt: skip


def _run(tmp_path: Path) -> Path:
    prof = ExtendedPyTorchProfiler(
        dirpath=tmp_path,
        schedule_cfg={"wait": 1, "warmup": 1, "active": 2},
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
    )
    pl.Trainer(
        default_root_dir=tmp_path, max_steps=5, profiler=prof, logger=False, accelerator="cpu", enable_checkpointing=False,
        enable_model_summary=False, enable_progress_bar=False,
    ).fit(TinyModel())  # fmt: skip
    return tmp_path / "fit_rank_0.1.pt.trace.json"


def test_profiler_views_render_offline_and_equal_the_analysis(tmp_path):
    # GIVEN a real CPU trace with memory categories, and the two CUDA-shaped ranks
    cpu = _run(tmp_path / "cpu")
    for f in ("kineto_cuda_worker0.pt.trace.json", "kineto_cuda_worker1.pt.trace.json"):
        shutil.copy(FIXTURES / f, tmp_path / f)
    html = tmp_path / "views.html"
    paths = [
        cpu,
        tmp_path / "kineto_cuda_worker0.pt.trace.json",
        tmp_path / "kineto_cuda_worker1.pt.trace.json",
    ]
    assert main(["report", *map(str, paths), "-o", str(html)]) == 0
    views = build_views(paths)
    assert views is not None
    cpu_dev = views.traces[0].devices[0]
    ones = next(p for p in cpu_dev.pairs if p.op == "aten::ones (aten::empty)")
    lo, hi = 0.0, ones.alloc_ms
    assert hi is not None
    # WHEN Chromium opens the page, reads the tables, then selects a range on the CPU curve
    with open_page(html) as view:
        before = json.loads(view.eval(_TABLES))
        view.eval(f"window.memprofilerSelectRange('mem-0-0', {lo}, {hi})")
        after = json.loads(view.eval(_TABLES))
    # THEN nothing went wrong and nothing was fetched
    assert view.errors == []
    assert view.offsite == [], view.requests
    # AND every device's statistics table equals the analysis
    expected = [_stat_cells(d.stats) for t in views.traces for d in t.devices]
    assert before["stats"] == expected
    # AND the selected range gives the analysis of that range
    assert after["stats"][0] == _stat_cells(range_stats(cpu_dev.range_data, lo, hi))
    assert after["stats"][0] != before["stats"][0]
    assert after["stats"][1:] == before["stats"][1:]
    # AND the category peak and the ranks are those of the analysis
    (cats,) = views.traces[0].categories
    assert sorted(before["catpeak"]) == sorted([c, str(b)] for c, b in cats.peak_by_category.items() if b)
    assert f"Peak {cats.peak_bytes:,} bytes" in before["text"]
    assert "cpu: memory by category (ms)" in before["plots"]
    assert "GPU0: memory over time (ms)" in before["plots"]  # (two points: a table of them)
    # (the CPU trace and the first fixture are both rank 0: their steps add up)
    slowest = views.slowest
    assert slowest is not None and slowest.rank == 0
    assert [r[0] for r in before["ranks"]] == ["0", "1"] and "Slowest rank: 0" in before["text"]
