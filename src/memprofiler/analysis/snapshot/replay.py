"""Replay an allocator snapshot's trace into blocks and segments with lifetimes (numpy arrays).

Where :mod:`memprofiler.analysis.snapshot.summary` keeps running totals, this keeps every block: its
first and last trace entry, requested size, address, stream and (interned) stack, so a
viewer can draw each allocation over time and list what is live at any instant. Lifetimes
are in trace entries: a block is live *after* entry ``i`` when ``start <= i < end``.
``start == -1`` marks a block allocated before the trace began (the ring buffer's first
entry is not the first allocation); ``end == instants`` one still alive at snapshot time.
Blocks counting as active follow the analysis: from ``alloc`` to ``free_completed``, sizes
in requested bytes, pre-trace blocks recovered from the end-state segments and from frees
of blocks the trace never allocated (whose stack is then the free's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import eq, itemgetter
from typing import Any

import numpy as np

from memprofiler.analysis.snapshot.columns import RELEASE, RESERVE, TraceColumns, read_columns
from memprofiler.analysis.snapshot.frames import frame_kind, label_index
from memprofiler.analysis.snapshot.roles import AnnotationSpans, RoleIndex

_LIVE_STATES = ("active_allocated", "active_pending_free")
_FRAME_KEY = itemgetter("name", "filename", "line")
#: Lists of one length that the probed positions are chosen on (see StackTable.intern_all).
_LEARN = 4096


@dataclass
class StackTable:
    """Interned strings, frames and stacks shared by every device of one snapshot."""

    strings: list[str] = field(default_factory=list)
    frames: list[tuple[int, int, int, int]] = field(default_factory=list)
    """``(name string id, file string id, line, kind bits)``."""
    stacks: list[tuple[int, ...]] = field(default_factory=list)
    """Frame ids, innermost first, as recorded."""
    labels: list[int] = field(default_factory=list)
    """Per stack, the frame id that labels its blocks (``-1``: no frames)."""
    _string_ids: dict[str, int] = field(default_factory=dict, repr=False)
    _frame_ids: dict[tuple[Any, ...], int] = field(default_factory=dict, repr=False)
    _stack_ids: dict[tuple[Any, ...], int] = field(default_factory=dict, repr=False)
    _by_probe: dict[tuple[int, ...], list[tuple[Any, int]]] = field(default_factory=dict, repr=False)
    _positions: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def intern(self, frames: Sequence[Mapping[str, Any]] | None) -> int:
        """The stack id of a frame list (``0`` is the empty stack)."""
        if not self.stacks:
            self.stacks.append(())
            self.labels.append(-1)
            self._stack_ids[()] = 0
        if not frames:
            return 0
        # torch shares one dict per distinct frame between every stack that names it (the pickle
        # memoizes it), so a list equal to one already seen compares by identity, element by
        # element, in C; the ids of a few frames find it (see _probe).
        probe = self._probe(frames)
        for other, known in self._by_probe.get(probe, ()):
            if other == frames:
                return known
        try:
            key = tuple(map(_FRAME_KEY, frames))
        except (KeyError, TypeError):
            key = tuple((f.get("name", "?"), f.get("filename", "?"), f.get("line", 0)) for f in frames)
        sid = self._stack_ids.get(key)
        if sid is None:
            fids = tuple(self._frame(*k) for k in key)
            sid = self._stack_ids[key] = len(self.stacks)
            self.stacks.append(fids)
            li = label_index([self.frames[f][3] for f in fids])
            self.labels.append(fids[li] if li >= 0 else -1)
        self._remember(frames, sid, probe)
        return sid

    def intern_all(self, lists: Sequence[Sequence[Mapping[str, Any]] | None]) -> np.ndarray:
        """The stack id of each frame list (int64): what :meth:`intern` gives each, in order.

        At a million allocations one call each costs more than the rest of the replay, so the
        lists are grouped here in bulk: by length, then by the identity of the frames at a
        few positions, chosen on the first lists of that length to tell its stacks apart.
        Each list is compared with the
        first of its group (identity, element by element, in C); only each group's first, and
        a list that differs from it, is interned, in the order they first appear, so every id
        is the one a pass in order gives.
        """
        self.intern(None)
        n = len(lists)
        each: Any = lists  # (a None among them fails len(): handled below)
        try:
            lens = np.fromiter(map(len, each), dtype=np.int64, count=n)
        except TypeError:  # a None among them (no frames), or no list of frames
            try:
                lens = np.fromiter((len(f) if f else 0 for f in lists), dtype=np.int64, count=n)
            except TypeError:  # not a list of frames: intern() says how it is malformed
                return np.asarray(list(map(self.intern, lists)), dtype=np.int64)
        pos = np.flatnonzero(lens)
        sub: list[Any] = list(lists) if pos.size == n else list(map(lists.__getitem__, pos.tolist()))
        lens = lens[pos]
        # first[k]: the first list of k's group equal to list k; every list then takes the
        # id of its first, and the firsts, taken in order, are interned one by one.
        if lens.size and lens.min() == lens.max():  # (one length, as a trace's stacks mostly are)
            first = self._firsts(sub)
        else:
            first = np.empty(len(sub), dtype=np.int64)
            order = np.argsort(lens, kind="stable")
            cuts = np.flatnonzero(np.diff(lens[order])) + 1
            for group in np.split(order, cuts) if order.size else ():
                first[group] = group[self._firsts(list(map(sub.__getitem__, group.tolist())))]
        firsts = np.flatnonzero(first == np.arange(first.size))  # (first[k] <= k)
        ids = np.zeros(first.size, dtype=np.int64)
        ids[firsts] = np.fromiter(
            map(self.intern, map(sub.__getitem__, firsts.tolist())), np.int64, firsts.size
        )
        out = np.zeros(n, dtype=np.int64)
        out[pos] = ids[first]
        return out

    def _firsts(self, members: list[Any]) -> np.ndarray:
        """For each of ``members`` (lists of one length), the index of the first equal one."""
        positions = list(self._positions.get(len(members[0])) or [len(members[0]) >> 1])
        # The positions that tell this length's stacks apart are found on its first lists.
        sample = members[:_LEARN]
        _group(sample, positions, 0)
        positions = _fewest(sample, positions)
        firsts, same = _group(members, positions, len(members) // 64)
        # the few lists unlike their group's first are groups of their own
        return np.where(same, firsts, np.arange(len(members)))

    def _probe(self, frames: Sequence[Any]) -> tuple[int, ...]:
        n = len(frames)
        pos = self._positions.get(n)
        if pos is None:
            pos = self._positions[n] = [n >> 1]
        return (n, *map(id, map(frames.__getitem__, pos)))

    def _remember(self, frames: Sequence[Any], sid: int, probe: tuple[int, ...]) -> None:
        """Cache a list under its probe; probe one more position when two stacks collide.

        The positions probed per stack length grow only where cached stacks of that length
        share the frames probed so far, so a look-up reads a few ids rather than all. Lists of
        fresh dicts (never hit again) stop being cached once the cache outgrows the stacks.
        """
        if len(self._by_probe) > 4 * len(self.stacks) + 4096:
            return
        seen = self._by_probe.setdefault(probe, [])
        pos = self._positions[len(frames)]
        for other, known in seen:
            if known != sid and len(pos) < 32:
                pos.append(next(i for i, (x, y) in enumerate(zip(other, frames, strict=True)) if x is not y))
                cached = [
                    item for k, items in self._by_probe.items() if k[0] == len(frames) for item in items
                ]
                for k in [k for k in self._by_probe if k[0] == len(frames)]:
                    del self._by_probe[k]
                for item in [*cached, (frames, sid)]:
                    bucket = self._by_probe.setdefault(self._probe(item[0]), [])
                    if len(bucket) < 8:
                        bucket.append(item)
                return
        if len(seen) < 8:
            seen.append((frames, sid))

    def _frame(self, name: Any, filename: Any, line: Any) -> int:
        key = (name, filename, line)
        fid = self._frame_ids.get(key)
        if fid is None:
            name, filename = str(name), str(filename)
            line_no = line if type(line) is int else 0
            fid = self._frame_ids[key] = len(self.frames)
            self.frames.append(
                (self._string(name), self._string(filename), line_no, frame_kind(name, filename))
            )
        return fid

    def _string(self, s: str) -> int:
        sid = self._string_ids.get(s)
        if sid is None:
            sid = self._string_ids[s] = len(self.strings)
            self.strings.append(s)
        return sid


def _group(members: list[Any], positions: list[int], allowed: int) -> tuple[np.ndarray, np.ndarray]:
    """Each member's first equal member (index), keyed by the identity of the frames at
    ``positions``, and whether it is equal to it; adds a position where a member differs
    from its first until at most ``allowed`` do (or 8 positions are probed)."""
    n = len(members)
    while True:
        # The frames' identities at the positions, mixed into one int64 per list (a collision
        # only costs a list that differs from its group's first: it is a group of its own).
        key = np.zeros(n, dtype=np.int64)
        for p in positions:
            key = key * 1_000_003 + np.fromiter(map(id, map(itemgetter(p), members)), np.int64, n)
        order = np.argsort(key, kind="stable")
        head = np.ones(n, dtype=bool)
        head[1:] = key[order[1:]] != key[order[:-1]]
        firsts = np.empty(n, dtype=np.int64)
        firsts[order] = order[head][np.cumsum(head) - 1]  # (a run's head: its smallest index)
        same = np.fromiter(map(eq, map(members.__getitem__, firsts.tolist()), members), bool, n)
        if n - int(same.sum()) <= allowed or len(positions) >= 8:
            return firsts, same
        j = int(np.argmin(same))
        a, b = members[j], members[int(firsts[j])]
        positions.append(next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x is not y))


def _fewest(members: list[Any], positions: list[int]) -> list[int]:
    """Of ``positions``, the fewest (chosen greedily) that tell ``members`` apart as all of them
    do: each position probed costs a pass over every list of the length."""

    def keys(chosen: list[int]) -> int:
        return len(set(zip(*[map(id, map(itemgetter(p), members)) for p in chosen], strict=True)))

    want = keys(positions)
    chosen: list[int] = []
    while not chosen or keys(chosen) < want:
        chosen.append(max((p for p in positions if p not in chosen), key=lambda p: keys([*chosen, p])))
    return chosen


@dataclass
class DeviceReplay:
    """One device's blocks and segments with lifetimes in trace entries, in allocation order."""

    device: int
    entries: int
    instants: int
    """``max(entries, 1)``: a device with no trace still has its end state to show."""
    start: np.ndarray
    end: np.ndarray
    size: np.ndarray
    addr: np.ndarray
    stream: np.ndarray
    stack: np.ndarray
    seg_start: np.ndarray
    seg_end: np.ndarray
    seg_addr: np.ndarray
    seg_size: np.ndarray
    seg_stream: np.ndarray
    time_us: np.ndarray
    """Per entry, microseconds since the first entry (0 where torch recorded no time)."""
    ooms: list[tuple[int, int]] = field(default_factory=list)
    """``(entry, requested bytes)`` of each ``oom`` action."""

    def active(self) -> np.ndarray:
        """Active requested bytes after each instant (int64, length ``instants``)."""
        return _live_bytes(self.instants, self.start, self.end, self.size)

    def reserved(self) -> np.ndarray:
        """Reserved (segment) bytes after each instant."""
        return _live_bytes(self.instants, self.seg_start, self.seg_end, self.seg_size)

    def live_at(self, t: int) -> np.ndarray:
        """Indices of the blocks live after instant ``t``."""
        return np.nonzero((self.start <= t) & (t < self.end))[0]


