"""Range selection on a device with more memory events than the page carries one by one:
the page works on bins of events, and a selected range gives the analysis of the range
widened to whole bins."""

from __future__ import annotations

import json

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from _range_stats import range_stats
from browser import BROWSER_MARKS, open_page
from memprofiler.__main__ import main
from memprofiler.analysis.traces import stream as trace_stream
from memprofiler.analysis.traces.views import build_views

pytestmark = BROWSER_MARKS

_STATS = """
JSON.stringify(Array.from(document.querySelectorAll("#mem-0-0 table[data-kind=stats] tbody tr")).map(
  (tr) => Array.from(tr.cells).map((td) => td.dataset.v !== undefined ? td.dataset.v : td.textContent)))
"""


def _cells(stats):
    return [
        [s.name, *map(str, (s.calls, s.increase, s.self_increase, s.alloc_count, s.self_alloc_count, s.alloc_size, s.self_alloc_size))]
        for s in stats
    ]  # fmt: skip


def test_binned_range_selection_equals_the_analysis_of_the_widened_range(tmp_path, monkeypatch):
    # GIVEN a CPU trace whose memory events go into bins of about 4 (RANGE_KEPT lowered)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    path = tmp_path / "b_rank_0.1.pt.trace.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
        for _ in range(6):
            with record_function("ProfilerStep#manual"):
                scratch = torch.ones(2**14)
                del scratch
                model(torch.randn(8, 16)).sum().backward()
    prof.export_chrome_trace(str(path))
    full = build_views([path])
    assert full is not None
    whole_rd = full.traces[0].devices[0].range_data  # every event: the oracle's input
    assert whole_rd is not None and "events" in whole_rd
    monkeypatch.setattr(trace_stream, "RANGE_KEPT", 10)
    monkeypatch.setattr(trace_stream, "RANGE_BINS", max(2, len(whole_rd["events"]) // 4))
    html = tmp_path / "v.html"
    assert main(["report", str(path), "-o", str(html)]) == 0
    views = build_views([path])
    assert views is not None
    dv = views.traces[0].devices[0]
    rd = dv.range_data
    assert rd is not None and "bins" in rd and len(rd["bins"]) > 3
    bins = rd["bins"]
    # a range from inside the second bin to inside the next-to-last one
    lo = (bins[1][0] + bins[1][1]) / 2 if bins[1][1] > bins[1][0] else bins[1][0]
    hi = bins[-2][0]
    with open_page(html) as view:
        before = json.loads(view.eval(_STATS))
        view.eval(f"window.memprofilerSelectRange('mem-0-0', {lo}, {hi})")
        after = json.loads(view.eval(_STATS))
        view.eval("window.memprofilerSelectRange('mem-0-0', -Infinity, Infinity)")
        whole = json.loads(view.eval(_STATS))
        text = view.eval("document.querySelector('#mem-0-0 p.range').textContent")
    assert view.errors == [] and view.offsite == []
    # THEN the statistics are those of the range widened to whole bins, from every event
    assert after == _cells(range_stats(whole_rd, bins[1][0], bins[-2][1]))
    assert after != before
    # AND the whole trace gives the whole-trace table again
    assert whole == before == _cells(dv.stats)
    assert "Selected" in text
