"""``memory_leak``: graphs kept alive and CUDA memory left allocated, with what holds them."""

from __future__ import annotations

pytest_plugins = ["pytester", "_pytester"]

KIB = 1024
MIB = 1024 * KIB

#: Inner conftest: a fake CUDA device (tests/fake_cuda.py) in place of the real one.
FAKE_CUDA = """
import pytest
from fake_cuda import FakeCudaBackend

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    config.pluginmanager.get_plugin("memprofiler-budgets").cuda_backend = FakeCudaBackend()

@pytest.fixture
def device(request):
    return request.config.pluginmanager.get_plugin("memprofiler-budgets").cuda_backend
"""


def test_a_loss_kept_in_a_list_is_a_leak_naming_its_holder(inner):
    # GIVEN a test that keeps its loss (and with it the graph) in a module-level list,
    # and one that runs backward and drops everything
    inner.write(
        "test_graphs",
        """
kept = []

@pytest.mark.memory_leak()
def test_keeps_loss():
    kept.append(MLP()(torch.randn(8, 256)).sum())

@pytest.mark.memory_leak()
def test_clean():
    step(batch=8)
""",
    )
    # WHEN the suite runs
    result = inner.run()
    # THEN the kept graph's saved activations (two ReLU outputs of 8 x 256 float32) are reported
    # with the modules that saved them and the list that holds the loss
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "memory_leak: saved_tensors = 16.00 KiB (16,384) saved for backward by graphs still alive after "
            "the test (3 tensors), over budget 0 B (0); saved by: net.1 8.00 KiB, net.3 8.00 KiB; "
            "held by: list `test_graphs.kept`",
        ]
    )


def test_holders_are_named_by_module_and_class_attribute(inner):
    # GIVEN a loss kept under a key of a dict that a helper module holds as a global, and one in
    # a list that a test class holds as a class attribute
    inner.pytester.makepyfile(helpers="CACHE = {}\n")
    inner.write(
        "test_held",
        """
import helpers

@pytest.mark.memory_leak()
def test_in_helper_dict():
    helpers.CACHE["last"] = MLP()(torch.randn(8, 256)).sum()

class TestHeld:
    keep = []

    @pytest.mark.memory_leak()
    def test_in_class_list(self):
        TestHeld.keep.append(MLP()(torch.randn(8, 256)).sum())
""",
    )
    # WHEN the suite runs
    result = inner.run()
    # THEN each holder is named as the user wrote it, not as `dict key 'last'`
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines_random(
        [
            "memory_leak: saved_tensors = 16.00 KiB * held by: dict `helpers.CACHE`, key 'last'",
            "memory_leak: saved_tensors = 16.00 KiB * held by: list `TestHeld.keep` (class attribute)",
        ]
    )
    assert "dict key 'last'" not in result.stdout.str()


def test_graph_budget_allows_a_known_cache(inner):
    # GIVEN a kept graph of 16 KiB and a 16 KiB saved_tensors allowance
    inner.write(
        "test_cache",
        """
class Cache:
    def __init__(self):
        self.losses = []

CACHE = Cache()

@pytest.mark.memory_leak(saved_tensors="16KiB")
def test_within():
    CACHE.losses.append(MLP()(torch.randn(8, 256)).sum())

@pytest.mark.memory_leak(saved_tensors="8KiB")
def test_over():
    CACHE.losses.append(MLP()(torch.randn(8, 256)).sum())
""",
    )
    # WHEN the suite runs
    result = inner.run()
    # THEN only the test over its allowance fails, naming the attribute that holds the graph
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "memory_leak: saved_tensors = 16.00 KiB (16,384) * over budget 8.00 KiB (8,192); "
            "saved by: net.1 8.00 KiB, net.3 8.00 KiB; held by: list attribute `losses` of Cache instance",
        ]
    )


def test_cuda_bytes_left_allocated_fail_the_leak_budget(inner):
    # GIVEN a fake CUDA device: one test leaves 4 MiB allocated, one frees what it allocated
    inner.pytester.makeconftest(FAKE_CUDA)
    inner.write(
        "test_cuda_leak",
        """
@pytest.mark.memory_leak(cuda="1MiB")
def test_leaves_4mib(device):
    device.alloc(4 * 2**20)

@pytest.mark.memory_leak(cuda="1MiB")
def test_frees(device):
    device.free(device.alloc(64 * 2**20))
""",
        model=False,
    )
    # WHEN the suite runs
    result = inner.run()
    # THEN the 4 MiB are reported exactly; the fake's memory has no Python holder to name
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "memory_leak: cuda = 4.00 MiB (4,194,304) still allocated after the test, over budget "
            "1.00 MiB (1,048,576); held by: no Python reference found (held by C++ or another graph)",
        ]
    )


def test_cuda_peak_budget_with_a_device(inner):
    # GIVEN a fake CUDA device and a test that allocates and frees 3 GiB
    inner.pytester.makeconftest(FAKE_CUDA)
    inner.write(
        "test_cuda_peak",
        """
@pytest.mark.memory_budget(cuda_peak="2GiB")
def test_transient(device):
    base = device.allocated
    device.free(device.alloc(3 * 2**30 - base))

@pytest.mark.memory_budget(cuda_peak="2GiB")
def test_small(device):
    device.free(device.alloc(2**20))
""",
        model=False,
    )
    # WHEN the suite runs
    result = inner.run()
    # THEN the peak since the test's start (the allocator's reset peak) is over budget, exactly
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "memory_budget: allocated_bytes.all.peak = 3.00 GiB (3,221,225,472), over budget 2.00 GiB "
            "(2,147,483,648); top modules by saved bytes: none",
        ]
    )


def test_cuda_leak_budget_on_cpu_is_skipped_with_a_reason(inner, monkeypatch):
    # GIVEN no CUDA device and an explicit CUDA leak budget
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    inner.write(
        "test_no_gpu",
        """
@pytest.mark.memory_leak(cuda="1MiB")
def test_gpu_cache():
    step(batch=8)
""",
    )
    # WHEN the suite runs
    result = inner.run("-rs")
    # THEN it is a skip that says why
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "SKIPPED [[]1[]] *: memory_leak: cuda not checked: no CUDA device in this run (all else its "
            "markers ask was checked and passed)"
        ]
    )
