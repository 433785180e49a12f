"""Profiler views read back from real CPU traces written by torch.profiler in the test."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from _range_stats import pairs_in, range_stats
from memprofiler.analysis.traces.views import build_views, trace_view
from memprofiler.errors import ArtifactError

#: The known allocation each step makes: 1 MiB of float32 by ``aten::ones``.
ONES_BYTES = 2**20
STEPS = 3


def _write_trace(path: Path) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
        for _ in range(STEPS):
            with record_function("ProfilerStep#manual"):
                scratch = torch.ones(ONES_BYTES // 4)
                del scratch
                model(x).sum().backward()
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_trace(tmp_path_factory.mktemp("trace") / "worker_rank_0.1.pt.trace.json")


def test_known_allocation_is_paired_and_attributed_to_its_operator(cpu_trace):
    # GIVEN a trace where each of 3 steps allocates and frees 1 MiB with torch.ones
    view = trace_view(cpu_trace)
    # WHEN the memory view of the CPU is built
    assert [d.memory.device for d in view.devices] == ["CPU"]
    cpu = view.devices[0]
    # THEN three 1 MiB pairs, named after the factory's caller, each released after allocation
    ones = [p for p in cpu.pairs if p.op == "aten::ones (aten::empty)"]
    assert [p.size for p in ones] == [ONES_BYTES] * STEPS
    assert all(p.alloc_ms is not None and p.duration_ms is not None and p.duration_ms >= 0 for p in ones)
    # AND the operator statistics hold it inclusive for aten::ones, self for aten::empty
    stats = {s.name: s for s in cpu.stats}
    assert stats["aten::ones"].calls == STEPS
    assert stats["aten::ones"].alloc_size == STEPS * ONES_BYTES
    assert stats["aten::ones"].self_alloc_size == 0
    assert stats["aten::ones"].increase == STEPS * ONES_BYTES  # freed after aten::ones returned
    assert stats["aten::empty"].self_alloc_count >= STEPS
    # AND the curve's peak is at least the 1 MiB block
    assert cpu.memory.peak_allocated >= ONES_BYTES


def test_operator_view_counts_calls_and_records_input_shapes(cpu_trace):
    view = trace_view(cpu_trace)
    ops = {r.name: r for r in view.ops}
    # two Linear layers per step
    assert ops["aten::linear"].calls == 2 * STEPS
    assert ops["aten::addmm"].calls == 2 * STEPS
    assert ops["aten::ones"].calls == STEPS
    shapes = dict(ops["aten::addmm"].shapes)
    assert shapes["[[32], [8, 16], [16, 32], [], []]"] == STEPS
    assert shapes["[[4], [8, 32], [32, 4], [], []]"] == STEPS
    # self time never exceeds total; linear's total holds addmm's
    for r in view.ops:
        assert 0 <= r.host_self_us <= r.host_total_us + 1e-6
    assert ops["aten::linear"].host_total_us >= ops["aten::addmm"].host_total_us
    assert not view.has_device_time and ops["aten::addmm"].device_total_us == 0


def test_range_selection_keeps_only_events_in_range(cpu_trace):
    view = trace_view(cpu_trace)
    cpu = view.devices[0]
    assert cpu.range_data is not None
    first = min(
        p.alloc_ms for p in cpu.pairs if p.op == "aten::ones (aten::empty)" and p.alloc_ms is not None
    )
    # WHEN the range ends at the first step's 1 MiB allocation (the trace's first memory event)
    stats = {s.name: s for s in range_stats(cpu.range_data, 0.0, first)}
    # THEN aten::ones was called once in it and allocated 1 MiB
    assert stats["aten::ones"].calls == 1
    assert stats["aten::ones"].alloc_size == ONES_BYTES
    assert set(stats) == {"aten::ones", "aten::empty"}
    assert [p.size for p in pairs_in(cpu.pairs, 0.0, first)] == [ONES_BYTES]
    # AND the whole range gives the whole-trace table
    assert range_stats(cpu.range_data) == cpu.stats


def test_gzipped_trace_reads_the_same(cpu_trace, tmp_path):
    gz = tmp_path / "worker_rank_0.1.pt.trace.json.gz"
    with open(cpu_trace, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    a, b = trace_view(cpu_trace), trace_view(gz)
    assert [(r.name, r.calls, r.alloc_bytes) for r in a.ops] == [
        (r.name, r.calls, r.alloc_bytes) for r in b.ops
    ]
    assert a.devices[0].stats == b.devices[0].stats


def test_directories_are_searched_and_a_bad_trace_is_one_line(cpu_trace, tmp_path):
    shutil.copy(cpu_trace, tmp_path / "a_rank_0.1.pt.trace.json")
    views = build_views([tmp_path])
    assert views is not None and [t.path.name for t in views.traces] == ["a_rank_0.1.pt.trace.json"]
    assert build_views([tmp_path / "nothing_here"]) is None
    bad = tmp_path / "b_rank_1.1.pt.trace.json"
    bad.write_text('{"traceEvents": [{"ph": "X", ')
    with pytest.raises(ArtifactError, match=r"b_rank_1\.1\.pt\.trace\.json: not a readable profiler trace"):
        trace_view(bad)
