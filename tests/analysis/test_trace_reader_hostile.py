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
        want = "no top-level traceEvents list"
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


def _cpu_events() -> dict:
    with gzip.open(CPU_TRACE, "rt") as f:
        return json.load(f)


def _figures(view) -> tuple:
    """What the views show of a trace: events, operator rows, each device's peak and events,
    the steps."""
    return (
        view.events,
        [(r.name, r.calls, r.alloc_bytes, round(r.host_self_us, 3)) for r in view.ops],
        [(d.memory.device, d.memory.peak_allocated, d.memory.event_count) for d in view.devices],
        [(s.step, round(s.total_us, 3)) for s in view.steps],
    )


def test_only_the_top_level_trace_events_are_read(tmp_path):
    # GIVEN a real trace with a decoy `traceEvents` of 50 events nested in a value written
    # before the real list (as deviceProperties would hold it), and one inside a string
    doc = _cpu_events()
    real = _figures(trace_view(CPU_TRACE))
    decoy = [_op(float(k), "aten::decoy") for k in range(50)]
    hostile = {
        "schemaVersion": 1,
        "note": 'a string with "traceEvents": [ in it',
        "deviceProperties": [{"traceEvents": decoy}],
        **{k: v for k, v in doc.items() if k != "traceEvents"},
        "traceEvents": doc["traceEvents"],
        "after": {"traceEvents": decoy},
    }
    path = tmp_path / "decoy_rank_0.1.pt.trace.json"
    path.write_text(json.dumps(hostile))
    # THEN the views are the real trace's (50 decoy events read instead of 1,140 before)
    view = trace_view(path)
    assert _figures(view) == real
    assert view.events == len(doc["traceEvents"]) > 1000
    assert not [r for r in view.ops if r.name == "aten::decoy"]
    # AND with only a nested list there is no trace, in one line
    path.write_text(json.dumps({"deviceProperties": [{"traceEvents": decoy}]}))
    with pytest.raises(ArtifactError, match="no top-level traceEvents list"):
        trace_view(path)


def test_times_written_as_strings_are_read_as_numbers_and_unreadable_ones_named(tmp_path):
    # GIVEN the real trace with every ts, dur and memory figure written as a JSON string
    doc = _cpu_events()
    real = _figures(trace_view(CPU_TRACE))
    timed = 0
    for ev in doc["traceEvents"]:
        for k in ("ts", "dur"):
            if k in ev:
                ev[k] = str(ev[k])
                timed += k == "ts"
        for k in ("Bytes", "Total Allocated"):
            if k in ev.get("args", {}):
                ev["args"][k] = str(ev["args"][k])
    path = tmp_path / "strings_rank_0.1.pt.trace.json"
    path.write_text(json.dumps(doc))
    # THEN the figures are the real trace's (steps and memory peaks missing before), and the
    # conversion is said
    view = trace_view(path)
    assert _figures(view) == real
    assert view.devices and view.steps
    assert f"{timed:,} event(s) with a `ts` written as a string: read as its number" in "\n".join(view.notes)
    # AND a time that is no number is counted and named in one line, not dropped without a word
    doc["traceEvents"][-1]["ts"] = "late"
    next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op")["dur"] = [1]
    path.write_text(json.dumps(doc))
    notes = trace_view(path).notes
    assert any(n.endswith("1 event(s) with a `ts` that is not a finite number "
                          "(first: 'late'): the event skipped") for n in notes), notes  # fmt: skip
    assert any(
        "1 event(s) with a `dur` that is not a finite number" in n and "read as 0" in n for n in notes
    ), notes


def test_the_notes_reach_the_terminal_report(tmp_path, capsys):
    path = tmp_path / "late_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": [_op(1), {**_op(2), "ts": "late"}, _mem(3, 64)]}))
    assert main(["report", "--no-html", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "1 event(s) with a `ts` that is not a finite number" in out


def test_a_full_temporary_folder_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    # GIVEN a temporary folder that is full: the reader's spill fails with ENOSPC
    import errno
    import os
    import tempfile

    from memprofiler.analysis.traces import stream as trace_stream

    def full(data, file):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(trace_stream, "_spill_write", full)
    monkeypatch.setattr(trace_stream, "RUN", 64)
    path = tmp_path / "big_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": [_op(float(k)) for k in range(200)]}))
    # THEN one line names the folder, the space needed and the variable (a traceback before)
    line = _report_one_line(path, capsys)
    assert f"no space left in {tempfile.gettempdir()} for the trace reader's temporary files" in line
    assert "MiB there); set TMPDIR to a folder with room" in line


