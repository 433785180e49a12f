"""Our rows spliced into a profiler's trace as text: the trace the dict merge wrote, Kineto's
events left as Kineto wrote them."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
from torch import nn

from _trace_oracles import dict_merge, step_events, step_trace
from _trace_orders import GPU_TRACE
from memprofiler.analysis.runs.ids import profiler_trace_run_id
from memprofiler.analysis.traces.events import iter_events
from memprofiler.output.events import SnapshotEvent
from memprofiler.output.step_timeline import DATA, DATA_TID, HOOK_TID, HOST_CATEGORY, StepTimeline
from memprofiler.output.timeline import MemoryTimeline, trace_span_ns
from memprofiler.output.trace_splice import ChromeTrace

MS = 1_000_000
#: The cycle identity a profiler puts first in each trace.
FIRST = {"memprofiler": {"run_id": "r1", "rank": 2, "cycle": 1, "epoch": 0}}
PID = 4242


@pytest.fixture(scope="module")
def kineto(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A trace as Kineto writes it (its own layout and whitespace): three steps of a small MLP."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for step in range(3):
            with torch.profiler.record_function(f"ProfilerStep#{step}"):
                model(torch.randn(8, 16)).sum().backward()
    path = tmp_path_factory.mktemp("kineto") / "trace.json"
    prof.export_chrome_trace(str(path))
    return path.read_bytes()


class _Samples:
    """Host samples at fixed times (a ``HostSampler``'s ``between``)."""

    def __init__(self, samples: list[tuple[int, dict[str, Any]]]) -> None:
        self.samples = samples

    def between(self, lo_ns: int, hi_ns: int) -> list[tuple[int, dict[str, Any]]]:
        return [(t, v) for t, v in self.samples if lo_ns <= t <= hi_ns]


def _snap(fn: str, call: int, phase: str, t_ns: int, metrics: dict[str, Any]) -> SnapshotEvent:
    return SnapshotEvent(f"2.{fn}.{call}.{phase}", 2, fn, call, phase, t_ns, metrics)


def _rows(lo: int, hi: int) -> tuple[MemoryTimeline, MemoryTimeline, StepTimeline]:
    """Rows around the span ``[lo, hi]``: inside, outside and across each edge.

    Memory: call 1 starts before the span and ends inside (its end's counters only, no span),
    call 2 is inside (counters and span), call 3 starts inside and ends after (its start's
    counters only), call 4 is after. A second memory timeline has nothing inside. Steps: a
    span over the whole cycle, one across its end and a data wait inside (kept), one before
    and one after (dropped); host samples before, inside (a NaN among them: left out) and after.
    """
    mid = (lo + hi) // 2
    mem = MemoryTimeline(rank=2)
    for fn, call, phase, t, metrics in [
        ('say "hi"', 1, "start", lo - 5 * MS, {"rss": 1}),
        ('say "hi"', 1, "end", lo + 1000, {"rss": 2, "rss_peak": 2**70}),
        ("é.step", 2, "start", mid - 7, {"rss": 3, "allocated_bytes.all.current": 2.5}),
        ("é.step", 2, "end", mid + 1234, {"rss": 4}),
        ("é.step", 3, "start", hi - 1, {"rss": 5}),
        ("é.step", 3, "end", hi + 5 * MS, {"rss": 6}),
        ("é.step", 4, "start", hi + 6 * MS, {"rss": 7}),
        ("é.step", 4, "end", hi + 7 * MS, {"rss": 8}),
    ]:
        mem.on_snapshot(_snap(fn, call, phase, t, metrics))
    idle = MemoryTimeline(rank=2)
    idle.on_snapshot(_snap("f", 1, "start", hi + MS, {"rss": 1}))
    idle.on_snapshot(_snap("f", 1, "end", hi + 2 * MS, {"rss": 1}))
    samples = [
        (lo - MS, {"cpu": 10.0}),
        (mid, {"cpu": 55.5, "rss": 123456789, 'disk "io"': math.nan}),
        (hi + MS, {"cpu": 20.0}),
    ]
    step = StepTimeline(rank=2, host=_Samples(samples))
    step.span("[LightningModule]M.training_step ✓", lo - MS, hi + MS)
    step.span("on_train_batch_end", hi - 10, hi + 3 * MS)
    step.span("[_TrainingEpochLoop].train_dataloader_next", mid, mid + 50, track=DATA)
    step.span("before", lo - 3 * MS, lo - 2 * MS)
    step.span("after", hi + 2 * MS, hi + 3 * MS)
    return mem, idle, step


def _ours(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if str(e.get("cat", "")).startswith("memprofiler")]


def test_the_spliced_trace_is_the_dict_merges_with_kinetos_events_as_written(kineto, tmp_path):
    # GIVEN a trace as Kineto wrote it, and memory and step rows around its span
    base = json.loads(kineto)["baseTimeNanoseconds"]
    span = trace_span_ns(json.loads(kineto))
    assert span is not None
    lo, hi = span
    rows = _rows(lo, hi)
    # WHEN our rows are spliced in
    trace = ChromeTrace.read(kineto)
    assert trace.as_text
    out = trace.with_rows(rows, PID, FIRST)
    # THEN it is JSON whose content is the dict merge's: every key in order, every event in order
    merged = json.loads(out)
    expected = dict_merge(kineto, rows, PID, FIRST)
    assert list(merged) == list(expected) and next(iter(merged)) == "memprofiler"
    assert merged == expected
    # AND our rows are the analytic ones: call 1's end and call 3's start as counters only,
    # call 2 as counters and a span, under Kineto's pid, ts in microseconds after its base
    ours = _ours(merged)
    memory = [(e["ph"], e["name"], e["ts"]) for e in ours if e["cat"] == "memprofiler"]
    us = lambda t: (t - base) / 1000.0  # noqa: E731
    mid = (lo + hi) // 2
    assert memory == [
        ("C", "rss", us(lo + 1000)),
        ("C", "rss_peak", us(lo + 1000)),
        ("C", "rss", us(mid - 7)),
        ("C", "cuda.allocated", us(mid - 7)),
        ("C", "rss", us(mid + 1234)),
        ("X", "é.step.2", us(mid - 7)),
        ("C", "rss", us(hi - 1)),
    ]
    (span_2,) = [e for e in ours if e["ph"] == "X" and e["cat"] == "memprofiler"]
    assert span_2["dur"] == 1.241 and span_2["args"] == {"rank": 2, "fn": "é.step", "call": 2, "rss": 4}
    assert [e["args"]["bytes"] for e in ours if e["name"] == "rss_peak"] == [2**70]
    steps = [(e["tid"], e["name"]) for e in ours if e["ph"] == "X" and e["cat"] != "memprofiler"]
    assert steps == [
        (HOOK_TID, "[LightningModule]M.training_step ✓"),
        (HOOK_TID, "on_train_batch_end"),
        (DATA_TID, "[_TrainingEpochLoop].train_dataloader_next"),
    ]
    host = [(e["name"], e["args"]["value"], e["ts"]) for e in ours if e["cat"] == HOST_CATEGORY]
    assert host == [("cpu", 55.5, us(mid)), ("rss", 123456789, us(mid))]
    assert {e["pid"] for e in ours} == {PID}
    # AND the timeline with nothing inside the span added nothing, not even its row names:
    # one memprofiler row name, after Kineto's events
    names = [
        e for e in merged["traceEvents"] if e.get("ph") == "M" and e.get("args") == {"name": "memprofiler"}
    ]
    assert len(names) == 1
    # AND Kineto's events are its own bytes, not written again
    events = bytes(msgspec.json.decode(kineto, type=dict[str, msgspec.Raw])["traceEvents"])
    assert events[:-1] in out
    # AND our readers take the file, plain and gzip'd: the run id from its first bytes, every event
    for path, data in [
        (tmp_path / "t.pt.trace.json", out),
        (tmp_path / "t.pt.trace.json.gz", gzip.compress(out)),
    ]:
        path.write_bytes(data)
        assert profiler_trace_run_id(path) == "r1"
        assert sum(1 for _ in iter_events(path)) == len(expected["traceEvents"])


B = 1_700_000_000_000_000_000
_X = b'{"ph": "X", "name": "op", "pid": 1, "tid": 1, "ts": 1000.0, "dur": 8000.0}'


@pytest.mark.parametrize(
    ("kineto", "as_text"),
    [
        # compact, no whitespace, traceEvents first
        (b'{"traceEvents":[' + _X + b'],"baseTimeNanoseconds":' + str(B).encode() + b"}", True),
        # a "memprofiler" key from before: replaced, and first
        (
            b'{"memprofiler": {"run_id": "old"}, "baseTimeNanoseconds": %d, "traceEvents": [\n' % B
            + _X
            + b"\n ]}",
            True,
        ),
        # non-ASCII names as raw UTF-8, ts as a string, a null dur, trailing keys
        (
            b' \n{"baseTimeNanoseconds": %d, "traceEvents": [{"ph": "X", "name": "na\xc3\xafve \xe2\x9c\x93", '
            b'"ts": "1000", "dur": null}, ' % B + _X + b'], "traceName": "a ] b"}\n',
            True,
        ),
        # traceEvents twice: the last one counts
        (b'{"baseTimeNanoseconds": %d, "traceEvents": [1], "traceEvents": [' % B + _X + b"]}", True),
        # no X event: no span, nothing of ours but the identity
        (b'{"baseTimeNanoseconds": %d, "traceEvents": [ \n ]}' % B, True),
        (b'{"baseTimeNanoseconds": %d}' % B, True),
        # what msgspec refuses goes the dict way: Infinity, an entry that is no object,
        # a lone surrogate, a byte-order mark
        (b'{"baseTimeNanoseconds": %d, "traceEvents": [' % B + _X + b', {"args": {"v": Infinity}}]}', False),
        (b'{"baseTimeNanoseconds": %d, "traceEvents": [' % B + _X + b", 7]}", False),
        (b'{"baseTimeNanoseconds": %d, "traceEvents": [' % B + _X + b', {"name": "\\ud800"}]}', False),
        (b"\xef\xbb\xbf" + b'{"baseTimeNanoseconds": %d, "traceEvents": [' % B + _X + b"]}", False),
    ],
)
def test_every_layout_of_a_trace_merges_as_the_dicts_did(kineto, as_text):
    # GIVEN a trace of one operator from 1 ms to 9 ms after its base, and rows around that span
    rows = _rows(B + MS, B + 9 * MS)
    # WHEN our rows go in
    trace = ChromeTrace.read(kineto)
    out = trace.with_rows(rows, PID, FIRST)
    # THEN the trace is the dict merge's, read as text where msgspec takes it
    assert trace.as_text is as_text
    merged = json.loads(out)
    expected = dict_merge(kineto, rows, PID, FIRST)
    assert merged == expected and list(merged) == list(expected)
    assert out.startswith(b'{"memprofiler": {"run_id": "r1"')


def test_a_trace_that_is_no_json_object_is_refused_or_flagged():
    # a file cut short and text that is not UTF-8 are no JSON; a list is JSON but no object
    for data in (b'{"traceEvents": [{"ph": "X"', b'{"traceEvents": ["\xff"]}', b""):
        with pytest.raises(ValueError):
            ChromeTrace.read(data)
    assert not ChromeTrace.read(b"[1, 2]").is_object
    assert ChromeTrace.read(b"{}").with_rows([], PID, {}) == b"{}"


def test_a_malformed_span_raises_for_the_caller_to_keep_the_trace():
    # an X event whose ts is no number: the dict merge raised too (the profiler warns, keeps Kineto's)
    for data in (b'{"traceEvents": [{"ph": "X", "ts": [1]}]}', b'{"traceEvents": [{"ph": "X", "ts": "x"}]}'):
        with pytest.raises((TypeError, ValueError)):
            ChromeTrace.read(data).with_rows(_rows(0, MS), PID, FIRST)


def test_step_timeline_text_is_what_json_dumps_writes_for_its_events(tmp_path):
    # GIVEN a step timeline with escaped names, spans on both rows and host samples
    _, _, step = _rows(B + MS, B + 9 * MS)
    step.span('a "quoted"\\name', B, B + 1)
    # THEN its events under any pid, base and window are the dict builder's, to the byte
    for pid in (7, "host 1"):
        for base in (0, B):
            for lo, hi in [(None, None), (B + MS, B + 9 * MS), (B + 4 * MS, B + 4 * MS)]:
                oracle = step_events(step, pid, base, lo, hi)
                assert step.events_json(pid, base, lo, hi) == json.dumps(oracle)[1:-1]
                assert step.events(pid, base, lo, hi) == oracle
    # AND its standalone file is json.dumps of the dict-built trace
    assert step.to_json() == json.dumps(step_trace(step))
    assert Path(step.dump(tmp_path)).read_text() == json.dumps(step_trace(step))
    assert StepTimeline(rank=1).to_json() == json.dumps(step_trace(StepTimeline(rank=1)))


@pytest.mark.skipif(
    not GPU_TRACE.is_file(), reason="the recorded GPU run (tests/fixtures/gpu_demo_run) is absent"
)
def test_a_recorded_h200_trace_takes_the_rows_as_the_dict_merge_did():
    # GIVEN the trace of a real GPU run (kernels, memcpy, CUDA memory events; written merged once)
    kineto = gzip.decompress(GPU_TRACE.read_bytes())
    span = trace_span_ns(json.loads(kineto))
    assert span is not None
    rows = _rows(*span)
    # WHEN our rows go in again THEN the trace is the dict merge's, its own events kept as bytes
    trace = ChromeTrace.read(kineto)
    out = trace.with_rows(rows, PID, FIRST)
    assert trace.as_text
    expected = dict_merge(kineto, rows, PID, FIRST)
    merged = json.loads(out)
    assert merged == expected and list(merged) == list(expected)
    assert bytes(msgspec.json.decode(kineto, type=dict[str, msgspec.Raw])["traceEvents"])[:-1] in out
