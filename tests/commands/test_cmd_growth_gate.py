"""The CI gate on growth: ``check --baseline RUN --max METRIC=+N%`` and ``diff --fail-on``.

Runs ``a`` and ``b`` are real CPU runs of one MLP, hidden width 256 and 512 (``run_fixtures``):
the step saves 4 x 8 x (64 + hidden + 64 + 8) bytes, 12,544 in ``a`` and 20,736 in ``b``, so
``b`` saves 8,192 bytes (8 KiB) more, +65.3%.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from memprofiler.__main__ import main
from memprofiler.analysis.growth import parse_growth
from memprofiler.errors import ConfigError
from run_fixtures import expected_saved_bytes

MiB = 2**20
SAVED = "saved_tensors.unique_bytes"


def test_hand_derived_sizes():
    assert (expected_saved_bytes(256), expected_saved_bytes(512)) == (12_544, 20_736)


def test_check_fails_on_growth_over_the_percent(real_runs, capsys):
    # GIVEN b saves 8 KiB more than a for the same step (+65.3%), WHEN gated at +5%
    rc = main(["check", str(real_runs["b"]), "--baseline", str(real_runs["a"]), "--max", f"{SAVED}=+5%"])
    out, err = capsys.readouterr()
    # THEN exit 1, one line per function: 5% of 12,544 B is 627.2 B allowed
    assert rc == 1
    assert out.splitlines() == [
        "0.training_step.end saved_tensors.unique_bytes: median of 2 calls, 20.25 KiB (20,736), "
        "baseline 12.25 KiB (12,544): +8.00 KiB (+65.3%), over the allowed +5% (+627 B); "
        "set by --max saved_tensors.unique_bytes=+5%"
    ]
    assert "1 of 1 values over budget" in err


def test_check_growth_limit_exact_and_one_byte_less(real_runs, capsys):
    base = ["check", str(real_runs["b"]), "--baseline", str(real_runs["a"])]
    assert main([*base, "--max", f"{SAVED}=+8KiB"]) == 0  # +8,192 allowed, +8,192 found
    assert capsys.readouterr().out.strip() == "memprofiler check: all 1 values within budget"
    assert main([*base, "--max", f"{SAVED}=+8191B"]) == 1
    # 8192 / 12544 = 65.306%: +65.4% passes, +65.3% does not
    assert main([*base, "--max", f"{SAVED}=+65.4%"]) == 0
    assert main([*base, "--max", f"{SAVED}=+65.3%"]) == 1


def test_check_absolute_and_relative_limits_together(real_runs, capsys):
    rc = main(
        [
            "check",
            str(real_runs["b"]),
            "--baseline",
            str(real_runs["a"]),
            "--max",
            f"{SAVED}=20KiB",  # 20,736 > 20,480 on both calls: 2 lines
            "--max",
            f"{SAVED}=+100%",  # within
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert rc == 1
    assert [line.split(" ")[0] for line in out] == ["0.training_step.2.end", "0.training_step.3.end"]


def _with_rss_peaks(src: Path, dst: Path, peaks: list[int]) -> Path:
    """A copy of run ``src`` whose end snapshots have the given ``rss_peak``, call by call."""
    shutil.copytree(src, dst)
    stats = dst / "rank_0_memory_stats.yaml"
    snaps = yaml.safe_load(stats.read_text())
    ends = [k for k in snaps if k.endswith(".end")]
    assert len(ends) == len(peaks)
    for key, peak in zip(ends, peaks, strict=True):
        snaps[key]["rss_peak"] = peak
    stats.write_text(yaml.safe_dump(snaps, sort_keys=False))
    return dst


def test_the_runs_own_noise_is_added_to_the_allowance(real_runs, tmp_path, capsys):
    # GIVEN rss_peak 1000 and 1010 MiB in the baseline, 1040 and 1050 MiB in the run: medians
    # 1005 and 1045 MiB (+40 MiB); noise = the larger range across calls = 10 MiB
    a = _with_rss_peaks(real_runs["a"], tmp_path / "a", [1000 * MiB, 1010 * MiB])
    b = _with_rss_peaks(real_runs["a"], tmp_path / "b", [1040 * MiB, 1050 * MiB])
    args = ["check", str(b), "--baseline", str(a), "--key", "*.end"]
    # +3% of 1005 MiB = 30.15 MiB, plus 10 MiB noise = 40.15 MiB >= 40 MiB: passes
    assert main([*args, "--max", "rss_peak=+3%"]) == 0
    # +2% = 20.1 MiB, plus 10 MiB = 30.1 MiB < 40 MiB: fails, and the line says the noise
    assert main([*args, "--max", "rss_peak=+2%"]) == 1
    line = capsys.readouterr().out.splitlines()[-1]
    assert line == (
        "0.training_step.end rss_peak: median of 2 calls, 1.02 GiB (1,095,761,920), baseline 1005.00 MiB "
        "(1,053,818,880): +40.00 MiB (+4.0%), over the allowed +2% (+20.10 MiB) plus the noise 10.00 MiB; "
        "set by --max rss_peak=+2%"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max", "rss_peak=+5%"], "`--max rss_peak=+5%`: a limit on the rise needs a run to rise over"),
        (["--max", "rss_peak=105%", "--baseline", "A"], "`--max rss_peak`: got '105%'; a limit over the"),
        (["--max", "rss_peek=+5%", "--baseline", "A"], "`--max rss_peek`: matches no metric both runs hold"),
        (["--max", "rss_peak=1.5"], "`--max rss_peak`: got '1.5' without a unit; rss_peak is in bytes"),
        (["--max", "rss_peak=700"], "write 700GiB or 700MiB (700B for 700 bytes)"),
        (["--max", "rss_peak=1.5B"], "= 1.5 bytes; a byte limit is a whole number"),
        # a CUDA limit on runs without a GPU says so, for the rise and for a budget
        (
            ["--max", "allocated_bytes.all.peak=+5%", "--baseline", "A"],
            "memprofiler); a CUDA figure, and no call there has one (no GPU in the run: leave CUDA limits "
            "out on a CPU runner); metrics there: rss, rss_peak, ",
        ),
        (["--max", "reserved_bytes.all.peak=1GiB"], "memprofiler; a CUDA figure, and no call there has one"),
        # a block whose layers saved the bytes (its own share: none) names the pattern of its layers
        (
            ["--max", "saved_tensors.by_module.enc=+5%", "--baseline", "A"],
            "`saved_tensors.by_module.enc.*` limits each of its submodules; metrics there:",
        ),
    ],
)
def test_bad_limits_one_line_exit_2(real_runs, capsys, args, message):
    args = [str(real_runs["a"]) if a == "A" else a for a in args]
    rc = main(["check", str(real_runs["b"]), *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err, err


def test_count_metrics_take_bare_numbers(real_runs, capsys):
    # saved_tensors.count is 7 tensors per call in both runs
    assert main(["check", str(real_runs["a"]), "--max", "saved_tensors.count=7"]) == 0
    assert main(["check", str(real_runs["a"]), "--max", "saved_tensors.count=6"]) == 1


def test_diff_fail_on_exit_1_with_the_table_first(real_runs, capsys):
    rc = main(
        ["diff", str(real_runs["a"]), str(real_runs["b"]), "--metric", "saved*", "--fail-on", f"{SAVED}=+5%"]
    )
    out, err = capsys.readouterr()
    assert rc == 1
    assert out.index("Differences per function") < out.index("over the allowed +5% (+627 B)")
    assert "1 of 1 compared values rose over --fail-on" in err
    assert main(["diff", str(real_runs["a"]), str(real_runs["b"]), "--fail-on", f"{SAVED}=+8KiB"]) == 0
    assert "all 1 compared values within --fail-on" in capsys.readouterr().out


def test_diff_fail_on_refuses_an_absolute_limit_and_per_call(real_runs, capsys):
    a, b = str(real_runs["a"]), str(real_runs["b"])
    assert main(["diff", a, b, "--fail-on", "rss_peak=2GiB"]) == 2
    assert "an absolute budget is `memprofiler check RUN --max rss_peak=2GiB`" in capsys.readouterr().err
    assert main(["diff", a, b, "--per-call", "--fail-on", "rss_peak=+5%"]) == 2
    assert "`--fail-on`: cannot gate --per-call" in capsys.readouterr().err


def test_parse_growth():
    g = parse_growth("saved_tensors.unique_bytes=+1.5MiB", "--max")
    assert (g.percent, g.amount, g.allowance(10.0)) == (None, 1.5 * MiB, 1.5 * MiB)
    assert parse_growth("rss_peak=+0%", "--max").allowance(5.0) == 0.0
    with pytest.raises(ConfigError, match="the percentage must be a finite number >= 0"):
        parse_growth("rss_peak=+nan%", "--max")
