"""A model of PyTorch's CUDA caching allocator, replayed over an estimate's allocation log.

It follows ``c10/cuda/CUDACachingAllocator.cpp``:

- every request is rounded up to a multiple of 512 B (``round_size``), or to the next of
  ``roundup_power2_divisions`` steps between powers of two when that setting is on;
- requests up to 1 MiB come from the small pool, carved out of 2 MiB segments; larger ones from
  the large pool, out of 20 MiB segments below 10 MiB and segments rounded up to 2 MiB above
  (``get_allocation_size``);
- a free block is reused best fit, by (size, address), within its pool and its stream: one pool
  pair per stream (``get_free_block``); an estimate's segments have no addresses, so their
  creation order stands in for one (a replay seeded from a real snapshot uses the real ones);
  with ``max_split_size_mb`` a request below it never takes a block at or above it, and a
  request at or above it only takes a block less than ``max_non_split_rounding_mb`` (20 MiB by
  default) larger;
- a reused block is split when the rest is worth keeping: any 512 B rest in the small pool, a rest
  over 1 MiB in the large one and only below ``max_split_size_mb`` (``should_split``); freed
  neighbours merge;
- ``expandable_segments:True``: each pool of each stream is one segment that grows by mapping
  pages (2 MiB small, 20 MiB large) at its end, and large blocks split down to 512 B; best fit
  takes the free tail of the mapped range only when no other free block fits (it counts the
  unmapped space after it as its size);
- when a new segment would pass the device's memory (``capacity``, times ``memory_fraction`` when
  one is set), cached segments are released and the allocation retried, as the allocator does
  before an OOM: with ``max_split_size_mb``, first the smallest whole free segment at or above
  both the limit and the request, or else the largest such segments until as many bytes are
  free (``release_available_cached_blocks``); then every wholly free segment
  (``release_cached_blocks``);
- ``garbage_collection_threshold`` acts only with a memory fraction set
  (``torch.cuda.set_per_process_memory_fraction``: ``memory_fraction``): when no cached block
  serves a request and reserved memory is above that share of the allowed memory, wholly free
  large-pool segments at least as old as their average (in large-pool requests since they were
  last freed) are released, pass after pass, until reserved memory is back at the line
  (``garbage_collect_cached_blocks``).

Segments are otherwise never returned unless :meth:`AllocatorReplay.release_cached` is called
(``empty_cache``, or the release before an OOM).

:meth:`AllocatorReplay.seeded` starts a replay from a given state (segments at their addresses,
with their live and free blocks): ``estimate/allocator_trace.py`` rewinds a real snapshot's trace to
its first entry and checks the model against what the real allocator did.
"""

from __future__ import annotations

import copy
import os
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from memprofiler.estimate.allocator.conf import AllocConf
from memprofiler.estimate.allocator.conf import read as read_conf

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_SEGMENT = 2 << 20
LARGE_SEGMENT = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20
NO_LIMIT = 1 << 62


