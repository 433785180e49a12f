"""``memprofiler report`` writes the same bytes as the golden pages: a reshuffle of the code behind
the report changes no page. A change meant to show up in the report regenerates them
(``python tests/fixtures/reports/make_reports.py``) in the same commit."""

from __future__ import annotations

import difflib

from _report_golden import read, render


def test_the_demo_run_report_is_byte_identical_to_the_golden_pages(tmp_path):
    # GIVEN the golden pages of the demo run (report, profiler views, three explorer pages)
    golden = read()
    assert {"terminal.txt", "report.html"} <= golden.keys()
    assert sum(name.startswith("allocator-explorer/") for name in golden) == 3
    # WHEN the report is written again
    pages = render(tmp_path)
    # THEN every page is there, byte for byte
    assert sorted(pages) == sorted(golden)
    for name, text in pages.items():
        if text != golden[name]:
            diff = difflib.unified_diff(golden[name].splitlines(), text.splitlines(), lineterm="", n=1)
            shown = [line if len(line) < 240 else line[:240] + " ..." for line in list(diff)[:40]]
            raise AssertionError(f"{name} differs from its golden page:\n" + "\n".join(shown))
