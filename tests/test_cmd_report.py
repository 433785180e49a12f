"""``memprofiler report`` on real CPU runs (plus hand-built allocator pickles)."""

from __future__ import annotations

import pickle
import re
import shutil
from pathlib import Path

import pytest

from memprofiler.__main__ import main
from memprofiler.units import format_bytes
from run_fixtures import expected_saved_bytes


def _save_dir(root: Path) -> Path:
    return next(root.rglob("rank_0_memory_stats.yaml")).parent


def test_terminal_summary_shows_calls_peaks_and_saved_modules(full_run, tmp_path, capsys):
    # GIVEN a run tree (save_dir three levels down) WHEN reported
    rc = main(["report", str(full_run), "-o", str(tmp_path / "r.html")])
    out = capsys.readouterr().out
    # THEN every rank's calls are listed with the analytic saved-tensor bytes
    assert rc == 0
    saved = format_bytes(expected_saved_bytes(256))
    assert saved == "12.25 KiB"
    call_lines = [
        ln for ln in out.splitlines() if re.match(r"│\s+[01] │ training_step │\s+\d │\s+[\d.]+ MiB", ln)
    ]
    assert len(call_lines) == 4  # 2 ranks x calls 2 and 3
    assert all(saved in ln for ln in call_lines)
    # the ReLU output (8 x 256 float32) is the biggest saved module
    assert re.search(r"enc\.1\s+│\s+8\.00 KiB", out)
    # rank 1 peaks 64 MiB higher: the summary names it, with max/mean a little above 1
    assert "Across ranks" in out
    assert re.search(r"training_step\.2\.end\s+│ rss_peak\s+│.*│\s+1 │\s+1\.0\d\d │", out)
    assert "peak allocated 2.25 MiB (entry 5" in out
    [fsdp_row] = [ln for ln in out.splitlines() if re.match(r"│\s+0 │ training_step │\s+2 │\s+4\.00 KiB", ln)]
    assert "64.00 KiB" in fsdp_row
    assert "8.00 GiB requested" in out
    assert f"HTML report: {tmp_path / 'r.html'}" in out


def test_html_report_is_self_contained_and_holds_the_figures(full_run, tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["report", str(full_run), "-o", str(out)]) == 0
    html = out.read_text()
    # self-contained: no external script, style, image, font or fetch
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", html)
    assert "@import" not in html and "url(" not in html and "fetch(" not in html
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) <= {"http://www.w3.org/2000/svg"}
    # every section is there
    for section in (
        "id='calls'",
        "id='across'",
        "id='saved'",
        "id='summary'",
        "id='modules'",
        "id='snapshots'",
        "id='oom'",
    ):
        assert section in html
    assert html.count("<svg") >= 6
    # the figures
    assert "Peak allocated <span title='2,359,296 bytes'>2.25 MiB</span>" in html
    assert "peak reserved <span title='6,291,456 bytes'>6.00 MiB</span>" in html
    assert "12.25 KiB saved for backward" in html
    assert "<span title='65,536 bytes'>64.00 KiB</span>" in html  # FSDP activation peak
    assert "33.3%" in html  # fragmented segment C


def test_default_output_goes_next_to_the_data(real_runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(real_runs["a"], run)
    assert main(["report", str(run)]) == 0
    assert (run / "report.html").is_file()
    assert main(["report", str(run), "--no-html"]) == 0


def _copy(real_runs: dict[str, Path], tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(real_runs["a"], run)
    return run


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("missing", "no such directory"),
        ("empty_dir", "no memprofiler files found"),
        ("empty_yaml", "file is empty"),
        ("truncated_yaml", "not valid YAML"),
        ("foreign_yaml", "expected a mapping"),
        ("bad_key", "is not a snapshot key"),
        ("truncated_pickle", "truncated"),
        ("malicious_pickle", "refused to load"),
        ("two_runs", "holds 2 runs"),
    ],
)
def test_bad_input_is_one_line_exit_2(real_runs, tmp_path, capsys, breakage, message):
    run = _copy(real_runs, tmp_path)
    stats = run / "rank_0_memory_stats.yaml"
    if breakage == "missing":
        run = tmp_path / "nope"
    elif breakage == "empty_dir":
        run = tmp_path / "empty"
        run.mkdir()
    elif breakage == "empty_yaml":
        stats.write_text("")
    elif breakage == "truncated_yaml":
        stats.write_text(stats.read_text()[:25] + "\n  - [unclosed")
    elif breakage == "foreign_yaml":
        stats.write_text("- just\n- a list\n")
    elif breakage == "bad_key":
        stats.write_text("hello: {rss: 1}\n")
    elif breakage == "truncated_pickle":
        (run / "cuda_alloc_rank_0.training_step.2.end.pickle").write_bytes(
            pickle.dumps({"segments": [1] * 50})[:20]
        )
    elif breakage == "malicious_pickle":
        (run / "oom_rank_0_0.pickle").write_bytes(
            b"cos\nsystem\n(S'touch " + str(tmp_path / "pwn").encode() + b"'\ntR."
        )
    elif breakage == "two_runs":
        shutil.copytree(run, tmp_path / "run" / "lightning_logs" / "version_1" / "memprofiler")
    rc = main(["report", str(run), "-o", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "pwn").exists()
