"""A real allocator snapshot's trace, rewound to its first entry and replayed through the model.

``torch.cuda.memory._snapshot()`` holds the allocator's state when it was taken (``segments``
with their ``blocks``) and a ring buffer of the events before it (``device_traces``). An
``alloc`` entry carries the *requested* size (the block's ``requested_size``), not the block
size; ``free_requested`` is when the caller freed it (``allocated_bytes`` drops), and
``free_completed`` when the block went back to its pool (only then can it be reused or merge).

:func:`rewind` walks the trace backwards from the dumped segments and so recovers the state at
the trace's first entry, the allocated and reserved bytes after every entry and the block size
every ``alloc`` was handed. :func:`check_trace` seeds :class:`AllocatorReplay` with that state,
replays the trace's requests forward and counts where the model decided as the real allocator
did. Undoing an entry:

- ``alloc``: its block becomes free and merges with free neighbours;
- ``free_requested``: the pending block is allocated again;
- ``free_completed``: the block is carved out of the free block that swallowed it, as pending;
  its size is the request's 512 B rounding, or up to the free block's end when the rest would
  have been too small to split off (a large-pool rest of at most 1 MiB): the trace does not
  record block sizes, so a block allocated before the first entry and freed in the trace may
  be given the wrong size (counted in :attr:`Rewound.guessed`);
- ``segment_alloc`` / ``segment_map``: the (wholly free) range leaves the state;
- ``segment_free`` / ``segment_unmap``: a wholly free range comes back.

The replay check covers ``expandable_segments:False`` traces only (the model's expandable
segments are one segment per pool and stream, which a rewound state of mapped ranges does not fit).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memprofiler.estimate.allocator.caching import (
    NO_LIMIT,
    SMALL_SEGMENT,
    SMALL_SIZE,
    AllocatorConfig,
    AllocatorReplay,
    SeedBlock,
    SeedSegment,
    round_size,
)

ALLOCATED, PENDING, FREE = "allocated", "pending", "free"
_STATES = {"active_allocated": ALLOCATED, "active_pending_free": PENDING, "inactive": FREE}
_GROW = ("segment_alloc", "segment_map")
_SHRINK = ("segment_free", "segment_unmap")


class RewindError(ValueError):
    """The trace does not fit the dumped state (entry index and what did not fit)."""


@dataclass
class Block:
    address: int
    size: int
    state: str
    requested: int = 0


@dataclass
class Segment:
    address: int
    stream: int
    small: bool
    blocks: list[Block]
    expandable: bool = False

    @property
    def size(self) -> int:
        return sum(b.size for b in self.blocks)

    @property
    def end(self) -> int:
        return self.address + self.size


@dataclass
class Rewound:
    """A trace rewound to its first entry."""

    segments: list[Segment]
    """The state before the first entry, by address."""
    allocated_after: list[int]
    """``allocated_bytes`` (block sizes, live until ``free_requested``) after each entry."""
    reserved_after: list[int]
    block_size: dict[int, int]
    """Entry index of each ``alloc`` -> the size of the block the allocator handed out."""
    guessed: int = 0
    """Blocks carved out with a guessed size (allocated before the trace, freed in it, unsplit rest)."""


def config_from_settings(settings: Mapping[str, Any] | None) -> AllocatorConfig:
    """The model's config from a snapshot's ``allocator_settings`` (torch 2.4+ writes them)."""
    if not settings:
        return AllocatorConfig()
    split = int(settings.get("max_split_size", -1))
    divs = settings.get("roundup_power2_divisions") or {}
    values = {int(v) for v in divs.values()} if isinstance(divs, Mapping) else {int(divs)}
    ignored = ("roundup_power2_divisions per size range",) if len(values) > 1 else ()
    return AllocatorConfig(
        max_split_size=NO_LIMIT if split < 0 or split >= NO_LIMIT else split,
        expandable_segments=bool(settings.get("expandable_segments", False)),
        garbage_collection_threshold=float(settings.get("garbage_collection_threshold", 0.0)),
        roundup_power2_divisions=max(values, default=0) if len(values) == 1 else 0,
        ignored=ignored,
    )


class _State:
    """Segments by address; blocks tile each segment."""

    def __init__(self, segments: list[Segment]) -> None:
        self.segs = sorted(segments, key=lambda g: g.address)
        self.starts = [g.address for g in self.segs]

    def segment_at(self, addr: int) -> Segment | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.segs[i].end:
            return self.segs[i]
        return None

    def add(self, seg: Segment) -> None:
        i = bisect.bisect_left(self.starts, seg.address)
        self.starts.insert(i, seg.address)
        self.segs.insert(i, seg)

    def drop(self, seg: Segment) -> None:
        i = self.starts.index(seg.address)
        del self.starts[i], self.segs[i]


def _block_index(seg: Segment, addr: int) -> int:
    for i, b in enumerate(seg.blocks):
        if b.address <= addr < b.address + b.size:
            return i
    raise KeyError(addr)


def _merge_free(seg: Segment, i: int) -> None:
    blocks = seg.blocks
    if i + 1 < len(blocks) and blocks[i + 1].state == FREE:
        blocks[i].size += blocks.pop(i + 1).size
    if i > 0 and blocks[i - 1].state == FREE:
        blocks[i - 1].size += blocks.pop(i).size


def segments_of(snapshot: Mapping[str, Any], device: int = 0) -> list[Segment]:
    """The dumped segments of ``device`` in the rewind's form."""
    out = []
    for g in snapshot.get("segments", []):
        if int(g.get("device", 0)) != device:
            continue
        blocks, addr = [], int(g["address"])
        for b in g["blocks"]:
            state = _STATES.get(str(b["state"]))
            if state is None:
                raise RewindError(f"segment {addr:#x}: unknown block state {b['state']!r}")
            blocks.append(Block(addr, int(b["size"]), state, int(b.get("requested_size", 0))))
            addr += int(b["size"])
        small = g.get("segment_type", "large") == "small"
        seg = Segment(int(g["address"]), int(g.get("stream", 0)), small, blocks, bool(g.get("is_expandable")))
        out.append(seg)
    return out


