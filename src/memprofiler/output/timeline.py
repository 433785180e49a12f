"""Memory snapshots as Chrome-trace events, on the PyTorch profiler's clock.

A :class:`MemoryTimeline` listens to a :class:`~memprofiler.MemProfiler` and turns every
snapshot into counter events (``"ph": "C"``: one track per figure) and every collected call
into a duration event (``"ph": "X"``) named ``{fn}.{call}``. The events go to
``memory_trace_rank_{rank}.json`` and, when the extended PyTorch profiler runs, into its trace
too, so memory sits above the operator and kernel rows.

The clock: on CPU, Kineto stamps events with the Unix epoch clock (``time.time_ns()``) and
writes ``ts`` in microseconds relative to the trace's ``baseTimeNanoseconds`` (older
versions wrote absolute epoch microseconds and no base). Snapshots are stamped with
``time.time_ns()`` too, so converting is ``(t_ns - base_ns) / 1000``: no calibration, no
drift. ``tests/test_timeline.py`` checks this against ``record_function`` markers.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from memprofiler import layout
from memprofiler import metrics as vocab
from memprofiler.output.events import SnapshotEvent
from memprofiler.output.writers import rewrite_tail, write_text

#: Counter track -> snapshot metric it draws. A track appears only where its metric exists
#: (``rss_peak`` and saved-tensor bytes exist at ``end`` only, CUDA tracks only with CUDA).
COUNTER_TRACKS: dict[str, str] = {
    vocab.RSS: vocab.RSS,
    vocab.RSS_PEAK: vocab.RSS_PEAK,
    "cuda.allocated": vocab.CUDA_ALLOCATED,
    "cuda.reserved": vocab.CUDA_RESERVED,
    "cuda.allocated_peak": vocab.CUDA_ALLOCATED_PEAK,
    "cuda.reserved_peak": vocab.CUDA_RESERVED_PEAK,
    vocab.SAVED_UNIQUE: vocab.SAVED_UNIQUE,
}
#: Category of every event memprofiler adds, so viewers can filter them.
CATEGORY = "memprofiler"
#: Row of the ``{fn}.{call}`` spans inside a process; kept apart from real thread ids so the
#: spans never have to nest with the operator slices of the main thread.
SPAN_TID = 0


@dataclass(frozen=True)
class _Mark:
    fn: str
    call: int
    phase: str
    t_ns: int
    values: dict[str, int | float]


def _counter_values(metrics: Mapping[str, Any]) -> dict[str, int | float]:
    out: dict[str, int | float] = {}
    for track, metric in COUNTER_TRACKS.items():
        value = metrics.get(metric)
        if value is None:
            continue
        # A plain int first (the common case); NaN/inf would make the file no JSON (json.dumps
        # writes bare NaN): never written.
        if type(value) is int or (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ):
            out[track] = value
    return out


#: ``json.dumps`` of a string (track, function name), kept: the same few repeat every call.
json_str = functools.lru_cache(maxsize=4096)(json.dumps)


def json_num(value: Any) -> str:
    """A finite number as ``json.dumps`` writes it."""
    return int.__repr__(value) if isinstance(value, int) else float.__repr__(value)


class MemoryTimeline:
    """Collects snapshot times and headline values; renders them as Chrome-trace events.

    Args:
        rank: global rank; the ``pid`` of the events in the standalone per-rank file.

    Example:
        >>> timeline = MemoryTimeline(rank=0)  # doctest: +SKIP
        >>> prof.add_listener(timeline.on_snapshot)
        >>> ...  # train
        >>> timeline.dump(save_dir)  # memory_trace_rank_0.json
    """

    def __init__(self, rank: int = 0, run_id: str | None = None, world_size: int | None = None) -> None:
        self.rank = rank
        #: The run's id, kept in ``otherData`` so ``merge-traces`` can tell two runs apart.
        self.run_id = run_id
        #: The process group's size (``None`` without one), kept beside it: it still tells two
        #: runs apart when this rank never learned the id.
        self.world_size = world_size
        self._marks: list[_Mark] = []
        # to_json's cache: the events of the first _rendered_n marks at _rendered_base, as text
        # (a piece per rendering that added any).
        self._rendered: list[str] = []
        self._rendered_n = 0
        self._rendered_base: int | None = None
        self._render_starts: dict[tuple[str, int], _Mark] = {}
        # The file as last written: path, base, marks in it, byte offset of its closing part.
        self._file: tuple[Path, int] | None = None
        self._file_n = 0
        self._base: int | None = None
        self._file_tail_at = 0
        self._file_starts: dict[tuple[str, int], _Mark] = {}

    def __len__(self) -> int:
        return len(self._marks)

    def on_snapshot(self, event: SnapshotEvent) -> None:
        """The :meth:`MemProfiler.add_listener` callback."""
        if event.phase not in ("start", "end"):
            return  # late tracker peaks have no instant of their own on the timeline
        self._marks.append(
            _Mark(
                fn=event.fn_name,
                call=event.call,
                phase=event.phase,
                t_ns=event.t_ns,
                values=_counter_values(event.metrics),
            )
        )

    def span_ns(self) -> tuple[int, int] | None:
        """First and last snapshot time, or ``None`` before any snapshot."""
        if not self._marks:
            return None
        return self._marks[0].t_ns, self._marks[-1].t_ns

    def events(
        self,
        pid: int | str,
        base_ns: int = 0,
        start_ns: int | None = None,
        end_ns: int | None = None,
    ) -> list[dict[str, Any]]:
        """Counter and duration events, ``ts`` in microseconds after ``base_ns``.

        Args:
            pid: process id the events are drawn under (Kineto's pid when merging).
            base_ns: the trace's ``baseTimeNanoseconds`` (``0`` for absolute epoch time).
            start_ns: drop snapshots taken before this time (a trace cycle's start).
            end_ns: drop snapshots taken after this time.
        """
        # The text the files get, read back: the events are built in one place only.
        events: list[dict[str, Any]] = json.loads(f"[{self.events_json(pid, base_ns, start_ns, end_ns)}]")
        return events

    def events_json(
        self,
        pid: int | str,
        base_ns: int = 0,
        start_ns: int | None = None,
        end_ns: int | None = None,
    ) -> str:
        """:meth:`events` as the text ``json.dumps`` writes for their list, without its brackets
        (``""`` for none): what a profiler trace cycle splices in (:mod:`~memprofiler.output.trace_splice`)."""
        lo = start_ns if start_ns is not None else -1
        hi = end_ns if end_ns is not None else 1 << 62
        marks = [mark for mark in self._marks if lo <= mark.t_ns <= hi]
        return self._events_json(marks, pid, base_ns, {})

    def _events_json(
        self, marks: list[_Mark], pid: int | str, base_ns: int, starts: dict[tuple[str, int], _Mark]
    ) -> str:
        """The events of ``marks`` as ``json.dumps`` writes their list, without its brackets:
        each snapshot's counters, and its call's span when a mark ends a call started in
        ``starts`` (updated: a start waits there for its end, in this rendering or a later one).

        The one place the events are built; written straight from the marks, without an event
        dict and an encoder pass each (a trace flush's share of a collected call's fixed
        cost). ``tests/output/test_timeline.py`` checks the text against plain dicts.
        """
        pid_json = int.__repr__(pid) if type(pid) is int else json.dumps(pid)
        rank = self.rank
        rank_json = int.__repr__(rank) if type(rank) is int else json.dumps(rank)
        head = f'"cat": {json_str(CATEGORY)}, '
        tail = f'"pid": {pid_json}, "tid": {json_num(SPAN_TID)}, "ts": '
        parts: list[str] = []
        for mark in marks:
            ts = float.__repr__((mark.t_ns - base_ns) / 1000.0)
            values = [(json_str(track), json_num(value)) for track, value in mark.values.items()]
            for name, value in values:
                parts.append(f'{{"ph": "C", {head}"name": {name}, {tail}{ts}, "args": {{"bytes": {value}}}}}')
            key = (mark.fn, mark.call)
            if mark.phase == "start":
                starts[key] = mark
            elif mark.phase == "end" and key in starts:
                begin = starts.pop(key)
                fn = json_str(mark.fn)
                if type(mark.call) is int:  # digits need no escaping: the name's JSON is fn's, extended
                    call = int.__repr__(mark.call)
                    span = f'{fn[:-1]}.{call}"'
                else:
                    call, span = json.dumps(mark.call), json.dumps(f"{mark.fn}.{mark.call}")
                extra = "".join(f", {name}: {value}" for name, value in values)
                parts.append(
                    f'{{"ph": "X", {head}"name": {span}, {tail}'
                    f"{float.__repr__((begin.t_ns - base_ns) / 1000.0)}, "
                    f'"dur": {float.__repr__((mark.t_ns - begin.t_ns) / 1000.0)}, '
                    f'"args": {{"rank": {rank_json}, "fn": {fn}, "call": {call}{extra}}}}}'
                )
        return ", ".join(parts)

    def metadata(self, pid: int | str, process_name: str | None = None) -> list[dict[str, Any]]:
        """Name the span row (and optionally the process) for trace viewers."""
        out: list[dict[str, Any]] = [
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": SPAN_TID, "args": {"name": "memprofiler"}},
            {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": SPAN_TID, "args": {"sort_index": -1}},
        ]
        if process_name is not None:
            out.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": process_name}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
        return out

    def _base_ns(self) -> int:
        """The standalone trace's base: the first snapshot's whole second (kept once known)."""
        if self._base is None:
            span = self.span_ns()
            if span is None:
                return 0
            self._base = (span[0] // 1_000_000_000) * 1_000_000_000
        return self._base

    def to_trace(self) -> dict[str, Any]:
        """The standalone per-rank trace: ``pid`` = rank, base = first snapshot's whole second."""
        base = self._base_ns()
        events = self.metadata(self.rank, f"rank {self.rank}") + self.events(self.rank, base)
        return {
            "schemaVersion": 1,
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": base,
            "traceEvents": events,
            "otherData": self._other_data(),
        }

    def to_json(self) -> str:
        """``json.dumps(self.to_trace())``, rendering only the snapshots new since last time.

        The file is rewritten at every window close; re-rendering every event each time made
        that quadratic in the number of windows.
        """
        base = self._base_ns()
        # Render into locals and publish them at the end: a SIGTERM dump can re-enter mid-render.
        if self._rendered_base == base:
            rendered, starts, done = list(self._rendered), dict(self._render_starts), self._rendered_n
        else:
            rendered, starts, done = [], {}, 0
        marks = self._marks[done:]
        if text := self._events_json(marks, self.rank, base, starts):
            rendered.append(text)
        self._rendered, self._render_starts = rendered, starts
        self._rendered_n, self._rendered_base = done + len(marks), base
        meta = [json.dumps(e) for e in self.metadata(self.rank, f"rank {self.rank}")]
        return (
            f'{{"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": {base}, '
            f'"traceEvents": [{", ".join(meta + rendered)}{self._tail()}'
        )

    def dump(self, save_dir: str | os.PathLike[str]) -> Path:
        """Write ``save_dir/memory_trace_rank_{rank}.json``: whole the first time, then by
        rewriting only its closing part with the events new since (constant cost per dump).

        Each write leaves a complete JSON document: the new events and the closing part go
        out in one ``pwrite``.
        """
        path = Path(save_dir) / layout.MEMORY_TRACE_JSON.format(rank=self.rank)
        base = self._base_ns()
        marks = self._marks[self._file_n :]
        if self._file != (path, base) or not path.exists():
            text = self.to_json()
            try:
                write_text(path, text)
            except OSError:
                self._start_on_a_full_disk(path, base)
                raise
            self._file, self._file_n = (path, base), len(self._marks)
            self._file_starts = dict(self._render_starts)
            self._file_tail_at = len(text.encode()) - len(self._tail().encode())
            return path
        if marks:
            self._append(path, base, marks)
        return path

    def _append(self, path: Path, base: int, marks: list[Any]) -> None:
        starts = dict(self._file_starts)
        text = self._events_json(marks, self.rank, base, starts)
        added = (", " + text).encode() if text else b""
        rewrite_tail(path, self._file_tail_at, added + self._tail().encode())
        self._file_n += len(marks)
        self._file_starts = starts
        self._file_tail_at += len(added)

    def _start_on_a_full_disk(self, path: Path, base: int) -> None:
        """The whole first write did not fit: start the file with its metadata alone (a valid
        trace), then add the marks one by one while they fit; the rest wait for the next dump."""
        meta = ", ".join(json.dumps(e) for e in self.metadata(self.rank, f"rank {self.rank}"))
        head = f'{{"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": {base}, "traceEvents": [{meta}'
        try:
            write_text(path, head + self._tail())
        except OSError:
            return  # not even that: the file stays absent and the next dump starts it again
        self._file, self._file_n, self._file_starts = (path, base), 0, {}
        self._file_tail_at = len(head.encode())
        for mark in list(self._marks):
            try:
                self._append(path, base, [mark])
            except OSError:
                return

    def forget_written(self, keep: int) -> None:
        """Drop all but the newest ``keep`` marks that the file already holds (bounded memory)."""
        drop = min(self._file_n, max(0, len(self._marks) - keep))
        if drop <= 0:
            return
        del self._marks[:drop]
        self._file_n -= drop
        self._rendered, self._rendered_n, self._rendered_base = [], 0, None
        self._render_starts = {}

    def _other_data(self) -> dict[str, Any]:
        other: dict[str, Any] = {"memprofiler_rank": self.rank, "os_pid": os.getpid()}
        if self.run_id:
            other[layout.TRACE_RUN_ID_KEY] = self.run_id
        if self.world_size is not None:
            other[layout.TRACE_WORLD_SIZE_KEY] = self.world_size
        return other

    def _tail(self) -> str:
        return f'], "otherData": {json.dumps(self._other_data())}}}'


class TraceRows(Protocol):
    """Rows a trace cycle can take in: a :class:`MemoryTimeline` or a step timeline.

    ``events_json`` is the events' list as ``json.dumps`` writes it, without its brackets
    (``""`` for none): a trace cycle splices that text into Kineto's, unparsed.
    """

    def events_json(
        self, pid: int | str, base_ns: int = 0, start_ns: int | None = None, end_ns: int | None = None
    ) -> str: ...

    def metadata(self, pid: int | str) -> list[dict[str, Any]]: ...


def merge_into_trace(
    trace: dict[str, Any], timeline: TraceRows, pid: int | str, span: tuple[int, int] | None = None
) -> int:
    """Add ``timeline``'s events inside ``trace``'s time span to ``trace``; return how many.

    The span runs from the first event's start to the last event's end; snapshots outside it
    belong to other trace cycles and are left out. Pass ``span`` (:func:`trace_span_ns`) when
    merging several timelines into one trace: finding it reads every event of the trace.

    The trace as dicts, for callers that hold one; a profiler trace cycle splices the text
    instead (:meth:`~memprofiler.output.trace_splice.ChromeTrace.with_rows`), to the same events.
    """
    base = int(trace.get("baseTimeNanoseconds", 0) or 0)
    if span is None:
        span = trace_span_ns(trace)
    if span is None:
        return 0
    added: list[dict[str, Any]] = json.loads(f"[{timeline.events_json(pid, base, span[0], span[1])}]")
    if added:
        trace["traceEvents"].extend(timeline.metadata(pid) + added)
    return len(added)


def trace_span_ns(trace: dict[str, Any]) -> tuple[int, int] | None:
    """A Chrome trace's span on the epoch clock: first ``X`` event's start to last one's end."""
    base = int(trace.get("baseTimeNanoseconds", 0) or 0)
    return span_of_durations(
        base,
        (
            (e["ts"], e.get("dur", 0))
            for e in trace.get("traceEvents", [])
            if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e
        ),
    )


def span_of_durations(base: int, durations: Iterable[tuple[Any, Any]]) -> tuple[int, int] | None:
    """First start to last end on the epoch clock of the ``(ts, dur)`` of a trace's ``X``
    events (µs after ``base``; a missing or null ``dur`` is 0), or ``None`` for none."""
    lo, hi = math.inf, -math.inf
    for ts, dur in durations:
        start = float(ts)
        end = start + float(dur or 0)
        if start < lo:
            lo = start
        if end > hi:
            hi = end
    if lo == math.inf:
        return None
    return base + int(lo * 1000), base + int(hi * 1000)
