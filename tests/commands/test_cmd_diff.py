"""``memprofiler diff`` between two real CPU runs that differ only in hidden width (256 vs 512)."""

from __future__ import annotations

import pytest

from memprofiler.__main__ import main
from memprofiler.analysis.diff import diff_runs
from memprofiler.analysis.runs.artifacts import load_run
from run_fixtures import expected_saved_bytes


def test_rows_hold_a_b_change_and_percent_sorted_by_absolute_change(real_runs):
    rows = diff_runs(load_run(real_runs["a"]), load_run(real_runs["b"]), metrics=["saved_tensors.*"])
    unique = [r for r in rows if r.metric == "saved_tensors.unique_bytes"]
    a, b = expected_saved_bytes(256), expected_saved_bytes(512)
    assert [(r.key, r.a, r.b, r.change) for r in unique] == [
        (f"0.training_step.{c}.end", a, b, b - a) for c in (2, 3)
    ]
    assert unique[0].percent == 100.0 * (b - a) / a
    changes = [abs(r.change) for r in rows if r.change is not None]
    assert changes == sorted(changes, reverse=True)
    # the ReLU output doubles: 8 x 256 -> 8 x 512 float32
    relu = [r for r in rows if r.metric == "saved_tensors.by_module.enc.1"]
    assert {(r.a, r.b) for r in relu} == {(8192, 16384)}


