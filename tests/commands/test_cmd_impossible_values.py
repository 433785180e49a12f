"""``check`` and ``diff`` on stats files holding values no run writes (NaN, a negative byte count):
one line naming the file and the metric, the value left out of the figures, a gate failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from memprofiler.__main__ import main
from memprofiler.analysis.impossible import why_impossible

STATS = "rank_0_memory_stats.yaml"


def _run(root: Path, rss: list[str], saved: int) -> Path:
    """A run of three ``training_step`` calls with these ``rss_peak`` values (YAML scalars)."""
    root.mkdir()
    (root / STATS).write_text(
        "".join(
            f"0.training_step.{call}.end:\n  rss_peak: {v}\n  saved_tensors.unique_bytes: {saved}\n"
            for call, v in enumerate(rss, 1)
        )
    )
    return root


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    # GIVEN run A, and run B whose rss_peak is NaN in call 2 and -4096 in call 3 (an edited file)
    return _run(tmp_path / "a", ["1000", "1100", "1200"], 400), _run(
        tmp_path / "b", ["1300", ".nan", "-4096"], 500
    )


def _lines(b: Path, outcome: str) -> list[str]:
    tail = "which no run writes (an edited or corrupted file?); " + outcome
    return [
        f"{b / STATS}: rss_peak = nan at 0.training_step.2.end is not a finite number, {tail}",
        f"{b / STATS}: rss_peak = -4.00 KiB at 0.training_step.3.end is a negative byte count, {tail}",
    ]


def test_check_names_each_impossible_value_by_file_and_metric_and_fails(runs, capsys):
    _, b = runs
    # WHEN B is checked against a limit every possible value of it is under
    rc = main(["check", str(b), "--max", "rss_peak=1GiB", "--max", "saved_tensors.unique_bytes=1KiB"])
    out, err = capsys.readouterr()
    # THEN the gate fails: one line per impossible value, naming the file, the metric and why
    assert rc == 1
    assert out.splitlines() == _lines(b, "the check fails on it")
    assert "2 value(s) no run writes, left out of the figures; the check fails" in err
    assert "within budget" not in out + err


def test_check_against_a_baseline_fails_on_them_too(runs, capsys):
    a, b = runs
    # WHEN B's growth over A is gated: 1000 -> 1300 over the one call both hold as figures, +30%
    rc = main(["check", str(b), "--baseline", str(a), "--max", "rss_peak=+50%"])
    out, _ = capsys.readouterr()
    # THEN the growth is within its limit, yet the check fails on the values no run writes
    assert rc == 1
    assert out.splitlines() == [
        f"{b / STATS}: rss_peak = nan at 0.training_step.*.end is not a finite number, which no run writes "
        "(an edited or corrupted file?); the check fails on it",
        f"{b / STATS}: rss_peak = -4.00 KiB at 0.training_step.*.end is a negative byte count, which no run "
        "writes (an edited or corrupted file?); the check fails on it",
    ]


def test_diff_warns_once_per_file_and_metric_and_leaves_them_out_of_the_medians(runs, capsys):
    a, b = runs
    # WHEN A and B are compared per function
    assert main(["diff", str(a), str(b), "--metric", "rss_peak"]) == 0
    out, err = capsys.readouterr()
    # THEN each impossible value is one warning naming B's file and the metric
    assert err.splitlines() == [
        f"memprofiler diff: warning: {b / STATS}: rss_peak = nan at 0.training_step.*.end is not a finite "
        "number, which no run writes (an edited or corrupted file?); left out of the medians",
        f"memprofiler diff: warning: {b / STATS}: rss_peak = -4.00 KiB at 0.training_step.*.end is a negative "
        "byte count, which no run writes (an edited or corrupted file?); left out of the medians",
    ]
    # AND the medians are of call 1 alone, the one call both runs hold as figures: 1000 -> 1300
    [row] = [ln for ln in out.splitlines() if "rss_peak" in ln]
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[:2] == ["0.training_step.end", "rss_peak"] and "1000 B" in cells and "+300 B" in cells


def test_diff_per_call_names_the_key_and_a_fail_on_gate_fails(runs, capsys):
    a, b = runs
    assert main(["diff", str(a), str(b), "--per-call", "--metric", "rss_peak"]) == 0
    err = capsys.readouterr().err
    assert f"{b / STATS}: rss_peak = nan at 0.training_step.2.end is not a finite number" in err
    assert f"{b / STATS}: rss_peak = -4.00 KiB at 0.training_step.3.end is a negative byte count" in err
    # AND a --fail-on gate does not pass on them, though the rise it sees (+30%) is within it
    assert main(["diff", str(a), str(b), "--fail-on", "rss_peak=+50%"]) == 1
    assert "--fail-on fails: the stats files hold values no run writes" in capsys.readouterr().err


def test_what_no_run_writes():
    assert why_impossible("allocated_bytes.all.peak", -1) == "a negative byte count"
    assert why_impossible("rss_peak", float("inf")) == "not a finite number"
    assert why_impossible("num_ooms", 0) is None and why_impossible("rss_peak", 0) is None
