"""CUDA's dense embedding backward scratch (torch 2.11's ``Embedding.cu`` / ``EmbeddingBackwardKernel.cu``,
read from the source, not measured), replayed for a CUDA target."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memprofiler.estimate import estimate_memory
from memprofiler.estimate.allocator.caching import round_size
from memprofiler.estimate.cuda import embedding_scratch
from memprofiler.estimate.cuda.embedding_scratch import backward_phases, bounds, num_bits, sort_storage

SMS = 132  # H100 / H200
V2_11 = (2, 11)
SGD = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731


def _args(
    shape: tuple[int, ...],
    dim: int,
    num_weights: int,
    dtype: torch.dtype = torch.float32,
    by_freq: bool = False,
) -> tuple[object, ...]:
    grad = torch.empty(*shape, dim, dtype=dtype, device="meta")
    ids = torch.empty(*shape, dtype=torch.long, device="meta")
    return grad, ids, num_weights, -1, by_freq


def _sort_and_segments(n: int, num_weights: int) -> list[list[int]]:
    """The phases every sort-path call has before its last one (no copies, int64 ids, no count)."""
    idx = 8 * n
    ms, _ = bounds(n, num_weights)
    return [
        [idx, idx, idx, sort_storage(n, 8, 8)],
        [idx, idx, idx, 8, idx, embedding_scratch.scan_storage(n)],
        [idx, idx, idx, 8, 8 * ms, 8 * ms, embedding_scratch.scan_storage(ms)],
    ]


def test_few_indices_take_the_direct_kernel_with_no_scratch():
    # GIVEN 8 x 384 = 3,072 ids (the direct kernel's limit) and a contiguous output gradient
    # THEN no scratch: the kernel accumulates straight into the zeroed gradient (the op's output)
    assert backward_phases(_args((8, 384), 64, 1000), SMS, V2_11) == []
    # AND a non-contiguous output gradient is copied (grad_.contiguous()), nothing else
    grad = torch.empty(64, 8, 384, device="meta").permute(1, 2, 0)
    ids = torch.empty(8, 384, dtype=torch.long, device="meta")
    assert backward_phases((grad, ids, 1000, -1, False), SMS, V2_11) == [[8 * 384 * 64 * 4]]
    # AND one id more takes the sort path
    assert backward_phases(_args((3073,), 64, 1000), SMS, V2_11) != []


def test_scale_grad_by_freq_sorts_even_few_indices_and_keeps_a_count():
    phases = backward_phases(_args((100,), 16, 50, by_freq=True), SMS, V2_11)
    # THEN the sort, then count (100 int64) with its scan storage next to sorted and orig ids
    assert phases[0] == [800, 800, 800, sort_storage(100, 8, 8)]
    assert phases[1] == [800, 800, 800, embedding_scratch.scan_storage(100)]
    # AND the count stays to the end
    assert phases[-1][:3] == [800, 800, 800]


def test_cub_sort_storage_is_the_alternate_buffers_bins_and_lookback():
    # GIVEN 4,096 int64 (key, value) pairs sorted over 64 bits: 8 passes of 8 bits
    # THEN 256 four-byte bins per pass (8,192 B), 2 tiles of 1 KiB look-back, the alternate key
    # and value buffers (32,768 B each), 8 counters (32 -> 256 B), plus 255 B
    assert sort_storage(4096, 8, 8) == 8192 + 2048 + 32768 + 32768 + 256 + 255 == 76_287


def test_later_torch_sorts_over_the_tables_bits_only():
    # GIVEN 4,096 ids into a 200-row table (8 bits: one pass) and into 1,000 rows (10 bits: two)
    assert num_bits(200) == 8 and num_bits(1000) == 10
    # THEN torch 2.11 sorts over 64 bits either way; from 2.12 a one-pass sort keeps no alternate
    # buffers (bins 1 KiB, look-back 2 KiB, counters 256 B, plus 255 B)
    assert backward_phases(_args((8, 512), 64, 200), SMS, V2_11)[0][-1] == 76_287
    assert backward_phases(_args((8, 512), 64, 200), SMS, (2, 12))[0][-1] == 1024 + 2048 + 256 + 255
    # AND two passes keep them (bins 2 KiB)
    two = 2048 + 2048 + 32768 + 32768 + 256 + 255
    assert backward_phases(_args((8, 512), 64, 1000), SMS, (2, 12))[0][-1] == two


def test_many_indices_are_sized_by_bounds_not_by_their_values():
    # GIVEN 8 x 512 int64 ids into 1,000 rows, dim 64, float32 (a real batch might hold 37
    # distinct ids or 4,096: the kernel sizes by min(n, num_weights) either way)
    n, v, d = 4096, 1000, 64
    phases = backward_phases(_args((8, 512), d, v), SMS, V2_11)
    # THEN max_segments = min(4096, 1000), max_partial_segment = 4096 // 10 + 1000
    assert bounds(n, v) == (1000, 1409)
    idx = 8 * n
    last = [idx, idx, idx, 8, 8000, 8000, 8, 1409 * 8, 1409 * d * 4]
    assert phases == [*_sort_and_segments(n, v), last]
    # AND the largest phase is the last: sorted, orig, segment_offsets, the two counters, the
    # per-segment counts and offsets, partial_segment_offset and grad_weight_per_segment
    assert max(sum(p) for p in phases) == sum(last) == 486_296
    # AND a table smaller than the batch bounds segments by its rows instead
    assert bounds(n, 100) == (100, 509)


def test_half_gradients_sum_partial_segments_in_float32():
    phases16 = backward_phases(_args((8, 512), 64, 1000, torch.bfloat16), SMS, V2_11)
    phases32 = backward_phases(_args((8, 512), 64, 1000), SMS, V2_11)
    # THEN grad_weight_per_segment is float32 (1409 x 64 x 4) for bfloat16 gradients too
    assert phases16[-1][-1] == phases32[-1][-1] == 1409 * 64 * 4
    # AND a float64 gradient sums in float64
    assert backward_phases(_args((8, 512), 64, 1000, torch.float64), SMS, V2_11)[-1][-1] == 1409 * 64 * 8


def test_few_segments_take_the_fused_atomic_kernel_from_torch_2_11():
    # GIVEN 4,096 ids into a 2-row table (token types), dim 64: the scatter's grid is 2 blocks,
    # under 4 per SM, and 409 + 2 = 411 partial segments are over 4 x 2
    idx, mp = 8 * 4096, 4096 // 10 + 2
    head = [idx, idx, idx, 8, 16, 16, 8, mp * 8]
    # THEN torch 2.11 maps partial segments to segments (411 int64) instead of the per-segment sums
    assert backward_phases(_args((8, 512), 64, 2), SMS, V2_11)[-1] == [*head, mp * 8]
    # AND for bfloat16 it accumulates into a zeroed float32 copy of the weight gradient (2 x 64 x 4)
    assert backward_phases(_args((8, 512), 64, 2, torch.bfloat16), SMS, V2_11)[-1] == [*head, mp * 8, 512]
    # AND torch 2.10, or deterministic algorithms, keep the two-pass sum (411 x 64 x 4)
    assert backward_phases(_args((8, 512), 64, 2), SMS, (2, 10))[-1] == [*head, mp * 64 * 4]
    two_pass = backward_phases(_args((8, 512), 64, 2), SMS, V2_11, deterministic=True)
    assert two_pass[-1] == [*head, mp * 64 * 4]


class EmbedLinear(nn.Module):
    """A wide embedding (8,192 rows, more than the batch's 4,096 ids) under a one-output Linear
    without bias: the peak is the embedding's backward, its gradient input (8 x 512 x 1024
    float32), weight gradient and scratch."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(8192, 1024)
        self.fc = nn.Linear(1024, 1, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(ids)).sum()


