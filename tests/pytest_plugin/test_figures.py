"""``--memprofiler-dir``: figures `memprofiler report` / `diff` read, under xdist too; the fixture."""

from __future__ import annotations

import pytest
import yaml

from memprofiler.__main__ import main

pytest_plugins = ["pytester", "_pytester"]

KIB = 1024

SUITE = """
@pytest.mark.memory_budget(saved_tensors="1MiB")
def test_wide():
    step(batch=64, width={width})

@pytest.mark.memory_budget(saved_tensors="1MiB")
def test_narrow():
    step(batch=32)

def test_unmarked():
    step(batch=32)
"""


def _stats(run_dir):
    return yaml.safe_load((run_dir / "rank_0_memory_stats.yaml").read_text())


def test_two_commits_figures_are_reported_and_diffed(inner, capsys):
    # GIVEN the same suite before and after a change that doubles one hidden layer (256 -> 512)
    inner.write("test_suite", SUITE.format(width=256))
    inner.run("--memprofiler-dir", "before").assert_outcomes(passed=3)
    inner.write("test_suite", SUITE.format(width=512))
    inner.run("--memprofiler-dir", "after").assert_outcomes(passed=3)
    before, after = inner.path / "before", inner.path / "after"
    # THEN each marked test is one call: the input (64 KiB) plus two ReLU outputs of 64 x width
    key = "0.test_suite.py::test_wide.1.end"
    assert _stats(before)[key]["saved_tensors.unique_bytes"] == 192 * KIB
    assert _stats(after)[key]["saved_tensors.unique_bytes"] == 64 * KIB + 128 * KIB + 64 * KIB
    assert _stats(after)[key]["saved_tensors.by_module"] == {
        "net.1": 128 * KIB,
        "net.0": 64 * KIB,
        "net.3": 64 * KIB,
    }
    assert sorted(_stats(after)) == [
        "0.test_suite.py::test_narrow.1.end",
        "0.test_suite.py::test_narrow.1.start",
        "0.test_suite.py::test_wide.1.end",
        "0.test_suite.py::test_wide.1.start",
    ]
    manifest = yaml.safe_load((after / "memprofiler_run.yaml").read_text())
    assert (manifest["status"], manifest["world_size"]) == ("finished", 1)
    # WHEN `memprofiler report` and `memprofiler diff` read them
    capsys.readouterr()
    assert main(["report", str(after), "--no-html"]) == 0
    report = capsys.readouterr().out
    assert main(["diff", str(before), str(after), "--metric", "saved_tensors.*"]) == 0
    diff = capsys.readouterr().out
    # THEN the report lists the tests, and the diff shows the one change with its exact bytes
    assert "test_suite.py::test_wide" in report and "test_suite.py::test_narrow" in report
    rows = [
        tuple(c.strip() for c in line.strip("│").split("│"))
        for line in diff.splitlines()
        if line.startswith("│")
    ]
    # (diff's default table: per function and phase, with the calls both runs hold and the noise)
    wide = "0.test_suite.py::test_wide.end"
    assert rows == [
        (wide, "saved_tensors.packed_bytes", "1", "512.00 KiB", "896.00 KiB", "+384.00 KiB", "+75.0%", "-"),
        (wide, "saved_tensors.by_module.net.1", "1", "64.00 KiB", "128.00 KiB", "+64.00 KiB", "+100.0%", "-"),
        (wide, "saved_tensors.unique_bytes", "1", "192.00 KiB", "256.00 KiB", "+64.00 KiB", "+33.3%", "-"),
    ]


def test_a_second_run_into_the_same_dir_writes_version_1(inner):
    # GIVEN a directory that already holds a run
    inner.write("test_suite", SUITE.format(width=256))
    inner.run("--memprofiler-dir", "figures").assert_outcomes(passed=3)
    # WHEN the suite runs into it again
    inner.run("--memprofiler-dir", "figures").assert_outcomes(passed=3)
    # THEN nothing is overwritten: the second run is in version_1
    assert len(_stats(inner.path / "figures")) == 4
    assert len(_stats(inner.path / "figures" / "version_1")) == 4


@pytest.mark.slow
def test_under_xdist_each_worker_measures_and_the_controller_writes_one_run(inner):
    # GIVEN the suite, one test over budget and one with a typo, run on two xdist workers
    inner.write(
        "test_suite",
        SUITE.format(width=256)
        + """
@pytest.mark.memory_budget(saved_tensors="64KiB")
def test_over():
    step(batch=64)

@pytest.mark.memory_budget(rss_peak="1 GiBs")
def test_typo():
    pass
""",
    )
    # WHEN it runs
    result = inner.run("-n", "2", "--memprofiler-dir", "figures", subprocess=True)
    # THEN the worker's failure line reaches the controller; a worker cannot end the session on a
    # usage error, so the typo errors its test with the same line
    result.assert_outcomes(passed=3, failed=1, errors=1)
    result.stdout.fnmatch_lines_random(
        [
            "memory_budget: saved_tensors.unique_bytes = 192.00 KiB (196,608), over budget 64.00 KiB "
            "(65,536); top modules by saved bytes: net.0 64.00 KiB, net.1 64.00 KiB, net.3 64.00 KiB",
            "usage error: test_suite.py::test_typo: `memory_budget(rss_peak='1 GiBs')`: got '1 GiBs'; "
            "expected a number with an optional unit *",
        ]
    )
    # AND one run holds every measured test's figures, keyed as without xdist
    stats = _stats(inner.path / "figures")
    assert {k: v["saved_tensors.unique_bytes"] for k, v in stats.items() if k.endswith(".end")} == {
        "0.test_suite.py::test_wide.1.end": 192 * KIB,
        "0.test_suite.py::test_narrow.1.end": 96 * KIB,
        "0.test_suite.py::test_over.1.end": 192 * KIB,
    }


def test_the_memprofiler_fixture_profiles_explicitly(inner):
    # GIVEN a test that profiles two steps with the fixture
    inner.write(
        "test_fixture",
        """
def test_steps(memprofiler):
    model = MLP()
    for batch in (64, 32):
        with memprofiler.profile("training_step", module=model):
            model(torch.randn(batch, 256)).sum().backward()
    ends = [memprofiler.snapshots[f"0.training_step.{n}.end"]["saved_tensors.unique_bytes"] for n in (1, 2)]
    assert ends == [192 * 1024, 96 * 1024]
    assert memprofiler.save_dir.parent.name.startswith("test_steps")
""",
    )
    # WHEN it runs
    result = inner.run("-W", "ignore::UserWarning")
    # THEN the profiler collected every call with exact saved bytes
    result.assert_outcomes(passed=1)
