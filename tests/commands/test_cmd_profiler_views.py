"""``memprofiler report`` and ``diff`` on profiler traces (the hand-built CUDA-shaped fixtures)."""

from __future__ import annotations

import shutil
from pathlib import Path

from memprofiler.__main__ import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RANK0 = FIXTURES / "kineto_cuda_worker0.pt.trace.json"
RANK1 = FIXTURES / "kineto_cuda_worker1.pt.trace.json"


def test_report_of_traces_alone_prints_the_views_and_writes_a_page(tmp_path, capsys):
    # GIVEN two ranks' traces and no memprofiler run
    html = tmp_path / "r.html"
    # WHEN they are reported
    assert main(["report", str(RANK0), str(RANK1), "-o", str(html)]) == 0
    out = capsys.readouterr().out
    # THEN the terminal has each view and the slowest rank
    assert (
        "GPU0: peak allocated 68.00 KiB at 0.160 ms, peak reserved 2.00 MiB, 1 allocations and releases"
        in out
    )
    assert "slowest rank: 1 (1.200 ms of profiled steps)" in out
    assert "ampere" not in out  # kernels are summarised per operator, not listed
    page = html.read_text()
    assert "Slowest rank: 1" in page and "memdata" in page


def test_report_of_a_directory_of_traces_and_a_missing_one(tmp_path, capsys):
    shutil.copy(RANK0, tmp_path / RANK0.name)
    assert main(["report", "--traces", str(tmp_path), str(tmp_path / "none.pt.trace.json"), "--no-html"]) == 2
    assert "none.pt.trace.json: no such trace" in capsys.readouterr().err


def test_diff_of_two_traces_by_operator(capsys):
    assert main(["diff", str(RANK0), str(RANK1)]) == 0
    out = capsys.readouterr().out
    # the sgemm took 200 µs longer on rank 1: aten::addmm and its caller aten::linear
    rows = [line for line in out.splitlines() if "aten::" in line]
    assert rows[0].split("│")[1].strip() == "aten::addmm"
    assert "+0.200" in rows[0] and "+0.200" in rows[1]