def _estimate(monkeypatch: pytest.MonkeyPatch, scratch: bool, **kw: object) -> object:
    if not scratch:
        monkeypatch.setattr(embedding_scratch, "backward_phases", lambda *a, **k: [])
    ids = torch.randint(0, 8192, (8, 512), generator=torch.Generator().manual_seed(0))
    est = estimate_memory(
        EmbedLinear(), ids, optimizer=SGD, loss_fn=lambda m, b: m(b), precision="32-true", steps=1, **kw
    )
    monkeypatch.undo()
    return est


def test_embedding_backward_scratch_is_in_the_h200_estimates_peak(monkeypatch):
    # GIVEN the step estimated for an H200 (torch 2.11) with and without the embedding scratch
    with_scratch = _estimate(monkeypatch, True, gpu="H200", torch_version="2.11")
    without = _estimate(monkeypatch, False, gpu="H200", torch_version="2.11")
    # THEN the peak is in backward at the embedding and grows by the last phase: max_segments =
    # min(4096, 8192) and grad_weight_per_segment is (4096 // 10 + 4096) x 1024 x 4 = 18,452,480 B,
    # served whole from an 18 MiB segment (the rest, 421,888 B, is under 1 MiB: not split off);
    # the other blocks rounded to 512 B
    idx = 8 * 4096
    last = [idx, idx, idx, 8, idx, idx, 8, 4505 * 8, 4505 * 1024 * 4]
    assert with_scratch.peak_phase == "backward"
    small = sum(round_size(b) for b in last[:-1])
    assert with_scratch.peak_bytes - without.peak_bytes == small + 18 * 2**20 == 19_075_584
    assert with_scratch.by_category["embedding_scratch"] == sum(last)
    assert "embedding_scratch" not in without.by_category
    assert any(
        note.startswith("embedding backward: scratch") and f"{sum(last):,} B" in note
        for note in with_scratch.notes
    )


