"""The suite's CUDA gate skips tests marked ``cuda``, and only those.

It used to key on ``"cuda" in item.keywords``: a keyword is also every node name and every
parametrize id, so a CPU test whose id is ``cuda`` was skipped without a word.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _cuda_gate import REASON

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

#: The inner session's gate: the suite's own, as on a machine without a GPU (on any machine).
INNER_CONFTEST = """
from _cuda_gate import skip_cuda_tests

def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device")

def pytest_collection_modifyitems(config, items):
    skip_cuda_tests(items, cuda_available=False)
"""

INNER_TESTS = """
import pytest

@pytest.mark.parametrize("device", ["cuda", "cpu"], ids=["cuda", "cpu"])
def test_device_named_in_the_id(device):
    assert device in ("cuda", "cpu")

@pytest.mark.cuda
@pytest.mark.parametrize("device", ["cuda"], ids=["cuda"])
def test_marked(device):
    raise AssertionError("a marked test ran on a machine without a GPU")

class cuda:  # noqa: N801 - a class named like the marker, without it
    def test_in_a_class_named_cuda(self):
        pass

@pytest.mark.cuda
class TestMarkedClass:
    def test_inherits_the_mark(self):
        raise AssertionError("ran")
"""


def test_only_the_marker_skips_and_an_id_named_cuda_runs(pytester: pytest.Pytester, monkeypatch):
    # GIVEN tests whose id, or class, is `cuda` without the marker, and two marked ones
    monkeypatch.setenv("PYTHONPATH", str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.syspath_prepend(str(TESTS))
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_gate=INNER_TESTS)
    pytester.makeini("[pytest]\npython_classes = Test* cuda\n")
    # WHEN the suite's gate runs them on a machine without a GPU
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-rs", "-v")
    # THEN the unmarked ones run and pass, the marked ones skip with the gate's reason
    result.assert_outcomes(passed=3, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*test_device_named_in_the_id[[]cuda[]] PASSED*",
            "*test_device_named_in_the_id[[]cpu[]] PASSED*",
            "*test_marked[[]cuda[]] SKIPPED*",
            "*cuda::test_in_a_class_named_cuda PASSED*",
            "*TestMarkedClass::test_inherits_the_mark SKIPPED*",
        ]
    )
    assert result.stdout.str().count(REASON) == 2