def rewind(snapshot: Mapping[str, Any], device: int = 0) -> Rewound:
    """Walk ``device``'s trace backwards from the dumped segments to the state before its first entry.

    Raises:
        RewindError: an entry does not fit the state (a block freed that is not live, a segment
            dropped that still holds blocks...): the snapshot and its trace disagree.
    """
    traces = snapshot.get("device_traces") or []
    trace: Sequence[Mapping[str, Any]] = traces[device] if device < len(traces) else []
    state = _State(segments_of(snapshot, device))
    allocated = sum(b.size for g in state.segs for b in g.blocks if b.state == ALLOCATED)
    reserved = sum(g.size for g in state.segs)
    n = len(trace)
    alloc_after, res_after = [0] * n, [0] * n
    block_size: dict[int, int] = {}
    first_alloc: dict[int, int] = {}  # address -> index of the first alloc there
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            first_alloc.setdefault(int(e["addr"]), i)
    guessed = 0
    for i in range(n - 1, -1, -1):
        alloc_after[i], res_after[i] = allocated, reserved
        e = trace[i]
        action, addr, size = e["action"], int(e.get("addr", 0)), int(e.get("size", 0))
        if action == "alloc":
            seg = _holder(state, i, action, addr)
            j = _block_index(seg, addr)
            blk = seg.blocks[j]
            if blk.address != addr or blk.state != ALLOCATED:
                raise RewindError(f"entry {i} (alloc at {addr:#x}): no allocated block starts there")
            block_size[i] = blk.size
            allocated -= blk.size
            blk.state, blk.requested = FREE, 0
            _merge_free(seg, j)
        elif action == "free_requested":
            seg = _holder(state, i, action, addr)
            blk = seg.blocks[_block_index(seg, addr)]
            if blk.address != addr or blk.state != PENDING:
                raise RewindError(f"entry {i} (free_requested at {addr:#x}): no pending block starts there")
            blk.state = ALLOCATED
            allocated += blk.size
        elif action == "free_completed":
            seg = _holder(state, i, action, addr)
            if _carve(seg, i, addr, size) and first_alloc.get(addr, n) > i:
                guessed += 1
        elif action in _GROW:
            _undo_grow(state, _holder(state, i, action, addr), i, action, addr, size)
            reserved -= size
        elif action in _SHRINK:
            _undo_shrink(state, e, action, addr, size)
            reserved += size
    return Rewound(state.segs, alloc_after, res_after, block_size, guessed)


