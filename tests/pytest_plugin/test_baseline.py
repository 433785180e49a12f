"""``--memprofiler-baseline DIR``: budgets written as a rise over the same test's stored figures.

The step of ``_pytester.MODEL`` saves, for batch 64: the input of ``net.0`` (64 x 256 float32,
64 KiB), the first ReLU's output (64 x width, kept once for ``net.1`` and ``net.2``) and the
last ReLU's output (64 KiB): 192 KiB at width 256, 256 KiB at width 512, a rise of 64 KiB (+33.3%).
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester", "_pytester"]

KIB = 1024

TEST = """
WIDTH = {width}

@pytest.mark.memory_budget(saved_tensors="{limit}")
def test_step():
    step(width=WIDTH)
"""


def _baseline(inner, limit: str = "+10%") -> None:
    inner.write("test_grow", TEST.format(width=256, limit=limit))
    result = inner.run("--memprofiler-dir", "base", "-rs")
    # without a baseline the rise is not checked, and the run says so
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["*memory_budget: saved_tensors.unique_bytes=+10% not checked: no --memprofiler-baseline DIR given*"]
    )


def test_a_rise_over_the_allowed_percent_fails_with_both_figures(inner):
    # GIVEN the figures of the test at width 256 stored as the baseline
    _baseline(inner)
    # WHEN the test, now at width 512, runs against it
    inner.write("test_grow", TEST.format(width=512, limit="+10%"))
    result = inner.run("--memprofiler-baseline", "base")
    # THEN it fails: 10% of 192 KiB is 19.2 KiB, the step saves 64 KiB more
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "memory_budget: saved_tensors.unique_bytes = 256.00 KiB (262,144), baseline 192.00 KiB (196,608): "
            "+64.00 KiB, +33.3%, over the allowed +10% (+19.20 KiB); top modules by saved bytes: "
            "net.1 128.00 KiB, net.0 64.00 KiB, net.3 64.00 KiB"
        ]
    )


def test_a_rise_of_a_block_counts_its_submodules(inner):
    # GIVEN a rise allowed on `net`, whose layers saved 192 KiB at width 256 (its own share: nothing)
    test = TEST.replace('saved_tensors="{limit}"', '"saved_tensors.by_module.net=+10%"')
    inner.write("test_grow", test.format(width=256))
    inner.run("--memprofiler-dir", "base")
    # WHEN the test, now at width 512, runs against it
    inner.write("test_grow", test.format(width=512))
    result = inner.run("--memprofiler-baseline", "base")
    # THEN the block's rise of 64 KiB fails it
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "memory_budget: saved_tensors.by_module.net = 256.00 KiB (262,144), "
            "baseline 192.00 KiB (196,608): +64.00 KiB, +33.3%*"
        ]
    )


@pytest.mark.parametrize(
    ("limit", "passed"), [("+34%", True), ("+33%", False), ("+64KiB", True), ("+63KiB", False)]
)
def test_the_limit_is_exact(inner, limit, passed):
    inner.write("test_grow", TEST.format(width=256, limit=limit))
    inner.run("--memprofiler-dir", "base")
    inner.write("test_grow", TEST.format(width=512, limit=limit))
    result = inner.run("--memprofiler-baseline", "base")
    result.assert_outcomes(**({"passed": 1} if passed else {"failed": 1}))


def test_a_test_missing_from_the_baseline_is_skipped_with_the_reason(inner):
    _baseline(inner)
    inner.write("test_new", TEST.format(width=256, limit="+10%"))
    result = inner.run("--memprofiler-baseline", "base", "-rs", "test_new.py")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["*not checked: the test is not in --memprofiler-baseline base (a new test?)*"]
    )


def test_a_missing_baseline_is_a_usage_error(inner):
    inner.write("test_grow", TEST.format(width=256, limit="+10%"))
    result = inner.run("--memprofiler-baseline", "nowhere")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: `--memprofiler-baseline` 'nowhere': *"])