def test_cli_table_and_filters(real_runs, capsys):
    rc = main(
        [
            "diff",
            str(real_runs["a"]),
            str(real_runs["b"]),
            "--metric",
            "saved_tensors.unique_bytes",
            "--key",
            "*.2.end",
            "--per-call",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    [line] = [ln for ln in out.splitlines() if "saved_tensors.unique_bytes" in ln]
    cells = [c.strip() for c in line.strip("│ ").split("│")]
    assert cells == [
        "0.training_step.2.end",
        "saved_tensors.unique_bytes",
        "12.25 KiB",
        "20.25 KiB",
        "+8.00 KiB",
        "+65.3%",
    ]


def test_min_change_and_top(real_runs, capsys):
    assert (
        main(
            [
                "diff",
                str(real_runs["a"]),
                str(real_runs["b"]),
                "--metric",
                "saved_tensors.*",
                "--min-change",
                "1MiB",
            ]
        )
        == 0
    )
    assert "no differences" in capsys.readouterr().out
    assert (
        main(["diff", str(real_runs["a"]), str(real_runs["b"]), "--metric", "saved_tensors.*", "--top", "1"])
        == 0
    )
    assert "(1 of " in capsys.readouterr().out


def test_same_run_has_no_differences_unless_all(real_runs, capsys):
    assert main(["diff", str(real_runs["a"]), str(real_runs["a"])]) == 0
    assert "no differences" in capsys.readouterr().out
    assert main(["diff", str(real_runs["a"]), str(real_runs["a"]), "--all", "--metric", "rss_peak"]) == 0
    assert "+0.0%" in capsys.readouterr().out


def test_missing_side_shown_as_missing(real_runs, tmp_path, capsys):
    import shutil

    import yaml

    b = tmp_path / "b"
    shutil.copytree(real_runs["a"], b)
    stats = yaml.safe_load((b / "rank_0_memory_stats.yaml").read_text())
    del stats["0.training_step.3.end"]
    (b / "rank_0_memory_stats.yaml").write_text(yaml.safe_dump(stats))
    assert main(["diff", str(real_runs["a"]), str(b), "--metric", "rss_peak", "--per-call"]) == 0
    out = capsys.readouterr().out
    assert "0.training_step.3.end" in out and "(missing)" in out


def test_bad_run_dir_exit_2(real_runs, tmp_path, capsys):
    assert main(["diff", str(real_runs["a"]), str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such directory" in err


def test_aggregate_medians_of_long_runs_are_exact(tmp_path):
    # GIVEN two runs of 5,001 and 5,000 calls (numpy's median path) with known values
    import random

    import yaml

    from memprofiler.analysis.diff import diff_functions

    rng = random.Random(3)

    def write(name: str, calls: int, scale: int) -> None:
        run = tmp_path / name
        run.mkdir()
        vals = list(range(1, calls + 1))
        rng.shuffle(vals)
        snaps = {
            f"0.training_step.{i + 1}.end": {"rss": v * scale, "by": {"m": v}} for i, v in enumerate(vals)
        }
        (run / "rank_0_memory_stats.yaml").write_text(yaml.safe_dump(snaps, sort_keys=False))

    write("a", 5001, 10)
    write("b", 5000, 30)
    # WHEN compared by function
    rows, unmatched = diff_functions(
        load_run(tmp_path / "a"), load_run(tmp_path / "b"), include_unchanged=True
    )
    by = {r.metric: r for r in rows}
    # THEN each median is the exact middle of the calls both runs hold (1..5000 shuffled in A's
    # first 5,000 calls is not 1..5000, so only B's median is known in closed form)
    assert by["rss"].b == 30 * 2500.5 and by["by.m"].b == 2500.5
    a_vals = sorted(
        v["rss"]
        for k, v in yaml.safe_load((tmp_path / "a" / "rank_0_memory_stats.yaml").read_text()).items()
        if int(k.split(".")[2]) <= 5000
    )
    assert by["rss"].a == (a_vals[2499] + a_vals[2500]) / 2
    assert unmatched.only_a == {"0.training_step.end": [5001]}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 2047, 2048, 2049, 5000])
def test_median_and_spread_agree_with_statistics_on_both_paths(n):
    # GIVEN byte counts and floats, below and above the length numpy takes over at
    import random
    import statistics

    from memprofiler.analysis.diff import _median_spread

    rng = random.Random(n)
    for values in ([rng.randrange(2**40) for _ in range(n)], [rng.random() * 1e9 for _ in range(n)]):
        # WHEN summarised
        median, spread = _median_spread(list(values), spread=True)
        # THEN the median is statistics' exactly, the spread its interquartile range (range for 2-3)
        assert median == statistics.median(values)
        if n == 1:
            assert spread is None
        elif n < 4:
            assert spread == max(values) - min(values)
        else:
            q = statistics.quantiles(values, n=4)
            assert spread == pytest.approx(q[2] - q[0], rel=1e-12)
        assert _median_spread(list(values), spread=False) == (median, None)


def test_medians_of_huge_counts_stay_exact():
    # GIVEN long lists of ints beyond float64's 2**53 (and beyond 64 bits)
    import statistics

    from memprofiler.analysis.diff import _median_spread

    for base in (2**60, 2**70):
        values = [base + i for i in range(3001)] + [base + 7]
        # THEN numpy's path is not taken where it would round
        assert _median_spread(list(values), spread=False)[0] == statistics.median(values)


def _write_run(path, snaps):
    import yaml

    path.mkdir()
    (path / "rank_0_memory_stats.yaml").write_text(yaml.safe_dump(snaps, sort_keys=False))


def test_streamed_pairs_in_any_order_match_the_whole_run_comparison(tmp_path):
    # GIVEN B listing its calls in reverse, with calls A lacks and A calls B lacks, and values
    # an int64 column cannot hold (a float, an int beyond 64 bits) arriving midway
    import random
    import statistics

    from memprofiler.analysis.diff import diff_functions

    rng = random.Random(5)
    a = {f"0.training_step.{c}.end": {"rss": rng.randrange(10**9), "by": {"m": c}} for c in range(1, 3001)}
    b = {
        f"0.training_step.{c}.end": {"rss": rng.randrange(10**9), "by": {"m": 2 * c}}
        for c in range(3000, 10, -1)
    }
    b["0.training_step.3001.end"] = {"rss": 1, "by": {"m": 1}}
    a["0.training_step.1500.end"]["rss"] = 1.5
    b["0.training_step.1600.end"]["rss"] = 2**70
    _write_run(tmp_path / "a", a)
    _write_run(tmp_path / "b", b)
    # WHEN compared by function (both read a block at a time, side by side)
    rows, unmatched = diff_functions(
        load_run(tmp_path / "a", streamed=True),
        load_run(tmp_path / "b", streamed=True),
        include_unchanged=True,
    )
    # THEN the medians over the calls both hold, exactly, and the one-sided calls named
    both = [k for k in a if k in b]
    by = {r.metric: r for r in rows}
    assert by["rss"].calls == len(both) == 2990
    assert by["rss"].a == statistics.median(a[k]["rss"] for k in both)
    assert by["rss"].b == statistics.median(b[k]["rss"] for k in both)
    assert (by["by.m"].a, by["by.m"].b) == (1505.5, 3011.0)
    assert unmatched.only_a == {"0.training_step.end": list(range(1, 11))}
    assert unmatched.only_b == {"0.training_step.end": [3001]}
