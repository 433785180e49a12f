"""The scratch CUDA's dense embedding backward allocates inside itself, from torch's source.

``aten.embedding_dense_backward`` on CUDA (``embedding_dense_backward_cuda`` in
``aten/src/ATen/native/cuda/Embedding.cu``, ``embedding_backward_cuda_kernel`` in
``EmbeddingBackwardKernel.cu``) takes one of two paths:

- few indices (at most 3,072, and no ``scale_grad_by_freq``): one kernel accumulates straight
  into the zeroed gradient. Nothing beyond the contiguous copies of the output gradient and of
  the indices that every call makes where they are not contiguous.
- otherwise it sorts: ``sorted_indices`` and ``orig_indices`` (each n indices of the index
  dtype) live to the end of the call. The sort (``at::cuda::cub::radix_sort_pairs``) also
  holds ``range`` (``arange(n)``, the values sorted along) and cub's temporary storage, both
  freed when it returns. With ``scale_grad_by_freq`` a ``count`` per index follows (two
  scan-by-key passes with their own cub storage). Then the segmenting: ``segment_offsets``
  (n indices) and the segment count (a 0-d int64 on the device) from ``cub::unique_by_key``,
  whose torch wrapper allocates the unique keys it discards (n more indices) for the call; then,
  all live at the last kernel with those two, ``partials_per_segment`` and its exclusive sum
  (``max_segments`` each), the partial-segment
  count (0-d int64) and ``partial_segment_offset`` (``max_partial_segment``). Finally either the
  two-pass sum: ``grad_weight_per_segment``, ``max_partial_segment`` x embedding dim in the
  accumulate type (float32 for half and bfloat16 gradients); or, in torch 2.11 and later where
  segments are few for the device (:func:`uses_fused_kernel`), a fused kernel with atomic adds:
  ``partial_to_segment_idx`` (``max_partial_segment`` indices) and, for half and bfloat16, a
  zeroed float32 copy of the whole weight gradient.

The sizes do not depend on the index values: since torch made the backward sync-free
(pytorch/pytorch#70943, 2022) it sizes by bounds, ``max_segments = min(n, num_weights)`` and
``max_partial_segment = n // NROWS_PER_THREAD + max_segments``, where ``NROWS_PER_THREAD = 10``.
So the estimate needs no real batch values here: the worst case is what the kernel allocates.

cub's temporary storage is cub's own size rule, which depends on its tuning for the device:

- the radix sort (``DeviceRadixSort::SortPairs`` with separate output buffers, torch's call):
  alternate key and value buffers (n each; cub skips them only for a single-pass sort) plus,
  in the one-sweep algorithm cub uses on sm80 and later, 256 four-byte bins per pass, a look-back
  array of 256 four-byte counters per tile and a counter per pass, each part aligned to 256 B
  plus 255 B. torch 2.11 sorts over all the key's bits (64 for int64 ids: 8 passes of 8 bits);
  pytorch/pytorch#183578 (merged May 2026, taken here as torch 2.12 and later, not checked
  against a release) passes only the bits of ``num_weights``, so a table under 256 rows sorts in
  one pass, with no alternate buffers. The tile is taken as 3,072 items (384 threads x 8 items
  for 8-byte keys, as cub's sm80+ tuning reads): the least certain term, under 0.35 B per index.
- the scans and the unique-by-key (decoupled look-back) are bounded at 24 B per tile of 128
  items plus 32 padding tiles (under 0.2 B per item): cub's tiles are larger, so this is over.

Each phase is replayed with the op's output (the zeroed weight gradient) alive, as the other
kernels' scratch is; torch allocates that output after the sort, so where the sort's phase is the
call's largest (a small table, or a dim of a few features) the estimate is over by the output's
size, which is then small. All from the source read on GitHub, not measured on a GPU.
"""

from __future__ import annotations

from typing import Any

import torch

EMBEDDING_BWD = torch.ops.aten.embedding_dense_backward.default
#: The most indices the direct (unsorted) kernel takes (``num_indices <= 3072``).
DIRECT_MAX = 3072
#: Rows each partial segment sums (``NROWS_PER_THREAD``).
NROWS_PER_THREAD = 10
#: ``MAX_BLOCK_SIZE`` (``SortingCommon.cuh``) on CUDA.
MAX_BLOCK_SIZE = 1024
#: ``MAX_ATOMIC_ACCUM_BLOCKS_PER_SM``: below this many blocks per SM the fused kernel may run.
ATOMIC_BLOCKS_PER_SM = 4
#: The first release with the fused atomic kernel (pytorch/pytorch#172454, merged January 2026).
FUSED_SINCE = (2, 11)
#: The first release taken to sort over the table's bits only (pytorch/pytorch#183578, May 2026).
NBITS_SINCE = (2, 12)
#: cub's alignment of each temporary inside its storage blob.
CUB_ALIGN = 256
RADIX_BITS = 8
RADIX_DIGITS = 1 << RADIX_BITS
#: Items per one-sweep tile assumed for the look-back array (see the module docstring).
ONESWEEP_TILE = 3072
#: The bound for scan/select look-back storage: bytes per tile, items per tile, padding tiles.
SCAN_TILE_BYTES, SCAN_TILE_ITEMS, SCAN_PADDING = 24, 128, 32
#: The 0-d int64 counters (segment count, partial-segment count).
COUNTER = 8
HALF = (torch.float16, torch.bfloat16)


