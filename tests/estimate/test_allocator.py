"""The caching-allocator model: rounding, pools, segments, reuse, splitting and merging."""

from __future__ import annotations

import torch
from torch import nn

from memprofiler.estimate import estimate_memory
from memprofiler.estimate.allocator import AllocatorReplay, round_size, segment_size

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
