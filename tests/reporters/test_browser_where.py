"""The run report's "where memory goes" in headless Chromium: the bars add up to each call's peak."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from browser import BROWSER_MARKS, open_page
from memprofiler.__main__ import main

pytestmark = BROWSER_MARKS

DEMO = Path(__file__).parents[1] / "fixtures" / "gpu_demo_run"

_BARS = """
(() => Array.from(document.querySelectorAll("#where ~ div g.sbar")).map((g) => {
  const rects = Array.from(g.querySelectorAll("rect[data-part]"));
  return {label: g.dataset.label, total: +g.dataset.total,
          parts: rects.map((r) => [r.dataset.part, +r.dataset.bytes]),
          width: rects.reduce((w, r) => w + r.getBoundingClientRect().width, 0)};
}))()
"""

# Charts in the "across calls" section: the siblings from its heading to the next one.
_ACROSS_PLOTS = """
(() => { let n = 0;
  for (let el = document.getElementById("across").nextElementSibling; el && el.tagName !== "H2"; el = el.nextElementSibling)
    n += el.matches("svg.plot") ? 1 : el.querySelectorAll("svg.plot").length;
  return n; })()
"""


def test_the_report_opens_on_where_memory_goes_and_each_bar_adds_up_to_the_peak(tmp_path):
    # GIVEN the recorded H200 demo run and its own figures
    run = tmp_path / "run"
    shutil.copytree(DEMO, run)
    stats = yaml.safe_load((DEMO / "rank_0_memory_stats.yaml").read_text())
    html = tmp_path / "report.html"
    assert main(["report", str(run), "-o", str(html)]) == 0
    # WHEN Chromium opens the report
    with open_page(html) as view:
        first = view.eval("document.querySelector('h2').id")
        bars = view.eval(_BARS)
        text = view.page.inner_text("body")
        lines = view.eval(_ACROSS_PLOTS)
    assert view.errors == [] and view.offsite == []
    # THEN the first section is "where memory goes"
    assert first == "where"
    by_label = {b["label"]: b for b in bars}
    for call in (3, 4):
        end, start = stats[f"0.training_step.{call}.end"], stats[f"0.training_step.{call}.start"]
        bar = by_label[f"training_step #{call}"]
        # each bar is the call's CUDA allocated peak, and its parts sum to it exactly
        assert bar["total"] == end["allocated_bytes.all.peak"] == 118_890_496
        assert sum(b for _, b in bar["parts"]) == bar["total"]
        parts = dict(bar["parts"])
        assert parts["resident"] == start["allocated_bytes.all.current"]
        assert parts["activations"] == end["saved_tensors.unique_bytes"]
    # and the drawn widths are in proportion: equal peaks, equal lengths
    assert abs(by_label["training_step #3"]["width"] - by_label["training_step #4"]["width"]) < 0.5
    # the 33 modules beside it are rolled up: four blocks of 8.03 MiB, every block's MLP 18 MiB
    assert "in 33 modules" in text and "other (25 more)" not in text
    assert "model.blocks.0\t8.03 MiB\t23.5%\t7" in text and "model.blocks.*.mlp\t18.00 MiB\t52.7%\t4" in text
    # the saved-tensor chart's list is cut at 15 with the rest in one row
    assert "other (18 more)" in text
    # two calls per function: the across-calls figures are tables, not lines through two points
    assert lines == 0
    # RSS peaks within 6% of each other are one line of text, not bars that look the same
    assert "1.43 GiB to 1.52 GiB in every call" in text


def test_the_report_leads_with_the_cuda_peak_and_shows_the_others_as_views_of_it(tmp_path):
    # GIVEN the recorded H200 demo run, with its profiler trace (memory categories and allocator curve)
    run = tmp_path / "run"
    shutil.copytree(DEMO, run)
    html = tmp_path / "report.html"
    assert main(["report", str(run), "-o", str(html)]) == 0
    # WHEN Chromium opens the report
    with open_page(html) as view:
        rows = view.eval(
            "Array.from(document.querySelectorAll('.mp-views tr')).map((tr) =>"
            " Array.from(tr.cells).slice(0, 3).map((c) => c.innerText))"
        )
        folded = view.eval(
            "Array.from(document.querySelectorAll('details.mp-view > summary')).map((s) => s.innerText)"
        )
        headline = view.page.inner_text("#where + p")
    assert view.errors == [] and view.offsite == []
    # THEN one peak leads, the CUDA allocated peak the device enforces
    assert "113.38 MiB (CUDA allocated peak)" in headline
    # AND every other figure is a view of it, with its difference: the reserved peak above it,
    # the categories' GPU timeline 65 MiB below, the allocator curve equal, host figures apart
    assert rows[1:] == [
        ["CUDA allocated peak (the headline peak)", "113.38 MiB", ""],
        ["CUDA reserved peak", "132.00 MiB", "+18.62 MiB (+16%)"],
        ["memory-categories peak, rank 0 · cpu", "138.39 KiB", "another device"],
        ["memory-categories peak, rank 0 · cuda:0", "48.38 MiB", "-65.00 MiB (-57%)"],
        ["profiler allocator curve, rank 0 · GPU0", "113.38 MiB", "0 B (+0%)"],
        ["profiler allocator curve, rank 0 · CPU", "8.12 KiB", "another device"],
    ]
    # AND their own bars are folded below it
    assert folded == ["memory-categories peak: its bars", "host RSS peak: its bars"]
