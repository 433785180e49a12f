"""MemoryTimeline: Chrome-trace counters and spans from snapshots, on Kineto's clock."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from _trace_oracles import memory_events as _reference_events
from memprofiler import MemProfiler
from memprofiler.collectors.cuda_backend import CudaBackend
from memprofiler.output.events import SnapshotEvent
from memprofiler.output.timeline import MemoryTimeline, merge_into_trace


class FakeCuda(CudaBackend):
    """Replays fixed allocator statistics: 3 MiB allocated, 8 MiB reserved, peaks 5 and 10."""

    STATS = {
        "allocated_bytes.all.current": 3 * 2**20,
        "reserved_bytes.all.current": 8 * 2**20,
        "allocated_bytes.all.peak": 5 * 2**20,
        "reserved_bytes.all.peak": 10 * 2**20,
    }

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def memory_stats(self) -> dict[str, Any]:
        return dict(self.STATS)

    def reset_peak_memory_stats(self) -> None:
        pass


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _run_steps(prof: MemProfiler, model: nn.Module, n: int) -> None:
    x = torch.randn(8, 16)
    for _ in range(n):
        with prof.profile("training_step", module=model):
            loss = model(x).sum()
        loss.backward()


def test_kineto_cpu_timestamps_are_epoch_nanoseconds_after_base(tmp_path):
    # GIVEN a record_function whose inside is stamped with time.time_ns()
    with profile(activities=[ProfilerActivity.CPU]) as p, record_function("marker"):
        inside_start = time.time_ns()
        time.sleep(0.02)
        inside_end = time.time_ns()
    p.export_chrome_trace(str(tmp_path / "t.json"))
    # WHEN its Kineto timestamps are converted with the trace's base
    trace = json.loads((tmp_path / "t.json").read_text())
    base = int(trace.get("baseTimeNanoseconds", 0))
    (marker,) = [e for e in trace["traceEvents"] if e.get("name") == "marker"]
    start_ns = base + marker["ts"] * 1000
    end_ns = start_ns + marker["dur"] * 1000
    # THEN the event encloses the wall-clock stamps, to within the clock conversion's slack
    slack = 200_000  # 0.2 ms
    assert start_ns <= inside_start + slack
    assert inside_end <= end_ns + slack
    assert end_ns - start_ns < (inside_end - inside_start) + 50_000_000


def test_memory_spans_land_inside_the_kineto_event_that_encloses_them(tmp_path):
    # GIVEN a plain PyTorch loop with memprofiler inside a torch.profiler region
    model = _mlp()
    prof = MemProfiler({"schedule": {"warmup": 0, "active": 1}}, save_dir=tmp_path, rank=0).setup(model)
    assert prof.timeline is not None
    with profile(activities=[ProfilerActivity.CPU]) as p, record_function("outer"):
        _run_steps(prof, model, 1)
    p.export_chrome_trace(str(tmp_path / "k.json"))
    trace = json.loads((tmp_path / "k.json").read_text())
    # WHEN the timeline is merged into the Kineto trace
    added = merge_into_trace(trace, prof.timeline, pid=4242)
    # THEN the call's span and counters are inside "outer", under the given pid
    (outer,) = [e for e in trace["traceEvents"] if e.get("name") == "outer"]
    ours = [e for e in trace["traceEvents"] if e.get("cat") == "memprofiler"]
    assert added == len(ours) > 0
    (span,) = [e for e in ours if e["ph"] == "X"]
    assert span["name"] == "training_step.1" and span["pid"] == 4242
    assert outer["ts"] <= span["ts"] and span["ts"] + span["dur"] <= outer["ts"] + outer["dur"]
    assert all(outer["ts"] <= e["ts"] <= outer["ts"] + outer["dur"] for e in ours)


def test_memory_trace_file_holds_the_snapshot_values(tmp_path):
    # GIVEN calls 1 and 2 collected, with a fake CUDA device
    model = _mlp()
    prof = MemProfiler({"schedule": {"warmup": 0, "active": 2}}, save_dir=tmp_path, rank=3, cuda=FakeCuda())
    # WHEN three calls run and the profiler exits
    with prof:
        prof.setup(model)
        _run_steps(prof, model, 3)
    # THEN the per-rank trace is valid JSON, pid = rank
    trace = json.loads((tmp_path / "memory_trace_rank_3.json").read_text())
    stats = yaml.safe_load((tmp_path / "rank_3_memory_stats.yaml").read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    assert {e["pid"] for e in trace["traceEvents"]} == {3}
    # AND one span per collected call, as long as start-to-end
    spans = {e["name"]: e for e in events if e["ph"] == "X"}
    assert sorted(spans) == ["training_step.1", "training_step.2"]
    assert all(s["dur"] > 0 for s in spans.values())
    # AND counters: rss at start and end, peaks and saved bytes at end, CUDA from the device
    counters = [e for e in events if e["ph"] == "C"]
    by_name: dict[str, list[Any]] = {}
    for c in sorted(counters, key=lambda c: c["ts"]):
        by_name.setdefault(c["name"], []).append(c["args"]["bytes"])
    assert by_name["rss"] == [
        stats[f"3.training_step.{n}.{p}"]["rss"] for n in (1, 2) for p in ("start", "end")
    ]
    assert by_name["rss_peak"] == [stats[f"3.training_step.{n}.end"]["rss_peak"] for n in (1, 2)]
    # saved for backward: x (8x16 fp32) and the ReLU output (8x32 fp32), weights excluded
    assert by_name["saved_tensors.unique_bytes"] == [8 * 16 * 4 + 8 * 32 * 4] * 2
    assert by_name["cuda.allocated"] == [3 * 2**20] * 4
    assert by_name["cuda.reserved"] == [8 * 2**20] * 4
    assert by_name["cuda.allocated_peak"] == [5 * 2**20] * 4
    assert by_name["cuda.reserved_peak"] == [10 * 2**20] * 4
    # AND timestamps are microseconds after the recorded base
    base = trace["baseTimeNanoseconds"]
    assert base % 1_000_000_000 == 0 and all(0 <= e["ts"] < 3_600e6 for e in events)


def _event(rank: int, fn: str, call: int, phase: Any, t_ns: int, metrics: dict[str, Any]) -> SnapshotEvent:
    return SnapshotEvent(f"{rank}.{fn}.{call}.{phase}", rank, fn, call, phase, t_ns, metrics)


def _reference_text(timeline: MemoryTimeline) -> str:
    """The standalone file's text as ``json.dumps`` writes the oracle's trace."""
    base = timeline._base_ns()
    rank = timeline.rank
    other: dict[str, Any] = {"memprofiler_rank": rank, "os_pid": os.getpid()}
    if timeline.run_id:
        other["memprofiler_run_id"] = timeline.run_id
    trace = {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": base,
        "traceEvents": timeline.metadata(rank, f"rank {rank}") + _reference_events(timeline, rank, base),
        "otherData": other,
    }
    return json.dumps(trace)


def test_merge_keeps_only_snapshots_inside_the_trace_span():
    # GIVEN snapshots at t = 1 ms, 2 ms (call 1) and 10 ms, 11 ms (call 2)
    timeline = MemoryTimeline(rank=0)
    for call, phase, t_ms in [(1, "start", 1), (1, "end", 2), (2, "start", 10), (2, "end", 11)]:
        timeline.on_snapshot(_event(0, "f", call, phase, t_ms * 1_000_000, {"rss": call * 100}))
    # AND a trace based at 0 whose only event spans 0.5 ms - 5 ms
    trace = {"baseTimeNanoseconds": 0, "traceEvents": [{"ph": "X", "name": "op", "ts": 500.0, "dur": 4500.0}]}
    # WHEN merged
    merge_into_trace(trace, timeline, pid=7)
    # THEN only call 1 is added, at its microsecond times
    ours = [e for e in trace["traceEvents"] if e.get("cat") == "memprofiler"]
    assert [(e["ph"], e["ts"]) for e in ours] == [("C", 1000.0), ("C", 2000.0), ("X", 1000.0)]
    assert ours[2]["name"] == "f.1" and ours[2]["dur"] == 1000.0


def test_dump_memory_trace_false_writes_no_trace(tmp_path):
    model = _mlp()
    with MemProfiler({"dump_memory_trace": False, "schedule": {"warmup": 0}}, save_dir=tmp_path) as prof:
        _run_steps(prof, model, 1)
    assert prof.timeline is None
    assert not list(Path(tmp_path).glob("memory_trace_rank_*.json"))
    assert (tmp_path / "rank_0_memory_stats.yaml").is_file()


def test_incremental_json_equals_the_full_trace_as_marks_arrive():
    # GIVEN a timeline rendered to JSON after every snapshot of two interleaved functions,
    # one of which has a start with no end yet when rendered
    timeline = MemoryTimeline(rank=3)
    marks = [
        ("f", 1, "start", 1),
        ("g", 1, "start", 2),
        ("f", 1, "end", 3),
        ("g", 1, "end", 5),
        ("f", 2, "start", 8),
    ]
    for fn, call, phase, t_ms in marks:
        t_ns = 1_700_000_000_000_000_000 + t_ms * 10**6
        timeline.on_snapshot(
            _event(3, fn, call, phase, t_ns, {"rss": t_ms * 100, "saved_tensors.unique_bytes": t_ms})
        )
        # THEN each rendering is exactly the text of the trace built from scratch
        assert timeline.to_json() == _reference_text(timeline) == json.dumps(timeline.to_trace())
    # AND the spans pair each end with its own start
    spans = {e["name"]: e["dur"] for e in timeline.to_trace()["traceEvents"] if e["ph"] == "X"}
    assert spans == {"f.1": 2000.0, "g.1": 3000.0}


def test_a_dump_that_interrupts_a_render_leaves_no_duplicate_events():
    # GIVEN a timeline rendered once (call 1), whose next rendering (call 2) is interrupted by
    # another rendering, as a SIGTERM handler's dump interrupts a window-close dump
    class Interrupted(MemoryTimeline):
        armed = False

        def _events_json(self, *args: Any) -> str:
            if self.armed:
                self.armed = False
                self.to_json()
            return super()._events_json(*args)

    timeline = Interrupted(rank=0)
    for call, phase, t_ms in [(1, "start", 1), (1, "end", 2)]:
        timeline.on_snapshot(_event(0, "f", call, phase, t_ms * 10**6, {"rss": 100}))
    timeline.to_json()
    for call, phase, t_ms in [(2, "start", 3), (2, "end", 4)]:
        timeline.on_snapshot(_event(0, "f", call, phase, t_ms * 10**6, {"rss": 200}))
    timeline.armed = True
    # WHEN it renders, then renders again
    timeline.to_json()
    assert not timeline.armed  # (the interruption happened)
    # THEN each event appears once
    events = json.loads(timeline.to_json())["traceEvents"]
    assert [e["ph"] for e in events if e.get("cat") == "memprofiler"] == ["C", "C", "X"] * 2
    assert timeline.to_json() == _reference_text(timeline) == json.dumps(timeline.to_trace())


class _Bytes(int):
    """An ``int`` subclass: ``json.dumps`` writes it with ``int.__repr__``."""

    def __repr__(self) -> str:
        return "not JSON"


def test_appended_events_are_the_text_json_dumps_writes(tmp_path):
    # GIVEN a trace file grown by appends (written directly, without event dicts) of marks
    # with awkward function names, every kind of number, starts without ends, empty values
    timeline = MemoryTimeline(rank=3)
    values = [
        {"rss": 123, "rss_peak": 2**70, "cuda.allocated": 0},
        {"rss": 1.5, "cuda.reserved": 1e-05, "cuda.allocated_peak": 1e22, "saved_tensors.unique_bytes": -0.0},
        {"rss": _Bytes(7), "rss_peak": True, "cuda.reserved": math.nan, "cuda.reserved_peak": -3},
        {},
    ]
    fns = ["training_step", 'say "hi"', "é\U0001f600.step", "a\\b"]
    t_ns = 1_700_000_000_123_456_789
    path = tmp_path / "memory_trace_rank_3.json"
    for call in range(1, 9):
        fn = fns[call % len(fns)]
        phases = ("start", "end") if call % 3 else ("end",) if call % 2 else ("start",)
        for phase in phases:
            t_ns += 1_234_567 * call
            timeline.on_snapshot(_event(3, fn, call, phase, t_ns, values[(call + len(phase)) % len(values)]))
        timeline.dump(tmp_path)
        # THEN after every append the file is exactly the JSON of the whole trace
        assert path.read_text() == _reference_text(timeline) == json.dumps(timeline.to_trace())
    # AND it holds the spans and counters (bool and NaN never written)
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["name"] for e in events if e["ph"] == "X"} >= {'say "hi".1', "é\U0001f600.step.2"}
    counters = [e["args"]["bytes"] for e in events if e["ph"] == "C"]
    assert 2**70 in counters and 7 in counters and not any(isinstance(v, bool) for v in counters)


def test_the_trace_text_is_the_chrome_trace_format_byte_for_byte(tmp_path):
    # GIVEN one call of rank 1 (run r1): counters at its start and end, a float among them
    timeline = MemoryTimeline(rank=1, run_id="r1")
    t0 = 1_700_000_000_250_000_000
    timeline.on_snapshot(_event(1, "step", 4, "start", t0, {"rss": 10, "allocated_bytes.all.current": 2.5}))
    timeline.on_snapshot(_event(1, "step", 4, "end", t0 + 1_500_000, {"rss": 12, "rss_peak": 20}))
    # WHEN written whole, then a start of call 5 appended
    first = timeline.to_json()
    timeline.dump(tmp_path)
    timeline.on_snapshot(_event(1, "step", 5, "start", t0 + 2_000_000, {"rss": 11}))
    timeline.dump(tmp_path)
    # THEN the text is exactly this (base: the first snapshot's whole second; ts, dur in us)
    meta = (
        '{"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "memprofiler"}}, '
        '{"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": 0, "args": {"sort_index": -1}}, '
        '{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "rank 1"}}, '
        '{"ph": "M", "name": "process_sort_index", "pid": 1, "args": {"sort_index": 1}}'
    )
    call_4 = (
        '{"ph": "C", "cat": "memprofiler", "name": "rss", "pid": 1, "tid": 0, "ts": 250000.0, "args": {"bytes": 10}}, '
        '{"ph": "C", "cat": "memprofiler", "name": "cuda.allocated", "pid": 1, "tid": 0, "ts": 250000.0, '
        '"args": {"bytes": 2.5}}, '
        '{"ph": "C", "cat": "memprofiler", "name": "rss", "pid": 1, "tid": 0, "ts": 251500.0, "args": {"bytes": 12}}, '
        '{"ph": "C", "cat": "memprofiler", "name": "rss_peak", "pid": 1, "tid": 0, "ts": 251500.0, '
        '"args": {"bytes": 20}}, '
        '{"ph": "X", "cat": "memprofiler", "name": "step.4", "pid": 1, "tid": 0, "ts": 250000.0, "dur": 1500.0, '
        '"args": {"rank": 1, "fn": "step", "call": 4, "rss": 12, "rss_peak": 20}}'
    )
    call_5 = (
        '{"ph": "C", "cat": "memprofiler", "name": "rss", "pid": 1, "tid": 0, "ts": 252000.0, '
        '"args": {"bytes": 11}}'
    )
    head = '{"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000, "traceEvents": ['
    tail = f'], "otherData": {{"memprofiler_rank": 1, "os_pid": {os.getpid()}, "memprofiler_run_id": "r1"}}}}'
    assert first == f"{head}{meta}, {call_4}{tail}"
    assert (tmp_path / "memory_trace_rank_1.json").read_text() == f"{head}{meta}, {call_4}, {call_5}{tail}"
    # AND the events merged into a profiler's trace are these, under that trace's pid and base
    merged = {"baseTimeNanoseconds": t0, "traceEvents": [{"ph": "X", "name": "op", "ts": 0.0, "dur": 1600.0}]}
    merge_into_trace(merged, timeline, pid=77)
    ours = json.dumps([e for e in merged["traceEvents"] if e.get("cat") == "memprofiler"])
    moved = {'"pid": 1,': '"pid": 77,', '"ts": 250000.0': '"ts": 0.0', '"ts": 251500.0': '"ts": 1500.0'}
    for was, now in moved.items():
        call_4 = call_4.replace(was, now)
    assert ours == f"[{call_4}]"


def test_events_are_the_oracles_under_any_pid_base_and_window():
    # GIVEN a timeline of awkward marks: escaped names, every kind of number, unpaired phases
    timeline = MemoryTimeline(rank=3)
    values: list[dict[str, Any]] = [
        {"rss": 123, "rss_peak": 2**70, "allocated_bytes.all.current": 0},
        {"rss": 1.5, "reserved_bytes.all.current": 1e-05, "saved_tensors.unique_bytes": -0.0},
        {"rss": _Bytes(7), "rss_peak": True, "reserved_bytes.all.current": math.nan},
        {},
    ]
    fns = ["training_step", 'say "hi"', "é\U0001f600.step", "a\\b"]
    t_ns = 1_700_000_000_123_456_789
    times = []
    for call in range(1, 9):
        phases = ("start", "end") if call % 3 else ("end",) if call % 2 else ("start",)
        for phase in phases:
            t_ns += 1_234_567 * call
            times.append(t_ns)
            timeline.on_snapshot(_event(3, fns[call % 4], call, phase, t_ns, values[(call + len(phase)) % 4]))
    # WHEN its events are taken for another pid, base and window (a trace cycle's span)
    for pid in (4242, "host 1"):
        for base in (0, 1_700_000_000_000_000_000):
            for lo, hi in [(-1, 1 << 62), (times[3], times[9]), (times[4] + 1, times[4] + 2)]:
                got = timeline.events(pid, base, lo, hi)
                # THEN they are the oracle's, to the byte (1000.0 and 1000 differ in the file)
                assert json.dumps(got) == json.dumps(_reference_events(timeline, pid, base, lo, hi))
