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