def _holder(state: _State, i: int, action: str, addr: int) -> Segment:
    seg = state.segment_at(addr)
    if seg is None:
        raise RewindError(f"entry {i} ({action} at {addr:#x}): no segment holds that address")
    return seg


def _carve(seg: Segment, i: int, addr: int, requested: int) -> bool:
    """Undo a ``free_completed``: cut the block at ``addr`` out of the free block that swallowed it,
    as pending. Its size is guessed (True) when a large-pool rest of at most 1 MiB follows it:
    the allocator would not have split that rest off, so the block is taken to reach the end."""
    j = _block_index(seg, addr)
    free = seg.blocks[j]
    if free.state != FREE:
        raise RewindError(f"entry {i} (free_completed at {addr:#x}): the block there is not free")
    want = round_size(requested)
    end = free.address + free.size
    rest = end - addr - want
    if rest < 0:
        raise RewindError(f"entry {i} (free_completed at {addr:#x}): {want} B do not fit the free block")
    guessed = not seg.small and 0 < rest <= SMALL_SIZE
    if guessed:
        want += rest
    pieces = [
        Block(free.address, addr - free.address, FREE),
        Block(addr, want, PENDING, requested),
        Block(addr + want, end - addr - want, FREE),
    ]
    seg.blocks[j : j + 1] = [p for p in pieces if p.size > 0]
    return guessed


def _undo_grow(state: _State, seg: Segment, i: int, action: str, addr: int, size: int) -> None:
    j = _block_index(seg, addr)
    blk = seg.blocks[j]
    if blk.state != FREE or blk.address > addr or blk.address + blk.size < addr + size:
        raise RewindError(f"entry {i} ({action} at {addr:#x}): the range still holds live blocks")
    if action == "segment_alloc":
        if seg.address != addr or seg.size != size:
            raise RewindError(f"entry {i} (segment_alloc at {addr:#x}): the dumped segment differs")
        state.drop(seg)
        return
    # segment_map: cut [addr, addr + size) out of the mapped range that holds it
    before = Block(blk.address, addr - blk.address, FREE)
    after = Block(addr + size, blk.address + blk.size - addr - size, FREE)
    head, tail = seg.blocks[:j], seg.blocks[j + 1 :]
    state.drop(seg)
    if head or before.size:
        state.add(Segment(seg.address, seg.stream, seg.small, head + [before] * (before.size > 0), True))
    if tail or after.size:
        state.add(Segment(addr + size, seg.stream, seg.small, [after] * (after.size > 0) + tail, True))


