"""Why the profiler views show two peaks for one device (allocator against memory by category),
and which operator, module and shape made each tensor live at the category peak."""

from __future__ import annotations

import json
import shutil
from html import escape

import pytest

from _trace_orders import GPU_RUN, GPU_TRACE
from memprofiler.analysis.traces.memory import DeviceMemory
from memprofiler.analysis.traces.memory_categories import TensorOrigin, read_category_file
from memprofiler.analysis.traces.peak_gap import explain, trace_device
from memprofiler.analysis.traces.views import build_views, trace_view
from memprofiler.reporters.traces.html import profiler_page

MIB = 2**20


def _dm(peak: int, at_ms: float = 5.0) -> DeviceMemory:
    return DeviceMemory("CPU", [(at_ms, peak, 0)], peak, at_ms, 0, [])


def _cats(tmp_path, rows, tensors=None):
    doc = {"format": "memprofiler-memory-categories", "version": 1, "categories": ["parameter", "activation", "unknown"],
           "devices": {"cpu": rows}}  # fmt: skip
    if tensors is not None:
        doc["tensors"] = tensors
    path = tmp_path / "c.memory_categories.json"
    path.write_text(json.dumps(doc))
    return read_category_file(path, 0.0)


def test_categories_above_the_allocator_by_the_tensors_from_before_the_cycle(tmp_path):
    # GIVEN 4 MiB of parameters from before the cycle and a 2 MiB activation made at 5 ms
    (tl,) = _cats(tmp_path, [[-1, 4 * MIB, 1, 0, 0], [5000, 2 * MIB, 2, 0, 1], [6000, -2 * MIB, 2, 0, 1]])
    assert (tl.peak_bytes, tl.preexisting_at_peak) == (6 * MIB, 4 * MIB)
    # WHEN the allocator, which counts only what was allocated while profiling, saw 2 MiB
    gap = explain(_dm(2 * MIB), tl, 2 * MIB)
    # THEN one sentence says the categories hold 4 MiB of tensors from before the profiler started
    assert gap.allocated_at_category_peak == 2 * MIB and gap.preexisting == 4 * MIB
    assert gap.reason == (
        "The allocator peaks at 2.00 MiB (5.000 ms), memory by category at 6.00 MiB (5.000 ms); at 5.000 ms "
        "the allocator counts 2.00 MiB, 4.00 MiB less: memory by category includes 4.00 MiB of tensors that "
        "existed before the profiler started (parameters, optimizer state), which the allocator's count in "
        "the trace leaves out (it counts only what was allocated while profiling)."
    )
    assert gap.reason.count(". ") == 0  # one sentence


def test_allocator_above_the_categories_and_clocks_that_cannot_be_joined(tmp_path):
    (tl,) = _cats(tmp_path, [[5000, 3 * MIB, 2, 0, 2]])
    gap = explain(_dm(10 * MIB), tl, 10 * MIB)
    assert "7.00 MiB more: the allocator counts memory no tensor the profiler followed holds" in gap.reason
    assert "'unknown' (3.00 MiB) is tensors the profiler saw but could not classify" in gap.reason
    assert "no baseTimeNanoseconds" in explain(_dm(10 * MIB), tl, None).reason


def test_tensor_origins_are_read_for_the_tensors_live_at_the_peak(tmp_path):
    rows = [[1000, MIB, 7, 0, 1], [2000, 2 * MIB, 8, 0, 1]]
    tensors = {"7": ["aten::addmm", "layer.0 (Linear)", [256, 1024], "float32"], "8": ["", "", None, None],
               "9": ["aten::mm", "", [1], "float32"], "bad": 3}  # fmt: skip
    (tl,) = _cats(tmp_path, rows, tensors)
    assert tl.origins == {
        7: TensorOrigin("aten::addmm", "layer.0 (Linear)", "[256, 1024] float32"),
        8: TensorOrigin("", "", ""),
    }
    (old,) = _cats(tmp_path, rows)  # a file written before origins were recorded
    assert old.origins == {}


def test_trace_devices_named_as_the_trace_names_them():
    assert [trace_device(d) for d in ("cpu", "cuda:0", "cuda:3", "cuda", "mps")] == [
        "CPU",
        "GPU0",
        "GPU3",
        "GPU0",
        None,
    ]


@pytest.mark.skipif(
    not GPU_TRACE.is_file(), reason="the recorded GPU run (tests/fixtures/gpu_demo_run) is absent"
)
def test_the_recorded_gpu_runs_two_peaks_are_explained_on_the_page(tmp_path):
    # GIVEN the GPU run's trace and categories (allocated 113.38 MiB, by category 48.38 MiB)
    for name in (GPU_TRACE.name, "fit_rank_0.1.memory_categories.json"):
        shutil.copy(GPU_RUN / name, tmp_path / name)
    view = trace_view(tmp_path / GPU_TRACE.name)
    gpu = next(g for g in view.peak_gaps if g.device == "GPU0")
    # THEN at the category peak the allocator counts its own peak: 65 MiB more (cuBLAS's 64 MiB
    # workspace among it), 'unknown' the largest category
    assert (gpu.allocated_peak, gpu.category_peak, gpu.allocated_at_category_peak) == (
        118890496,
        50731540,
        118890496,
    )
    assert "65.00 MiB more" in gpu.reason and "'unknown' (35.13 MiB)" in gpu.reason
    cpu = next(g for g in view.peak_gaps if g.device == "CPU")
    assert "existed before the profiler started" in cpu.reason
    # AND the page says it under each device's memory by category, and in the overview's peaks
    views = build_views([tmp_path])
    assert views is not None
    html = profiler_page(views, "t")
    assert html.count("<p class='peakwhy'>") == 2 + 2
    assert f"<p class='peakwhy'>GPU0: {escape(gpu.reason)}</p>" in html
    assert all(f">{col}<" in html for col in ("operator", "module", "shape"))
