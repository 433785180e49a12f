"""``memprofiler check``: the CI memory budget gate, on a real CPU run."""

from __future__ import annotations

import pytest

from memprofiler.__main__ import main
from run_fixtures import expected_saved_bytes


def test_within_budget_exits_0(real_runs, capsys):
    # GIVEN limits above every collected value, in human units
    rc = main(
        ["check", str(real_runs["a"]), "--max", "rss_peak=64GiB", "--max", "saved_tensors.unique_bytes=1.5GB"]
    )
    # THEN exit 0 and a one-line all-clear (2 calls x 2 metrics checked)
    assert rc == 0
    assert capsys.readouterr().out.strip() == "memprofiler check: all 4 values within budget"


def test_each_violation_is_one_line_naming_key_value_and_limit(real_runs, capsys):
    saved = expected_saved_bytes(256)  # 12544 bytes = 12.25 KiB
    rc = main(
        ["check", str(real_runs["a"]), "--max", "saved_tensors.unique_bytes=12KiB", "--max", "rss_peak=64GiB"]
    )
    captured = capsys.readouterr()
    assert rc == 1
    assert captured.out.splitlines() == [
        f"0.training_step.{call}.end saved_tensors.unique_bytes = 12.25 KiB ({saved:,}) exceeds limit "
        "12.00 KiB (12,288) set by --max saved_tensors.unique_bytes"
        for call in (2, 3)
    ]
    assert "2 of 4 values over budget" in captured.err


def test_exact_limit_passes_and_one_byte_less_fails(real_runs, capsys):
    saved = expected_saved_bytes(256)
    assert main(["check", str(real_runs["a"]), "--max", f"saved_tensors.unique_bytes={saved}B"]) == 0
    assert main(["check", str(real_runs["a"]), "--max", f"saved_tensors.unique_bytes={saved - 1}B"]) == 1


def test_patterns_and_key_filter(real_runs, capsys):
    # by_module entries are metrics too; only call 3 is checked
    rc = main(
        [
            "check",
            str(real_runs["a"]),
            "--max",
            "saved_tensors.by_module.*=4KiB",
            "--key",
            "*.training_step.3.end",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert rc == 1
    assert out == [
        "0.training_step.3.end saved_tensors.by_module.enc.1 = 8.00 KiB (8,192) exceeds limit 4.00 KiB (4,096) "
        "set by --max saved_tensors.by_module.*"
    ]


@pytest.mark.parametrize(
    ("limit", "message"),
    [
        ("rss_peek=2GiB", "`--max rss_peek`: matches no collected value"),
        ("rss_peak=2 parsecs", "`--max rss_peak`: got '2 parsecs'"),
        ("rss_peak", "expected METRIC=VALUE"),
        ("rss_peak=-1GiB", "`--max rss_peak`: got '-1GiB'; must not be negative"),
    ],
)
def test_bad_limits_are_one_line_exit_2(real_runs, capsys, limit, message):
    rc = main(["check", str(real_runs["a"]), "--max", limit])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err


def test_missing_run_dir_exit_2(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope"), "--max", "rss_peak=1GiB"]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_key_filter_matching_nothing_names_the_key_option(real_runs, capsys):
    # GIVEN a --key pattern with a typo
    rc = main(["check", str(real_runs["a"]), "--max", "rss_peak=64GiB", "--key", "*.training_stp.*"])
    # THEN exit 2 blaming --key (not --max) and showing what keys look like
    assert rc == 2
    assert capsys.readouterr().err == (
        "memprofiler check: error: `--key`: '*.training_stp.*' matches no snapshot key in "
        f"{real_runs['a']}; keys look like 0.training_step.2.end, 0.training_step.2.start, "
        "0.training_step.3.end, 0.training_step.3.start\n"
    )


@pytest.mark.parametrize("bad", [".nan", ".inf"])
def test_non_finite_value_fails_the_budget(tmp_path, capsys, bad):
    # GIVEN a stats file whose rss_peak is not a finite number (edited or corrupted)
    (tmp_path / "rank_0_memory_stats.yaml").write_text(
        f"0.training_step.2.end:\n  rss_peak: {bad}\n0.training_step.3.end:\n  rss_peak: 100\n"
    )
    # WHEN checked against a generous limit
    rc = main(["check", str(tmp_path), "--max", "rss_peak=1GiB"])
    captured = capsys.readouterr()
    # THEN the gate fails closed: exit 1 and one line naming the file, the key and the value
    assert rc == 1
    assert captured.out.splitlines() == [
        f"{tmp_path / 'rank_0_memory_stats.yaml'}: rss_peak = {float(bad[1:])} at 0.training_step.2.end is "
        "not a finite number, which no run writes (an edited or corrupted file?); the check fails on it"
    ]
    assert "1 value(s) no run writes, left out of the figures; the check fails" in captured.err


@pytest.mark.parametrize(
    "pattern",
    [
        "saved_tensors.by_module.enc.1",
        "saved_tensors.by_module.enc.?",
        "*enc.1",
        "[s]aved_tensors.by_module.enc.1",
    ],
)
def test_a_nested_name_is_reached_by_literal_and_wildcard_limits(real_runs, capsys, pattern):
    # GIVEN a limit under `saved_tensors.by_module`, literal or with a wildcard anywhere, and an
    # `rss_peak` limit beside it (which alone lets the checker skip the nested breakdowns)
    rc = main(["check", str(real_runs["a"]), "--max", f"{pattern}=4KiB", "--max", "rss_peak=64GiB"])
    out = capsys.readouterr().out
    # THEN the module's 8 KiB is still found over budget in every collected call
    assert rc == 1
    assert [line.split()[0] for line in out.splitlines() if " saved_tensors.by_module.enc.1 " in line] == [
        "0.training_step.2.end",
        "0.training_step.3.end",
    ]


def test_streamed_and_loaded_runs_give_the_same_verdict(real_runs):
    # GIVEN the same run loaded whole and left to be streamed a block at a time
    from memprofiler.analysis.budget import Limit, check_budget
    from memprofiler.analysis.runs.artifacts import load_run

    whole, streamed = load_run(real_runs["a"]), load_run(real_runs["a"], streamed=True)
    assert streamed.stats == {} and list(streamed.stats_files) == [0]
    limits = [Limit.parse("saved_tensors.by_module.*=4KiB"), Limit.parse("rss_peak=64GiB")]
    # THEN the same violations and counts, and the streamed one still holds no snapshot
    assert check_budget(streamed, limits) == check_budget(whole, limits)
    assert streamed.stats == {}
