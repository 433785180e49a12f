"""The allocator model against what real CUDA caching allocators did.

Real evidence (see tests/fixtures/README.md): ``gpu_runs/demo`` (two training steps of the demo
model, H200, torch 2.11, the trace complete from the first allocation), ``gpu_runs/oom`` (a fit
that ends in a 400 GiB OOM, the allocator releasing its cached segments first) and
``gpu_transformer_forward_mixed.pickle`` (a data-center GPU, ring buffer truncated: 227 of its
688 segments and 12.69 GiB predate the first entry). Each trace is rewound to its first entry,
replayed through :class:`AllocatorReplay` and compared at every allocation and every event.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _scripts import load_script
from memprofiler.analysis.snapshot.summary import load_snapshot
from memprofiler.estimate.allocator.caching import (
    NO_LIMIT,
    AllocatorConfig,
    AllocatorReplay,
    SeedBlock,
    SeedSegment,
    round_size,
)
from memprofiler.estimate.allocator.trace import (
    RewindError,
    check_trace,
    clean_replay,
    config_from_settings,
    rewind,
)

MiB = 1 << 20
FIX = Path(__file__).parents[1] / "fixtures"
DEMO3 = FIX / "gpu_runs" / "demo" / "cuda_alloc_rank_0.training_step.3.start.pickle"
DEMO4 = FIX / "gpu_runs" / "demo" / "cuda_alloc_rank_0.training_step.4.end.pickle"
OOM = FIX / "gpu_runs" / "oom" / "oom_rank_0_0.pickle"
OOM_LAST = FIX / "gpu_runs" / "oom" / "oom_rank_0_1.pickle"
TRANSFORMER = FIX / "gpu_transformer_forward_mixed.pickle"


@pytest.fixture(scope="module")
def transformer() -> dict:
    return load_snapshot(TRANSFORMER)


def test_a_trace_alloc_carries_the_request_not_the_block_size(transformer):
    # the blocks still live at the dump, matched with the alloc entry that made them
    last = {}
    for e in transformer["device_traces"][0]:
        if e["action"] == "alloc":
            last[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            del last[e["addr"]]
    blocks = {b["address"]: b for g in transformer["segments"] for b in g["blocks"] if b["address"] in last}
    assert all(b["state"] == "active_allocated" for b in blocks.values())
    assert len(blocks) == 1289
    assert all(last[a] == b["requested_size"] for a, b in blocks.items())
    # 30 of them got more than their 512 B rounding: 2.5 MiB requests that kept a whole 3 MiB
    # block (the 512 KiB rest is not worth splitting off in the large pool)
    wider = [b for b in blocks.values() if b["size"] != round_size(b["requested_size"])]
    assert len(wider) == 30
    assert {(b["requested_size"], b["size"]) for b in wider} == {(5 * MiB // 2, 3 * MiB)}


def test_a_complete_trace_rewinds_to_an_empty_allocator():
    # GIVEN the demo run's pickle at call 3's start: history on before the first allocation
    snap = load_snapshot(DEMO3)
    back = rewind(snap)
    # THEN nothing existed before the first entry, and the figures after the last one are the
    # allocator's own counters at call 3's start (gpu_demo_run/rank_0_memory_stats.yaml)
    assert back.segments == []
    assert (back.allocated_after[-1], back.reserved_after[-1]) == (82_041_344, 138_412_032)
    assert max(back.allocated_after) == 118_890_496  # allocated_bytes.all.peak in steps 1-2
    assert back.guessed == 0


@pytest.mark.parametrize("path", [DEMO4, OOM_LAST], ids=["demo4", "oom"])
def test_the_rewound_figures_equal_the_allocators_own_at_every_dump(path):
    # a `snapshot` entry records the active bytes when torch dumped the state (no block was
    # pending a cross-stream free in these runs, so active equals allocated)
    snap = load_snapshot(path)
    back = rewind(snap)
    trace = snap["device_traces"][0]
    dumps = [(e["size"], back.allocated_after[i]) for i, e in enumerate(trace) if e["action"] == "snapshot"]
    assert len(dumps) >= 3
    assert all(real == rewound for real, rewound in dumps)


def test_a_truncated_trace_rewinds_to_the_cache_it_started_from(transformer):
    back = rewind(transformer)
    live = [b for g in back.segments for b in g.blocks if b.state != "free"]
    assert (len(back.segments), len(live)) == (227, 324)
    # 12.69 GiB requested (12.82 GiB in blocks) before the history; 116,736 B of the cache was free
    assert (sum(b.requested for b in live), sum(b.size for b in live)) == (13_628_553_216, 13_763_491_840)
    assert sum(g.size for g in back.segments) == 13_763_608_576
    assert back.allocated_after[-1] == sum(
        b["size"] for g in transformer["segments"] for b in g["blocks"] if b["state"] == "active_allocated"
    )
    assert back.reserved_after[-1] == sum(g["total_size"] for g in transformer["segments"])


@pytest.mark.parametrize(
    "path", [DEMO3, DEMO4, OOM, TRANSFORMER], ids=["demo3", "demo4", "oom", "transformer"]
)
def test_the_model_decides_every_allocation_as_the_real_allocator(path):
    """Failed before segments had addresses: best fit broke size ties by segment creation order,
    the real allocator by address (demo call 4: 47% of the blocks at the real address, one
    2 MiB segment too many, the reserved peak 140,509,184 B instead of 138,412,032 B)."""
    check = check_trace(load_snapshot(path))
    assert check.allocs > 0
    assert check.divergences == []
    assert check.rates() == dict.fromkeys(
        ("source", "address", "block_size", "segment_size", "allocated", "reserved", "release"), 1.0
    )
    assert check.end_state_equal
    assert (check.model_peak_allocated, check.model_peak_reserved) == (
        check.real_peak_allocated,
        check.real_peak_reserved,
    )


def test_figures_of_the_real_traces(transformer):
    demo = check_trace(load_snapshot(DEMO4))
    assert (demo.real_peak_allocated, demo.real_peak_reserved) == (118_890_496, 138_412_032)
    assert demo.real_slack_at_peak == 0  # no live block wider than its 512 B rounding at the peak
    oom = check_trace(load_snapshot(OOM))
    assert (oom.releases, oom.same_release) == (1, 1)  # the two cached 16 MiB segments, before the OOM
    big = check_trace(transformer)
    assert (big.real_new_segments, big.real_peak_allocated) == (461, 24_024_505_344)
    assert big.real_slack_at_peak == big.model_slack_at_peak == 151_191_552
    # as an estimate starts, from an empty cache with segment creation order for addresses: the
    # transformer's peaks to the byte (its slack is the rules', not its cache history's); the demo
    # takes one 2 MiB segment more where two equal free blocks tie
    clean = clean_replay(transformer)
    assert (clean.peak_allocated, clean.peak_reserved, clean.slack_at_peak) == (
        24_024_505_344,
        24_245_174_272,
        151_191_552,
    )
    demo_clean = clean_replay(load_snapshot(DEMO4))
    assert (demo_clean.peak_allocated, demo_clean.peak_reserved) == (118_890_496, 138_412_032 + 2 * MiB)


# ---- hand-computed cases ------------------------------------------------------------------------


def test_best_fit_breaks_size_ties_by_address_not_by_creation_order():
    # GIVEN two small-pool segments; cudaMalloc put the second one BELOW the first
    places = iter([0x9000_0000, 0x1000_0000])
    r = AllocatorReplay(segment_address=lambda n: next(places))
    for key in (1, 2, 3, 4):  # 1 MiB each: two per 2 MiB segment
        r.alloc(key, MiB)
    assert [r.block(k) for k in (1, 3)] == [(0x9000_0000, MiB), (0x1000_0000, MiB)]
    # WHEN the first block of each is freed, two 1 MiB free blocks tie on size
    r.free(1)
    r.free(3)
    r.alloc(5, MiB)
    # THEN the lower address wins, though its segment is the younger
    assert r.block(5) == (0x1000_0000, MiB)


def test_an_estimate_without_addresses_uses_creation_order():
    r = AllocatorReplay()
    for key in (1, 2, 3, 4):
        r.alloc(key, MiB)
    r.free(3)
    r.free(1)
    r.alloc(5, MiB)
    # the two free 1 MiB blocks tie: segment 1 (made first) wins, as before addresses existed
    assert r.block(5) == (1, MiB)  # segment 1 stands at "address" 1, the block at its offset 0


def test_a_seeded_replay_starts_from_the_given_state_and_releases_only_whole_free_segments():
    seeds = [
        SeedSegment(0x4000_0000, 0, False, (SeedBlock(20 * MiB),)),  # cached, whole
        SeedSegment(0x2000_0000, 0, False, (SeedBlock(4 * MiB, key=7), SeedBlock(16 * MiB))),
        SeedSegment(0x1000_0000, 0, True, (SeedBlock(2 * MiB),)),  # small pool, cached
    ]
    r = AllocatorReplay.seeded(seeds)
    assert (r.allocated, r.reserved, r.peak_reserved) == (4 * MiB, 42 * MiB, 42 * MiB)
    assert r.block(7) == (0x2000_0000, 4 * MiB)
    r.alloc(8, 16 * MiB)  # best fit: the 16 MiB rest of the split segment, not the 20 MiB one
    assert r.block(8) == (0x2000_0000 + 4 * MiB, 16 * MiB)
    assert sorted(r.release_cached()) == [(0x1000_0000, 2 * MiB), (0x4000_0000, 20 * MiB)]
    assert (r.reserved, r.released) == (20 * MiB, 22 * MiB)


def _snap(segments: list[dict], trace: list[dict]) -> dict:
    return {"segments": segments, "device_traces": [trace]}


def _seg(address: int, blocks: list[tuple[int, str, int]], kind: str = "large") -> dict:
    return {
        "device": 0,
        "address": address,
        "total_size": sum(b[0] for b in blocks),
        "stream": 0,
        "segment_type": kind,
        "blocks": [{"size": s, "state": st, "requested_size": r} for s, st, r in blocks],
    }


def test_rewind_undoes_each_action_by_hand():
    A = 0x10_0000_0000
    # dumped: one 20 MiB segment, a 3 MiB block live, the rest free; one segment freed in the trace
    snap = _snap(
        [_seg(A, [(3 * MiB, "active_allocated", 3 * MiB), (17 * MiB, "inactive", 0)])],
        [
            {"action": "free_completed", "addr": A + 3 * MiB, "size": 5 * MiB + 100, "stream": 0},
            {"action": "segment_free", "addr": A + 64 * MiB, "size": 2 * MiB, "stream": 0},
            {"action": "alloc", "addr": A, "size": 3 * MiB, "stream": 0},
        ],
    )
    back = rewind(snap)
    # before the trace: the 2 MiB (small) segment existed; in the 20 MiB one a block of
    # round(5 MiB + 100) = 5 MiB + 512 was live (freed without its free_requested: pending)
    assert [(g.address, g.small, [(b.size, b.state) for b in g.blocks]) for g in back.segments] == [
        (A, False, [(3 * MiB, "free"), (5 * MiB + 512, "pending"), (12 * MiB - 512, "free")]),
        (A + 64 * MiB, True, [(2 * MiB, "free")]),
    ]
    assert back.block_size == {2: 3 * MiB}
    assert back.allocated_after == [0, 0, 3 * MiB]
    assert back.reserved_after == [22 * MiB, 20 * MiB, 20 * MiB]


def test_rewind_names_the_entry_that_does_not_fit():
    A = 0x10_0000_0000
    snap = _snap(
        [_seg(A, [(20 * MiB, "inactive", 0)])],
        [{"action": "free_requested", "addr": A, "size": MiB, "stream": 0}],
    )
    with pytest.raises(RewindError, match=r"entry 0 \(free_requested"):
        rewind(snap)


def test_allocator_settings_become_the_models_config():
    assert config_from_settings(None) == AllocatorConfig()
    cfg = config_from_settings(
        {
            "max_split_size": 128 * MiB,
            "expandable_segments": True,
            "roundup_power2_divisions": {"1": 4, "2": 4},
        }
    )
    assert (cfg.max_split_size, cfg.expandable_segments, cfg.roundup_power2_divisions) == (128 * MiB, True, 4)
    assert config_from_settings({"max_split_size": -1}).max_split_size == NO_LIMIT


def test_the_check_tool_prints_the_figures_and_fails_on_a_file_that_does_not_rewind(tmp_path, capsys):
    import json
    import pickle

    tool = load_script("tools/allocator_check.py")

    assert tool.main([str(OOM)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["exact"] and out["figures"]["allocs"] == 94
    assert out["clean_start"] == {
        "peak_allocated": 236_065_792,
        "peak_reserved": 236_978_176,
        "slack_at_peak": 0,
    }
    # a trace that frees a block the dumped state never held
    bad = tmp_path / "bad.pickle"
    seg = _seg(0x10_0000_0000, [(20 * MiB, "inactive", 0)])
    bad.write_bytes(
        pickle.dumps(_snap([seg], [{"action": "free_requested", "addr": 0x10_0000_0000, "size": 1}]))
    )
    assert tool.main([str(bad)]) == 1
    assert "entry 0 (free_requested at 0x1000000000)" in capsys.readouterr().err


def test_a_block_freed_before_its_alloc_was_recorded_gets_a_guessed_size():
    A = 0x10_0000_0000
    # a 19.5 MiB request freed in the trace, allocated before it: the 512 KiB behind it in the
    # large pool would not have been split off, so the block is taken to reach the segment's end
    snap = _snap(
        [_seg(A, [(20 * MiB, "inactive", 0)])],
        [
            {"action": "free_requested", "addr": A, "size": 39 * MiB // 2, "stream": 0},
            {"action": "free_completed", "addr": A, "size": 39 * MiB // 2, "stream": 0},
        ],
    )
    back = rewind(snap)
    assert [(b.size, b.state) for b in back.segments[0].blocks] == [(20 * MiB, "allocated")]
    assert back.guessed == 1
    assert back.allocated_after == [0, 0]


def test_clean_replay_reports_each_windows_peak_and_what_a_cut_up_cache_adds() -> None:
    A = 0x10_0000_0000
    # one 20 MiB segment: a parameter, a temporary, a second parameter (the rest, 471,040 B past
    # its 8,500,224 B rounding, is under 1 MiB: not split off), the temporary freed; then a step
    # asks 7,000,064 B and takes the temporary's 8,000,000 B hole whole (999,936 B over)
    t_at, p_at = A + 4_000_256, A + 12_000_256
    trace = [
        {"action": "segment_alloc", "addr": A, "size": 20 * MiB, "stream": 0},
        {"action": "alloc", "addr": A, "size": 4_000_000, "stream": 0},
        {"action": "alloc", "addr": t_at, "size": 8_000_000, "stream": 0},
        {"action": "alloc", "addr": p_at, "size": 8_500_000, "stream": 0},
        {"action": "free_requested", "addr": t_at, "size": 8_000_000, "stream": 0},
        {"action": "free_completed", "addr": t_at, "size": 8_000_000, "stream": 0},
        {"action": "alloc", "addr": t_at, "size": 7_000_000, "stream": 0},  # the step: entry 6
        {"action": "free_requested", "addr": t_at, "size": 7_000_000, "stream": 0},
        {"action": "free_completed", "addr": t_at, "size": 7_000_000, "stream": 0},
    ]
    dumped = [(4_000_256, "active_allocated", 4_000_000), (8_000_000, "inactive", 0)]
    snap = _snap([_seg(A, [*dumped, (8_971_264, "active_allocated", 8_500_000)])], trace)
    full = 20 * MiB  # the segment, every byte in a live block at the step's peak
    whole = clean_replay(snap, windows=[(0, 6), (6, 9)])
    # from the trace's start an empty cache decides as the real one did
    assert whole.windows == [(full, 471_040), (full, 471_040 + 999_936)]
    assert (whole.peak_allocated, whole.slack_at_peak) == (full, 471_040)
    # from the step's start, the two parameters requested into an empty cache: the second is
    # split (8,471,040 B free behind it) and the step's request splits that rest too
    step = clean_replay(_snap(snap["segments"], trace[6:]), windows=[(0, 3)])
    assert step.windows == [(4_000_256 + 8_500_224 + 7_000_064, 0)]
    assert full - step.windows[0][0] == 471_040 + 999_936  # what the cut-up cache added