def replay(
    data: Mapping[str, Any],
    table: StackTable,
    roles: RoleIndex | None = None,
    columns: dict[int, TraceColumns] | None = None,
) -> list[DeviceReplay]:
    """Every device of a checked ``_snapshot()`` dict (see :func:`snapshot.check_layout`).

    ``roles`` (the role map beside a recording) names the blocks older than the trace: their
    stack is then the role's synthetic frames (category, then the tensor), see
    :mod:`~memprofiler.analysis.snapshot.roles`.
    An allocation recorded with no Python stack is named by the ``record_function`` span it
    was made in, when the snapshot kept its annotations (:class:`AnnotationSpans`).
    ``columns``: the traces of ``data`` already read, by device
    (:func:`~memprofiler.analysis.snapshot.summary.analyze_columns`), handed over: each is taken
    out of the dict as its device is replayed, so its memory goes before the page's arrays are
    built (at 1M entries, 30 MB of a 960 MB peak); the traces not in it are read here.

    Raises:
        KeyError, TypeError, ValueError, OverflowError: a malformed entry; callers turn these
            into :class:`~memprofiler.errors.ArtifactError` naming the file.
    """
    return [blocks.replay() for blocks in replay_blocks(data, table, roles, columns)]


def replay_blocks(
    data: Mapping[str, Any],
    table: StackTable,
    roles: RoleIndex | None = None,
    columns: dict[int, TraceColumns] | None = None,
) -> Iterator[DeviceBlocks]:
    """:func:`replay` a device at a time, each first as its blocks' lifetimes, sizes and
    addresses (read off the columns, a few milliseconds), then, from
    :meth:`DeviceBlocks.replay`, whole: its stacks, streams and times (the rest of the work).
    The stacks are interned device after device, each before the next is yielded, so the ids
    are those of :func:`replay`. Arguments and errors as :func:`replay`.
    """
    table.intern(None)
    segments = data.get("segments") or []
    traces = data.get("device_traces") or []
    devices = sorted({d for d, t in enumerate(traces) if t} | {s.get("device", 0) for s in segments})
    spans = AnnotationSpans(data.get("external_annotations"))
    for dev in devices:
        entries = traces[dev] if dev < len(traces) else []
        cols = columns.pop(dev, None) if columns is not None else None
        cols = cols or read_columns(entries, f"device_traces[{dev}]")
        blocks = _replay_device(dev, cols, entries, segments, table, roles, spans)
        del cols  # (its memory goes before the next device's arrays)
        yield blocks
        blocks.replay()  # (in device order, whether the caller asked for it or not)


