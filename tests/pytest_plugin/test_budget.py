"""``memory_budget``: inner suites under budget pass, over budget fail with the exact line."""

from __future__ import annotations

import re

import yaml

pytest_plugins = ["pytester", "_pytester"]

KIB = 1024
MIB = 1024 * KIB


def test_saved_tensors_within_an_exact_budget_passes_and_one_byte_less_fails(inner):
    # GIVEN three activations of 64 x 256 float32 (64 KiB each) saved for backward
    inner.write(
        "test_saved",
        """
@pytest.mark.memory_budget(saved_tensors="192KiB")
def test_at_budget():
    step()

@pytest.mark.memory_budget(saved_tensors=192 * 1024 - 1)
def test_one_byte_over():
    step()
""",
    )
    # WHEN the suite runs
    result = inner.run()
    # THEN the exact budget passes, and one byte less fails with one line naming the top modules
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "memory_budget: saved_tensors.unique_bytes = 192.00 KiB (196,608), over budget 192.00 KiB "
            "(196,607); top modules by saved bytes: net.0 64.00 KiB, net.1 64.00 KiB, net.3 64.00 KiB",
        ]
    )


def test_metric_names_as_check_takes_them_and_per_module_budgets(inner):
    # GIVEN budgets written as `memprofiler check --max` METRIC=VALUE strings
    inner.write(
        "test_names",
        """
@pytest.mark.memory_budget("saved_tensors.by_module.net.0=32KiB", "saved_tensors.count=100")
def test_first_linear():
    step()
""",
    )
    # WHEN the suite runs
    result = inner.run()
    # THEN only the module over its budget is reported, with its exact bytes
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "memory_budget: saved_tensors.by_module.net.0 = 64.00 KiB (65,536), over budget 32.00 KiB "
            "(32,768); top modules by saved bytes: net.0 64.00 KiB, net.1 64.00 KiB, net.3 64.00 KiB",
        ]
    )
    assert "saved_tensors.count =" not in result.stdout.str()


def test_a_budget_on_a_block_counts_its_submodules(inner):
    # GIVEN a budget on `net`, the container whose layers saved 3 x 64 KiB (its own share: nothing),
    # the figure the report's "by block" row gives it
    inner.write(
        "test_block",
        """
@pytest.mark.memory_budget("saved_tensors.by_module.net=128KiB")
def test_over():
    step()

@pytest.mark.memory_budget("saved_tensors.by_module.net=192KiB")
def test_at():
    step()
""",
    )
    # WHEN the suite runs
    result = inner.run()
    # THEN the block's 192 KiB are checked, not its own share of 0 (which passed any budget)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "memory_budget: saved_tensors.by_module.net = 192.00 KiB (196,608) (the module with its "
            "submodules), over budget 128.00 KiB (131,072); top modules by saved bytes: net.0 64.00 KiB, "
            "net.1 64.00 KiB, net.3 64.00 KiB",
        ]
    )


def test_rss_transient_of_256mib_fails_a_128mib_budget_and_16mib_passes(inner):
    # GIVEN a 256 MiB and a 16 MiB transient host buffer (pages written, then freed)
    inner.write(
        "test_rss",
        """
@pytest.mark.memory_budget(rss_peak="128MiB")
def test_big():
    buf = b"\\x01" * (256 * 2**20)
    del buf

@pytest.mark.memory_budget(rss_peak="128MiB")
def test_small():
    buf = b"\\x01" * (16 * 2**20)
    del buf
""",
        model=False,
    )
    # WHEN the suite runs, writing its figures
    result = inner.run("--memprofiler-dir", "figures")
    # THEN the big transient fails with one line giving the rise over the start RSS
    result.assert_outcomes(passed=1, failed=1)
    lines = [line for line in result.outlines if line.startswith("memory_budget:")]
    assert len(lines) == 1
    assert re.fullmatch(
        r"memory_budget: rss_peak = 2[4-9]\d\.\d\d MiB \([\d,]+\) above the [\d.]+ [MG]iB RSS at the "
        r"test's start, over budget 128\.00 MiB \(134,217,728\); top modules by saved bytes: none",
        lines[0],
    ), lines[0]
    # AND the figures hold the peak over the start RSS: the transient, less what the heap already
    # held free (a few MiB), plus no more than noise
    stats = yaml.safe_load((inner.path / "figures" / "rank_0_memory_stats.yaml").read_text())
    start, end = stats["0.test_rss.py::test_big.1.start"], stats["0.test_rss.py::test_big.1.end"]
    assert 240 * MIB <= end["rss_peak"] - start["rss"] < 320 * MIB


def test_cuda_budget_on_cpu_is_skipped_with_a_reason_unless_another_budget_fails(inner, monkeypatch):
    # GIVEN a CPU-only run (no CUDA device) and a CUDA budget
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    inner.write(
        "test_cpu",
        """
@pytest.mark.memory_budget(cuda_peak="1GiB", saved_tensors="1MiB")
def test_fits_on_host():
    step()

@pytest.mark.memory_budget(cuda_peak="1GiB", saved_tensors="64KiB")
def test_over_on_host():
    step()
""",
    )
    # WHEN the suite runs
    result = inner.run("-rs")
    # THEN the CUDA budget is not passed silently: a skip with the reason; a host violation still fails
    result.assert_outcomes(skipped=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED [[]1[]] *: memory_budget: allocated_bytes.all.peak not checked: no CUDA device in "
            "this run (all else its markers ask was checked and passed)",
        ]
    )


def test_a_failing_body_keeps_its_own_failure_and_its_figures(inner):
    # GIVEN a marked test whose body raises
    inner.write(
        "test_raises",
        """
@pytest.mark.memory_budget(saved_tensors="1KiB")
def test_boom():
    step()
    raise ValueError("boom")

@pytest.mark.memory_budget(saved_tensors="1KiB")
def test_skips():
    pytest.skip("not on this machine")
""",
    )
    # WHEN the suite runs
    result = inner.run("--memprofiler-dir", "figures")
    # THEN the test's own error is reported, not a budget line, and its end snapshot says failed;
    # a body that skips is a skip, with no figures
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["E       ValueError: boom"])
    assert "memory_budget:" not in result.stdout.str()
    stats = yaml.safe_load((inner.path / "figures" / "rank_0_memory_stats.yaml").read_text())
    assert stats["0.test_raises.py::test_boom.1.end"]["failed"] is True
    assert stats["0.test_raises.py::test_boom.1.end"]["saved_tensors.unique_bytes"] == 192 * KIB
    assert not [key for key in stats if "test_skips" in key]