def test_a_real_full_filesystem_under_the_reader_is_the_same_line(tmp_path, monkeypatch, capsys):
    # GIVEN TMPDIR on a real 64 KiB tmpfs (numpy's own error on it names no errno)
    import os
    import shutil
    import subprocess
    import tempfile

    from memprofiler.analysis.traces import stream as trace_stream

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(mnt))
        monkeypatch.setattr(trace_stream, "RUN", 4096)
        path = tmp_path / "big_rank_0.1.pt.trace.json"
        path.write_text(json.dumps({"traceEvents": [_op(float(k)) for k in range(20_000)]}))
        line = _report_one_line(path, capsys)
        assert f"no space left in {mnt} for the trace reader's temporary files" in line
        assert not os.listdir(mnt)  # nothing left behind
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_gzip_bomb_stops_at_the_stated_ratio_and_the_limit_is_configurable(tmp_path, monkeypatch, capsys):
    # GIVEN a 1 MiB trace opening that expands (gzipped) past 200 times its file's size
    monkeypatch.setattr(trace_events, "RATIO_FROM", 2**20)
    bomb = tmp_path / "bomb_rank_0.1.pt.trace.json.gz"
    with gzip.open(bomb, "wb") as f:
        f.write(b'{"traceEvents": [' + json.dumps(_op(1.0)).encode() + b", ")
        f.write(b" " * (64 * 2**20))
    assert bomb.stat().st_size < 2**18
    line = _report_one_line(bomb, capsys)
    assert "200 times the gzip file's size, the reader's limit MAX_GZIP_RATIO" in line
    # AND the absolute limit comes from MEMPROFILER_MAX_TRACE_BYTES, named in its line
    monkeypatch.setenv("MEMPROFILER_MAX_TRACE_BYTES", "100000")
    plain = tmp_path / "plain_rank_0.1.pt.trace.json"
    plain.write_text(json.dumps({"traceEvents": [_op(float(k)) for k in range(2000)]}))
    line = _report_one_line(plain, capsys)
    assert "longer than 100,000 bytes decompressed" in line and "set MEMPROFILER_MAX_TRACE_BYTES" in line
    monkeypatch.setenv("MEMPROFILER_MAX_TRACE_BYTES", "lots")
    assert main(["report", "--no-html", str(plain)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "MEMPROFILER_MAX_TRACE_BYTES='lots': not a positive number of bytes" in line


def test_a_long_read_says_how_far_it_is(tmp_path, monkeypatch, capsys):
    # GIVEN a line due every 100,000 bytes, read in blocks of 65,536
    monkeypatch.setattr(trace_events, "PROGRESS_EVERY", 100_000)
    monkeypatch.setattr(trace_events, "_BLOCK", 65536)
    path = tmp_path / "long_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": [_op(float(k)) for k in range(3000)]}))
    assert 300_000 < path.stat().st_size < 400_000
    trace_view(path)
    # THEN a line at 131,072 bytes read, 262,144 and 327,680
    assert capsys.readouterr().err.splitlines() == [
        f"memprofiler: {path}: {mib} MiB read (the limit: 16.0 GiB, MEMPROFILER_MAX_TRACE_BYTES)"
        for mib in ("0.1", "0.2", "0.3")
    ]


def test_a_category_that_is_not_a_string_is_counted_not_a_traceback(tmp_path, capsys):
    # GIVEN operators whose `cat` is a list or an object beside one real operator
    events = [{**_op(1), "cat": ["cpu_op"]}, {**_op(2), "cat": {"a": 1}}, _op(3), _mem(4, 64)]
    path = tmp_path / "cats_rank_0.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    # THEN the report reads the real one (TypeError: unhashable type: 'list' before) and names them
    assert main(["report", "--no-html", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "2 event(s) with a `cat` that is not a string (first: ['cpu_op']): the event skipped" in out
    assert [(r.name, r.calls) for r in trace_view(path).ops] == [("aten::add", 1)]


def test_input_dims_that_do_not_decode_are_named_and_the_rest_is_read(tmp_path):
    # GIVEN operators whose Input Dims hold a number past float's range (the scan skips over
    # Input Dims: they are decoded once per distinct text, afterwards) beside good ones
    text = json.dumps(
        {"traceEvents": [
            {**_op(10), "args": {"Input Dims": [[2, 3]]}},
            {**_op(20), "args": {"Input Dims": [[2, 3]]}},
            {**_op(30), "args": {"Input Dims": "BAD"}},
            {**_op(40), "args": {"Input Dims": "BAD"}},
            {**_op(50), "args": {"Input Dims": 5}},
        ]}
    ).replace('"BAD"', "[[1e999]]")  # fmt: skip
    path = tmp_path / "dims_rank_0.1.pt.trace.json"
    path.write_text(text)
    view = trace_view(path)
    # THEN every operator is counted, the good shapes twice, and the bad ones named in one line
    (row,) = view.ops
    assert (row.calls, row.shapes) == (5, [("[[2, 3]]", 2)])
    assert view.notes == [
        "dims_rank_0.1.pt.trace.json: 2 event(s) with a `Input Dims` that is not a list of shapes "
        "(first: '[[1e999]]'): its shapes left out"
    ]
