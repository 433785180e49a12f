"""Open the HTML report in real headless Chromium, offline, and check what a user would see.

Needs Debian's ``chromium`` (``.ci/run`` installs it); skipped with a reason where none is found.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdp_pipe import CdpPipe, find_browser
from memprofiler.__main__ import main

BROWSER = find_browser()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        BROWSER is None, reason="no Chromium found (apt-get install -y chromium, or set MEMPROFILER_CHROMIUM)"
    ),
]

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


def _open(
    html: Path, profile: Path, run_filter: bool = True
) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    assert BROWSER is not None
    with CdpPipe(BROWSER, profile) as cdp:
        target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            cdp.send(f"{domain}.enable", session=session)
        # No network at all: anything the page asked for beyond its own file would fail and show.
        cdp.send(
            "Network.emulateNetworkConditions",
            {"offline": True, "latency": 0, "downloadThroughput": 0, "uploadThroughput": 0},
            session=session,
        )
        cdp.send("Page.navigate", {"url": html.resolve().as_uri()}, session=session)
        cdp.wait_event("Page.loadEventFired", session=session)
        probe = cdp.send("Runtime.evaluate", {"expression": _PROBE, "returnByValue": True}, session=session)
        filtered = ""
        if run_filter:
            res = cdp.send(
                "Runtime.evaluate", {"expression": _FILTER, "returnByValue": True}, session=session
            )
            filtered = res["result"].get("value", json.dumps(res))
        events = list(cdp.events)
    return json.loads(probe["result"]["value"]), events, filtered


def _errors(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for ev in events:
        m, p = ev.get("method"), ev.get("params", {})
        if m == "Runtime.exceptionThrown":
            details = p.get("exceptionDetails", {})
            out.append(details.get("exception", {}).get("description") or details.get("text", "exception"))
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(json.dumps(p.get("args", []))[:300])
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append(p["entry"].get("text", ""))
    return out


def test_report_renders_offline_with_no_console_errors(full_run, tmp_path, capsys):
    # GIVEN the HTML report of a run with calls, ranks, FSDP tables and allocator history
    html = tmp_path / "report.html"
    assert main(["report", str(full_run), "-o", str(html)]) == 0
    # WHEN headless Chromium opens it from a file:// URL with the network off
    page, events, filtered = _open(html, tmp_path / "profile")
    # THEN nothing was logged as an error and no request left the page
    assert _errors(events) == []
    requests = [
        e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"
    ]
    assert requests and all(u.startswith("file://") for u in requests), requests
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
    _, events, _ = _open(bad, tmp_path / "profile", run_filter=False)
    # THEN all three are seen, so a clean report really is clean
    errors = _errors(events)
    assert any("boom" in e for e in errors)
    assert any("undefinedFunction" in e for e in errors), errors
    requests = [
        e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"
    ]
    assert "https://example.com/x.png" in requests
