"""Allocator-snapshot analysis against hand-computed answers (see ``snapshot_fixtures``)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from _scripts import load_script
from memprofiler.analysis.snapshot.summary import NO_STACK, analyze, load_snapshot
from memprofiler.errors import ArtifactError
from snapshot_fixtures import KNOWN, ROUND_BASE, KiB, known_snapshot, rounded_snapshot, trace_only_snapshot


def test_peaks_and_totals_match_hand_computed_values():
    # GIVEN a snapshot whose trace starts after some blocks already existed
    data = known_snapshot()
    # WHEN it is analysed
    dev = analyze(data).devices[0]
    # THEN the baseline, peaks and end totals are the hand-computed ones
    assert dev.entries == 12
    assert dev.baseline_allocated == KNOWN["baseline"]
    assert dev.peak_allocated == KNOWN["peak_allocated"]
    assert dev.peak_allocated_index == KNOWN["peak_index"]
    assert dev.peak_allocated_time_us == KNOWN["peak_time_us"]
    assert dev.end_allocated == KNOWN["end_allocated"]
    assert dev.peak_reserved == KNOWN["peak_reserved"]
    assert dev.peak_reserved_index == KNOWN["peak_reserved_index"]
    assert dev.end_reserved == KNOWN["end_reserved"]


def test_end_state_of_the_trace_agrees_with_the_segments():
    result = analyze(known_snapshot())
    assert result.total_reserved == KNOWN["total_reserved"]
    assert result.total_requested == result.devices[0].end_allocated == KNOWN["end_allocated"]
    assert result.total_allocated == KNOWN["end_allocated"]  # requested == rounded in this fixture


def test_live_blocks_at_peak_grouped_by_python_stack_sum_to_the_peak():
    dev = analyze(known_snapshot()).devices[0]
    assert [(g.bytes, g.count) for g in dev.top_stacks] == KNOWN["stacks"]
    assert sum(g.bytes for g in dev.top_stacks) == dev.peak_allocated
    assert dev.live_blocks_at_peak == 5
    top = dev.top_stacks[0]
    # Python frames only, innermost first; the C++ allocator frame is dropped
    assert top.frames == (
        "linear_forward (linear_forward.py:10)",
        "model_forward (model_forward.py:11)",
        "training_step (training_step.py:12)",
    )
    assert dev.top_stacks[1].frames[0] == "init_weights (init_weights.py:10)"
    assert (NO_STACK,) in [g.frames for g in dev.top_stacks]


def test_top_n_keeps_the_largest_groups():
    dev = analyze(known_snapshot(), top=2).devices[0]
    assert [g.bytes for g in dev.top_stacks] == [1280 * KiB, 512 * KiB]
    assert dev.live_blocks_at_peak == 5  # counted over every group, not only the shown ones


def test_fragmentation_per_segment():
    segs = {s.address: s for s in analyze(known_snapshot()).segments}
    a, b, c = segs[1_000_000], segs[5_000_000], segs[8_000_000]
    assert (a.total_size, a.allocated, a.free, a.largest_free) == (
        2048 * KiB,
        1536 * KiB,
        512 * KiB,
        512 * KiB,
    )
    assert a.requested == 1536 * KiB
    assert a.fragmentation == 0.0
    assert b.fragmentation == 0.0 and b.free == 1024 * KiB
    assert c.fragmentation == pytest.approx(1 / 3)


def test_figures_are_requested_bytes_when_blocks_are_rounded_up():
    # GIVEN blocks whose rounded sizes exceed what was requested (pre-trace blocks alive at
    # the end and freed in the trace, one block only free_requested at the end)
    result = analyze(rounded_snapshot())
    [dev] = result.devices
    # THEN every trace figure is in requested bytes, worked out by hand in the fixture
    assert (dev.baseline_allocated, dev.peak_allocated, dev.peak_allocated_index, dev.end_allocated) == (
        1700,
        6004,
        4,
        3004,
    )
    assert [a for _, a, _ in analyze(rounded_snapshot(), points=100).devices[0].timeline] == [
        1704,
        1704,
        1004,
        4004,
        6004,
        6004,
        3004,
        3004,
    ]
    # AND the stacks live at the peak add up to it in requested bytes
    assert [(g.bytes, g.count, g.frames[0]) for g in dev.top_stacks] == [
        (5000, 2, "linear_forward (linear_forward.py:10)"),
        (1000, 1, "init_weights (init_weights.py:10)"),
        (4, 1, "attention_forward (attention_forward.py:10)"),
    ]
    # AND the trace's end agrees with the segments' requested bytes, while the segment keeps the
    # allocator's rounded count (the active_pending_free block is still in both)
    [seg] = result.segments
    assert (seg.address, seg.allocated, seg.requested) == (ROUND_BASE, 3584, 3004)
    assert result.total_requested == dev.end_allocated == 3004
    assert result.total_allocated == 3584


def test_oom_entries_are_reported():
    ooms = analyze(known_snapshot()).ooms
    assert len(ooms) == 1
    o = ooms[0]
    assert (o.device, o.index, o.size, o.device_free, o.time_us) == (0, 9, 8 * 1024**3, 1000, 170)
    assert o.frames[0] == "attention_forward (attention_forward.py:10)"


def test_timeline_keeps_the_peak_and_ends_at_the_end_state():
    dev = analyze(known_snapshot(), points=4).devices[0]
    assert max(a for _, a, _ in dev.timeline) == dev.peak_allocated
    assert max(r for _, _, r in dev.timeline) == dev.peak_reserved
    assert dev.timeline[-1][0] == dev.entries - 1
    full = analyze(known_snapshot(), points=1000).devices[0]
    assert [a for _, a, _ in full.timeline][-1] == dev.end_allocated


def test_trace_without_segments_starts_from_zero():
    result = analyze(trace_only_snapshot())
    [dev] = result.devices
    assert dev.device == 1
    assert (dev.baseline_allocated, dev.peak_allocated, dev.peak_allocated_index, dev.end_allocated) == (
        0,
        300,
        1,
        250,
    )
    assert [(g.bytes, g.count) for g in dev.top_stacks] == [(200, 1), (100, 1)]


def test_segments_without_trace_report_the_current_state():
    data = known_snapshot()
    data["device_traces"] = []
    [dev] = analyze(data).devices
    assert dev.entries == 0
    assert dev.peak_allocated == KNOWN["end_allocated"]
    assert dev.peak_allocated_index == -1
    assert sum(g.bytes for g in dev.top_stacks) == KNOWN["end_allocated"]


def test_torch_memory_viz_trace_total_is_wrong_where_ours_is_right():
    # GIVEN torch's own text tool on the same snapshot
    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    text = memory_viz.trace(known_snapshot())
    total_line = text.strip().splitlines()[-1]
    # THEN its total is not the allocated bytes at the end of the trace (its counter doubles as
    # the loop index), while ours matches the segments
    assert total_line.startswith("TOTAL MEM:")
    # (the net trace change is 896 KiB and the true end total 1.75 MiB; torch prints "11.0B")
    assert total_line not in ("TOTAL MEM: 896.0KiB", "TOTAL MEM: 1.8MiB")
    assert analyze(known_snapshot()).devices[0].end_allocated == 1792 * KiB


def test_load_snapshot_reads_protocol_4_pickles(tmp_path):
    p = tmp_path / "snap.pickle"
    p.write_bytes(pickle.dumps(known_snapshot(), protocol=4))
    assert analyze(load_snapshot(p), str(p)).devices[0].peak_allocated == KNOWN["peak_allocated"]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"hello": 1}, "not a CUDA allocator snapshot"),
        ([1, 2, 3], "malformed allocator snapshot"),
        ({"segments": [], "device_traces": [[{"addr": 1}]]}, "malformed allocator snapshot"),
        ("text", "not a CUDA allocator snapshot"),
    ],
)
def test_foreign_data_is_a_one_line_artifact_error(tmp_path, payload, message):
    p = tmp_path / "x.pickle"
    p.write_bytes(pickle.dumps(payload, protocol=4))
    with pytest.raises(ArtifactError, match=message) as info:
        analyze(load_snapshot(p), str(p))
    assert str(p) in str(info.value)
    assert "\n" not in str(info.value)


def test_full_resolution_timeline_is_the_state_after_every_entry():
    dev = analyze(known_snapshot(), points=1000).devices[0]
    assert [a // KiB for _, a, _ in dev.timeline] == [
        896,
        1152,
        1408,
        1408,
        1280,
        2304,
        2304,
        2048,
        1792,
        1792,
        1792,
        1792,
    ]
    assert [r // KiB for _, _, r in dev.timeline] == [4096] * 10 + [6144, 4096]


def _benchmark_generator():

    return load_script("benchmarks/snapshot_analysis.py", "bench_snapshot_analysis").make_snapshot


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_realistic_trace_peak_matches_generator_truth(seed):
    # GIVEN the benchmark's synthetic snapshot (reused addresses, request/complete pairs)
    data, true_peak = _benchmark_generator()(5000, seed=seed)
    # WHEN analysed
    result = analyze(data)
    dev = result.devices[0]
    # THEN the peak is the generator's, the end state agrees with the segments, and the stacks
    # live at the peak add up to it
    assert dev.peak_allocated == true_peak
    assert dev.baseline_allocated == 0
    assert dev.end_allocated == result.total_requested
    assert dev.end_reserved == result.total_reserved
    assert sum(g.bytes for g in analyze(data, top=10_000).devices[0].top_stacks) == true_peak


_FIXTURES = Path(__file__).parents[1] / "fixtures"
_REAL = sorted(
    p
    for p in _FIXTURES.glob("*.pickle")
    if p.name.startswith("gpu_") or any(k in p.name for k in ("alloc", "oom", "snapshot"))
)


@pytest.mark.skipif(not _REAL, reason="no recorded GPU allocator pickle committed under tests/fixtures/ yet")
@pytest.mark.parametrize("path", _REAL, ids=[p.name for p in _REAL])
def test_real_recorded_snapshot_is_self_consistent(path):
    # GIVEN an allocator-history pickle recorded on a real GPU
    result = analyze(load_snapshot(path), str(path), top=1_000_000)
    # THEN each device's trace replays to the state its segments show, and the stacks live at
    # the peak add up to the peak
    assert result.devices
    for dev in result.devices:
        segs = [s for s in result.segments if s.device == dev.device]
        if segs:
            assert dev.end_allocated == sum(s.requested for s in segs)
            assert dev.end_reserved == sum(s.total_size for s in segs)
        assert sum(g.bytes for g in dev.top_stacks) == dev.peak_allocated
        assert dev.peak_allocated >= dev.end_allocated
