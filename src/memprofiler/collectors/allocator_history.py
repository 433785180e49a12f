"""CUDA allocator history for memory_viz: one recording per collected window, calls marked in it.

Recording starts on the first warmup call of a collected function (or at the start of its
first collected call when the schedule has no warmup), so the first collected call is
covered in full. It stops when no collected window of any function remains open; it never
runs for the whole training run.

Each collected call is *marked* inside the recording, not copied out of it: its start and end
are the ``START``/``END`` annotations of a user-scope ``record_function`` named
``memprofiler:{fn}:{call}``, which the allocator keeps in the snapshot's
``external_annotations`` on the clock of its own trace (:meth:`CudaBackend.mark_start`). When
the last open window closes, the recording is written once, to
``cuda_alloc_rank_{rank}.window_{n}.pickle`` (pickle protocol 4, which memory_viz needs,
atomically), with ``cuda_alloc_rank_{rank}.window_{n}.json`` beside it: the calls it holds
(with their boundaries on memprofiler's own clock too, for a torch that keeps no annotations)
and the role map of the blocks alive when the window began (:mod:`block_roles`). A call's view
(:mod:`memprofiler.analysis.snapshot.calls`) is cut from that file.

Nothing is lost: the recording is also written when a collected call raises, at teardown
with a window still open (training ended inside it), when training ends in an exception (the OOM recorder writes its own pickle at the OOM itself), and at the
profiler's flushes once ``flush_interval_s`` has passed since the last write, so a process
killed later keeps the history up to then. Before the ring can wrap past a part's first call,
the part is written and the next calls go to part ``n + 1``: one call into a part the ring is
looked at (one snapshot) to learn the entries per call, and again before the part can fill
half of it at that rate; a look that finds it half full or more starts the next part. A call
that records more entries than half the ring may still lose its start to the next one, and
one larger than the ring always does: ``allocator_history.max_entries`` must hold it.

Cost per collected call: two annotations (about 25 us on CPU together), instead of a
snapshot copy and pickle of the whole ring at its start and end.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memprofiler import layout
from memprofiler.collectors.base import BaseCollector, CallContext, CallId, ProfilerView
from memprofiler.collectors.block_roles import role_map
from memprofiler.collectors.cuda_backend import CudaBackend
from memprofiler.collectors.history_recording import HistoryOptions, HistoryRecording
from memprofiler.output.writers import write_json, write_pickle

#: Prefix of this collector's holders in :class:`HistoryRecording`, one per open window.
WINDOW_HOLDER = "window:"
#: Format version of the window index file (2: ``run_id`` and ``digest`` tie it to its recording).
INDEX_VERSION = 2
#: The first look at the ring in a part, after this many calls: it measures entries per call
#: (after the first, so that a call filling half the ring is a part of its own before the
#: second can wrap the ring past it).
FIRST_PROBE = 1
#: Fraction of the ring a part may fill before the next part starts: at half, any call no
#: larger than half the ring that follows a look at the ring below it stays whole.
ROLL_AT = 0.5


def trace_entries(snapshot: Mapping[str, Any]) -> int:
    """Number of recorded alloc/free events over all devices of a snapshot."""
    return sum(len(trace) for trace in snapshot.get("device_traces", ()))


def _now_us() -> int:
    return time.time_ns() // 1000


class AllocatorHistoryCollector(BaseCollector):
    """Marks collected calls in one allocator recording per window and writes it once.

    Args:
        backend: the CUDA seam.
        recording: the shared recording owner (also used by the OOM recorder).
        options: ``max_entries``, ``stacks`` and ``context`` for the recording.
    """

    name = "cuda_allocator_history"

    def __init__(
        self,
        backend: CudaBackend,
        recording: HistoryRecording,
        options: HistoryOptions,
        flush_interval_s: float = 60.0,
    ) -> None:
        self._backend = backend
        self._recording = recording
        self._options = options
        self._save_dir: Path | None = None
        self._rank = 0
        self._view: ProfilerView | None = None
        self._module: nn.Module | None = None
        self._ctx_module: nn.Module | None = None
        self._optimizers: Sequence[torch.optim.Optimizer] = ()
        self._part = -1
        self._parts_written = 0
        self._calls: list[dict[str, Any]] = []
        self._roles: list[dict[str, Any]] = []
        self._open: dict[CallId, tuple[Any, dict[str, Any]]] = {}
        self._dirty = False
        self._flush_interval_s = flush_interval_s
        self._last_write = time.monotonic()
        #: Calls in the part after which the ring is looked at again (see _plan_probe).
        self._probe_at: int | None = FIRST_PROBE
        recording.plan(options)

    def bind(self, view: ProfilerView) -> None:
        """Learn where to write; called once by the profiler at set-up."""
        self._save_dir = view.save_dir
        self._rank = view.rank
        self._view = view

    def bind_model(self, module: nn.Module | None, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """The model and optimizers whose blocks are named at each window's start."""
        self._module = module
        self._optimizers = list(optimizers)

    @property
    def part(self) -> int:
        """Number of the recording file the current window writes (``-1`` before the first)."""
        return self._part

    def warmup(self, ctx: CallContext) -> None:
        self._hold(ctx)

    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        self._hold(ctx)
        call = {"fn": ctx.fn_name, "call": ctx.call, "start_us": _now_us(), "end_us": None, "ok": None}
        handle = self._backend.mark_start(layout.call_mark(ctx.fn_name, ctx.call))
        self._open[ctx.call_id] = (handle, call)
        self._calls.append(call)
        self._dirty = True
        return {}

    def end(self, ctx: CallContext, ok: bool) -> Mapping[str, Any]:
        handle, call = self._open.pop(ctx.call_id, (None, None))
        if call is not None:
            self._backend.mark_end(handle)
            call["end_us"], call["ok"] = _now_us(), ok
        metrics = {"allocator_history.window": self._part}
        if ctx.closes_window:
            holder = WINDOW_HOLDER + ctx.fn_name
            try:
                if self.open_windows() == {ctx.fn_name}:
                    self._write(closing=True)  # the last open window closes: the recording, once
            finally:
                self._recording.release(holder)
        elif not ok:
            self._write()  # the call raised: keep the history up to the failure now
        elif self._probe_at is not None and len(self._calls) >= self._probe_at:
            self._write()  # the ring may soon wrap past this part's first call
        return metrics

    def dump(self) -> list[Path]:
        """The profiler flushes its files: write the recording if a call was marked since the
        last write and ``flush_interval_s`` has passed (a snapshot copies the whole ring)."""
        if self._dirty and time.monotonic() - self._last_write >= self._flush_interval_s:
            return self._write()
        return []

    def crash(self, exc: BaseException) -> list[Path]:
        """Training is over: write the open window's recording, then stop recording."""
        try:
            return self._write() if self.open_windows() or self._dirty else []
        finally:
            self._release_windows()

    def close(self) -> None:
        """The profiler tears down: a window still open (training ended inside it, as at
        ``max_steps``) or calls marked since the last write are written before recording stops."""
        try:
            if self._dirty and self._save_dir is not None:
                self._write(closing=True)
        finally:
            self._release_windows()

    def open_windows(self) -> frozenset[str]:
        """Functions whose collected window currently holds the recording."""
        n = len(WINDOW_HOLDER)
        return frozenset(h[n:] for h in self._recording.holders() if h.startswith(WINDOW_HOLDER))

    # ------------------------------------------------------------------ internals
    def _hold(self, ctx: CallContext) -> None:
        """Make sure the recording runs for ``ctx``'s window; the first window opens a part."""
        if not self.open_windows():
            self._new_part(ctx.module)
        self._recording.acquire(WINDOW_HOLDER + ctx.fn_name, self._options)

    def _new_part(self, module: nn.Module | None = None) -> None:
        self._part = self._parts_written
        self._parts_written += 1
        self._calls = [c for _, c in self._open.values()]
        self._dirty = bool(self._calls)
        self._probe_at = FIRST_PROBE
        if module is not None:
            self._ctx_module = module
        # The blocks alive now are the ones the recording will show without a stack.
        self._roles = role_map(
            self._module if self._module is not None else self._ctx_module, self._optimizers
        )

    def _release_windows(self) -> None:
        for fn in self.open_windows():
            self._recording.release(WINDOW_HOLDER + fn)

    def _write(self, closing: bool = False) -> list[Path]:
        if self._save_dir is None:
            raise RuntimeError("allocator-history collector used before the profiler bound it")
        if self._part < 0:
            return []
        snap = self._backend.snapshot()
        pickle_name = layout.CUDA_ALLOC_WINDOW_PICKLE.format(rank=self._rank, n=self._part)
        index_name = layout.CUDA_ALLOC_WINDOW_INDEX.format(rank=self._rank, n=self._part)
        entries = trace_entries(snap)
        # plain=False: the snapshot is already plain data, and memory_viz needs it verbatim.
        written = [write_pickle(self._save_dir / pickle_name, snap, plain=False)]
        index = {
            "format": layout.CUDA_ALLOC_WINDOW_FORMAT,
            "version": INDEX_VERSION,
            "rank": self._rank,
            "window": self._part,
            "pickle": pickle_name,
            "run_id": getattr(self._view, "run_id", None),
            "ring_entries": self._recording.ring_entries,
            "trace_entries": entries,
            "digest": layout.recording_digest(snap),
            "calls": [dict(c) for c in self._calls],
            "roles": self._roles,
        }
        written.append(write_json(self._save_dir / index_name, index))
        self._dirty = False
        self._last_write = time.monotonic()
        if not closing and self.open_windows():
            self._plan_probe(snap)
        return written

    def _plan_probe(self, snap: Mapping[str, Any]) -> None:
        """Start the next part now, or plan when to look at the ring again.

        A part's file holds all of its calls while the entries recorded since its first call
        fit the ring. At this write there are ``e`` of them over ``k`` calls: at 80% of the
        ring a new part starts (the next call is its first); below, the ring is looked at
        again after nine tenths of the calls that would take ``e`` there at this rate.
        """
        ring = self._recording.ring_entries
        if not ring:
            self._probe_at = None  # the user's ring: its size is unknown
            return
        first = next((c["start_us"] for c in self._calls), None)
        marks = {layout.call_mark(c["fn"], c["call"]) for c in self._calls[:1]}
        for a in snap.get("external_annotations") or ():
            if isinstance(a, Mapping) and a.get("name") in marks and a.get("stage") == "START":
                first = a.get("time_us") if type(a.get("time_us")) is int else first
                break
        e = max((_entries_since(t, first) for t in snap.get("device_traces", ())), default=0)
        k = max(1, len(self._calls))
        if e >= ROLL_AT * ring:
            self._new_part()
            return
        per_call = max(1.0, e / k)
        self._probe_at = k + max(1, int((ROLL_AT * ring - e) / per_call * 0.9))


def _entries_since(trace: Sequence[Mapping[str, Any]], t_us: int | None) -> int:
    """Entries of ``trace`` at or after ``t_us`` (all when unknown or the times are not ours)."""
    if t_us is None or not trace:
        return len(trace)
    n = 0
    for entry in reversed(trace):
        t = entry.get("time_us")
        if type(t) is int and t < t_us:
            break
        n += 1
    return n