@dataclass(frozen=True)
class AllocatorConfig:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` settings the model follows (the rest is noted, not modelled)."""

    max_split_size: int = NO_LIMIT
    max_non_split_rounding: int = LARGE_SEGMENT
    """How much larger than a request at or above ``max_split_size`` a cached block may be."""
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: int = 0
    ignored: tuple[str, ...] = ()

    @classmethod
    def from_conf(cls, conf: AllocConf) -> AllocatorConfig:
        """The options of ``conf`` (the variable as torch read it) that the model follows; the
        ones it does not are kept in ``ignored``."""
        split = conf.max_split_size
        return cls(
            max_split_size=NO_LIMIT if split is None or split >= NO_LIMIT else split,
            max_non_split_rounding=(
                conf.max_non_split_rounding if conf.max_non_split_rounding is not None else LARGE_SEGMENT
            ),
            expandable_segments=conf.expandable_segments,
            garbage_collection_threshold=conf.garbage_collection_threshold,
            roundup_power2_divisions=conf.roundup_power2_divisions,
            ignored=conf.not_modelled,
        )

    @classmethod
    def parse(cls, text: str | None) -> AllocatorConfig:
        """``"max_split_size_mb:128,expandable_segments:True"`` as torch reads it (:mod:`.conf`).

        Raises:
            ConfigError: a setting torch refuses.
        """
        return cls.from_conf(read_conf({"PYTORCH_CUDA_ALLOC_CONF": text or ""}))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AllocatorConfig:
        return cls.from_conf(read_conf(os.environ if env is None else env))

    def describe(self) -> str:
        parts = []
        if self.max_split_size != NO_LIMIT:
            parts.append(f"max_split_size_mb:{self.max_split_size >> 20}")
        if self.max_non_split_rounding != LARGE_SEGMENT:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding >> 20}")
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold}")
        if self.roundup_power2_divisions:
            parts.append(f"roundup_power2_divisions:{self.roundup_power2_divisions}")
        return ",".join(parts) or "defaults"


def _power2_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def round_size(nbytes: int, config: AllocatorConfig | None = None) -> int:
    """Bytes the allocator hands out for a request of ``nbytes`` (``allocated_bytes`` counts these)."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    div = config.roundup_power2_divisions if config is not None else 0
    if div > 1 and nbytes > MIN_BLOCK * div:
        return _power2_division(nbytes, div)
    return -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(rounded: int) -> int:
    """Bytes ``cudaMalloc`` reserves when no cached block can serve a ``rounded`` request."""
    if rounded <= SMALL_SIZE:
        return SMALL_SEGMENT
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-rounded // ROUND_LARGE) * ROUND_LARGE


@dataclass(frozen=True)
class SeedBlock:
    """One block of a seeded segment: free (cached) when ``key`` is None, else live request ``key``."""

    size: int
    key: int | None = None


@dataclass(frozen=True)
class SeedSegment:
    """A segment that exists when a seeded replay starts; its blocks tile it from ``address`` on."""

    address: int
    stream: int
    small: bool
    blocks: tuple[SeedBlock, ...]


@dataclass
class StreamFigures:
    """One stream's bytes in blocks and in segments, now and at their peaks."""

    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0

    def allocate(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def reserve(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)


@dataclass(eq=False)
class _Block:
    segment: int
    offset: int
    size: int
    free: bool = True
    gc_base: int = 0
    """The pool's request count when the block was last put back as free (its age starts there)."""


@dataclass(eq=False)
class _Segment:
    ident: int
    size: int
    blocks: list[_Block]
    address: int = 0
    """Where the segment starts: best fit breaks size ties by address (creation order in an estimate)."""


#: A free block in its pool's index: (size, segment address, offset, segment, block); the first
#: three order it as ``get_free_block`` does and are unique within a pool.
_FreeEntry = tuple[int, int, int, _Segment, _Block]


@dataclass
class AllocatorReplay:
    """Replays ``alloc`` / ``free`` calls and keeps the allocator's peaks.

    Example:
        >>> r = AllocatorReplay()
        >>> r.alloc(1, 100); r.free(1)
        >>> (r.peak_allocated, r.peak_reserved)
        (512, 2097152)
    """

    config: AllocatorConfig = field(default_factory=AllocatorConfig)
    capacity: int | None = None
    """Device memory in bytes; None: unlimited (no release before an OOM)."""
    memory_fraction: float | None = None
    """``torch.cuda.set_per_process_memory_fraction``'s share of ``capacity``; None: not set."""
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    segments: int = 0
    released: int = 0
    """Bytes of cached segments released to make room (before an OOM, or by garbage collection)."""
    segment_address: Callable[[int], int] | None = None
    """Where ``cudaMalloc`` puts the next segment of n bytes; None: its creation order."""
    _pools: dict[tuple[int, bool], list[_Segment]] = field(default_factory=dict)
    _live: dict[int, tuple[tuple[int, bool], _Segment, _Block]] = field(default_factory=dict)
    _free: dict[tuple[int, bool], list[_FreeEntry]] = field(default_factory=dict)
    """Each pool's free blocks sorted by (size, address, offset): best fit by bisection."""
    _requests: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    """Requests per pool kind (small: True) so far: the garbage collector's clock."""
    what_if: bool = False
    """A :class:`MirroredReplay`'s twin: its figures are a what-if, not the estimate's."""
    by_stream: dict[int, StreamFigures] = field(default_factory=dict)
    """Each stream's own figures: its pools are its own (a block freed in one stream's pool is
    never given to a request on another)."""
    _busy: bool = False
    """Serving a call now: a free arriving meanwhile waits in ``_deferred``."""
    _deferred: list[int] = field(default_factory=list)

    @classmethod
    def seeded(
        cls,
        segments: Iterable[SeedSegment],
        config: AllocatorConfig | None = None,
        capacity: int | None = None,
        segment_address: Callable[[int], int] | None = None,
    ) -> AllocatorReplay:
        """A replay that starts from ``segments`` (peaks start at the seeded figures)."""
        r = cls(config or AllocatorConfig(), capacity, segment_address=segment_address)
        for seed in sorted(segments, key=lambda g: g.address):
            r.segments += 1
            seg = _Segment(r.segments, 0, [], seed.address)
            for b in seed.blocks:
                blk = _Block(seg.ident, seg.size, b.size, b.key is None)
                seg.blocks.append(blk)
                seg.size += b.size
                if b.key is None:
                    r._index((seed.stream, seed.small), seg, blk)
                else:
                    r._live[b.key] = ((seed.stream, seed.small), seg, blk)
                    r.allocated += b.size
                    r._stream(seed.stream).allocate(b.size)
            r._pools.setdefault((seed.stream, seed.small), []).append(seg)
            r.reserved += seg.size
            r._stream(seed.stream).reserve(seg.size)
        r.peak_allocated, r.peak_reserved = r.allocated, r.reserved
        return r

    def block(self, key: int) -> tuple[int, int] | None:
        """Address and size of live request ``key``'s block (None when it is not live)."""
        found = self._live.get(key)
        if found is None:
            return None
        _, seg, blk = found
        return seg.address + blk.offset, blk.size

    def alloc(self, key: int, nbytes: int, stream: int = 0) -> None:
        """Serve request ``key`` of ``nbytes`` bytes on ``stream`` (0-byte requests take nothing)."""
        if nbytes <= 0:
            return
        self._busy = True
        try:
            self._alloc(key, nbytes, stream)
        finally:
            self._settle()

    def free(self, key: int) -> None:
        """Return request ``key``'s block to its pool, merging it with free neighbours.

        A free that arrives while a request is being served (a tensor's storage dies in a garbage
        collection the replay's own Python objects set off, and the tracker's weak-reference
        callback frees it) waits until that request is done: the pools are never changed halfway.
        """
        if self._busy:
            self._deferred.append(key)
            return
        self._busy = True
        try:
            self._free_now(key)
        finally:
            self._settle()

    def _settle(self) -> None:
        """Apply the frees deferred while busy, then take calls again."""
        try:
            while self._deferred:
                self._free_now(self._deferred.pop(0))
        finally:
            self._busy = False

    def _alloc(self, key: int, nbytes: int, stream: int) -> None:
        size = round_size(nbytes, self.config)
        pool_key = (stream, size <= SMALL_SIZE)
        pool = self._pools.setdefault(pool_key, [])
        self._requests[pool_key[1]] += 1
        found = self._best_fit(pool_key, size)
        if found is not None:
            self._unindex(pool_key, *found)
        else:
            if self._gc_active():
                self._garbage_collect()
            found = self._grow(pool, pool_key, size)
        seg, blk = found
        self._split(pool_key, seg, blk, size)
        blk.free = False
        self._live[key] = (pool_key, seg, blk)
        self.allocated += blk.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self._stream(stream).allocate(blk.size)

    def _free_now(self, key: int) -> None:
        found = self._live.pop(key, None)
        if found is None:
            return
        (stream, small), seg, blk = found
        self.allocated -= blk.size
        self._stream(stream).allocated -= blk.size
        blk.free = True
        i = seg.blocks.index(blk)
        if i + 1 < len(seg.blocks) and seg.blocks[i + 1].free:
            self._unindex((stream, small), seg, seg.blocks[i + 1])
            blk.size += seg.blocks.pop(i + 1).size
        if i > 0 and seg.blocks[i - 1].free:
            self._unindex((stream, small), seg, seg.blocks[i - 1])
            seg.blocks[i - 1].size += seg.blocks.pop(i).size
            blk = seg.blocks[i - 1]
        blk.gc_base = self._requests[small]
        self._index((stream, small), seg, blk)

    def layout(self) -> list[tuple[int, int, bool]]:
        """Every block of every segment: (address, size, free), by address."""
        return sorted(
            (seg.address + blk.offset, blk.size, blk.free)
            for pool in self._pools.values()
            for seg in pool
            for blk in seg.blocks
        )

    def _best_fit(self, pool_key: tuple[int, bool], size: int) -> tuple[_Segment, _Block] | None:
        """The smallest free block that fits, by (size, address); with expandable segments a free
        tail (which could grow into the unmapped space after it) only when no other block fits.
        Like ``get_free_block``, the limits of ``max_split_size_mb`` are checked on that one block:
        a block it refuses is not replaced by another."""
        expandable = self.config.expandable_segments
        index = self._free.get(pool_key, [])
        found: tuple[_Segment, _Block] | None = None
        tail: tuple[_Segment, _Block] | None = None
        for i in range(bisect_left(index, (size,)), len(index)):
            seg, blk = index[i][3], index[i][4]
            if expandable and blk is seg.blocks[-1]:
                tail = tail or (seg, blk)
                continue
            found = (seg, blk)
            break
        found = found or tail
        if found is None:
            return None
        limit, got = self.config.max_split_size, found[1].size
        if size < limit <= got:  # no oversize block for a request below the limit
            return None
        if size >= limit and got >= size + self.config.max_non_split_rounding:
            return None
        return found

    def _split(self, pool_key: tuple[int, bool], seg: _Segment, blk: _Block, size: int) -> None:
        rest = blk.size - size
        small = pool_key[1]
        if small or self.config.expandable_segments:
            keep = rest >= MIN_BLOCK
        else:
            keep = size < self.config.max_split_size and rest > SMALL_SIZE
        if keep:
            rest_blk = _Block(seg.ident, blk.offset + size, rest, gc_base=self._requests[small])
            seg.blocks.insert(seg.blocks.index(blk) + 1, rest_blk)
            blk.size = size
            self._index(pool_key, seg, rest_blk)

    def _index(self, pool_key: tuple[int, bool], seg: _Segment, blk: _Block) -> None:
        """Put free ``blk`` into its pool's free index."""
        insort(self._free.setdefault(pool_key, []), (blk.size, seg.address, blk.offset, seg, blk))

    def _unindex(self, pool_key: tuple[int, bool], seg: _Segment, blk: _Block) -> None:
        """Take free ``blk`` out of its pool's free index (before its size changes)."""
        index = self._free[pool_key]
        i = bisect_left(index, (blk.size, seg.address, blk.offset))
        if i == len(index) or index[i][4] is not blk:
            raise AssertionError(f"free block at {seg.address}+{blk.offset} is not in its pool's index")
        del index[i]

    def _grow(self, pool: list[_Segment], pool_key: tuple[int, bool], size: int) -> tuple[_Segment, _Block]:
        if self.config.expandable_segments:
            return self._map_pages(pool, pool_key, size)
        seg_bytes = segment_size(size)
        self._make_room(seg_bytes, pool_key, size)
        self.segments += 1
        blk = _Block(self.segments, 0, seg_bytes)
        seg = _Segment(self.segments, seg_bytes, [blk], self._address(seg_bytes))
        pool.append(seg)
        self._reserve(seg_bytes, pool_key[0])
        return seg, blk

    def _map_pages(
        self, pool: list[_Segment], pool_key: tuple[int, bool], size: int
    ) -> tuple[_Segment, _Block]:
        """Expandable segments: grow this pool's one segment at its end by whole pages."""
        page = SMALL_SEGMENT if pool_key[1] else LARGE_SEGMENT
        if not pool:
            self.segments += 1
            pool.append(_Segment(self.segments, 0, [], self._address(0)))
        seg = pool[0]
        tail = seg.blocks[-1] if seg.blocks and seg.blocks[-1].free else None
        if tail is not None:
            self._unindex(pool_key, seg, tail)
        need = size - (tail.size if tail is not None else 0)
        grow = -(-need // page) * page
        self._make_room(grow, pool_key, size)
        if tail is None:
            tail = _Block(seg.ident, seg.size, 0)
            seg.blocks.append(tail)
        tail.size += grow
        seg.size += grow
        self._reserve(grow, pool_key[0])
        return seg, tail

    def _address(self, nbytes: int) -> int:
        return self.segments if self.segment_address is None else self.segment_address(nbytes)

    def _reserve(self, nbytes: int, stream: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self._stream(stream).reserve(nbytes)

    def _stream(self, stream: int) -> StreamFigures:
        found = self.by_stream.get(stream)
        if found is None:
            found = self.by_stream[stream] = StreamFigures()
        return found

    def _allowed(self) -> int | None:
        if self.capacity is None or self.memory_fraction is None:
            return self.capacity
        return int(self.capacity * self.memory_fraction)

    def _gc_active(self) -> bool:
        return self.config.garbage_collection_threshold > 0 and self.memory_fraction is not None

    def _make_room(self, nbytes: int, pool_key: tuple[int, bool], size: int) -> None:
        """The retries of a ``cudaMalloc`` of ``nbytes`` that would pass the allowed memory."""
        allowed = self._allowed()
        if allowed is None or self.reserved + nbytes <= allowed:
            return
        if not self.config.expandable_segments:
            self._release_available(pool_key, size)
        if self.reserved + nbytes > allowed:
            self.release_cached()

    def _whole_free(self, pool_key: tuple[int, bool]) -> list[_Segment]:
        """This pool's wholly free segments, in the allocator's block order (size, address)."""
        segs = [g for g in self._pools.get(pool_key, []) if len(g.blocks) == 1 and g.blocks[0].free]
        return sorted(segs, key=lambda g: (g.size, g.address))

    def _release(self, pool_key: tuple[int, bool], seg: _Segment) -> None:
        for blk in seg.blocks:
            self._unindex(pool_key, seg, blk)  # a released segment is wholly free
        self._pools[pool_key].remove(seg)
        self.reserved -= seg.size
        self._stream(pool_key[0]).reserved -= seg.size
        self.released += seg.size

    def _release_available(self, pool_key: tuple[int, bool], size: int) -> None:
        """With ``max_split_size_mb``: free oversize cached segments, only as many bytes as needed."""
        limit = self.config.max_split_size
        if limit == NO_LIMIT:
            return
        want = max(size, limit)
        whole = self._whole_free(pool_key)
        fit = [g for g in whole if g.size >= want]
        if fit:
            self._release(pool_key, fit[0])
            return
        freed = 0
        for seg in reversed(whole):  # the largest first, while oversize
            if freed >= want or seg.size < limit:
                break
            self._release(pool_key, seg)
            freed += seg.size

    def _garbage_collect(self) -> None:
        """``garbage_collect_cached_blocks``: old wholly free large-pool segments, down to the line."""
        allowed = self._allowed()
        if allowed is None:
            return
        line = int(self.config.garbage_collection_threshold * allowed)
        if self.reserved <= line:
            return
        target, reclaimed = self.reserved - line, 0
        now = self._requests[False]
        keys = sorted(k for k in self._pools if not k[1])
        cands = [(k, g) for k in keys for g in self._whole_free(k)]
        total_age = sum(now - g.blocks[0].gc_base for _, g in cands)
        freed = True
        while reclaimed < target and freed and cands:
            average = total_age / len(cands)
            freed = False
            for k, g in list(cands):
                age = now - g.blocks[0].gc_base
                if age >= average:
                    freed = True
                    reclaimed += g.size
                    total_age -= age
                    cands.remove((k, g))
                    self._release(k, g)

    def release_cached(self) -> list[tuple[int, int]]:
        """Return every wholly free segment to the device, as ``empty_cache`` and the retry before
        an OOM do (``release_cached_blocks``); the released segments' (address, size)."""
        out: list[tuple[int, int]] = []
        if self.config.expandable_segments:
            return out
        for pool_key in list(self._pools):
            for seg in self._whole_free(pool_key):
                self._release(pool_key, seg)
                out.append((seg.address, seg.size))
        return out


@dataclass
class MirroredReplay(AllocatorReplay):
    """An allocator replay with a what-if twin: once :meth:`start_mirror` is called, every request
    is served by a second replay too, where the requests made through :meth:`alloc_as` take
    another size. The estimate uses it for cuDNN's workspaces (``workspaces.CONV_ENVELOPE``): the
    twin's peaks are the step's had every convolution taken its envelope, reserved segments
    included, so the margin follows the caching allocator rather than adding sizes up. Each
    replay makes room for itself (a release before an OOM is the replay's own).
    """

    mirror: AllocatorReplay | None = None
    _mirror_sizes: dict[int, int] = field(default_factory=dict)

    def start_mirror(self) -> None:
        """From here on keep the twin (a copy of this replay's state now); once only."""
        if self.mirror is None:
            twin = AllocatorReplay(self.config, self.capacity, self.memory_fraction, what_if=True)
            state = copy.deepcopy({k: getattr(self, k) for k in _REPLAY_STATE})
            for k, v in state.items():
                setattr(twin, k, v)
            self.mirror = twin

    def alloc_as(self, key: int, nbytes: int, mirror_nbytes: int, stream: int = 0) -> None:
        """Serve ``nbytes`` here and ``mirror_nbytes`` in the twin (when there is one)."""
        if self.mirror is not None:
            self._mirror_sizes[key] = mirror_nbytes
        self.alloc(key, nbytes, stream)

    def _alloc(self, key: int, nbytes: int, stream: int) -> None:
        super()._alloc(key, nbytes, stream)
        if self.mirror is not None:
            self.mirror.alloc(key, self._mirror_sizes.pop(key, nbytes), stream)

    def _free_now(self, key: int) -> None:
        super()._free_now(key)
        if self.mirror is not None:
            self.mirror.free(key)


#: What a replay's state is (copied into a mirror at its start).
_REPLAY_STATE = (
    "allocated",
    "reserved",
    "peak_allocated",
    "peak_reserved",
    "segments",
    "released",
    "_pools",
    "_live",
    "_free",
    "_requests",
    "by_stream",
)
