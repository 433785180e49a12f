"""Where a call's memory goes: each split adds up to the call's peak, from analytic figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memprofiler.analysis.runs.artifacts import load_run
from memprofiler.reporters.model.call_table import CallRow
from memprofiler.reporters.model.memory_split import CallSplit, peak_of, split_call, top_with_other
from memprofiler.reporters.model.report import build_model

MIB = 1024**2
DEMO = Path(__file__).parents[1] / "fixtures" / "gpu_demo_run"


def test_a_cuda_call_is_what_it_held_before_plus_its_activations_plus_the_rest():
    # GIVEN a call that began with 40 MiB allocated (weights, grads, Adam state), saved 24 MiB
    # for backward and peaked at 70 MiB
    c = CallRow(
        0,
        "training_step",
        3,
        cuda_allocated_start=40 * MIB,
        cuda_allocated_peak=70 * MIB,
        saved_unique=24 * MIB,
        rss_start=500 * MIB,
        rss_peak=510 * MIB,
    )
    s = split_call(c)
    # THEN the bar is the CUDA peak: 40 + 24 + 6 MiB
    assert s.peak_name == "CUDA allocated peak" and s.peak == 70 * MIB
    assert s.parts == (("resident", 40 * MIB), ("activations", 24 * MIB), ("in_call", 6 * MIB))
    assert s.capped == 0


def test_the_trackers_categories_split_the_peak_and_the_cuda_excess_is_other():
    # GIVEN the module tracker's categories at its peak (they sum to its total) and a CUDA peak
    # 3 MiB above that total (allocator rounding, the cuBLAS workspace)
    peaks = {
        "parameter": 8 * MIB,
        "gradient": 8 * MIB,
        "optstate": 16 * MIB,
        "activation": 20 * MIB,
        "temp": 2 * MIB,
        "buffer": 1 * MIB,
        "other": 0,
        "total": 55 * MIB,
    }
    c = CallRow(0, "training_step", 3, cuda_allocated_peak=58 * MIB, tracker_peaks=peaks)
    s = split_call(c)
    assert s.peak == 58 * MIB
    assert dict(s.parts) == {
        "parameters": 8 * MIB,
        "gradients": 8 * MIB,
        "optimizer": 16 * MIB,
        "activations": 20 * MIB,
        "temporaries": 2 * MIB,
        "other": 4 * MIB,
    }
    # and on CPU (no CUDA figure) the bar is the tracker's own total
    cpu = split_call(CallRow(0, "training_step", 3, tracker_peaks=peaks))
    assert cpu.peak == 55 * MIB and dict(cpu.parts)["other"] == 1 * MIB
    # FSDP's categories map onto the same parts
    fsdp = {
        "sharded_param": 2 * MIB,
        "unsharded_param": 6 * MIB,
        "sharded_grad": 2 * MIB,
        "all_gather": 3 * MIB,
        "inputs": 1 * MIB,
        "total": 14 * MIB,
    }
    assert dict(split_call(CallRow(0, "f", 1, tracker_peaks=fsdp)).parts) == {
        "parameters": 8 * MIB,
        "gradients": 2 * MIB,
        "temporaries": 3 * MIB,
        "other": 1 * MIB,
    }


def test_a_host_call_is_the_process_before_it_and_its_rss_rise_with_the_saved_bytes_apart():
    # GIVEN a CPU call whose RSS rose 2 MiB although it saved 5 MiB (reused memory)
    c = CallRow(0, "training_step", 2, rss_start=490 * MIB, rss_peak=492 * MIB, saved_unique=5 * MIB)
    s = split_call(c)
    # THEN the bar is the RSS peak: the process before the call and the RSS rise, nothing named
    # activations; the 5 MiB saved stand beside it whole, not capped at the rise
    assert s.peak_name == "host RSS peak" and s.peak == 492 * MIB
    assert s.parts == (("process", 490 * MIB), ("rise", 2 * MIB))
    assert s.saved_apart == 5 * MIB and s.capped == 0
    # without a figure at its start, all of the peak is other
    s2 = split_call(CallRow(0, "f", 1, rss_peak=10 * MIB, saved_unique=4 * MIB))
    assert s2.parts == (("other", 10 * MIB),) and s2.saved_apart == 4 * MIB
    # and a call with no peak at all has no bar
    assert split_call(CallRow(0, "f", 1, saved_unique=4)) is None


def test_a_split_that_does_not_add_up_is_refused():
    with pytest.raises(ValueError, match="do not add up"):
        CallSplit(0, "f #1", 10, "host RSS peak", (("process", 4), ("other", 5)), "x.")


def test_a_cut_list_ends_with_an_other_row_holding_the_rest():
    items = {f"m{i}": 100 - i for i in range(33)}
    rows = top_with_other(items, 15)
    assert len(rows) == 16 and rows[-1][0] == "other (18 more)"
    assert sum(b for _, b in rows) == sum(items.values())
    assert top_with_other({"a": 2, "b": 1}, 1) == [("a", 2), ("b", 1)]  # no "other" for a single row


def test_the_recorded_gpu_run_splits_into_its_recorded_figures():
    # GIVEN the stats of the real H200 demo run
    model = build_model(load_run(DEMO))
    by_label = {c.label: split_call(c) for c in model.calls}
    s = by_label["training_step #3"]
    # THEN allocated_bytes.all.peak = current at start + saved-tensor bytes + the rest, exactly
    assert s.peak == 118_890_496
    assert dict(s.parts) == {
        "resident": 82_041_344,
        "activations": 35_807_940,
        "in_call": 118_890_496 - 82_041_344 - 35_807_940,
    }
    # validation had no CUDA figures: its bar is host RSS
    assert by_label["validation_step #3"].peak_name == "host RSS peak"


def test_a_real_cpu_run_splits_its_rss_peak_into_the_process_and_the_call(real_runs):
    # GIVEN a real CPU run of the tiny MLP (hidden 256): saved bytes known analytically
    from run_fixtures import expected_saved_bytes

    model = build_model(load_run(real_runs["a"]))
    for c in model.calls:
        s = split_call(c)
        # THEN each bar is the call's RSS peak: the process at its start, then what the call added
        assert s.peak_name == "host RSS peak" and s.peak == c.rss_peak
        parts = dict(s.parts)
        assert parts["process"] == c.rss_start
        assert c.saved_unique == expected_saved_bytes(256)
        # the rest of the bar is the RSS rise during the call; the saved bytes stand beside it, whole
        assert parts.get("rise", 0) == c.rss_peak - c.rss_start
        assert "activations" not in parts and s.saved_apart == expected_saved_bytes(256)
        assert sum(parts.values()) == c.rss_peak


def test_a_profilers_category_timeline_is_a_bar_of_its_peak():
    from memprofiler.analysis.traces.memory_categories import CategoryTimeline
    from memprofiler.reporters.model.memory_split import category_split

    # GIVEN the categories at the peak of the recorded H200 demo's cuda:0 timeline
    at_peak = {"input": 16_896, "temporary": 0, "activation": 0, "gradient": 3_468_288,
               "autograd_detail": 0, "parameter": 3_468_800, "optimizer_state": 6_936_576,
               "unknown": 36_840_980}  # fmt: skip
    tl = CategoryTimeline(Path("x.json"), "cuda:0", list(at_peak), [0.0], [list(at_peak.values())],
                          50_731_540, 37.9, at_peak, [], 0.0)  # fmt: skip
    s = category_split(tl, "rank 0 · cuda:0")
    # THEN the bar is the timeline's peak, unknown and input being other
    assert s.peak == 50_731_540 == sum(at_peak.values())
    assert dict(s.parts) == {"parameters": 3_468_800, "gradients": 3_468_288, "optimizer": 6_936_576,
                             "other": 36_840_980 + 16_896}  # fmt: skip


def test_a_long_run_draws_the_calls_with_the_highest_peaks():
    from memprofiler.analysis.runs.artifacts import RunArtifacts
    from memprofiler.reporters.model.report import ReportModel
    from memprofiler.reporters.where import MAX_BARS, where_html

    # GIVEN 300 calls whose CUDA peaks rise with the call number
    calls = [
        CallRow(0, "training_step", k, cuda_allocated_start=MIB, cuda_allocated_peak=(k + 1) * MIB)
        for k in range(300)
    ]
    html = where_html(ReportModel(run=RunArtifacts(root=Path("/run")), calls=calls))
    # THEN the chart holds the MAX_BARS highest, in call order, each adding up to its peak
    bars = re.findall(r'data-label="training_step #(\d+)" data-total="(\d+)"', html)
    assert [int(c) for c, _ in bars] == list(range(300 - MAX_BARS, 300))
    assert f"the {MAX_BARS} calls with the highest peaks of 300" in html
    for g in re.findall(r'<g class="sbar".*?</g>', html):
        total = int(re.search(r'data-total="(\d+)"', g).group(1))
        assert sum(int(v) for v in re.findall(r'data-bytes="(\d+)"', g)) == total


@pytest.mark.parametrize(
    ("total", "cuda", "rss", "expected"),
    [
        (55, 58, 90, ("CUDA allocated peak", 58)),  # tracker, CUDA above its total: the CUDA peak
        (55, 55, 90, ("tracker peak", 55)),  # CUDA equal or below: the tracker's total
        (55, 40, None, ("tracker peak", 55)),
        (55, None, 90, ("tracker peak", 55)),  # CPU: the tracker's total, not RSS
        (0, 40, 90, ("CUDA allocated peak", 40)),  # a zero total is no tracker figure
        (None, 40, 90, ("CUDA allocated peak", 40)),
        (None, 0, 90, ("CUDA allocated peak", 0)),  # a CUDA figure of 0 is still the CUDA peak
        (None, None, 90, ("host RSS peak", 90)),
        (0, None, 90, ("host RSS peak", 90)),
        (None, None, None, None),
        (0, None, None, None),
    ],
)
def test_the_bar_drawn_is_the_peak_the_top_calls_rank_by(total, cuda, rss, expected):
    # GIVEN a call with these figures (bytes in MiB)
    peaks = None if total is None else {"activation": total // 2, "total": total * MIB}
    c = CallRow(
        0,
        "f",
        1,
        cuda_allocated_start=None if cuda is None else 0,
        cuda_allocated_peak=None if cuda is None else cuda * MIB,
        rss_start=None if rss is None else 0,
        rss_peak=None if rss is None else rss * MIB,
        tracker_peaks=peaks,
    )
    # WHEN its split is made and its peak ranked
    s = split_call(c)
    found = peak_of(total and total * MIB, c.cuda_allocated_peak, c.rss_peak)
    # THEN both are the same peak: the one expected
    want = None if expected is None else (expected[0], expected[1] * MIB)
    assert found == want
    assert (s and (s.peak_name, s.peak)) == want
