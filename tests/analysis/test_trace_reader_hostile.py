"""Hostile or broken profiler traces: each gets one line naming the file and what is wrong, in
bounded memory, and leaves no temporary file open (issue 38's reader items)."""

from __future__ import annotations

import gc
import gzip
import json
import resource
import warnings
from pathlib import Path

import pytest

from _trace_orders import CPU_TRACE
from memprofiler.__main__ import main
from memprofiler.analysis.traces import events as trace_events
from memprofiler.analysis.traces.views import trace_view
from memprofiler.errors import ArtifactError


def _op(ts: float, name: str = "aten::add") -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 5, "args": {}}


def _mem(ts: float, nbytes: int) -> dict:
    return {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
            "args": {"Bytes": nbytes, "Addr": 64, "Total Allocated": max(nbytes, 0), "Total Reserved": 0,
                     "Device Type": 0}}  # fmt: skip


def _report_one_line(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``memprofiler report --no-html PATH``: exit 2 and exactly one line on stderr, no
    ResourceWarning (an unclosed temporary file) left behind."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(["report", "--no-html", str(path)]) == 2
        gc.collect()
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(path) in lines[0]
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)], [str(w.message) for w in seen]
    return lines[0]


def test_numbers_strings_and_nulls_among_the_events_are_skipped(tmp_path):
    # GIVEN traceEvents holding a number, a string, null and a list beside two real events
    path = tmp_path / "odd_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": [1, "x", _op(10), None, [2], _mem(12, 256)]}))
    # THEN the views read the two events (AttributeError before) and count all six
    view = trace_view(path)
    assert view.events == 6
    assert [(r.name, r.calls, r.alloc_bytes) for r in view.ops] == [("aten::add", 1, 256)]


def test_odd_field_types_are_skipped_not_a_traceback(tmp_path):
    events = [
        {**_op(10), "ts": "late", "dur": [1]},
        {**_op(20), "name": {"not": "a name"}, "pid": [1], "tid": {"a": 1}},
        {**_op(30), "args": "none", "dur": True},
        {**_mem(31, 128), "args": {"Bytes": "many", "Addr": None}},
        {**_mem(32, 2**80)},
        _op(40),
        {**_op(50), "ts": 10**400},  # an integer past float's range: no time
        {**_op(60), "dur": 10**400, "args": {"External id": 1e300}},
    ]
    path = tmp_path / "types_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    view = trace_view(path)
    assert view.events == 8
    assert sum(r.calls for r in view.ops) == 4  # ts "late" and 10**400 are no time: skipped
    (dev,) = view.devices
    assert dev.memory.event_count == 1  # the unreadable Bytes is no event; 2**80 is held at int64's top


def test_args_nested_a_million_deep_is_one_line_in_bounded_memory(tmp_path, capsys):
    # GIVEN an operator whose args nest a million objects deep (MemoryError at 6 GiB before)
    deep = '{"a": ' * 1_000_000 + "1" + "}" * 1_000_000
    path = tmp_path / "deep_rank_0.1.pt.trace.json"
    path.write_text(
        '{"traceEvents": [' + json.dumps(_op(1)) + ', {"ph": "X", "ts": 2, "args": ' + deep + "}]}"
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    line = _report_one_line(path, capsys)
    assert "nested deeper than the JSON scanner's limit" in line and "recursion limit" in line
    grew_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grew_mib < 200


@pytest.mark.parametrize(
    "case", ["cut_gzip", "not_json", "nan", "infinity", "cut_json", "no_list", "no_comma"]
)
def test_broken_traces_get_one_line(case, tmp_path, capsys):
    path = tmp_path / f"{case}_rank_0.1.pt.trace.json"
    good = json.dumps({"traceEvents": [_op(float(k)) for k in range(2000)]})
    if case == "cut_gzip":
        path = path.with_name(path.name + ".gz")
        whole = CPU_TRACE.read_bytes()  # torch's trace, gzipped
        path.write_bytes(whole[: len(whole) // 2])
        want = "re-copy the file"
    elif case == "not_json":
        path.write_text(good[:5000] + "<html>" + good[5000:])
        want = "not JSON"
    elif case == "nan":
        path.write_text(good.replace('"ts": 1500.0', '"ts": NaN'))
        want = "NaN is not JSON: numbers must be finite"
    elif case == "infinity":
        path.write_text(good.replace('"dur": 5', '"dur": 1e999', 1))
        want = "1e999 is not JSON: numbers must be finite"
    elif case == "cut_json":
        path.write_text(good[: len(good) - 300])
        want = "cut short"
    elif case == "no_list":
        path.write_text('{"schemaVersion": 1, "events": []}')
        want = "no traceEvents list"
    else:
        path.write_text(good.replace("}, {", "} {", 1))
        want = "no ',' between events"
    line = _report_one_line(path, capsys)
    assert want in line, line
    assert "not a readable profiler trace" in line


def test_the_size_limits_are_named_in_the_message(tmp_path, monkeypatch):
    # GIVEN an event longer than the reader's limit (lowered to 10,000 characters)
    monkeypatch.setattr(trace_events, "MAX_EVENT_CHARS", 10_000)
    monkeypatch.setattr(trace_events, "_BLOCK", 4096)
    big = {**_op(1), "args": {"Input Dims": [[1] * 20_000]}}
    path = tmp_path / "big_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": [_op(0), big, _op(2)]}))
    with pytest.raises(ArtifactError, match=r"MAX_EVENT_CHARS"):
        trace_view(path)
    # AND a gzip that expands past MAX_TRACE_BYTES (lowered to 1 MiB) is refused while streaming
    monkeypatch.setattr(trace_events, "MAX_TRACE_BYTES", 2**20)
    bomb = tmp_path / "bomb_rank_0.1.pt.trace.json.gz"
    with gzip.open(bomb, "wt") as f:
        f.write('{"traceEvents": [' + ", ".join(json.dumps(_op(float(k))) for k in range(40_000)) + "]}")
    assert bomb.stat().st_size < 2**20
    with pytest.raises(ArtifactError, match=r"longer than 1,048,576 bytes decompressed.*MAX_TRACE_BYTES"):
        trace_view(bomb)


def test_a_cut_inside_an_event_falls_back_to_the_exact_path(tmp_path):
    # GIVEN events whose args hold a list of objects: '}, {' inside an event, where the fast
    # path may cut a block
    odd = [{**_op(float(k)), "args": {"x": [{"a": 1}, {"b": 2}]}} for k in range(3000)]
    path = tmp_path / "objs_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": [*odd, _mem(5.0, 64)]}))
    view = trace_view(path)
    assert view.events == 3001 and sum(r.calls for r in view.ops) == 3000
