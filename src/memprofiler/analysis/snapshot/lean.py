"""Load a large allocator snapshot with one frame list per distinct stack, not one per entry.

torch writes every traceback's frames as a fresh list (one per allocation, one per free),
each a pointer to the shared frame dicts: with deep stacks those lists are about half of a
loaded trace's memory. :class:`FrameSharer` sits between the file and the unpickler; every
few megabytes it walks the trace entries loaded since its last visit, points each entry's
``frames`` at the first list seen with the same frames, and shrinks the entry's own list to
a one-element marker naming that list, so a later entry that shares it (a free's two
entries do) finds the shared list too, as do the end-state segments and blocks that share
their allocation's list (mended when the load ends). The trace list is found early, in the
unpickler's memo. The loaded data equals a plain load's, entry for entry.
"""

from __future__ import annotations

from typing import IO, Any

from memprofiler.analysis.snapshot.replay import StackTable

#: Files at least this large load through :class:`FrameSharer` (a plain load is faster).
LEAN_BYTES = 256 << 20

_EVERY = 64
"""Reads (about 64 KB each in a protocol 4-5 pickle) between two visits."""


class _Marker:
    __slots__ = ("sid",)

    def __init__(self, sid: int) -> None:
        self.sid = sid


class FrameSharer:
    """The reader for :func:`memprofiler.analysis.files.safe_pickle.load` (see the module)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.unpickler: Any = None
        self.traces: list[list[Any]] = []
        self.done: list[int] = []
        self.visits = 0
        self.reads = 0
        self.table = StackTable()
        self.shared: dict[int, list[Any]] = {}
        self.markers: dict[int, tuple[_Marker]] = {}

    def read(self, n: int = -1) -> bytes:
        self.reads += 1
        if self.reads % _EVERY == 0:
            self._visit()
        return self.stream.read(n)

    def readline(self) -> bytes:
        return self.stream.readline()

    def finish(self, obj: Any) -> Any:
        if not self.traces:
            self._find()
        self._visit()
        # A segment and its blocks share their allocation's list, which may be a marker now.
        if self.markers and isinstance(obj, dict) and isinstance(obj.get("segments"), list):
            for seg in obj["segments"]:
                if isinstance(seg, dict):
                    self._mend(seg)
                    for block in seg.get("blocks", ()) if isinstance(seg.get("blocks"), list) else ():
                        self._mend(block)
        return obj

    def _mend(self, owner: Any) -> None:
        frames = owner.get("frames") if isinstance(owner, dict) else None
        if type(frames) is list and len(frames) == 1 and type(frames[0]) is _Marker:
            owner["frames"] = self.shared[frames[0].sid]

    def _find(self) -> None:
        # The memo holds every list built so far; the trace is the one of dicts with an action.
        for obj in self.unpickler.memo.copy().values():
            if type(obj) is list and obj and type(obj[0]) is dict and "action" in obj[0]:
                self.traces.append(obj)
                self.done.append(0)

    def _visit(self) -> None:
        if not self.traces:
            # Looked for at visits 1, 2, 4, 8...: copying the memo costs its size, so all the
            # looks together cost about twice the last one (segments come before the trace).
            self.visits += 1
            if self.visits & (self.visits - 1) == 0 and self.unpickler is not None:
                self._find()
            if not self.traces:
                return
        for k, trace in enumerate(self.traces):
            start = self.done[k]
            for e in trace[start:] if start else trace:
                if type(e) is dict:
                    self._share(e)
            self.done[k] = len(trace)

    def _share(self, entry: dict[str, Any]) -> None:
        frames = entry.get("frames")
        if type(frames) is not list or not frames:
            return
        if len(frames) == 1 and type(frames[0]) is _Marker:
            entry["frames"] = self.shared[frames[0].sid]
            return
        try:
            sid = self.table.intern(frames)
        except Exception:  # a malformed frame: left as it is, for the analysis to report
            return
        first = self.shared.setdefault(sid, frames)
        if first is not frames:
            entry["frames"] = first
            marker = self.markers.get(sid)
            if marker is None:
                marker = self.markers[sid] = (_Marker(sid),)
            frames[:] = marker
