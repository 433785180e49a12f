"""One read of a device trace's entries into numpy columns, shared by the analysis and the replay.

Both need the same fields of the same entries: every entry's ``action``, and the ``addr`` and
``size`` of each ``alloc`` and ``free_completed`` (the *events*). They are read here once,
field by field (each a map over the entries in C, no Python step per entry), and the events
are paired by address with one sort. Who is alive when then follows from the pairing, under
either of the two rules the readers keep for an address allocated twice without a free
between (which torch never records, but a ring buffer cut or a crafted file can hold):

- the analysis keeps the *later* block (its live set is a dict by address): a block lives
  from its ``alloc`` up to the next event at its address (:meth:`TraceColumns.live_at`);
- the replay keeps the *first* alive to the end (it draws every block): a block lives up to
  the ``free_completed`` right after it, else to the end (:meth:`TraceColumns.replay_ends`).

A ``free_completed`` whose address's event before it is not an ``alloc`` frees a block older
than the trace under both rules (:meth:`TraceColumns.older_frees`).
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import itemgetter
from typing import Any

import numpy as np

ALLOC, FREE, RESERVE, RELEASE, OOM = 1, 2, 3, 4, 5
#: Each action's code in :attr:`TraceColumns.code` (0: any other action, ``free_requested``...).
CODES = {"alloc": ALLOC, "free_completed": FREE, "oom": OOM}
CODES.update({a: RESERVE for a in ("segment_alloc", "segment_map")})
CODES.update({a: RELEASE for a in ("segment_free", "segment_unmap")})
#: A running total of requested bytes must stay an int64 (no allocator holds 8 EiB).
_MOST = 1 << 62
_ACTION = itemgetter("action")
_ADDR = itemgetter("addr")
_SIZE = itemgetter("size")


class BadEntry(ValueError):
    """A field holding what no allocator writes (a negative or non-integer byte count, address or
    time); the message names where it is, the field and the value."""


@dataclass(frozen=True)
class TraceColumns:
    """One device trace as columns: per entry, and per event (``alloc`` / ``free_completed``)."""

    entries: int
    code: np.ndarray
    """Per entry (int8): :data:`CODES` of its action, 0 for any other."""
    index: np.ndarray
    """Per event, in trace order (int64): its entry index."""
    alloc: np.ndarray
    """Per event (bool): an ``alloc`` (else a ``free_completed``)."""
    addr: np.ndarray
    """Per event (int64): its ``addr``."""
    size: np.ndarray
    """Per event (int64): its ``size`` (requested bytes)."""
    next: np.ndarray
    """Per event (int64): the entry index of the next event at its address, ``entries`` if none."""
    next_alloc: np.ndarray
    """Per event (bool): that next event is an ``alloc``."""
    after_alloc: np.ndarray
    """Per event (bool): the event before it at its address is an ``alloc``."""
    segment_index: np.ndarray
    """The entry index of each segment reserve or release (``segment_alloc``, ``segment_free``...)."""
    segment_size: np.ndarray
    """Their ``size``, reserved bytes (a release's counts down)."""

    def active(self) -> np.ndarray:
        """Requested bytes allocated in the trace and not yet freed, after each entry (int64)."""
        step = np.zeros(self.entries, dtype=np.int64)
        step[self.index] = np.where(self.alloc, self.size, -self.size)
        return np.cumsum(step, out=step)

    def reserved(self) -> np.ndarray:
        """Segment bytes reserved in the trace and not yet released, after each entry (int64)."""
        step = np.zeros(self.entries, dtype=np.int64)
        grows = self.code[self.segment_index] == RESERVE
        step[self.segment_index] = np.where(grows, self.segment_size, -self.segment_size)
        return np.cumsum(step, out=step)

    def live_at(self, t: int) -> np.ndarray:
        """Events (positions) of the blocks the analysis holds live after entry ``t``: allocated
        at or before it, with no later event at their address up to it (a second ``alloc``
        at an address replaces the block there)."""
        return np.flatnonzero(self.alloc & (self.index <= t) & (t < self.next))

    def older_frees(self) -> np.ndarray:
        """Events (positions) that free a block older than the trace: no ``alloc`` just before."""
        return np.flatnonzero(~self.alloc & ~self.after_alloc)

    def alive_at_end(self) -> set[int]:
        """The addresses of the blocks allocated in the trace and alive at its end."""
        return set(self.addr[self.alloc & (self.next == self.entries)].tolist())

    def replay_ends(self, end: int) -> np.ndarray:
        """Per ``alloc`` event, the entry that frees its block as the replay counts it: the
        ``free_completed`` right after it at its address, else ``end`` (a second ``alloc`` there
        leaves the first block alive to the end)."""
        closed = ~self.next_alloc & (self.next < self.entries)
        return np.where(closed, self.next, end)[self.alloc]

    def pick(self, entries: Sequence[Mapping[str, Any]], events: np.ndarray) -> list[Mapping[str, Any]]:
        """The entries (of the trace read) of the events at ``events`` (positions, or a mask)."""
        return list(map(entries.__getitem__, self.index[events].tolist()))


def read_columns(entries: Sequence[Mapping[str, Any]], where: str = "device_traces[0]") -> TraceColumns:
    """The columns of one device trace (``where`` names it in a :class:`BadEntry`).

    Raises:
        KeyError, TypeError, ValueError, OverflowError: an entry lacks a field or holds one
            that is no integer; :class:`BadEntry` for a size that is not a Python ``int``,
            is negative, or takes a running total past ``2**62`` bytes.
    """
    n = len(entries)
    code = np.fromiter(map(CODES.get, map(_ACTION, entries), repeat(0)), dtype=np.int8, count=n)
    is_event = (code == ALLOC) | (code == FREE)
    index = np.flatnonzero(is_event)
    events = list(compress(entries, is_event.tolist()))  # (a third less than picking by index)
    alloc = code[index] == ALLOC
    sizes = list(map(_SIZE, events))
    seg_index = np.flatnonzero((code == RESERVE) | (code == RELEASE))
    seg_sizes = list(map(_SIZE, map(entries.__getitem__, seg_index.tolist())))
    size = _sizes(sizes, index, entries, where)
    segment_size = _sizes(seg_sizes, seg_index, entries, where)
    del sizes
    if float(size.sum(dtype=np.float64)) + float(segment_size.sum(dtype=np.float64)) >= _MOST:
        raise BadEntry(f"{where}: its sizes add up to more than 2**62 bytes")
    try:
        addr = np.fromiter(map(_ADDR, events), dtype=np.int64, count=len(events))
    except (TypeError, ValueError, OverflowError):
        k = next(
            (k for k, e in enumerate(events) if type(e["addr"]) is not int or not 0 <= e["addr"] < 1 << 63), 0
        )
        got = events[k]["addr"]
        raise BadEntry(_named(where, index, k, entries, f"addr must be an integer, got {got!r}")) from None
    del events
    # Sorted by address, then by entry (the events already are in entry order: a stable sort).
    order = np.argsort(addr, kind="stable")
    s_addr, s_alloc = addr[order], alloc[order]
    same = s_addr[1:] == s_addr[:-1]  # an event and the one after it share their address
    nxt = np.full(index.size, n, dtype=np.int64)
    next_alloc = np.zeros(index.size, dtype=bool)
    after_alloc = np.zeros(index.size, dtype=bool)
    nxt[order[:-1][same]] = index[order[1:][same]]
    next_alloc[order[:-1][same]] = s_alloc[1:][same]
    after_alloc[order[1:][same]] = s_alloc[:-1][same]
    return TraceColumns(
        entries=n,
        code=code,
        index=index,
        alloc=alloc,
        addr=addr,
        size=size,
        next=nxt,
        next_alloc=next_alloc,
        after_alloc=after_alloc,
        segment_index=seg_index,
        segment_size=segment_size,
    )


def _sizes(
    values: list[Any], index: np.ndarray, entries: Sequence[Mapping[str, Any]], where: str
) -> np.ndarray:
    """``values`` as int64, each checked to be an integer (numpy would take ``1.5`` or ``True``)
    of at least 0 bytes.

    ``array("q")`` refuses what is no integer (a float, a string, ``None``) as it converts, in
    C; of what a pickle holds only a ``bool`` passes it, and is looked for only when a value is
    0 or 1 (a scan of every value's type costs as much as the conversion).
    """
    try:
        out: np.ndarray | None = np.frombuffer(array("q", values), dtype=np.int64)
    except (TypeError, OverflowError):
        out = None
    least = int(out.min()) if out is not None and out.size else 0
    if out is None or least <= 1:
        _integers(values, index, entries, where)
    if out is None:  # (integers all, and one of them too large)
        k = next(k for k, v in enumerate(values) if not -_MOST <= v < _MOST)
        raise BadEntry(_named(where, index, k, entries, f"size must be below 2**62, got {values[k]}"))
    if least < 0:
        k = int(np.argmax(out < 0))
        raise BadEntry(_named(where, index, k, entries, f"size must be >= 0 bytes, got {values[k]}"))
    return out


def _integers(values: list[Any], index: np.ndarray, entries: Sequence[Mapping[str, Any]], where: str) -> None:
    if set(map(type, values)) - {int}:
        k = next(k for k, v in enumerate(values) if type(v) is not int)
        raise BadEntry(_named(where, index, k, entries, f"size must be an integer, got {values[k]!r}"))


def _named(where: str, index: np.ndarray, k: int, entries: Sequence[Mapping[str, Any]], what: str) -> str:
    i = int(index[k])
    return f"{where}[{i}] ({entries[i]['action']}): {what}"[:200]
