"""Charts of few points are tables, and call-number axes tick at whole numbers only."""

from __future__ import annotations

import re

from memprofiler.reporters.parts import svg
from memprofiler.units import format_bytes


def _ticks(chart: str) -> list[str]:
    return re.findall(r'class="tick">([^<]*)</text>', chart)


def test_calls_two_and_three_tick_once_each():
    # GIVEN a function collected in calls 2 and 3, and another in 2, 3 and 4
    chart = svg.line_chart(
        [("a", [(2.0, 10.0), (3.0, 20.0)]), ("b", [(2.0, 5.0), (3.0, 7.0), (4.0, 9.0)])],
        format_bytes,
        "t",
        integer_x=True,
    )
    # THEN the x axis shows 2, 3, 4 once each (it was "2 2 2 3 3" for 2..3); y ticks are bytes
    x_ticks = [t for t in _ticks(chart) if not t.endswith("B")]
    assert x_ticks == ["2", "3", "4"]


def test_a_long_run_ticks_at_round_steps():
    assert svg.integer_ticks(1, 1000) == [200, 400, 600, 800, 1000]
    assert svg.integer_ticks(0, 7) == list(range(8))
    assert svg.integer_ticks(2.2, 2.8) == []


def test_two_points_are_a_table_of_their_values():
    # WHEN every series has fewer than three points
    out = svg.line_chart([("rss", [(2.0, 1024.0), (3.0, 2048.0)])], format_bytes, "host RSS peak")
    # THEN there is no SVG, but a table with the chart's title and every point
    assert "<svg" not in out and "host RSS peak" in out
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", out)
    assert cells == ["rss", "2", "1.00 KiB", "rss", "3", "2.00 KiB"]
    # and x labels name the points where the chart has them
    named = svg.line_chart([("s", [(0.0, 1.0)])], str, "t", x_labels=["call 7"])
    assert re.findall(r"<td[^>]*>([^<]*)</td>", named) == ["s", "call 7", "1.0"]


def _memory_trace(tmp_path, device_type, sizes):
    """A trace of one operator allocating ``sizes`` one after another on one device."""
    import json

    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::empty",
            "pid": 1,
            "tid": 1,
            "ts": 1000,
            "dur": 100,
            "args": {},
        }
    ]
    total = 0
    for k, size in enumerate(sizes):
        total += size
        events.append(
            {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1001 + k,
             "args": {"Bytes": size, "Addr": 4096 * (k + 1), "Total Allocated": total, "Total Reserved": total,
                      "Device Type": device_type, "Device Id": 0}}
        )  # fmt: skip
    path = tmp_path / "m_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _page(path):
    from memprofiler.analysis.traces.views import build_views
    from memprofiler.reporters.traces.html import profiler_page

    views = build_views([path])
    assert views is not None
    return profiler_page(views, "t")


def test_a_devices_memory_chart_starts_at_zero(tmp_path):
    # GIVEN a GPU trace whose allocated bytes go from 72 MiB to 100 MiB (the model already there)
    page = _page(_memory_trace(tmp_path, 1, [72 * 2**20, 4 * 2**20, 8 * 2**20, 16 * 2**20]))
    # WHEN its memory chart is drawn THEN the axis starts at 0 B, not near 72 MiB
    (chart,) = re.findall(r"<svg[^>]*memory over time.*?</svg>", page, re.S)
    assert _ticks(chart)[0] == "0 B"


def test_host_rss_lines_still_zoom_in():
    chart = svg.line_chart(
        [("rss", [(1.0, 900.0 * 2**20), (2.0, 950.0 * 2**20), (3.0, 1000.0 * 2**20)])], format_bytes, "t"
    )
    assert _ticks(chart)[0] == "890.00 MiB"


def test_a_few_kib_of_host_memory_get_a_line_not_a_chart(tmp_path):
    # GIVEN a trace whose host memory peaks at 8 KiB (a GPU run's few host tensors)
    page = _page(_memory_trace(tmp_path, 0, [2048, 2048, 4096]))
    # THEN no chart is drawn for it, one line says why
    assert "memory over time" not in page
    assert "CPU: at most 8.00 KiB allocated in this trace, under 1.00 MiB: no chart." in page