def _align(n: int) -> int:
    return -(-n // CUB_ALIGN) * CUB_ALIGN


def _blob(sizes: list[int]) -> int:
    """cub's ``alias_temporaries``: each part aligned to 256 B, plus 255 B."""
    return sum(_align(s) for s in sizes) + CUB_ALIGN - 1


def num_bits(max_key: int) -> int:
    """``at::cuda::cub::get_num_bits``: 1 plus the times ``max_key`` halves before reaching 1."""
    bits = 1
    while max_key > 1:
        max_key >>= 1
        bits += 1
    return bits


def sort_storage(n: int, key_size: int, value_size: int, end_bit: int | None = None) -> int:
    """cub's temporary storage for sorting ``n`` (key, value) pairs over ``end_bit`` bits (all the
    key's by default) into separate output buffers (the one-sweep algorithm)."""
    passes = -(-(end_bit or key_size * 8) // RADIX_BITS)
    tiles = -(-n // ONESWEEP_TILE)
    alternate = passes > 1
    return _blob(
        [
            passes * RADIX_DIGITS * 4,  # bins
            tiles * RADIX_DIGITS * 4,  # look-back
            n * key_size if alternate else 0,
            n * value_size if alternate else 0,
            passes * 4,  # counters
        ]
    )


def scan_storage(n: int) -> int:
    """A bound on a cub scan's (or unique-by-key's) temporary storage over ``n`` items."""
    return _blob([(-(-n // SCAN_TILE_ITEMS) + SCAN_PADDING) * SCAN_TILE_BYTES])


def _copy_bytes(t: torch.Tensor) -> int:
    return 0 if t.is_contiguous() else t.numel() * t.element_size()


def uses_fused_kernel(dim: int, max_segments: int, max_partial: int, sms: int, deterministic: bool) -> bool:
    """Whether ``embedding_backward_cuda_kernel`` (torch 2.11+) takes the fused atomic kernel:
    the two-pass scatter's grid (``max_segments`` x the warp-rounded dim, in blocks of at most
    1,024 threads) is under 4 blocks per SM, there are over 4x as many partial segments as that
    grid's blocks, and deterministic algorithms are off."""
    warped = -(-dim // 32) * 32
    block = min(warped, MAX_BLOCK_SIZE)
    grid = -(-max_segments * warped // block)
    return not deterministic and grid < sms * ATOMIC_BLOCKS_PER_SM and max_partial > 4 * grid


def bounds(n: int, num_weights: int) -> tuple[int, int]:
    """(``max_segments``, ``max_partial_segment``) the kernel sizes its buffers by."""
    max_segments = min(n, num_weights)
    return max_segments, n // NROWS_PER_THREAD + max_segments


def backward_phases(
    args: tuple[Any, ...],
    sms: int,
    torch_version: tuple[int, int],
    deterministic: bool | None = None,
) -> list[list[int]]:
    """Phases of scratch (each a list of blocks live together) of one CUDA
    ``embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq)``."""
    grad, indices, num_weights, padding_idx = args[0], args[1], int(args[2]), int(args[3])
    by_freq = bool(args[4]) if len(args) > 4 else False
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    n = indices.numel()
    dim = int(grad.shape[-1]) if grad.dim() else 1
    copies = [s for s in (_copy_bytes(grad), _copy_bytes(indices)) if s]
    if n <= DIRECT_MAX and not by_freq:
        return [copies] if copies else []
    isz = indices.element_size()
    idx = n * isz
    end_bit = None
    if torch_version >= NBITS_SINCE:
        end_bit = num_bits(num_weights if padding_idx >= 0 else num_weights - 1 - padding_idx)
    sort = [*copies, idx, idx, idx, sort_storage(n, isz, isz, end_bit)]  # sorted, orig, range, cub
    phases = [sort]
    base = [*copies, idx, idx]
    if by_freq:
        phases.append([*base, idx, scan_storage(n)])  # count and the scan-by-key storage
        base.append(idx)
    max_segments, max_partial = bounds(n, num_weights)
    # segment_offsets and the segment count; unique_by_key's discarded keys (n) and cub storage
    phases.append([*base, idx, COUNTER, idx, scan_storage(n)])
    segs = [*base, idx, COUNTER, max_segments * isz, max_segments * isz]
    phases.append([*segs, scan_storage(max_segments)])  # the exclusive sum
    last = [*segs, COUNTER, max_partial * isz]
    fused = torch_version >= FUSED_SINCE and uses_fused_kernel(
        dim, max_segments, max_partial, sms, deterministic
    )
    if fused:
        last.append(max_partial * isz)  # partial_to_segment_idx
        if grad.dtype in HALF:
            last.append(num_weights * dim * 4)  # the float32 accumulator
    else:
        acc = 4 if grad.dtype in HALF else grad.element_size()
        last.append(max_partial * dim * acc)  # grad_weight_per_segment
    phases.append(last)
    return phases
