"""The caching-allocator model: rounding, pools, segments, reuse, splitting and merging."""

from __future__ import annotations

import torch
from torch import nn

from memprofiler.estimate import estimate_memory
from memprofiler.estimate.allocator.caching import AllocatorReplay, round_size, segment_size

MiB = 1 << 20


def test_rounding_and_segment_sizes():
    assert [round_size(n) for n in (1, 512, 513, 4000)] == [512, 512, 1024, 4096]
    assert segment_size(512) == 2 * MiB  # small pool
    assert segment_size(MiB) == 2 * MiB
    assert segment_size(MiB + 512) == 20 * MiB  # large pool, under 10 MiB
    assert segment_size(10 * MiB + 512) == 12 * MiB  # 2 MiB multiples above


def test_small_blocks_share_a_segment_and_merge_back():
    # GIVEN one 2 MiB small-pool segment filled by 512 KiB + 512 KiB + 1 MiB
    r = AllocatorReplay()
    for key, n in ((1, MiB // 2), (2, MiB // 2), (3, MiB)):
        r.alloc(key, n)
    assert (r.allocated, r.reserved, r.segments) == (2 * MiB, 2 * MiB, 1)
    # WHEN the two neighbours are freed and 1 MiB is asked for
    r.free(1)
    r.free(2)
    r.alloc(4, MiB)
    # THEN they merged into one 1 MiB block that serves it: no second segment
    assert (r.segments, r.peak_allocated, r.peak_reserved) == (1, 2 * MiB, 2 * MiB)


def test_large_pool_reuses_a_freed_block_best_fit():
    r = AllocatorReplay()
    r.alloc(1, 4 * MiB)
    r.alloc(2, 4 * MiB)  # the same 20 MiB segment, split
    r.free(1)
    r.alloc(3, 3 * MiB)  # best fit: the freed 4 MiB block; the 1 MiB rest is not split off
    assert r.segments == 1
    assert r.allocated == 8 * MiB
    assert r.peak_reserved == 20 * MiB


def test_cuda_estimate_reports_the_allocator_view_and_cpu_the_tensor_bytes():
    with torch.device("meta"):
        net = nn.Linear(1000, 1000)
    x = torch.randn(3, 1000)
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    cuda = estimate_memory(net, x, optimizer=sgd, device="cuda")
    cpu = estimate_memory(net, x, optimizer=sgd, device="cpu")
    assert cpu.peak_bytes == cpu.tensor_peak_bytes == cuda.tensor_peak_bytes
    # every live block is rounded up to 512 B, never down; segments hold them all
    assert cuda.tensor_peak_bytes < cuda.peak_bytes <= cuda.reserved_peak_bytes
    assert cuda.peak_bytes % 512 == 0


# ---- PYTORCH_CUDA_ALLOC_CONF settings (CUDACachingAllocator.cpp) -------------------------------


def test_alloc_conf_is_parsed_and_what_the_model_does_not_follow_is_named():
    from memprofiler.estimate.allocator.caching import AllocatorConfig

    cfg = AllocatorConfig.parse(
        "max_split_size_mb:128,expandable_segments:True,garbage_collection_threshold:0.6,"
        "roundup_power2_divisions:[256:1,>:4],pinned_use_cuda_host_register:True"
    )
    assert cfg.max_split_size == 128 * MiB
    assert cfg.expandable_segments and cfg.garbage_collection_threshold == 0.6
    # per-size divisions are not the model's single setting; a host-memory option changes nothing here
    assert cfg.ignored == ("roundup_power2_divisions:[256:1,>:4]",)


def test_roundup_power2_divisions_rounds_to_the_next_quarter_of_the_power_of_two():
    from memprofiler.estimate.allocator.caching import AllocatorConfig

    cfg = AllocatorConfig(roundup_power2_divisions=4)
    assert round_size(1_200_000, cfg) == MiB + MiB // 4  # [1 MiB, 2 MiB) in steps of 256 KiB
    assert round_size(2 * MiB, cfg) == 2 * MiB  # a power of two stays
    assert round_size(1000, cfg) == 1024  # at or below 512 x 4: plain 512 B rounding


def test_max_split_size_keeps_oversize_blocks_from_small_requests():
    from memprofiler.estimate.allocator.caching import AllocatorConfig

    r = AllocatorReplay(AllocatorConfig(max_split_size=16 * MiB))
    r.alloc(1, 30 * MiB)
    r.free(1)
    r.alloc(2, 4 * MiB)  # below the limit: the cached 30 MiB block is oversize, a new 20 MiB segment
    assert (r.segments, r.reserved) == (2, 50 * MiB)
    r.alloc(3, 40 * MiB)
    r.free(3)
    r.alloc(4, 18 * MiB)  # above: takes the 30 MiB block (less than 18 + 20 MiB), whole, unsplit
    assert r.allocated == 4 * MiB + 30 * MiB
    assert r.segments == 3


def test_expandable_segments_grow_one_segment_by_pages():
    from memprofiler.estimate.allocator.caching import AllocatorConfig

    plain = AllocatorReplay()
    grown = AllocatorReplay(AllocatorConfig(expandable_segments=True))
    for r in (plain, grown):
        r.alloc(1, 4 * MiB)
        r.alloc(2, 18 * MiB)
    assert (plain.segments, plain.peak_reserved) == (2, 20 * MiB + 18 * MiB)
    # the 16 MiB free tail of the first 20 MiB page grows by one more page
    assert (grown.segments, grown.peak_reserved) == (1, 40 * MiB)


def test_cached_segments_are_released_before_an_oom():
    r = AllocatorReplay(capacity=50 * MiB)
    r.alloc(1, 30 * MiB)
    r.free(1)
    r.alloc(2, 40 * MiB)  # 30 cached + 40 new would pass 50 MiB: the cached segment goes first
    assert (r.reserved, r.peak_reserved, r.released) == (40 * MiB, 40 * MiB, 30 * MiB)


def test_streams_have_their_own_pools():
    r = AllocatorReplay()
    r.alloc(1, 4 * MiB, stream=0)
    r.alloc(2, 4 * MiB, stream=1)  # the first segment's free 16 MiB belongs to stream 0
    assert r.segments == 2


def test_garbage_collection_needs_a_memory_fraction_and_frees_the_oldest_large_segments():
    from memprofiler.estimate.allocator.caching import AllocatorConfig

    def run(fraction: float | None) -> AllocatorReplay:
        # threshold 0.5 of the allowed memory (200 MiB x 0.5 = 100 MiB): the line is 50 MiB
        r = AllocatorReplay(
            AllocatorConfig(garbage_collection_threshold=0.5), capacity=200 * MiB, memory_fraction=fraction
        )
        r.alloc(1, 30 * MiB)  # large-pool request 1: segment A
        r.free(1)  # A free since request 1
        r.alloc(2, 32 * MiB)  # request 2: A is too small, segment B
        r.free(2)  # B free since request 2
        r.alloc(3, 40 * MiB)  # request 3: nothing cached fits
        return r

    # with a fraction: reserved 62 MiB > 50 MiB, 12 MiB to reclaim; ages A 2, B 1, average 1.5:
    # A (30 MiB) goes, which is enough; B stays
    gc = run(0.5)
    assert (gc.released, gc.reserved) == (30 * MiB, 72 * MiB)
    # without one (torch.cuda.set_per_process_memory_fraction never called) the threshold does
    # nothing: 102 MiB fit in 200 MiB, nothing is released
    plain = run(None)
    assert (plain.released, plain.reserved) == (0, 102 * MiB)


def test_before_an_oom_max_split_size_releases_one_oversize_segment_first():
    from memprofiler.estimate.allocator.caching import AllocatorConfig

    r = AllocatorReplay(AllocatorConfig(max_split_size=20 * MiB), capacity=100 * MiB)
    r.alloc(1, 60 * MiB)
    r.alloc(2, 30 * MiB)
    r.free(1)
    r.free(2)
    # 35 MiB: the cached 60 MiB block is 20 MiB or more too large, so a new 36 MiB segment;
    # 90 + 36 MiB pass 100 MiB: the smallest cached segment of at least 36 MiB (60) goes, the 30 stays
    r.alloc(3, 35 * MiB)
    assert (r.released, r.reserved) == (60 * MiB, 66 * MiB)


def test_max_non_split_rounding_widens_what_an_oversize_request_may_take():
    from memprofiler.estimate.allocator.caching import AllocatorConfig

    cfg = AllocatorConfig.parse("max_split_size_mb:20,max_non_split_rounding_mb:40")
    assert (cfg.max_non_split_rounding, cfg.describe()) == (
        40 * MiB,
        "max_split_size_mb:20,max_non_split_rounding_mb:40",
    )
    r = AllocatorReplay(cfg)
    r.alloc(1, 60 * MiB)
    r.free(1)
    r.alloc(2, 35 * MiB)  # 60 < 35 + 40: the cached block serves it, whole
    assert (r.segments, r.allocated) == (1, 60 * MiB)


def test_an_estimate_says_garbage_collection_needs_a_memory_fraction(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6")
    with torch.device("meta"):
        net = nn.Linear(100, 100)
    est = estimate_memory(
        net, torch.randn(3, 100), optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), device="cuda"
    )
    (note,) = [n for n in est.notes if n.startswith("caching allocator:")]
    assert note == (
        "caching allocator: PYTORCH_CUDA_ALLOC_CONF='garbage_collection_threshold:0.6': follows "
        "garbage_collection_threshold:0.6 (it acts only under torch.cuda.set_per_process_memory_fraction, "
        "which the estimate does not assume)"
    )


def test_expandable_segments_prefer_a_hole_to_the_growable_tail():
    from memprofiler.estimate.allocator.caching import AllocatorConfig

    r = AllocatorReplay(AllocatorConfig(expandable_segments=True))
    r.alloc(1, 4 * MiB)  # one 20 MiB page: [0, 4) taken
    r.alloc(2, 10 * MiB)  # [4, 14)
    r.alloc(3, 2 * MiB)  # [14, 16); the free tail [16, 20) is 4 MiB
    r.free(2)  # a 10 MiB hole at 4 MiB
    # 3 MiB: by size the 4 MiB tail fits best, but get_free_block ranks the tail by the size it
    # could grow to (the unmapped space after it), so the hole serves the request
    r.alloc(4, 3 * MiB)
    seg_base = r.block(1)[0]
    assert r.block(4) == (seg_base + 4 * MiB, 3 * MiB)
    assert (r.segments, r.reserved) == (1, 20 * MiB)


def test_a_mirrored_replay_serves_the_same_requests_with_what_if_sizes_from_its_start():
    from memprofiler.estimate.allocator.caching import MirroredReplay

    r = MirroredReplay()
    r.alloc(1, 3 << 20)  # before the twin: 3 MiB, a 20 MiB segment
    r.start_mirror()
    r.alloc_as(2, 1 << 20, 30 << 20)  # 1 MiB here, 30 MiB in the twin
    r.free(2)
    r.alloc(3, 5 << 20)  # both serve it from the first segment (best fit)
    assert r.mirror is not None
    # THEN the twin holds the same blocks, but reserved a 30 MiB segment where the model took 2 MiB
    assert (r.allocated, r.mirror.allocated) == (8 << 20, 8 << 20)
    assert (r.peak_reserved, r.mirror.peak_reserved) == (22 << 20, 50 << 20)  # + a 2 MiB small segment
    assert r.mirror.peak_allocated == (3 << 20) + (30 << 20)
    r.free(1)
    r.free(3)
    assert r.mirror.allocated == 0


def test_a_free_arriving_while_a_request_is_served_waits_for_it(monkeypatch):
    # GIVEN two 4 MiB blocks and the 12 MiB rest of their 20 MiB segment, and a 6 MiB request
    # during which a garbage collection ends the block beside that rest (the tracker's
    # weak-reference callback frees its storage from inside the replay's own code)
    def replay(reentrant: bool) -> AllocatorReplay:
        r = AllocatorReplay()
        r.alloc(1, 4 * MiB)
        r.alloc(2, 4 * MiB)
        if reentrant:
            split = r._split

            def collected_meanwhile(*args: object) -> None:
                r.free(2)  # arrives while the rest is taken out of the free blocks and split
                split(*args)  # type: ignore[arg-type]

            monkeypatch.setattr(r, "_split", collected_meanwhile)
        r.alloc(3, 6 * MiB)
        if not reentrant:
            r.free(2)
        r.free(1)
        r.alloc(4, 8 * MiB)
        return r

    # THEN the pools are as when the free comes after the request, never changed halfway (the
    # free merged the block with the one being served: "free block ... is not in its pool's index")
    together, after = replay(True), replay(False)
    assert together.layout() == after.layout()
    assert (together.peak_allocated, together.peak_reserved) == (after.peak_allocated, after.peak_reserved)
    assert together.allocated == after.allocated == 14 * MiB
