"""Replay an allocator snapshot's trace into blocks and segments with lifetimes (numpy arrays).

Where :mod:`memprofiler.analysis.snapshot` keeps running totals, this keeps every block: its
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from memprofiler.analysis.snapshot_frames import frame_kind, label_index

_LIVE_STATES = ("active_allocated", "active_pending_free")
_RESERVE = ("segment_alloc", "segment_map")
_RELEASE = ("segment_free", "segment_unmap")
_FRAME_KEY = itemgetter("name", "filename", "line")


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
    _by_object: dict[int, int] = field(default_factory=dict, repr=False)

    def intern(self, frames: Sequence[Mapping[str, Any]] | None) -> int:
        """The stack id of a frame list (``0`` is the empty stack)."""
        if not self.stacks:
            self.stacks.append(())
            self.labels.append(-1)
            self._stack_ids[()] = 0
        if not frames:
            return 0
        # torch builds each entry's list afresh, but our own fixtures (and memo'd pickles)
        # share them: the object id is a free first look-up. The data outlives the table's use.
        sid = self._by_object.get(id(frames))
        if sid is not None:
            return sid
        try:
            key = tuple(map(_FRAME_KEY, frames))
        except (KeyError, TypeError):
            key = tuple((f.get("name", "?"), f.get("filename", "?"), f.get("line", 0)) for f in frames)
        sid = self._stack_ids.get(key)
        if sid is None:
            ids = tuple(self._frame(*k) for k in key)
            sid = self._stack_ids[key] = len(self.stacks)
            self.stacks.append(ids)
            li = label_index([self.frames[f][3] for f in ids])
            self.labels.append(ids[li] if li >= 0 else -1)
        self._by_object[id(frames)] = sid
        return sid

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
        m = self.instants
        s = np.maximum(self.start, 0)
        d = np.zeros(m + 1)
        d += np.bincount(s, weights=self.size, minlength=m + 1)[: m + 1]
        d -= np.bincount(self.end, weights=self.size, minlength=m + 1)[: m + 1]
        return np.cumsum(d[:m]).astype(np.int64)

    def reserved(self) -> np.ndarray:
        """Reserved (segment) bytes after each instant."""
        m = self.instants
        s = np.maximum(self.seg_start, 0)
        d = np.zeros(m + 1)
        d += np.bincount(s, weights=self.seg_size, minlength=m + 1)[: m + 1]
        d -= np.bincount(self.seg_end, weights=self.seg_size, minlength=m + 1)[: m + 1]
        return np.cumsum(d[:m]).astype(np.int64)

    def live_at(self, t: int) -> np.ndarray:
        """Indices of the blocks live after instant ``t``."""
        return np.nonzero((self.start <= t) & (t < self.end))[0]


def replay(data: Mapping[str, Any], table: StackTable) -> list[DeviceReplay]:
    """Every device of a checked ``_snapshot()`` dict (see :func:`snapshot.check_layout`).

    Raises:
        KeyError, TypeError, ValueError, OverflowError: a malformed entry; callers turn these
            into :class:`~memprofiler.errors.ArtifactError` naming the file.
    """
    table.intern(None)
    segments = data.get("segments") or []
    traces = data.get("device_traces") or []
    devices = sorted({d for d, t in enumerate(traces) if t} | {s.get("device", 0) for s in segments})
    return [_replay_device(dev, traces[dev] if dev < len(traces) else [], segments, table) for dev in devices]


def _replay_device(
    dev: int, entries: Sequence[Mapping[str, Any]], segments: Sequence[Mapping[str, Any]], table: StackTable
) -> DeviceReplay:
    n = len(entries)
    m = max(n, 1)
    start: list[int] = []
    end: list[int] = []
    size: list[int] = []
    addr: list[int] = []
    stream: list[int] = []
    stack: list[int] = []
    live: dict[int, int] = {}
    seg: list[list[int]] = []  # [start, end, addr, size, stream]
    seg_live: dict[int, int] = {}
    times: list[int] = []
    ooms: list[tuple[int, int]] = []
    intern = table.intern
    for i, e in enumerate(entries):
        a = e["action"]
        times.append(e.get("time_us") or 0)
        if a == "alloc":
            # An address allocated twice without a free keeps its first block counted to the
            # end, as the analysis's running total does.
            live[e["addr"]] = len(start)
            start.append(i)
            end.append(m)
            size.append(e["size"])
            addr.append(e["addr"])
            stream.append(e.get("stream", 0))
            stack.append(intern(e.get("frames")))
        elif a == "free_completed":
            b = live.pop(e["addr"], None)
            if b is None:  # allocated before the trace began
                start.append(-1)
                end.append(i)
                size.append(e["size"])
                addr.append(e["addr"])
                stream.append(e.get("stream", 0))
                stack.append(intern(e.get("frames")))
            else:
                end[b] = i
        elif a in _RESERVE:
            seg_live[e["addr"]] = len(seg)
            seg.append([i, m, e["addr"], e["size"], e.get("stream", 0)])
        elif a in _RELEASE:
            k = seg_live.pop(e["addr"], None)
            if k is None:
                seg.append([-1, i, e["addr"], e["size"], e.get("stream", 0)])
            else:
                seg[k][1] = i
        elif a == "oom":
            ooms.append((i, e.get("size", 0)))
    for s in segments:
        if s.get("device", 0) != dev:
            continue
        if s.get("address", 0) not in seg_live:
            seg.append([-1, m, s.get("address", 0), s["total_size"], s.get("stream", 0)])
        for blk in s.get("blocks", []):
            if blk["state"] in _LIVE_STATES and blk["address"] not in live:
                start.append(-1)
                end.append(m)
                size.append(int(blk.get("requested_size", blk["size"])))
                addr.append(blk["address"])
                stream.append(s.get("stream", 0))
                stack.append(intern(blk.get("frames")))
    order = np.argsort(np.asarray(start, dtype=np.int64), kind="stable")
    segs = np.asarray(seg, dtype=np.int64).reshape(-1, 5)
    seg_order = np.lexsort((segs[:, 2], segs[:, 0])) if len(segs) else np.zeros(0, dtype=np.int64)
    segs = segs[seg_order]
    t = np.asarray(times or [0], dtype=np.int64)
    t0 = t[t > 0].min() if (t > 0).any() else 0
    return DeviceReplay(
        device=dev,
        entries=n,
        instants=m,
        start=np.asarray(start, dtype=np.int64)[order],
        end=np.asarray(end, dtype=np.int64)[order],
        size=np.asarray(size, dtype=np.int64)[order],
        addr=np.asarray(addr, dtype=np.int64)[order],
        stream=np.asarray(stream, dtype=np.int64)[order],
        stack=np.asarray(stack, dtype=np.int32)[order],
        seg_start=segs[:, 0],
        seg_end=segs[:, 1],
        seg_addr=segs[:, 2],
        seg_size=segs[:, 3],
        seg_stream=segs[:, 4],
        time_us=np.where(t > 0, t - t0, 0),
        ooms=ooms,
    )
