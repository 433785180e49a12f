"""Module-wise flat keys are read from the device training uses, not the one with the largest peak.

On the H200, ``test_tracker_peaks_merged_at_step_end_are_logged_at_the_calls_step`` logged
``module_mem.peak.parameter == 0``: TinyModel allocates a 64 MiB CPU tensor inside every GPU step,
so the tracker's CPU peak total (64 MiB) beat the GPU's (a few KiB), and the flat keys were read
from ``cpu``, where there are no parameters. Here the tracker's report has the same two devices.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from memprofiler.collectors import mem_report
from memprofiler.collectors.base import CallContext
from memprofiler.collectors.module_mem import ModuleMemCollector
from memprofiler.collectors.tracker_window import training_device

MIB = 1 << 20
PARAM_BYTES = (16 * 32 + 32 + 32 * 1 + 1) * 4  # TinyModel's two Linear layers, fp32
CATEGORIES = ("Parameter", "Buffer", "Gradient", "Activation", "Temp", "Optstate", "Other")


def _cats(**bytes_: int) -> dict[str, int]:
    cats = {c: bytes_.get(c.lower(), 0) for c in CATEGORIES}
    cats["Total"] = sum(cats.values())
    return cats


#: What MemTracker reports for a TinyModel step on the GPU: the 64 MiB host scratch on ``cpu``,
#: parameters, gradients and activations on ``cuda:0``.
TWO_DEVICES = {
    torch.device("cpu"): _cats(temp=64 * MIB),
    torch.device("cuda", 0): _cats(parameter=PARAM_BYTES, gradient=PARAM_BYTES, activation=2048),
}


class FakeTracker:
    """The part of ``MemTracker`` the collector drives, with a fixed two-device report."""

    def __init__(self) -> None:
        self.memory_tracking: dict[Any, Any] = {}
        self.repeated_forward = False

    def reset_mod_stats(self) -> None:
        pass

    def track_external(self, *things: Any) -> None:
        pass

    def __enter__(self) -> FakeTracker:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def get_tracker_snapshot(self, kind: str) -> dict[torch.device, dict[str, int]]:
        return TWO_DEVICES


class FakeParam:
    def __init__(self, device: torch.device, numel: int) -> None:
        self.device = device
        self._numel = numel

    def numel(self) -> int:
        return self._numel

    def element_size(self) -> int:
        return 4


class PlacedModel(nn.Module):
    """A model whose parameters report ``device`` (a GPU cannot be had on CPU)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device_ = device

    def parameters(self, recurse: bool = True) -> Iterator[Any]:  # type: ignore[override]
        yield FakeParam(self.device_, PARAM_BYTES // 4)


class FakeTrackerCollector(ModuleMemCollector):
    def _new_tracker(self) -> Any:
        return FakeTracker()


def _flat_keys(model: nn.Module) -> dict[str, Any]:
    collector = FakeTrackerCollector()
    collector.bind_model(model, [])
    ctx = CallContext(fn_name="training_step", call=2, rank=0, module=model, closes_window=True)
    collector.start(ctx)
    collector.end(ctx, ok=True)
    return dict(collector.step_end()[ctx.call_id])


def test_gpu_training_reads_the_gpu_figures_from_a_two_device_report():
    # GIVEN the tracker's two-device report of a GPU step, the model's parameters on cuda:0
    keys = _flat_keys(PlacedModel(torch.device("cuda", 0)))
    # THEN the flat keys are cuda:0's: the parameter bytes, not the CPU's 0
    assert keys["module_mem.peak_device"] == "cuda:0"
    assert keys["module_mem.peak.parameter"] == PARAM_BYTES
    assert keys["module_mem.peak.gradient"] == PARAM_BYTES
    assert keys["module_mem.peak.total"] == 2 * PARAM_BYTES + 2048


def test_without_parameters_the_accelerator_wins_over_a_larger_cpu_peak():
    peak = mem_report.plain_snapshot(TWO_DEVICES)
    assert mem_report.main_device(peak) == "cuda:0"
    assert mem_report.peak_metrics(peak, "fsdp")["fsdp.peak.parameter"] == PARAM_BYTES


def test_cpu_only_report_and_cpu_training_read_the_cpu():
    cpu_only = {"cpu": _cats(parameter=PARAM_BYTES, temp=MIB)}
    assert mem_report.main_device(cpu_only) == "cpu"
    # a model trained on CPU whose step also touched the GPU: the parameters' device decides
    both = mem_report.plain_snapshot(TWO_DEVICES)
    assert mem_report.main_device(both, training="cpu") == "cpu"


def test_training_device_follows_a_model_moved_after_set_up():
    model = nn.Linear(4, 2)
    assert training_device(model) == "cpu"
    model.to("meta")  # moved after the collector was bound: read again when the window closes
    assert training_device(model) == "meta"
    assert training_device(nn.ReLU()) is None
