"""The streamed views (bounded memory) equal the held ones, and what they keep is bounded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from memprofiler.analysis import trace_stream
from memprofiler.analysis.profiler_views import build_views, held_trace_view, trace_view
from memprofiler.reporters.profiler_html import profiler_page

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STEPS = 4


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    path = tmp_path_factory.mktemp("stream") / "s_rank_0.1.pt.trace.json"
    acts = [ProfilerActivity.CPU]
    with profile(
        activities=acts, record_shapes=True, profile_memory=True, with_stack=True, with_modules=True
    ) as p:
        for _ in range(STEPS):
            with record_function("ProfilerStep#manual"):
                scratch = torch.ones(2**16)
                del scratch
                model(x).sum().backward()
    p.export_chrome_trace(str(path))
    return path


def _same(a, b):
    assert [(d.memory, d.pairs, d.pair_count, d.stats, d.range_data) for d in a.devices] == [
        (d.memory, d.pairs, d.pair_count, d.stats, d.range_data) for d in b.devices
    ]
    for x, y in ((a.ops, b.ops), (a.modules, b.modules)):
        assert [r.name for r in x] == [r.name for r in y]
        for r, s in zip(x, y, strict=True):
            assert (r.calls, r.alloc_bytes, r.self_alloc_bytes, r.increase, r.self_increase, r.shapes) == (
                s.calls, s.alloc_bytes, s.self_alloc_bytes, s.increase, s.self_increase, s.shapes
            )  # fmt: skip
            for f in ("host_self_us", "host_total_us", "device_self_us", "device_total_us"):
                assert getattr(r, f) == pytest.approx(getattr(s, f), rel=1e-12, abs=1e-9)
    assert [(s.step, s.total_us) for s in a.steps] == [(s.step, s.total_us) for s in b.steps]
    for s, t in zip(a.steps, b.steps, strict=True):
        assert s.parts == pytest.approx(t.parts)
    assert (a.events, a.has_device_time, a.rank_row) == (b.events, b.has_device_time, b.rank_row)


@pytest.mark.parametrize(
    "name", ["cpu", "kineto_cuda_worker0.pt.trace.json", "kineto_cuda_worker1.pt.trace.json"]
)
def test_streamed_views_equal_the_held_ones(cpu_trace, name):
    path = cpu_trace if name == "cpu" else FIXTURES / name
    trace_stream.summarise(path)  # streams: no Unordered
    _same(trace_view(path), held_trace_view(path))


def test_a_trace_out_of_time_order_is_read_the_held_way(cpu_trace, tmp_path, monkeypatch):
    # GIVEN the same trace with its events reversed, and a reorder heap of 8 events
    data = json.loads(cpu_trace.read_text())
    data["traceEvents"].reverse()
    rev = tmp_path / "r_rank_0.1.pt.trace.json"
    rev.write_text(json.dumps(data))
    monkeypatch.setattr(trace_stream, "REORDER", 8)
    with pytest.raises(trace_stream.Unordered):
        trace_stream.summarise(rev)
    # THEN the views fall back to the held path and show the same figures
    _same(trace_view(rev), held_trace_view(rev))


def test_kept_pairs_and_range_events_are_bounded(cpu_trace, monkeypatch):
    full = trace_view(cpu_trace).devices[0]
    assert full.range_data is not None and full.pair_count == len(full.pairs) > 10
    # WHEN the streamed reader may keep 10 pairs and 10 range events
    monkeypatch.setattr(trace_stream, "PAIRS_KEPT", 10)
    monkeypatch.setattr(trace_stream, "RANGE_KEPT", 10)
    small = trace_view(cpu_trace).devices[0]
    # THEN it keeps the 10 largest pairs, in the table's order, and counts them all
    assert small.pair_count == full.pair_count
    largest = sorted(full.pairs, key=lambda p: -p.size)[:10]
    assert sorted(small.pairs, key=lambda p: -p.size) == largest
    assert small.pairs == [p for p in full.pairs if p in largest]
    # AND its range selection works on bins of events, the statistics and curve unchanged
    assert small.memory.events == [] and small.memory.event_count == len(full.memory.events)
    assert (small.stats, small.memory.curve) == (full.stats, full.memory.curve)
    rd = small.range_data
    assert rd is not None and "events" not in rd and rd["pairs_total"] == full.pair_count
    # every event in exactly one bin: per bin and call path, bytes add up to the events'
    times = [t for t, _, _ in full.memory.events]
    assert sum(sum(1 for t in times if b[0] <= t <= b[1]) for b in rd["bins"]) == len(times)
    assert sum(g[2] for g in rd["groups"]) == sum(b for _, b, _ in full.memory.events)
    assert sum(g[3] for g in rd["groups"]) == sum(1 for _, b, _ in full.memory.events if b > 0)
    # AND the page says how many pairs there are and how many it does not show
    views = build_views([cpu_trace])
    assert views is not None
    html = profiler_page(views, "t")
    assert f"Memory events ({full.pair_count:,} allocations and releases)" in html
    assert f"over {full.memory.event_count:,} events, a range is widened to whole bins" in html
    assert "(of the 10 largest allocations and releases)" in html
    assert f"{full.pair_count - 10:,} smaller ones not shown" in html


def test_curve_is_thinned_as_the_held_path_thins_it(cpu_trace, monkeypatch):
    import memprofiler.analysis.profiler_memory as pm

    monkeypatch.setattr(pm, "CURVE_POINTS", 7)
    monkeypatch.setattr(trace_stream, "CURVE_POINTS", 7)
    a, b = trace_view(cpu_trace).devices[0].memory, held_trace_view(cpu_trace).devices[0].memory
    assert len(a.curve) <= 7 and a.curve == b.curve
    assert (a.peak_allocated, a.peak_ms, a.peak_reserved) == (b.peak_allocated, b.peak_ms, b.peak_reserved)


def test_kernels_joined_in_small_batches_give_the_same_device_time(monkeypatch):
    path = FIXTURES / "kineto_cuda_worker0.pt.trace.json"
    monkeypatch.setattr(trace_stream, "_JOIN", 1)
    _same(trace_view(path), held_trace_view(path))
    assert any(r.device_self_us > 0 for r in trace_view(path).ops)


def test_host_communication_on_two_threads_splits_as_the_held_path(tmp_path):
    # GIVEN a CPU-only trace: a collective inside an operator on thread 1, and one on thread 2
    # overlapping thread 1's computation, in a 200 µs step
    def op(name, tid, ts, dur, cat="cpu_op"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}

    events = [
        op("ProfilerStep#1", 1, 1000, 200, "user_annotation"),
        op("aten::mm", 1, 1000, 100),
        op("c10d::allreduce_", 1, 1050, 30),
        op("aten::add", 1, 1150, 40),
        op("gloo:all_reduce", 2, 1090, 60),
        op("aten::copy_", 2, 1160, 30),
    ]
    path = tmp_path / "h_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    a, b = trace_view(path), held_trace_view(path)
    _same(a, b)
    # AND the figures are the analytic ones: comm 1050-1080 and 1090-1150, comp 1000-1050,
    # 1080-1100 (less comm on its own thread), 1150-1190 and 1160-1190
    r = a.rank_row
    assert r is not None and r.source == "host"
    assert (r.step_us, r.communication_us + r.overlap_us, r.computation_us + r.overlap_us) == (200, 90, 110)
    assert r.overlap_us == 10  # 1090-1100: thread 1 computes while thread 2 communicates


def test_lightning_module_spans_after_torch_ones_read_again_as_the_held_path(tmp_path):
    # GIVEN torch's nn.Module span read before Lightning's span of the same module
    def span(name, ts, dur, cat):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}

    mem = {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1012,
           "args": {"Bytes": 512, "Addr": 64, "Total Allocated": 512, "Total Reserved": 0, "Device Type": 0}}  # fmt: skip
    events = [
        span("nn.Module: Linear_0", 1001, 40, "python_function"),
        span("[pl][module]torch.nn.modules.linear.Linear: layer", 1000, 50, "user_annotation"),
        span("aten::linear", 1010, 20, "cpu_op"),
        mem,
    ]
    path = tmp_path / "m_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    a, b = trace_view(path), held_trace_view(path)
    _same(a, b)
    # THEN only Lightning's module is shown, with the 512 bytes allocated inside it
    assert [(r.name, r.calls, r.alloc_bytes) for r in a.modules] == [("layer (Linear)", 1, 512)]


def test_spills_read_back_in_small_chunks_and_kernels_out_of_order(cpu_trace, tmp_path, monkeypatch):
    # GIVEN temporary files written and read two records at a time
    monkeypatch.setattr(trace_stream, "_CHUNK", 2)
    _same(trace_view(cpu_trace), held_trace_view(cpu_trace))
    # AND a CUDA-shaped trace whose kernels, memcpy and memset come in reverse time order
    data = json.loads((FIXTURES / "kineto_cuda_worker0.pt.trace.json").read_text())
    dev = [e for e in data["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    rest = [e for e in data["traceEvents"] if e not in dev]
    data["traceEvents"] = rest + dev[::-1]
    path = tmp_path / "k_rank_0.1.pt.trace.json"
    path.write_text(json.dumps(data))
    trace_stream.summarise(path)  # streamed: device spans need no reordering
    _same(trace_view(path), held_trace_view(path))
