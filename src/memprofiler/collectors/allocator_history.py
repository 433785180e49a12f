"""CUDA allocator history for pytorch.org/memory_viz, recorded only on the schedule's window.

Recording starts on the first warmup call of a collected function (or at the start of its
first collected call when the schedule has no warmup), so the first collected call is
covered in full. It stops when no collected window of any function remains open; it never
runs for the whole training run. At the start and at the end of every collected call the
allocator snapshot is written to ``cuda_alloc_rank_{rank}.{fn}.{call}.{start|end}.pickle``
with pickle protocol 4 (memory_viz rejects 5), atomically. The ``end`` pickle is written
also when the call raised: it then holds the history up to the failure.

Cost: recording adds about 2 us per allocation with ``stacks="python"``; each dump copies
the ring (``max_entries``) from the allocator and pickles it, so it is paid twice per
collected call and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memprofiler import layout
from memprofiler.collectors.base import BaseCollector, CallContext, ProfilerView
from memprofiler.collectors.cuda_backend import CudaBackend
from memprofiler.collectors.history_recording import HistoryOptions, HistoryRecording
from memprofiler.output.writers import write_pickle

#: Prefix of this collector's holders in :class:`HistoryRecording`, one per open window.
WINDOW_HOLDER = "window:"


def trace_entries(snapshot: Mapping[str, Any]) -> int:
    """Number of recorded alloc/free events over all devices of a snapshot."""
    return sum(len(trace) for trace in snapshot.get("device_traces", ()))


class AllocatorHistoryCollector(BaseCollector):
    """Writes memory_viz pickles at the start and end of collected calls.

    Args:
        backend: the CUDA seam.
        recording: the shared recording owner (also used by the OOM recorder).
        options: ``max_entries``, ``stacks`` and ``context`` for the recording.
    """

    name = "cuda_allocator_history"

    def __init__(self, backend: CudaBackend, recording: HistoryRecording, options: HistoryOptions) -> None:
        self._backend = backend
        self._recording = recording
        self._options = options
        self._save_dir: Path | None = None
        recording.plan(options)

    def bind(self, view: ProfilerView) -> None:
        """Learn where to write; called once by the profiler at set-up."""
        self._save_dir = view.save_dir

    def warmup(self, ctx: CallContext) -> None:
        self._recording.acquire(WINDOW_HOLDER + ctx.fn_name, self._options)

    def start(self, ctx: CallContext) -> Mapping[str, Any]:
        self._recording.acquire(WINDOW_HOLDER + ctx.fn_name, self._options)
        return self._write(ctx, "start")

    def end(self, ctx: CallContext, ok: bool) -> Mapping[str, Any]:
        try:
            return self._write(ctx, "end")
        finally:
            if ctx.closes_window:
                self._recording.release(WINDOW_HOLDER + ctx.fn_name)

    def crash(self, exc: BaseException) -> list[Path]:
        """Training is over: stop recording for every open window."""
        self._release_windows()
        return []

    def close(self) -> None:
        self._release_windows()

    def open_windows(self) -> frozenset[str]:
        """Functions whose collected window currently holds the recording."""
        n = len(WINDOW_HOLDER)
        return frozenset(h[n:] for h in self._recording.holders() if h.startswith(WINDOW_HOLDER))

    def _release_windows(self) -> None:
        for fn in self.open_windows():
            self._recording.release(WINDOW_HOLDER + fn)

    def _write(self, ctx: CallContext, phase: str) -> dict[str, Any]:
        if self._save_dir is None:
            raise RuntimeError("allocator-history collector used before the profiler bound it")
        snap = self._backend.snapshot()
        name = layout.cuda_alloc_pickle(ctx.rank, ctx.fn_name, ctx.call, phase)
        # plain=False: the snapshot is already plain data, and memory_viz needs it verbatim.
        write_pickle(self._save_dir / name, snap, plain=False)
        # Numbers only in the snapshot; the pickle's name follows from the snapshot key.
        return {"allocator_history.entries": trace_entries(snap)}
