"""A model of PyTorch's CUDA caching allocator, replayed over an estimate's allocation log.

It follows the documented rules of ``c10/cuda/CUDACachingAllocator.cpp`` with default
settings: every request is rounded up to a multiple of 512 B; requests up to 1 MiB come from
the small pool, carved out of 2 MiB segments; larger ones from the large pool, out of 20 MiB
segments below 10 MiB and segments rounded up to 2 MiB above. A free block is reused best-fit
within its pool and split when the rest is worth keeping (any rest in the small pool, more
than 1 MiB in the large one); freed neighbours merge; segments are never returned (no
``empty_cache``). What it does not model: cuBLAS / cuDNN / NCCL workspaces, the CUDA context,
``expandable_segments``, ``max_split_size_mb`` and ``roundup_power2_divisions``, and
fragmentation that comes from streams (one stream is assumed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_SEGMENT = 2 << 20
LARGE_SEGMENT = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(nbytes: int) -> int:
    """Bytes the allocator hands out for a request of ``nbytes`` (``allocated_bytes`` counts these)."""
    return MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(rounded: int) -> int:
    """Bytes ``cudaMalloc`` reserves when no cached block can serve a ``rounded`` request."""
    if rounded <= SMALL_SIZE:
        return SMALL_SEGMENT
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-rounded // ROUND_LARGE) * ROUND_LARGE


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    free: bool = True


@dataclass
class AllocatorReplay:
    """Replays ``alloc`` / ``free`` calls and keeps the allocator's peaks.

    Example:
        >>> r = AllocatorReplay()
        >>> r.alloc(1, 100); r.free(1)
        >>> (r.peak_allocated, r.peak_reserved)
        (512, 2097152)
    """

    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    segments: int = 0
    _pools: dict[bool, list[_Block]] = field(default_factory=lambda: {True: [], False: []})
    _live: dict[int, tuple[bool, _Block]] = field(default_factory=dict)

    def alloc(self, key: int, nbytes: int) -> None:
        """Serve request ``key`` of ``nbytes`` bytes (0-byte requests take nothing)."""
        if nbytes <= 0:
            return
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self._pools[small]
        best: _Block | None = None
        for blk in pool:  # best fit, as the allocator's size-ordered set gives
            if blk.free and blk.size >= size and (best is None or blk.size < best.size):
                best = blk
        if best is None:
            seg = segment_size(size)
            self.segments += 1
            best = _Block(self.segments, 0, seg)
            pool.append(best)
            self.reserved += seg
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = best.size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            pool.append(_Block(best.segment, best.offset + size, rest))
            best.size = size
        best.free = False
        self._live[key] = (small, best)
        self.allocated += best.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: int) -> None:
        """Return request ``key``'s block to its pool, merging it with free neighbours."""
        found = self._live.pop(key, None)
        if found is None:
            return
        small, blk = found
        self.allocated -= blk.size
        blk.free = True
        pool = self._pools[small]
        for other in [b for b in pool if b.segment == blk.segment and b.free and b is not blk]:
            if other.offset + other.size == blk.offset:
                other.size += blk.size
                pool.remove(blk)
                blk = other
            elif blk.offset + blk.size == other.offset:
                blk.size += other.size
                pool.remove(other)
