"""Open the HTML report in real headless Chromium (Playwright), offline, and check what a user would see.

Needs Debian's ``chromium`` (``.ci/run`` installs it); skipped with a reason where none is found.
"""

from __future__ import annotations

import json

from browser import BROWSER_MARKS, open_page
from memprofiler.__main__ import main

pytestmark = BROWSER_MARKS

_PROBE = """
(() => {
  const plots = Array.from(document.querySelectorAll("svg.plot, canvas")).map((el) => {
    const r = el.getBoundingClientRect();
    return {tag: el.tagName.toLowerCase(), w: r.width, h: r.height,
            marks: el.querySelectorAll("rect, polyline, circle, path").length,
            label: el.getAttribute("aria-label") || ""};
  });
  const filters = document.querySelectorAll("input.filter").length;
  return JSON.stringify({plots, filters, text: document.body.innerText});
})()
"""

_FILTER = """
(() => {
  const table = document.querySelector("#calls ~ table.filterable");
  const box = table.previousElementSibling;
  box.value = "rank-does-not-exist";
  box.dispatchEvent(new Event("input"));
  const hidden = Array.from(table.querySelectorAll("tbody tr")).filter((tr) => tr.style.display === "none").length;
  box.value = "";
  box.dispatchEvent(new Event("input"));
  return hidden + "/" + table.querySelectorAll("tbody tr").length;
})()
"""


def test_report_renders_offline_with_no_console_errors(full_run, tmp_path, capsys):
    # GIVEN the HTML report of a run with calls, ranks, FSDP tables and allocator history
    html = tmp_path / "report.html"
    assert main(["report", str(full_run), "-o", str(html)]) == 0
    # WHEN headless Chromium opens it from a file:// URL with every other request refused
    with open_page(html) as view:
        page = json.loads(view.eval(_PROBE))
        filtered = view.eval(_FILTER)
    # THEN nothing was logged as an error and no request left the page
    assert view.errors == []
    assert view.requests and view.offsite == [], view.requests
    # the plots rendered with real size and marks
    plots = page["plots"]
    assert len(plots) >= 6
    for plot in plots:
        assert plot["w"] >= 300 and plot["h"] >= 50 and plot["marks"] >= 1, plot
    labels = [p["label"] for p in plots]
    assert "device 0: active memory over trace entries" in labels
    assert "saved-tensor bytes (unique)" in labels
    # the page shows the expected peak figures
    text = page["text"]
    assert "Peak active 2.25 MiB requested at entry 5" in text
    assert "peak reserved 6.00 MiB at entry 10" in text
    assert "12.25 KiB saved for backward" in text
    assert "OOM at entry 9: 8.00 GiB requested" in text
    # and its one script works: the filter hides every calls row for a query that matches none
    assert page["filters"] >= 3
    assert filtered == "4/4"


def test_the_harness_catches_console_errors_and_network_requests(tmp_path):
    # GIVEN a page that logs an error, throws, and asks the network for an image
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><body><img src='https://example.com/x.png'>"
        "<script>console.error('boom'); undefinedFunction();</script></body></html>"
    )
    # WHEN opened the same way as the report
    with open_page(bad) as view:
        pass
    # THEN all three are seen, so a clean report really is clean
    assert any("boom" in e for e in view.errors), view.errors
    assert any("undefinedFunction" in e for e in view.errors), view.errors
    assert view.offsite == ["https://example.com/x.png"]
