"""The run report links one allocation explorer per allocator history the run recorded."""

from __future__ import annotations

import re

from memprofiler.__main__ import main
from memprofiler.reporters.explorer.page import EXPLORER_DIR


def test_report_links_an_explorer_per_allocator_history(full_run, tmp_path, capsys):
    # GIVEN a run with allocator history pickles
    out = tmp_path / "report.html"
    # WHEN its report is written
    assert main(["report", str(full_run), "-o", str(out)]) == 0
    html = out.read_text()
    # THEN every link points at an explorer page written next to the report
    links = re.findall(r"<a class='explorer' href='([^']+)'>", html)
    assert links and len(links) == html.count("<h3>", html.index("id='snapshots'"))
    for link in links:
        assert link.startswith(EXPLORER_DIR + "/")
        page = (tmp_path / link).read_text()
        assert "id='mp-data'" in page and "Allocation explorer" in page