def test_cpu_estimates_are_unchanged(monkeypatch):
    with_hook = _estimate(monkeypatch, True, device="cpu")
    without = _estimate(monkeypatch, False, device="cpu")
    assert with_hook.peak_bytes == without.peak_bytes
    assert with_hook.by_category == without.by_category
    assert "embedding_scratch" not in with_hook.by_category
    assert not any(note.startswith("embedding backward") for note in with_hook.notes)


def test_t5_relative_bias_sorts_many_ids_into_a_small_table():
    # GIVEN T5's relative position bias: 512 x 512 bucket ids into 32 rows of 8 heads, its output
    # gradient a permuted view (not contiguous)
    grad = torch.empty(8, 512, 512, device="meta").permute(1, 2, 0)
    ids = torch.empty(512, 512, dtype=torch.long, device="meta")
    phases = backward_phases((grad, ids, 32, -1, False), SMS, V2_11)
    n, idx = 512 * 512, 8 * 512 * 512
    # THEN the largest phase is the sort's: the gradient's copy, sorted, orig and range ids, cub's
    # storage (the note's 18,971,135 B in T5's estimate)
    assert phases[0] == [512 * 512 * 8 * 4, idx, idx, idx, sort_storage(n, 8, 8)]
    assert max(sum(p) for p in phases) == sum(phases[0]) == 18_971_135
    # AND the fused kernel (the scatter's grid is 32 blocks) maps its 26,246 partial segments
    assert bounds(n, 32) == (32, 26_246)
    assert phases[-1][-2:] == [26_246 * 8, 26_246 * 8]


def test_int32_ids_hold_four_byte_copies():
    grad = torch.empty(8, 512, 64, device="meta")
    ids = torch.empty(8, 512, dtype=torch.int32, device="meta")
    phases = backward_phases((grad, ids, 1000, -1, False), SMS, V2_11)
    # THEN sorted, orig and range are 4,096 x 4 B; cub sorts 4-byte keys and values over 32 bits
    assert phases[0] == [16_384, 16_384, 16_384, sort_storage(4096, 4, 4)]
    assert sort_storage(4096, 4, 4) == 4096 + 2048 + 16_384 + 16_384 + 256 + 255


def test_the_batch_values_do_not_change_the_estimate(monkeypatch):
    # GIVEN the H200 estimate with 4,096 copies of one id, and with random ids
    same = estimate_memory(
        EmbedLinear(), torch.zeros(8, 512, dtype=torch.long), optimizer=SGD, loss_fn=lambda m, b: m(b),
        precision="32-true", steps=1, gpu="H200", torch_version="2.11",
    )  # fmt: skip
    random = _estimate(monkeypatch, True, gpu="H200", torch_version="2.11")
    # THEN the same scratch: torch 2.11 sizes it by min(ids, rows), whatever the values
    assert same.by_category["embedding_scratch"] == random.by_category["embedding_scratch"]
    assert same.peak_bytes == random.peak_bytes
