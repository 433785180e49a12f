"""The step timeline: framework hook spans, data-loader waits and host samples as Chrome-trace rows.

A :class:`StepTimeline` is fed ``begin(name)`` / ``end(name)`` by whatever times the
framework's hooks (the Lightning profiler does, for every hook of every step) and reads host
samples from a :class:`~memprofiler.core.host_sampler.HostSampler`. It renders them on the
epoch clock Kineto uses, into a trace cycle's Chrome trace (:meth:`StepTimeline.merge_into`)
and into a per-rank file for the whole run, ``step_timeline_rank_{rank}.json``, which
``memprofiler merge-traces`` folds into the cross-rank trace.

Rows (``tid``) are fixed numbers far above real thread ids, named by metadata events:
``lightning hooks``, ``data loader``; host metrics are counter tracks of the process.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from memprofiler import layout
from memprofiler.output.timeline import json_num, json_str, merge_into_trace
from memprofiler.output.writers import write_text

#: Categories of the events this module adds, so viewers and the merge can tell them apart.
HOOK_CATEGORY = "memprofiler.hooks"
DATA_CATEGORY = "memprofiler.dataloader"
HOST_CATEGORY = "memprofiler.host"
CATEGORIES = (HOOK_CATEGORY, DATA_CATEGORY, HOST_CATEGORY)
#: Rows of the spans; far above Linux thread ids (at most 2**22) so they never share a row.
HOOK_TID = 0x7FFF0001
DATA_TID = 0x7FFF0002
#: Track kinds a span can go to.
HOOKS, DATA = "hooks", "data"
_ROWS = {HOOKS: (HOOK_TID, HOOK_CATEGORY, "lightning hooks"), DATA: (DATA_TID, DATA_CATEGORY, "data loader")}


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _name_json(name: object) -> str:
    """``json.dumps(name)``; cached for strings (the same hook and metric names repeat)."""
    return json_str(name) if type(name) is str else json.dumps(name)


class SampleSource(Protocol):
    """What the timeline reads host samples from (a ``HostSampler``)."""

    def between(self, lo_ns: int, hi_ns: int) -> list[tuple[int, dict[str, float]]]: ...


class StepTimeline:
    """Hook spans and host samples of one rank, rendered as Chrome-trace events.

    Args:
        rank: global rank (the ``pid`` of the standalone per-rank file).
        max_spans: spans kept in memory; the oldest go first.
        host: where host samples come from, or ``None``.

    Example:
        >>> timeline = StepTimeline(rank=0)
        >>> timeline.begin("[LightningModule]M.training_step")
        >>> timeline.end("[LightningModule]M.training_step")
        >>> [s[1] for s in timeline.spans]
        ['[LightningModule]M.training_step']
    """

    def __init__(self, rank: int = 0, max_spans: int = 250_000, host: SampleSource | None = None) -> None:
        self.rank = rank
        self.host = host
        #: ``(track, name, start_ns, end_ns)`` of every finished span, oldest first.
        self.spans: deque[tuple[str, str, int, int]] = deque(maxlen=max_spans)
        self._open: dict[str, list[tuple[str, int]]] = {}

    # ------------------------------------------------------------------ recording
    def begin(self, name: str, track: str = HOOKS) -> None:
        """``name`` starts now (two dict operations and a clock read: safe in every hook)."""
        self._open.setdefault(name, []).append((track, time.time_ns()))

    def end(self, name: str) -> None:
        """The innermost open ``name`` ends now; an ``end`` without ``begin`` is ignored."""
        t_ns = time.time_ns()
        stack = self._open.get(name)
        if stack:
            track, t0 = stack.pop()
            self.spans.append((track, name, t0, t_ns))

    def span(self, name: str, start_ns: int, end_ns: int, track: str = HOOKS) -> None:
        """Add a finished span measured elsewhere."""
        self.spans.append((track, name, start_ns, end_ns))

    # ------------------------------------------------------------------ rendering
    def events(
        self, pid: int | str, base_ns: int = 0, start_ns: int | None = None, end_ns: int | None = None
    ) -> list[dict[str, Any]]:
        """Spans overlapping ``[start_ns, end_ns]`` and samples inside it; ``ts`` in µs after ``base_ns``."""
        # The text a trace gets, read back: the events are built in one place only.
        events: list[dict[str, Any]] = json.loads(f"[{self.events_json(pid, base_ns, start_ns, end_ns)}]")
        return events

    def events_json(
        self, pid: int | str, base_ns: int = 0, start_ns: int | None = None, end_ns: int | None = None
    ) -> str:
        """:meth:`events` as the text ``json.dumps`` writes for their list, without its brackets
        (``""`` for none), written straight from the spans and samples (no dict per event)."""
        lo = start_ns if start_ns is not None else 0
        hi = end_ns if end_ns is not None else 1 << 62
        pid_json = json.dumps(pid)
        rows = {
            track: f'{{"ph": "X", "cat": {json_str(cat)}, "name": ' for track, (_, cat, _) in _ROWS.items()
        }
        ends = {
            track: f', "pid": {pid_json}, "tid": {json_num(tid)}, "ts": '
            for track, (tid, _, _) in _ROWS.items()
        }
        parts: list[str] = []
        for track, name, t0, t1 in list(self.spans):
            if t1 >= lo and t0 <= hi:  # overlapping the window: a step's outer spans too
                parts.append(
                    f"{rows[track]}{_name_json(name)}{ends[track]}{float.__repr__((t0 - base_ns) / 1000.0)}, "
                    f'"dur": {float.__repr__((t1 - t0) / 1000.0)}}}'
                )
        if self.host is not None:
            head = f'{{"ph": "C", "cat": {json_str(HOST_CATEGORY)}, "name": '
            for t_ns, values in self.host.between(lo, hi):
                ts = float.__repr__((t_ns - base_ns) / 1000.0)
                for track_name, value in values.items():
                    if not _finite(value):  # a sample source other than HostSampler may hand NaN
                        continue
                    parts.append(
                        f'{head}{_name_json(track_name)}, "pid": {pid_json}, "ts": {ts}, '
                        f'"args": {{"value": {json_num(value)}}}}}'
                    )
        return ", ".join(parts)

    def metadata(self, pid: int | str) -> list[dict[str, Any]]:
        """Name the span rows and put them above the operator rows."""
        out: list[dict[str, Any]] = []
        for i, (tid, _, label) in enumerate(_ROWS.values()):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}})
            out.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": -3 + i},
                }
            )
        return out

    def merge_into(self, trace: dict[str, Any], pid: int | str, span: tuple[int, int] | None = None) -> int:
        """Add the events inside ``trace``'s span to ``trace``; return how many (``span``: see
        :func:`~memprofiler.output.timeline.merge_into_trace`)."""
        return merge_into_trace(trace, self, pid, span)

    def to_trace(self) -> dict[str, Any]:
        """The whole run of this rank as a standalone trace: ``pid`` = rank."""
        trace: dict[str, Any] = json.loads(self.to_json())
        return trace

    def to_json(self) -> str:
        """``json.dumps`` of :meth:`to_trace`, written from the events' text."""
        starts = [s[2] for s in self.spans]
        if self.host is not None:
            starts += [t for t, _ in self.host.between(0, 1 << 62)[:1]]
        base = (min(starts) // 1_000_000_000) * 1_000_000_000 if starts else 0
        meta = [
            {"ph": "M", "name": "process_name", "pid": self.rank, "args": {"name": f"rank {self.rank}"}},
            *self.metadata(self.rank),
        ]
        events = [json.dumps(e) for e in meta]
        if text := self.events_json(self.rank, base):
            events.append(text)
        other = json.dumps({"memprofiler_rank": self.rank, "os_pid": os.getpid()})
        return (
            f'{{"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": {json_num(base)}, '
            f'"traceEvents": [{", ".join(events)}], "otherData": {other}}}'
        )

    def dump(self, save_dir: str | os.PathLike[str]) -> Path:
        """Write ``save_dir/step_timeline_rank_{rank}.json`` (whole, atomically)."""
        path = Path(save_dir) / layout.STEP_TIMELINE_JSON.format(rank=self.rank)
        return write_text(path, self.to_json())