def _undo_shrink(state: _State, e: Mapping[str, Any], action: str, addr: int, size: int) -> None:
    stream = int(e.get("stream", 0))
    if action == "segment_free":
        state.add(Segment(addr, stream, size == SMALL_SEGMENT, [Block(addr, size, FREE)]))
        return
    # segment_unmap: the range comes back, joined to the mapped ranges it touches
    left = state.segment_at(addr - 1)
    right = state.segment_at(addr + size)
    # no neighbour to ask: large-pool pages are 20 MiB, so any other multiple is a small pool's
    small = left.small if left is not None else right.small if right is not None else size % (20 << 20) != 0
    blocks = [Block(addr, size, FREE)]
    start = addr
    if left is not None and left.expandable and left.end == addr:
        state.drop(left)
        blocks, start = left.blocks + blocks, left.address
    if right is not None and right.expandable and right.address == addr + size:
        state.drop(right)
        blocks = blocks + right.blocks
    merged = Segment(start, stream, small, [], True)
    for b in blocks:  # free neighbours across the joined ranges merge
        if merged.blocks and merged.blocks[-1].state == FREE and b.state == FREE:
            merged.blocks[-1].size += b.size
        else:
            merged.blocks.append(b)
    state.add(merged)


# ---- the forward replay ------------------------------------------------------------------------


@dataclass
class TraceCheck:
    """How often the model decided as the real allocator did, over one trace."""

    allocs: int = 0
    same_source: int = 0
    """Allocations served as the real one was: from a cached block, or from a new segment."""
    real_new_segments: int = 0
    model_new_segments: int = 0
    same_segment_size: int = 0
    """Of the allocations where both made a new segment: the same size."""
    same_address: int = 0
    """The block handed out starts at the real block's address."""
    same_block_size: int = 0
    """The block handed out has the real block's size (split or not, as the real one)."""
    events: int = 0
    same_allocated: int = 0
    same_reserved: int = 0
    releases: int = 0
    same_release: int = 0
    """Release runs (before an OOM, ``empty_cache``) that freed the same segments."""
    real_peak_allocated: int = 0
    model_peak_allocated: int = 0
    real_peak_reserved: int = 0
    model_peak_reserved: int = 0
    real_slack_at_peak: int = 0
    """At the real allocated peak: live blocks' size minus their 512 B-rounded request, summed."""
    model_slack_at_peak: int = 0
    """The model's same sum at the same entry."""
    live_at_peak: int = 0
    end_state_equal: bool = False
    """The replay ends with the dumped segments and blocks (address, size, free or not)."""
    divergences: list[str] = field(default_factory=list)
    """The first few allocations where the model departed, described."""

    def rates(self) -> dict[str, float]:
        def r(a: int, b: int) -> float:
            return round(a / b, 4) if b else 1.0

        return {
            "source": r(self.same_source, self.allocs),
            "address": r(self.same_address, self.allocs),
            "block_size": r(self.same_block_size, self.allocs),
            "segment_size": r(self.same_segment_size, min(self.real_new_segments, self.model_new_segments)),
            "allocated": r(self.same_allocated, self.events),
            "reserved": r(self.same_reserved, self.events),
            "release": r(self.same_release, self.releases),
        }


def _placed(model: AllocatorReplay, key: int) -> tuple[int, int]:
    got = model.block(key)
    if got is None:
        raise RewindError(f"request {key} is not live in the model")
    return got


def _size(model: AllocatorReplay, key: int) -> int:
    return _placed(model, key)[1]


def _seed(segments: list[Segment], keys: dict[int, int]) -> list[SeedSegment]:
    out = []
    for g in segments:
        blocks = []
        for b in g.blocks:
            key = None
            if b.state != FREE:
                key = keys.setdefault(b.address, len(keys))
            blocks.append(SeedBlock(b.size, key))
        out.append(SeedSegment(g.address, g.stream, g.small, tuple(blocks)))
    return out


