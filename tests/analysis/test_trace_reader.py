"""The one trace reader: the same figures whatever the order of the events (golden figures
of the in-memory reader it replaced, ``tests/fixtures/traces/golden/``), and what it keeps is bounded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _trace_orders import (
    CPU_TRACE,
    FIXTURES,
    GPU_TRACE,
    ORDERS,
    assert_same,
    figures,
    read_golden,
    write_order,
)
from memprofiler.analysis.traces import events as trace_events
from memprofiler.analysis.traces import stream as trace_stream
from memprofiler.analysis.traces.views import build_views, trace_view
from memprofiler.reporters.traces.html import profiler_page

_GPU = pytest.mark.skipif(
    not GPU_TRACE.is_file(), reason="the recorded GPU run (tests/fixtures/gpu_demo_run) is absent"
)
_CASES = [pytest.param("cpu_mlp", CPU_TRACE, o, id=f"cpu_mlp-{o}") for o in ORDERS]
_CASES += [
    pytest.param("gpu_demo", GPU_TRACE, o, id=f"gpu_demo-{o}", marks=_GPU) for o in ("written", "shuffled")
]
_CASES += [
    pytest.param(
        f"kineto_cuda_worker{w}", FIXTURES / f"kineto_cuda_worker{w}.pt.trace.json", o, id=f"worker{w}-{o}"
    )
    for w in (0, 1)
    for o in ("written", "reversed")
]


@pytest.mark.parametrize(("name", "src", "order"), _CASES)
def test_every_order_gives_the_held_readers_figures(name, src, order, tmp_path):
    # GIVEN a real trace (torch 2.13's CPU trace, memory events after the last operator; the
    # recorded GPU run) or a hand-built CUDA one, its events written in ``order``
    path = write_order(src, order, tmp_path)
    # THEN every figure of every view equals what the in-memory reader showed for that file
    assert_same(figures(trace_view(path)), read_golden(name, order))


@pytest.mark.parametrize("order", ["written", "memory_first", "shuffled", "two_ranks"])
def test_tiny_runs_windows_blocks_and_spill_chunks_give_the_same_figures(order, tmp_path, monkeypatch):
    # GIVEN runs and merge windows of 5 records, 2-record spill chunks and 300-byte reads: every
    # window boundary, tie at a boundary and block boundary inside an event is crossed
    monkeypatch.setattr(trace_stream, "RUN", 5)
    monkeypatch.setattr(trace_stream, "_CHUNK", 2)
    monkeypatch.setattr(trace_events, "_BLOCK", 300)
    path = write_order(CPU_TRACE, order, tmp_path)
    assert_same(figures(trace_view(path)), read_golden("cpu_mlp", order))


@_GPU
def test_the_gpu_trace_in_small_windows_and_kernel_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_stream, "RUN", 257)
    monkeypatch.setattr(trace_stream, "_JOIN", 3)
    monkeypatch.setattr(trace_events, "_BLOCK", 300)  # strings longer than a block: the exact path
    path = write_order(GPU_TRACE, "shuffled", tmp_path)
    got = figures(trace_view(path))
    assert_same(got, read_golden("gpu_demo", "shuffled"))
    assert any(r["device_self_us"] > 0 for r in got["ops"])


def test_kept_pairs_and_range_events_are_bounded(tmp_path, monkeypatch):
    path = write_order(CPU_TRACE, "written", tmp_path)
    full = trace_view(path).devices[0]
    assert full.range_data is not None and full.pair_count == len(full.pairs) > 10
    # WHEN the reader may keep 10 pairs and 10 range events
    monkeypatch.setattr(trace_stream, "PAIRS_KEPT", 10)
    monkeypatch.setattr(trace_stream, "RANGE_KEPT", 10)
    small = trace_view(path).devices[0]
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
    views = build_views([path])
    assert views is not None
    html = profiler_page(views, "t")
    assert f"Memory events ({full.pair_count:,} allocations and releases)" in html
    assert f"over {full.memory.event_count:,} events, a range is widened to whole bins" in html
    assert "(of the 10 largest allocations and releases)" in html
    assert f"{full.pair_count - 10:,} smaller ones not shown" in html


def test_curve_is_thinned_to_each_bins_highest_point(tmp_path, monkeypatch):
    path = write_order(CPU_TRACE, "written", tmp_path)
    whole = trace_view(path).devices[0].memory
    assert len(whole.curve) == whole.event_count  # under CURVE_POINTS: every point
    monkeypatch.setattr(trace_stream, "CURVE_POINTS", 7)
    thin = trace_view(path).devices[0].memory
    size = -(-len(whole.curve) // 7)
    want = [max(whole.curve[k : k + size], key=lambda p: p[1]) for k in range(0, len(whole.curve), size)]
    assert thin.curve == want and len(thin.curve) <= 7
    assert (thin.peak_allocated, thin.peak_ms, thin.peak_reserved) == (
        whole.peak_allocated, whole.peak_ms, whole.peak_reserved
    )  # fmt: skip


def test_host_communication_on_two_threads_splits_analytically(tmp_path):
    # GIVEN a CPU-only trace: a collective inside an operator on thread 1, and one on thread 2
    # overlapping thread 1's computation, in a 200 µs step; thread 2's events first
    def op(name, tid, ts, dur, cat="cpu_op"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}

    events = [
        op("gloo:all_reduce", 2, 1090, 60),
        op("aten::copy_", 2, 1160, 30),
        op("ProfilerStep#1", 1, 1000, 200, "user_annotation"),
        op("aten::add", 1, 1150, 40),
        op("aten::mm", 1, 1000, 100),
        op("c10d::allreduce_", 1, 1050, 30),
    ]
    path = tmp_path / "h_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    # THEN the figures are the analytic ones: comm 1050-1080 and 1090-1150, comp 1000-1050,
    # 1080-1100 (less comm on its own thread), 1150-1190 and 1160-1190
    r = trace_view(path).rank_row
    assert r is not None and r.source == "host"
    assert (r.step_us, r.communication_us + r.overlap_us, r.computation_us + r.overlap_us) == (200, 90, 110)
    assert r.overlap_us == 10  # 1090-1100: thread 1 computes while thread 2 communicates


@pytest.mark.parametrize("lightning_first", [False, True])
def test_lightning_module_spans_win_over_torchs_in_any_order(tmp_path, lightning_first):
    # GIVEN torch's nn.Module span of a module and Lightning's span of the same module, in
    # either order, with a memory event inside both
    def span(name, ts, dur, cat):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": {}}

    mem = {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1012,
           "args": {"Bytes": 512, "Addr": 64, "Total Allocated": 512, "Total Reserved": 0, "Device Type": 0}}  # fmt: skip
    torch_span = span("nn.Module: Linear_0", 1001, 40, "python_function")
    pl_span = span("[pl][module]torch.nn.modules.linear.Linear: layer", 1000, 50, "user_annotation")
    events = [mem, pl_span, torch_span] if lightning_first else [torch_span, pl_span, mem]
    events.append(span("aten::linear", 1010, 20, "cpu_op"))
    path = tmp_path / "m_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    # THEN only Lightning's module is shown, with the 512 bytes allocated inside it
    mods = trace_view(path).modules
    assert [(r.name, r.calls, r.alloc_bytes, r.self_alloc_bytes) for r in mods] == [
        ("layer (Linear)", 1, 512, 512)
    ]


def test_kernels_in_reverse_time_order_give_the_same_figures(tmp_path):
    data = json.loads((FIXTURES / "kineto_cuda_worker0.pt.trace.json").read_text())
    dev = [e for e in data["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    rest = [e for e in data["traceEvents"] if e not in dev]
    data["traceEvents"] = rest + dev[::-1]
    path = tmp_path / "kineto_cuda_worker0.pt.trace.json"
    path.write_text(json.dumps(data))
    assert_same(figures(trace_view(path)), read_golden("kineto_cuda_worker0", "written"))


def test_every_temporary_file_is_closed_on_success_and_on_error(tmp_path, monkeypatch):
    opened: list = []
    real = trace_stream._Spill.__init__

    def spy(self, *a, **k):
        real(self, *a, **k)
        opened.append(self.file)

    monkeypatch.setattr(trace_stream._Spill, "__init__", spy)
    path = write_order(CPU_TRACE, "written", tmp_path)
    trace_view(path)
    assert opened and all(f.closed for f in opened)
    # AND a trace cut short half way closes them too
    opened.clear()
    cut = tmp_path / "cut_rank_0.1.pt.trace.json"
    text = Path(path).read_bytes()
    import gzip

    cut.write_bytes(gzip.decompress(text)[: len(gzip.decompress(text)) * 2 // 3])
    with pytest.raises(Exception, match="not a readable profiler trace"):
        trace_view(cut)
    assert opened and all(f.closed for f in opened)


@pytest.mark.parametrize("block", [1, 7, 64])
def test_the_exact_path_reads_any_cut_of_words_numbers_and_strings(block, tmp_path, monkeypatch):
    # GIVEN events with literals, exponents, escapes and long strings, read 1-64 characters at a
    # time on the exact path only (no block cut)
    monkeypatch.setattr(trace_events, "_BLOCK", block)
    monkeypatch.setattr(trace_events, "_SEP", __import__("re").compile(rb"(?!)"))
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "a\"b\u00e9" * 40, "pid": 1, "tid": True, "ts": 1.5e3, "dur": -0.0,
         "args": {"x": [None, False, True, 12345678901234567890, -1e-7]}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": None, "ts": 2000, "args": {"Bytes": 64, "Addr": 1}},
    ]  # fmt: skip
    path = tmp_path / "w_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}, indent=3))
    got = list(trace_events.iter_events(path))
    # THEN every event is what json.loads reads
    assert [(e.ph, e.name, e.tid, e.ts, e.dur) for e in got] == [
        (e["ph"], e["name"], e["tid"], e["ts"], e.get("dur")) for e in events
    ]
    assert got[1].args is not None and got[1].args.nbytes == 64


def test_a_dispatch_modes_wrapper_is_no_operator_and_its_own_time_is_counted_apart(tmp_path):
    # GIVEN a module tracker's PythonDispatchMode span (100 µs) inside aten::linear, around
    # aten::addmm (30 µs) which allocates 4 KiB
    def op(name, ts, dur):
        return {
            "ph": "X",
            "cat": "cpu_op",
            "name": name,
            "pid": 1,
            "tid": 1,
            "ts": ts,
            "dur": dur,
            "args": {},
        }

    mem = {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1050,
           "args": {"Bytes": 4096, "Addr": 64, "Total Allocated": 4096, "Total Reserved": 0, "Device Type": 0}}  # fmt: skip
    events = [
        op("aten::linear", 1000, 120),
        op("PythonDispatchMode", 1010, 100),
        op("aten::addmm", 1040, 30),
        mem,
    ]
    path = tmp_path / "w_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    # WHEN the views are built
    tv = trace_view(path)
    # THEN the wrapper is no operator row and in no operator's memory: addmm allocated the 4 KiB
    rows = {
        r.name: (r.calls, r.host_self_us, r.host_total_us, r.alloc_bytes, r.self_alloc_bytes) for r in tv.ops
    }
    assert rows == {"aten::linear": (1, 20.0, 120.0, 4096, 0), "aten::addmm": (1, 30.0, 30.0, 4096, 4096)}
    assert [s.name for s in tv.devices[0].stats] == ["aten::addmm", "aten::linear"]
    # AND its own 70 µs are counted apart, in one sentence of the report
    assert (tv.wrapper_calls, tv.wrapper_self_us) == (1, 70.0)
    assert tv.wrapper_note.startswith("1 PythonDispatchMode span (") and "0.070 ms" in tv.wrapper_note
