"""Our rows added to a profiler's Chrome trace as text: Kineto's events stay the bytes it wrote.

A trace cycle once parsed Kineto's whole trace into dicts, extended ``traceEvents`` with our
rows (themselves parsed back from the text they are built as) and wrote the tree out again:
``json.loads`` and ``json.dumps`` of every Kineto event, each cycle. Here msgspec locates the
trace's top-level values as raw text (``msgspec.Raw``: checked as JSON, not built), reads
Kineto's events through a struct of the three fields the time span needs, and our rows' text
(:meth:`~memprofiler.output.timeline.TraceRows.events_json`) goes in before ``traceEvents``'
closing bracket. The result holds the events :func:`~memprofiler.output.timeline.merge_into_trace`
adds, in the same order, and the same top-level keys, the given ones first.

A trace msgspec does not take that way (text that is not UTF-8, ``NaN``, an entry of
``traceEvents`` that is not an object, a lone surrogate escape...) is read as dicts by the
standard library and merged as before, so every input reads as it did.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from memprofiler.output.timeline import TraceRows, span_of_durations, trace_span_ns


class _Timed(msgspec.Struct, gc=False):
    """The fields of a ``traceEvents`` entry the time span reads (the others are skipped)."""

    ph: Any = None
    ts: Any = msgspec.UNSET
    dur: Any = None


_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_TIMED = msgspec.json.Decoder(list[_Timed])
_EVENTS = "traceEvents"
_BASE = "baseTimeNanoseconds"


class ChromeTrace:
    """A Chrome trace read for a merge (:meth:`read`): its top-level values as text, or (the
    fallback) as dicts."""

    def __init__(
        self,
        raw: dict[str, msgspec.Raw] | None,
        timed: list[_Timed] | None,
        tree: Any = None,
    ) -> None:
        self._raw = raw
        self._timed = timed
        self._tree = tree

    @classmethod
    def read(cls, data: bytes) -> ChromeTrace:
        """``data`` located as text; as dicts where msgspec refuses it but ``json.loads`` does not.

        Raises:
            ValueError: ``data`` is no JSON.
        """
        try:
            if not data.isascii():
                data.decode("utf-8")  # msgspec leaves a Raw value's bytes unchecked
            raw = _TOP.decode(data)
            events = raw.get(_EVENTS)
            timed = _TIMED.decode(events) if events is not None else []
        except (msgspec.MsgspecError, UnicodeDecodeError):
            return cls(None, None, json.loads(data))
        return cls(raw, timed)

    @property
    def is_object(self) -> bool:
        """Whether the trace is a JSON object (Kineto's always is; a cut file may not be)."""
        return self._raw is not None or isinstance(self._tree, dict)

    @property
    def as_text(self) -> bool:
        """Whether the trace was located as text (not the dict fallback)."""
        return self._raw is not None

    def base_ns(self) -> int:
        """``baseTimeNanoseconds`` (``0`` without one)."""
        if self._raw is None:
            return int(self._tree.get(_BASE, 0) or 0)
        value = self._raw.get(_BASE)
        return int((json.loads(bytes(value)) if value is not None else 0) or 0)

    def span_ns(self) -> tuple[int, int] | None:
        """First ``X`` event's start to last one's end on the epoch clock, or ``None``."""
        if self._raw is None:
            return trace_span_ns(self._tree)
        assert self._timed is not None
        return span_of_durations(
            self.base_ns(),
            ((e.ts, e.dur) for e in self._timed if e.ph == "X" and e.ts is not msgspec.UNSET),
        )

    def with_rows(self, rows: Sequence[TraceRows], pid: int | str, first: Mapping[str, Any]) -> bytes:
        """The trace with ``rows``' events inside its span (each timeline's metadata before its
        events, none for a timeline without events) at the end of ``traceEvents``, and the
        ``first`` keys before its own (replacing any of the same name), as UTF-8 JSON.

        Raises:
            ValueError, TypeError, KeyError: a malformed span, base or ``traceEvents`` (for
                the caller to keep the trace as it was).
        """
        span = self.span_ns()
        texts: list[str] = []
        if span is not None:
            base = self.base_ns()
            for timeline in rows:
                if text := rows_json(timeline, pid, base, span):
                    texts.append(text)
        if self._raw is None:  # the dict fallback: the merge as it always was
            tree = self._tree
            if texts:
                tree[_EVENTS].extend(json.loads(f"[{', '.join(texts)}]"))
            return json.dumps({**first, **{k: v for k, v in tree.items() if k not in first}}).encode()
        out: list[bytes | memoryview] = []
        for key, value in first.items():
            out += [b", ", f"{json.dumps(key)}: {json.dumps(value)}".encode()]
        for key, raw in self._raw.items():
            if key in first:
                continue
            out += [b", ", f"{json.dumps(key)}: ".encode()]
            if key == _EVENTS and texts:
                # "[ ... ]", a list of objects (read() made sure) with an X event at least (a span)
                out += [memoryview(raw)[:-1], f", {', '.join(texts)}]".encode()]
            else:
                out.append(memoryview(raw))
        if not out:
            return b"{}"
        out[0] = b"{"  # in place of the first member's separator
        out.append(b"}")
        return b"".join(out)


def rows_json(timeline: TraceRows, pid: int | str, base_ns: int, span: tuple[int, int]) -> str:
    """``timeline``'s metadata and events inside ``span`` as list items (``""`` for no events)."""
    events = timeline.events_json(pid, base_ns, span[0], span[1])
    if not events:
        return ""
    return ", ".join([*(json.dumps(e) for e in timeline.metadata(pid)), events])
