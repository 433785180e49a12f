"""Per-call views cut from one allocator recording, checked on what a real GPU recorded."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from memprofiler.analysis.snapshot.calls import (
    CallRange,
    call_ranges,
    call_view,
    entry_range,
    find_call,
    parse_call,
)
from memprofiler.analysis.snapshot.summary import analyze, load_snapshot
from memprofiler.errors import ArtifactError

DEMO = Path(__file__).parents[1] / "fixtures" / "gpu_runs" / "demo"


def _recording_with_marks() -> tuple[dict, dict]:
    """The demo's end-of-call-4 pickle as one recording of calls 3 and 4, and the call-3 start file.

    The per-call collector's dumps left ``snapshot`` entries at the start of call 3, its end and
    the start of call 4, each on the trace's clock: they become the marks memprofiler now
    records instead (the ``START``/``END`` annotations of ``memprofiler:training_step:N``).
    """
    end4 = load_snapshot(DEMO / "cuda_alloc_rank_0.training_step.4.end.pickle")
    start3 = load_snapshot(DEMO / "cuda_alloc_rank_0.training_step.3.start.pickle")
    trace = end4["device_traces"][0]
    marks = [e["time_us"] for e in trace if e["action"] == "snapshot"]
    assert len(marks) == 3
    rec = copy.deepcopy(end4)
    for stage, call, t in (
        ("START", 3, marks[0]),
        ("END", 3, marks[1]),
        ("START", 4, marks[2]),
        ("END", 4, trace[-1]["time_us"]),
    ):
        rec["external_annotations"].append(
            {"stage": stage, "name": f"memprofiler:training_step:{call}", "device": 0, "time_us": t}
        )
    return rec, start3


def _no_markers(snap: dict) -> dict:
    out = dict(snap)
    out["device_traces"] = [[e for e in t if e["action"] != "snapshot"] for t in snap["device_traces"]]
    out.pop("external_annotations", None)
    return out


def test_annotations_and_trace_share_one_clock_on_the_gpu():
    # GIVEN Lightning's module annotations in the demo's recording: the qkv projection of block 0
    end4 = load_snapshot(DEMO / "cuda_alloc_rank_0.training_step.4.end.pickle")
    name = "[pl][module]torch.nn.modules.linear.Linear: model.blocks.0.qkv"
    starts = [
        a["time_us"] for a in end4["external_annotations"] if a["name"] == name and a["stage"] == "START"
    ]
    ends = [a["time_us"] for a in end4["external_annotations"] if a["name"] == name and a["stage"] == "END"]
    assert len(starts) == len(ends) == 3
    for s, e in zip(starts, ends, strict=True):
        # THEN the allocations timed inside each span are the qkv output, demo.py line 56
        inside = [x for x in end4["device_traces"][0] if x["action"] == "alloc" and s <= x["time_us"] <= e]
        lines = {f["line"] for x in inside for f in x["frames"] if f["filename"].endswith("demo.py")}
        assert inside and 56 in lines


def test_the_view_at_a_gpu_calls_start_equals_the_file_written_there():
    # GIVEN one recording of calls 3 and 4 (see _recording_with_marks)
    rec, start3 = _recording_with_marks()
    ranges = call_ranges(rec)
    assert [r.key for r in ranges] == ["training_step:3", "training_step:4"]
    # WHEN call 3's start is cut from it, with the segments rewound over 956 later entries
    view = call_view(rec, find_call(ranges, "training_step", 3), "start")
    # THEN the trace is the file's, entry for entry
    assert _no_markers(view)["device_traces"] == _no_markers(start3)["device_traces"]
    # AND every figure the analysis draws from trace and segments is the file's: peaks,
    # baseline, stacks at the peak, timeline, reserved, requested and rounded allocated bytes
    got, want = analyze(view), analyze(start3)
    assert got.devices == want.devices
    assert (
        (got.total_reserved, got.total_requested, got.total_allocated)
        == (
            want.total_reserved,
            want.total_requested,
            want.total_allocated,
        )
        == (138_412_032, 82_038_936, 82_041_344)
    )
    assert got.segments == want.segments
    # AND call 4's end view is the recording itself
    end4 = call_view(rec, find_call(ranges, "training_step", 4), "end")
    assert analyze(end4).devices == analyze(rec).devices


def test_call_range_and_bad_requests():
    rec, _ = _recording_with_marks()
    ranges = call_ranges(rec)
    trace = rec["device_traces"][0]
    # the entries inside call 3 are those between its start and end markers
    first, end = entry_range(trace, ranges[0])
    assert trace[first]["action"] == "snapshot" and trace[end - 1]["action"] == "snapshot"
    assert end - first == 1912 - 1810 + 1
    assert parse_call("model.encode:12") == ("model.encode", 12)
    with pytest.raises(ArtifactError, match="expected FUNCTION:CALL"):
        parse_call("training_step")
    with pytest.raises(ArtifactError, match=r"no call training_step:9 .*training_step:3, training_step:4"):
        find_call(ranges, "training_step", 9, "rec.pickle")
    with pytest.raises(ArtifactError, match="had not ended"):
        call_view(rec, CallRange("training_step", 5, trace[-1]["time_us"], None), "end")
    with pytest.raises(ArtifactError, match="ring wrapped"):
        call_view(
            rec, CallRange("training_step", 1, trace[0]["time_us"] - 10, trace[0]["time_us"] - 5), "end"
        )


def test_calls_from_the_index_when_torch_kept_no_annotations():
    # GIVEN a recording without annotations and its index's calls
    rec, _ = _recording_with_marks()
    rec["external_annotations"] = []
    t = rec["device_traces"][0][1000]["time_us"]
    index = {"calls": [{"fn": "training_step", "call": 3, "start_us": t, "end_us": t + 5}]}
    # THEN the index's times (memprofiler's clock) stand in, said to be from the index
    (rng,) = call_ranges(rec, index)
    assert (rng.key, rng.source, rng.start_us) == ("training_step:3", "index", t)