@dataclass
class DeviceBlocks:
    """One device's blocks before its stacks are interned: :class:`DeviceReplay`'s ``start``,
    ``end``, ``size`` and ``addr``; :meth:`replay` gives the whole replay."""

    start: np.ndarray
    end: np.ndarray
    size: np.ndarray
    addr: np.ndarray
    _rest: Callable[[], DeviceReplay] | None = field(repr=False)
    _done: DeviceReplay | None = field(default=None, repr=False)

    def replay(self) -> DeviceReplay:
        """The device's replay: interns its stacks (once) and reads its streams and times."""
        if self._done is None:
            assert self._rest is not None
            self._done, self._rest = self._rest(), None  # (what it read of the trace goes)
        return self._done


def _ints(values: Any, count: int = -1) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64, count=count)


def _field(entries: Sequence[Mapping[str, Any]], key: str, default: Any = None) -> Any:
    # (dict.get on each entry, mapped in C: a third of the cost of a methodcaller)
    get: Any = dict.get
    return map(get, entries, repeat(key), repeat(default))


def _times(entries: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Each entry's ``time_us``, 0 where torch recorded none."""
    if not entries:
        return np.zeros(1, dtype=np.int64)
    try:
        return _ints(_field(entries, "time_us"), len(entries))
    except (TypeError, ValueError):  # a None (or another false value) among them
        return np.asarray([t or 0 for t in _field(entries, "time_us")], dtype=np.int64)


def _replay_device(
    dev: int,
    cols: TraceColumns,
    entries: Sequence[Mapping[str, Any]],
    segments: Sequence[Mapping[str, Any]],
    table: StackTable,
    roles: RoleIndex | None = None,
    spans: AnnotationSpans | None = None,
) -> DeviceBlocks:
    # Column by column rather than entry by entry (the columns' read, shared with the analysis):
    # allocations are paired with their frees by address (see TraceColumns.replay_ends).
    n = cols.entries
    m = max(n, 1)
    code = cols.code
    is_alloc = cols.alloc
    a_idx, f_idx = cols.index[is_alloc], cols.index[~is_alloc]
    # A free closes the block of the event just before it at its address when that is an
    # alloc; otherwise the block was allocated before the trace began. An address allocated
    # twice without a free keeps its first block alive to the end, as the analysis counts it.
    a_end = cols.replay_ends(m)
    older = ~is_alloc & ~cols.after_alloc  # frees of blocks older than the trace
    pre = np.flatnonzero(older[~is_alloc])  # (their positions among the frees)
    live = cols.alive_at_end()

    seg: list[list[int]] = []  # [start, end, addr, size, stream]
    seg_live: dict[int, int] = {}
    ooms: list[tuple[int, int]] = []
    for i in np.flatnonzero(code >= RESERVE).tolist():
        e = entries[i]
        c = code[i]
        if c == RESERVE:
            seg_live[e["addr"]] = len(seg)
            seg.append([i, m, e["addr"], e["size"], e.get("stream", 0)])
        elif c == RELEASE:
            k = seg_live.pop(e["addr"], None)
            if k is None:
                seg.append([-1, i, e["addr"], e["size"], e.get("stream", 0)])
            else:
                seg[k][1] = i
        else:
            ooms.append((i, e.get("size", 0)))
    end_size: list[int] = []
    end_addr: list[int] = []
    end_stream: list[int] = []
    end_frames: list[Any] = []  # (interned after the trace's stacks, as they always were)
    for s in segments:
        if s.get("device", 0) != dev:
            continue
        if s.get("address", 0) not in seg_live:
            seg.append([-1, m, s.get("address", 0), s["total_size"], s.get("stream", 0)])
        for blk in s.get("blocks", []):
            if blk["state"] in _LIVE_STATES and blk["address"] not in live:
                end_size.append(int(blk.get("requested_size", blk["size"])))
                end_addr.append(blk["address"])
                end_stream.append(s.get("stream", 0))
                named = roles.frames(blk["address"]) if roles is not None else None
                end_frames.append(named or blk.get("frames"))
    # Blocks in allocation order: those older than the trace (freed in it, then alive at its
    # end), then the trace's allocations.
    k_pre, k_end = int(np.count_nonzero(older)), len(end_size)
    start = np.concatenate([np.full(k_pre + k_end, -1, dtype=np.int64), a_idx.astype(np.int64)])
    end = np.concatenate([f_idx[pre].astype(np.int64), np.full(k_end, m, dtype=np.int64), a_end])
    size = np.concatenate([cols.size[older], _ints(end_size), cols.size[is_alloc]])
    addr = np.concatenate([cols.addr[older], _ints(end_addr), cols.addr[is_alloc]])

    def rest() -> DeviceReplay:
        # Stacks are interned in trace order, as the ids of an entry-by-entry pass would be.
        chosen = is_alloc | older
        picked = cols.pick(entries, chosen)
        frames_of: list[Any] = list(_field(picked, "frames"))
        is_pre = older[chosen].tolist() if roles is not None or spans else []
        if roles is not None:  # a block freed in the trace but older than it may be named by the role map
            for p, old in enumerate(is_pre):
                named = roles.frames(picked[p].get("addr")) if old else None
                if named is not None:
                    frames_of[p] = named
        if spans:  # an allocation with no Python stack: named by the span it was made in
            bare = [p for p, f in enumerate(frames_of) if not f and not is_pre[p]]
            names = spans.names(picked[p].get("time_us") or 0 for p in bare)
            for p, name in zip(bare, names, strict=True):
                frames_of[p] = spans.frames(name) or frames_of[p]
        sids = table.intern_all(frames_of)
        pre_sids, a_sids = sids[older[chosen]], sids[is_alloc[chosen]]
        end_stack = [table.intern(f) for f in end_frames]
        allocs = cols.pick(entries, is_alloc) if pre.size else picked
        pre_frees = cols.pick(entries, older)
        segs = np.asarray(seg, dtype=np.int64).reshape(-1, 5)
        seg_order = np.lexsort((segs[:, 2], segs[:, 0])) if len(segs) else np.zeros(0, dtype=np.int64)
        segs = segs[seg_order]
        t = _times(entries)
        t0 = t[t > 0].min() if (t > 0).any() else 0
        return DeviceReplay(
            device=dev,
            entries=n,
            instants=m,
            start=start,
            end=end,
            size=size,
            addr=addr,
            stream=np.concatenate(
                [
                    _ints(_field(pre_frees, "stream", 0)),
                    _ints(end_stream),
                    _ints(_field(allocs, "stream", 0), a_idx.size),
                ]
            ),
            stack=np.concatenate([pre_sids, _ints(end_stack), a_sids]).astype(np.int32),
            seg_start=segs[:, 0],
            seg_end=segs[:, 1],
            seg_addr=segs[:, 2],
            seg_size=segs[:, 3],
            seg_stream=segs[:, 4],
            time_us=np.where(t > 0, t - t0, 0),
            ooms=ooms,
        )

    return DeviceBlocks(start=start, end=end, size=size, addr=addr, _rest=rest)


def _live_bytes(m: int, start: np.ndarray, end: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Bytes live after each of ``m`` instants, for blocks living ``[start, end)`` (a start
    below 0: live before the first instant)."""
    d = np.zeros(m + 1)
    d += np.bincount(np.maximum(start, 0), weights=size, minlength=m + 1)[: m + 1]
    d -= np.bincount(end, weights=size, minlength=m + 1)[: m + 1]
    return np.cumsum(d[:m]).astype(np.int64)