def check_trace(
    snapshot: Mapping[str, Any],
    device: int = 0,
    config: AllocatorConfig | None = None,
    keep: int = 10,
) -> TraceCheck:
    """Replay ``device``'s trace through the model from its rewound first state and compare.

    Raises:
        RewindError: the trace does not rewind, or its segments are expandable (not checked).
    """
    traces = snapshot.get("device_traces") or []
    trace: Sequence[Mapping[str, Any]] = traces[device] if device < len(traces) else []
    back = rewind(snapshot, device)
    if any(g.expandable for g in segments_of(snapshot, device)):
        raise RewindError("expandable segments: the trace rewinds, but its replay is not checked")
    config = config or config_from_settings(snapshot.get("allocator_settings"))
    new_at: list[int] = []
    synthetic = iter(range(1 << 62, 1 << 63, 1 << 40))

    def place(nbytes: int) -> int:
        return new_at.pop() if new_at else next(synthetic)

    keys: dict[int, int] = {}  # live block address -> request key
    model = AllocatorReplay.seeded(_seed(back.segments, keys), config, segment_address=place)
    requested = {keys[b.address]: b.requested for g in back.segments for b in g.blocks if b.state != FREE}
    pending = {keys[b.address] for g in back.segments for b in g.blocks if b.state == PENDING}
    real_live = {keys[b.address]: b.size for g in back.segments for b in g.blocks if b.state == ALLOCATED}
    model_pending = sum(_size(model, k) for k in pending)
    out = TraceCheck()
    model_peak = model.allocated - model_pending
    out.real_peak_allocated = max([model_peak, *back.allocated_after])
    out.real_peak_reserved = max([model.reserved, *back.reserved_after])
    # the first entry after which allocated_bytes was at its peak (-1: before the first entry)
    peak_at = (
        back.allocated_after.index(out.real_peak_allocated) if out.real_peak_allocated > model_peak else -1
    )
    released_run = False
    for i, e in enumerate(trace):
        action, addr, size = e["action"], int(e.get("addr", 0)), int(e.get("size", 0))
        if action != "segment_free":
            released_run = False
        if action == "alloc":
            prev = trace[i - 1] if i else None
            real_new = prev is not None and prev["action"] == "segment_alloc" and int(prev["addr"]) == addr
            new_at[:] = [addr] if real_new else []
            before_seg, before_res = model.segments, model.reserved
            key = (1 << 40) + i  # the seeded blocks' keys count up from 0
            keys[addr] = key
            requested[key] = size
            model.alloc(key, size, int(e.get("stream", 0)))
            model_new = model.segments > before_seg
            got = _placed(model, key)
            real_size = back.block_size[i]
            real_live[key] = real_size
            out.allocs += 1
            out.real_new_segments += real_new
            out.model_new_segments += model_new
            same = (real_new == model_new, got[0] == addr, got[1] == real_size)
            out.same_source += same[0]
            out.same_address += same[1]
            out.same_block_size += same[2]
            if real_new and model_new:
                out.same_segment_size += model.reserved - before_res == int(trace[i - 1]["size"])
            if not all(same) and len(out.divergences) < keep:
                out.divergences.append(
                    f"entry {i}: request {size} B -> real {'new segment' if real_new else 'cached'} "
                    f"{addr:#x} block {real_size}; model {'new segment' if model_new else 'cached'} "
                    f"{got[0]:#x} block {got[1]}"
                )
        elif action == "free_requested":
            key = keys[addr]
            pending.add(key)
            model_pending += _size(model, key)
            real_live.pop(key, None)
        elif action == "free_completed":
            key = keys.pop(addr)
            pending.discard(key)
            model_pending -= _size(model, key)
            model.free(key)
            requested.pop(key, None)
        elif action == "segment_free" and not released_run:
            released_run = True
            run = set()
            for f in trace[i:]:
                if f["action"] != "segment_free":
                    break
                run.add((int(f["addr"]), int(f["size"])))
            out.releases += 1
            out.same_release += set(model.release_cached()) == run
        if action in ("segment_alloc", "segment_map"):
            continue  # the model reserves and hands out in one step: compare after the alloc
        if action == "segment_free" and i + 1 < len(trace) and trace[i + 1]["action"] == "segment_free":
            continue  # the model releases a run at once: compare after its last entry
        out.events += 1
        out.same_allocated += model.allocated - model_pending == back.allocated_after[i]
        out.same_reserved += model.reserved == back.reserved_after[i]
        model_peak = max(model_peak, model.allocated - model_pending)
        if i == peak_at:
            live = [k for k in real_live if k not in pending]
            out.live_at_peak = len(live)
            out.real_slack_at_peak = sum(real_live[k] - round_size(requested[k], config) for k in live)
            out.model_slack_at_peak = sum(_size(model, k) - round_size(requested[k], config) for k in live)
    out.model_peak_allocated = model_peak
    out.model_peak_reserved = model.peak_reserved
    out.end_state_equal = sorted(model.layout()) == sorted(
        (b.address, b.size, b.state == FREE) for g in segments_of(snapshot, device) for b in g.blocks
    )
    return out


