"""The measuring pieces on their own: module labels, alive graphs, the CUDA peak reset."""

from __future__ import annotations

import torch
from torch import nn

from fake_cuda import FakeCudaBackend
from memprofiler.collectors.host import HostCollector
from memprofiler.pytest_plugin.measure import BodyMeter

KIB = 1024


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())


class _Uninitialised(FakeCudaBackend):
    """A device present but not initialised: ``memory_stats()`` is empty, as torch's is."""

    def memory_stats(self, device: int | None = None) -> dict:
        return {}


def test_saved_bytes_by_module_of_a_model_built_inside_the_body():
    # GIVEN a meter and a model built after it started
    meter = BodyMeter(HostCollector("sampler"), None, leak=False)
    meter.start("t", 1)
    _model()(torch.randn(64, 256)).sum().backward()
    # WHEN it ends
    end = meter.end(ok=True)
    meter.close()
    # THEN each module's saved bytes are exact: input 64 KiB, two ReLU outputs of 64 KiB
    assert end["saved_tensors.unique_bytes"] == 192 * KIB
    assert end["saved_tensors.by_module"] == {"0": 64 * KIB, "1": 64 * KIB, "3": 64 * KIB}


def test_alive_graphs_are_found_and_released_ones_are_not():
    # GIVEN a body that keeps one loss and drops another
    meter = BodyMeter(HostCollector("sampler"), None, leak=True)
    meter.start("t", 1)
    model = _model()
    kept = model(torch.randn(8, 256)).sum()
    model(torch.randn(8, 256)).sum().backward()
    meter.end(ok=True)
    # WHEN the leaks are looked for
    leaks = meter.leaks()
    meter.close()
    # THEN only the kept graph's two ReLU outputs (8 KiB each) count
    assert (leaks.saved_count, leaks.saved_bytes, leaks.saved_by_module) == (
        3,
        16 * KIB,
        {"1": 8 * KIB, "3": 8 * KIB},
    )
    assert kept.grad_fn is not None


def test_cuda_peak_is_reset_only_on_an_initialised_device():
    # GIVEN a device not yet initialised, and one in use
    cold, warm = _Uninitialised(), FakeCudaBackend()
    for backend in (cold, warm):
        meter = BodyMeter(HostCollector("sampler"), backend, leak=False)
        # WHEN a body is measured
        meter.start("t", 1)
        meter.end(ok=True)
        meter.close()
    # THEN measuring never initialises the cold one, and resets the warm one's peak once
    assert (cold.resets, warm.resets) == (0, 1)
