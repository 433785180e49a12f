"""The profiler views' overview in headless Chromium: every link lands on its table, unfolded."""

from __future__ import annotations

import shutil
from pathlib import Path

from browser import BROWSER_MARKS, open_page
from memprofiler.__main__ import main
from memprofiler.analysis.traces.views import build_views

pytestmark = BROWSER_MARKS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

_LANDED = """
(id) => {
  const el = document.getElementById(id);
  if (!el) return null;
  const r = el.getBoundingClientRect();
  let closed = 0;
  for (let p = el; p; p = p.parentElement) if (p.tagName === "DETAILS" && !p.open) closed++;
  const cell = el.tagName === "TR" ? el.cells[0].textContent : null;
  return {top: r.top, bottom: r.bottom, h: r.height, closed, cell, tag: el.tagName,
          marked: el.classList.contains("pv-target"), vh: window.innerHeight};
}
"""


def test_every_overview_link_lands_on_its_table_unfolded(tmp_path):
    # GIVEN the views of a CUDA-shaped trace (device time, memory events on the GPU)
    trace = tmp_path / "kineto_cuda_worker0.pt.trace.json"
    shutil.copy(FIXTURES / trace.name, trace)
    html = tmp_path / "views.html"
    assert main(["report", str(trace), "-o", str(html)]) == 0
    views = build_views([trace])
    (tv,) = views.traces
    with open_page(html) as view:
        # the overview comes before every table, and every table starts folded
        order = view.eval(
            "(() => { const o = document.getElementById('profiler-overview');"
            " const t = document.querySelector('details.pv-fold');"
            " return [!!o, !!(o.compareDocumentPosition(t) & Node.DOCUMENT_POSITION_FOLLOWING),"
            " Array.from(document.querySelectorAll('details.pv-fold')).every((d) => !d.open)]; })()"
        )
        links = view.eval(
            "Array.from(document.querySelectorAll('#profiler-overview a.pv-link'))"
            ".map((a) => [a.getAttribute('href').slice(1), a.textContent])"
        )
        height = view.eval("document.body.scrollHeight")
        landed = {}
        for k, (target, text) in enumerate(links):
            view.page.locator("#profiler-overview a.pv-link").nth(k).click()
            view.page.wait_for_timeout(30)
            landed[target] = (text, view.eval(f"({_LANDED})({target!r})"))
    assert view.errors == [] and view.offsite == []
    assert order == [True, True, True]
    # THEN there are links to the steps, each device's memory, and the top operators
    targets = [t for t, _ in links]
    assert "steps-0" in targets and "mem-0-0" in targets and "ops-0" in targets
    assert "mem-0-0-stats" in targets and any(t.startswith("mem-0-0-stat-") for t in targets)
    by_time = sorted(tv.ops, key=lambda r: (-r.host_self_us, r.name))[:5]
    assert [text for t, text in links if t.startswith("op-")][: len(by_time)] == [r.name for r in by_time]
    # and each one lands: the target is unfolded, drawn, in the window and marked
    for target, (text, got) in landed.items():
        assert got is not None, target
        assert got["closed"] == 0 and got["h"] > 0 and got["marked"], (target, got)
        assert got["top"] >= 0 and got["bottom"] <= got["vh"] + got["h"], (target, got)
        if got["tag"] == "TR":  # a row link lands on the row of the operator it names
            assert got["cell"] == text, (target, got)
    # and with the tables folded the page is no 10,000-pixel column
    assert height < 4000