@dataclass
class CleanReplay:
    """The trace's requests replayed as an estimate would: from an empty cache, no addresses."""

    peak_allocated: int
    peak_reserved: int
    slack_at_peak: int
    """At the model's allocated peak: live blocks' size minus their 512 B-rounded request, summed."""
    windows: list[tuple[int, int]] = field(default_factory=list)
    """Per window asked for: the largest allocated after an entry in it, and the slack then."""


def clean_replay(
    snapshot: Mapping[str, Any],
    device: int = 0,
    config: AllocatorConfig | None = None,
    windows: Sequence[tuple[int, int]] = (),
) -> CleanReplay:
    """Replay ``device``'s trace from an empty allocator: the blocks live before its first entry are
    requested first (in address order), then every request and free of the trace. Against the real
    peaks this tells how much the real cache's history (its layout, its addresses) moved them.

    ``windows``: ``[start, end)`` entry ranges (a training step's) whose own peaks to report too.
    """
    traces = snapshot.get("device_traces") or []
    trace: Sequence[Mapping[str, Any]] = traces[device] if device < len(traces) else []
    back = rewind(snapshot, device)
    config = config or config_from_settings(snapshot.get("allocator_settings"))
    model = AllocatorReplay(config)
    keys: dict[int, int] = {}
    slack_of: dict[int, int] = {}  # live request -> its block's size minus its rounded request
    pending: set[int] = set()
    pending_bytes = slack = 0
    counter = iter(range(1 << 62))

    def request(addr: int, nbytes: int, stream: int) -> int:
        nonlocal slack
        key = next(counter)
        keys[addr] = key
        model.alloc(key, nbytes, stream)
        slack_of[key] = _size(model, key) - round_size(nbytes, config)
        slack += slack_of[key]
        return key

    def set_pending(key: int) -> None:
        nonlocal pending_bytes, slack
        pending.add(key)
        pending_bytes += _size(model, key)
        slack -= slack_of[key]

    for g in back.segments:
        for b in g.blocks:
            if b.state != FREE:
                key = request(b.address, b.requested, g.stream)
                if b.state == PENDING:
                    set_pending(key)
    peak, peak_slack = model.allocated - pending_bytes, slack
    in_window = [(0, -1)] * len(windows)  # (allocated, slack) at each window's peak so far
    for i, e in enumerate(trace):
        action, addr = e["action"], int(e.get("addr", 0))
        if action == "segment_free" and (i == 0 or trace[i - 1]["action"] != "segment_free"):
            model.release_cached()  # empty_cache, or the retry before an OOM: the program asked
        elif action == "alloc":
            request(addr, int(e["size"]), int(e.get("stream", 0)))
        elif action == "free_requested":
            set_pending(keys[addr])
        elif action == "free_completed":
            key = keys.pop(addr)
            if key in pending:
                pending.discard(key)
                pending_bytes -= _size(model, key)
            else:  # freed with no request before it: it leaves allocated now
                slack -= slack_of[key]
            model.free(key)
            del slack_of[key]
        now = model.allocated - pending_bytes
        if now > peak:
            peak, peak_slack = now, slack
        for w, (lo, hi) in enumerate(windows):
            if lo <= i < hi and now > in_window[w][0]:
                in_window[w] = (now, slack)
    return CleanReplay(peak, model.peak_reserved, peak_slack, in_window)
