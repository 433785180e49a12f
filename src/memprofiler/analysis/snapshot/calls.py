"""Per-call views of one allocator recording: the calls marked in it, and the snapshot at a mark.

memprofiler records a collected window once and marks each call's start and end inside it
(the ``START``/``END`` annotations of ``memprofiler:{fn}:{call}`` in ``external_annotations``,
on the clock of the trace itself; see :mod:`memprofiler.collectors.allocator_history`). The
view of a call at a mark is what a snapshot taken at that instant would have held:

* ``device_traces``: the entries recorded before the mark (at its start: strictly before its
  time; at its end: up to and including it; an entry in the same microsecond as a mark counts
  as inside the call);
* ``segments``: the end state rewound to the mark, undoing every later entry: a later
  ``alloc`` was not live yet, a later ``free_completed`` still was (with the stack of its
  allocation when the trace holds it, else none, as for any block older than the trace), a later
  ``free_requested`` was not
  requested yet, later segment allocations and releases are undone. Segments that none of
  this touches keep their blocks as recorded; a touched segment gets its live blocks and the
  free gaps between them. Blocks brought back are sized by the allocator's smallest rounding
  (512 bytes), so a segment's ``allocated`` bytes and largest free block are close, and its
  requested bytes, like every trace figure, exact;
* ``external_annotations``: those before the mark.

It equals the pickle the per-call collector used to write at that mark, less the ``snapshot``
entries that writing added to the trace. memory_viz reads the recording itself; these views
serve ``memprofiler snapshot --call`` and the explorer.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprofiler import layout
from memprofiler.errors import ArtifactError

_LIVE_STATES = ("active_allocated", "active_pending_free")
_RESERVE = ("segment_alloc", "segment_map")
_RELEASE = ("segment_free", "segment_unmap")
_UNDONE = frozenset(("alloc", "free_completed", "free_requested", *_RESERVE, *_RELEASE))


@dataclass(frozen=True)
class CallRange:
    """A collected call marked in a recording; times on the trace's clock (microseconds)."""

    fn: str
    call: int
    start_us: int | None
    """``None``: the mark fell out of the ring (the recording no longer holds the call's start)."""
    end_us: int | None
    """``None``: the call had not ended when the recording was written."""
    source: str = "annotation"
    """``annotation`` (the allocator's own clock) or ``index`` (memprofiler's, from the window
    index, where torch kept no annotations)."""

    @property
    def key(self) -> str:
        return f"{self.fn}:{self.call}"


def parse_call(text: str) -> tuple[str, int]:
    """``("training_step", 3)`` from ``"training_step:3"``.

    Raises:
        ArtifactError: not ``FN:N``.
    """
    fn, _, call = text.rpartition(":")
    if not fn or not call.isdigit():
        raise ArtifactError(f"--call {text!r}: expected FUNCTION:CALL, e.g. training_step:3")
    return fn, int(call)


def read_index(pickle_path: str | os.PathLike[str], what: str = "window index") -> dict[str, Any] | None:
    """The window index beside a recording (``...window_{n}.json``; an OOM record's role map,
    ``oom_rank_{r}_{n}.json``, has its format); ``None`` when absent.

    Args:
        pickle_path: the recording.
        what: the file's name in messages.

    Raises:
        ArtifactError: the file exists but is not a window index.
    """
    p = Path(pickle_path)
    if not p.name.endswith(".pickle"):
        return None
    path = p.with_name(p.name[: -len(".pickle")] + ".json")
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ArtifactError(f"{path}: unreadable {what} ({err})") from None
    if not isinstance(data, dict) or data.get("format") != layout.CUDA_ALLOC_WINDOW_FORMAT:
        raise ArtifactError(f"{path}: not a memprofiler {what} (format tag missing)")
    return data


def index_mismatch(
    index: Mapping[str, Any], data: Mapping[str, Any], run_id: str | None = None
) -> str | None:
    """Why ``index`` does not belong to the recording ``data`` (of run ``run_id``, when known),
    or ``None`` when it does: its trace entry count, the digest of the traces' first and last
    entries (:func:`memprofiler.layout.recording_digest`; an index written before it has none)
    and its run id must match."""
    traces = data.get("device_traces") or []
    held = sum(len(t) for t in traces if isinstance(t, list)) if isinstance(traces, list) else 0
    said = index.get("trace_entries")
    if type(said) is int and said != held:
        return f"it lists {said:,} trace entries, the recording holds {held:,}"
    digest = index.get("digest")
    version = index.get("version")
    if digest is None and type(version) is int and version >= 2:
        return "it carries no digest of its recording, which its format version writes"
    if digest is not None and digest != layout.recording_digest(data):
        return "its digest of the recording's first and last entries differs"
    theirs = index.get("run_id")
    if run_id and isinstance(theirs, str) and theirs and theirs != run_id:
        return f"it is from run {theirs}, the recording's run is {run_id}"
    return None


def checked_index(
    pickle_path: str | os.PathLike[str], data: Mapping[str, Any], run_id: str | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """:func:`read_index`, checked against the recording ``data`` it was read beside: the
    index, or ``None`` and one line saying why it is ignored (another recording's index copied
    over this one's: its calls would be shown as views of this recording).

    Raises:
        ArtifactError: as :func:`read_index`.
    """
    index = read_index(pickle_path)
    if index is None:
        return None, None
    why = index_mismatch(index, data, run_id)
    if why is None:
        return index, None
    p = Path(pickle_path)
    name = p.with_name(p.name[: -len(".pickle")] + ".json")
    return None, (
        f"{name}: not the index of the recording beside it ({why}); ignored: the calls are read "
        "from the recording's own marks (re-copy both files of the window together)"
    )


def call_ranges(data: Mapping[str, Any], index: Mapping[str, Any] | None = None) -> list[CallRange]:
    """Every collected call marked in a recording, in the order the calls started.

    Calls come from the snapshot's annotations; a call the index lists but the annotations
    lack (a torch that records none) takes the index's times, which are memprofiler's clock.
    """
    found: dict[tuple[str, int], list[int | None]] = {}
    for a in data.get("external_annotations") or ():
        if not isinstance(a, Mapping):
            continue
        parsed = layout.parse_call_mark(str(a.get("name", "")))
        t = a.get("time_us")
        if parsed is None or type(t) is not int:
            continue
        marks = found.setdefault(parsed, [None, None])
        if a.get("stage") == "START":
            marks[0] = t
        elif a.get("stage") == "END":
            marks[1] = t
    out = [CallRange(fn, call, s, e) for (fn, call), (s, e) in found.items()]
    for c in (index or {}).get("calls") or ():
        if not isinstance(c, Mapping):
            continue
        key = (str(c.get("fn")), c.get("call"))
        if type(key[1]) is int and key not in found:
            s, e = c.get("start_us"), c.get("end_us")
            out.append(
                CallRange(
                    key[0], key[1], s if type(s) is int else None, e if type(e) is int else None, "index"
                )
            )
    return sorted(out, key=lambda r: (r.start_us if r.start_us is not None else -1, r.fn, r.call))


def find_call(ranges: Sequence[CallRange], fn: str, call: int, source: str = "") -> CallRange:
    """The range of ``fn:call``.

    Raises:
        ArtifactError: the recording has no such call; the message lists those it has.
    """
    for r in ranges:
        if (r.fn, r.call) == (fn, call):
            return r
    have = ", ".join(r.key for r in ranges[:20]) or "none"
    raise ArtifactError(
        f"{source or 'the recording'}: no call {fn}:{call} is marked in it (calls marked: {have})"
    )


def _times(entries: Sequence[Mapping[str, Any]]) -> list[int]:
    return [t if type(t) is int else 0 for t in (e.get("time_us") for e in entries)]


def _cut(entries: Sequence[Mapping[str, Any]], t: int, inclusive: bool) -> int:
    times = _times(entries)
    return (bisect.bisect_right if inclusive else bisect.bisect_left)(times, t)


def entry_range(entries: Sequence[Mapping[str, Any]], rng: CallRange) -> tuple[int, int] | None:
    """``(first, end)`` trace indices of the entries recorded inside the call (``end`` exclusive);
    ``None`` when a mark is missing."""
    if rng.start_us is None or rng.end_us is None:
        return None
    times = _times(entries)
    return bisect.bisect_left(times, rng.start_us), bisect.bisect_right(times, rng.end_us)


def call_view(
    data: Mapping[str, Any],
    rng: CallRange,
    phase: str = "end",
    source: str = "",
    ring_entries: int | None = None,
) -> dict[str, Any]:
    """The snapshot as it stood at the start or end of the call ``rng`` (see the module docstring).

    Args:
        ring_entries: the ring's size (the window index's ``ring_entries``): a trace shorter
            than it never wrapped, so a call's start may precede its oldest entry.

    Raises:
        ArtifactError: the mark is not in the recording (the ring wrapped past it, or the call
            had not ended), or the recording's oldest entry is younger than the mark.
    """
    if phase not in ("start", "end"):
        raise ArtifactError(f"phase {phase!r}: expected start or end")
    t = rng.start_us if phase == "start" else rng.end_us
    where = source or "the recording"
    if t is None:
        raise ArtifactError(
            f"{where}: the {phase} of {rng.key} is not in it "
            + (
                "(the call had not ended when it was written)"
                if phase == "end"
                else "(the ring wrapped past it)"
            )
        )
    inclusive = phase == "end"
    traces = data.get("device_traces") or []
    heads, tails = [], []
    for entries in traces:
        n = _cut(entries, t, inclusive)
        heads.append(entries[:n])
        tails.append(entries[n:])
    oldest = min(
        (e[0].get("time_us") for e in traces if e and type(e[0].get("time_us")) is int), default=None
    )
    full = ring_entries is None or any(len(e) >= ring_entries for e in traces)
    if oldest is not None and t < oldest and (phase == "end" or full):
        raise ArtifactError(
            f"{where}: the {phase} of {rng.key} is older than the recording's oldest entry (the ring "
            "wrapped past it; raise `allocator_history.max_entries`)"
        )
    view = dict(data)
    view["device_traces"] = heads
    view["segments"] = rewind_segments(data.get("segments") or [], heads, tails)
    annotations = data.get("external_annotations")
    if isinstance(annotations, list):
        view["external_annotations"] = [
            a
            for a in annotations
            if isinstance(a, Mapping)
            and type(a.get("time_us")) is int
            and (a["time_us"] <= t if inclusive else a["time_us"] < t)
        ]
    return view


def round_size(size: int) -> int:
    """The caching allocator's smallest block rounding: a multiple of 512 bytes, at least 512."""
    return max(512, -(-size // 512) * 512)


def rewind_segments(
    segments: Sequence[Mapping[str, Any]],
    heads: Sequence[Sequence[Mapping[str, Any]]],
    tails: Sequence[Sequence[Mapping[str, Any]]],
) -> list[dict[str, Any]]:
    """The segments as they stood before each device's ``tails`` entries (``heads`` came before)."""
    segs: dict[tuple[int, int], dict[str, Any]] = {}
    live: dict[tuple[int, int], Mapping[str, Any]] = {}
    for s in segments:
        dev = s.get("device", 0)
        segs[(dev, s.get("address", 0))] = dict(s)
        for b in s.get("blocks", ()):
            if b.get("state") in _LIVE_STATES:
                live[(dev, b["address"])] = b
    touched: set[tuple[int, int]] = set()
    for dev, tail in enumerate(tails):
        alloc_frames: dict[int, Any] | None = None
        for e in reversed(tail):
            a = e.get("action")
            if a not in _UNDONE:
                continue
            addr = int(e["addr"])
            key = (dev, addr)
            if a == "alloc":
                live.pop(key, None)
                touched.add(key)
            elif a == "free_completed":
                if alloc_frames is None:
                    alloc_frames = {
                        h["addr"]: h.get("frames") for h in heads[dev] if h.get("action") == "alloc"
                    }
                # Its allocation's stack when the trace holds it; else it predates the trace,
                # and the allocator kept no stack for it either.
                frames = alloc_frames.get(addr)
                size = int(e["size"])
                live[key] = {
                    "address": addr,
                    "size": round_size(size),
                    "requested_size": size,
                    "state": "active_pending_free",
                    "frames": frames if frames is not None else [],
                }
                touched.add(key)
            elif a == "free_requested":
                b = live.get(key)
                if b is not None and b.get("state") == "active_pending_free":
                    live[key] = {**b, "state": "active_allocated"}
                    touched.add(key)
            elif a in _RESERVE:
                seg = segs.get(key)
                if seg is not None and seg.get("total_size", 0) > e["size"]:
                    seg["total_size"] = seg["total_size"] - e["size"]  # an expandable segment grew
                    touched.add(key)
                else:
                    segs.pop(key, None)
            elif a in _RELEASE:
                seg = segs.get(key)
                if seg is not None:
                    seg["total_size"] = seg.get("total_size", 0) + e["size"]
                else:
                    segs[key] = {
                        "device": dev,
                        "address": addr,
                        "total_size": int(e["size"]),
                        "stream": e.get("stream", 0),
                        "segment_type": "large",
                        "blocks": [],
                    }
                touched.add(key)
    return _place(segs, live, touched)


def _place(
    segs: dict[tuple[int, int], dict[str, Any]],
    live: dict[tuple[int, int], Mapping[str, Any]],
    touched: set[tuple[int, int]],
) -> list[dict[str, Any]]:
    """Segments with their blocks; a segment holding a touched address is laid out afresh."""
    by_dev: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for (dev, addr), seg in segs.items():
        by_dev.setdefault(dev, []).append((addr, seg))
    for lst in by_dev.values():
        lst.sort(key=lambda x: x[0])
    starts = {dev: [a for a, _ in lst] for dev, lst in by_dev.items()}

    def owner(dev: int, addr: int) -> dict[str, Any] | None:
        lst = by_dev.get(dev, [])
        i = bisect.bisect_right(starts.get(dev, []), addr) - 1
        if i >= 0 and addr < lst[i][0] + lst[i][1].get("total_size", 0):
            return lst[i][1]
        return None

    redo: set[int] = set()
    for dev, addr in touched:
        hit = owner(dev, addr)
        if hit is not None:
            redo.add(id(hit))
    contents: dict[int, list[Mapping[str, Any]]] = {}
    orphans: list[dict[str, Any]] = []
    for (dev, addr), b in live.items():
        home = owner(dev, addr)
        if home is None:
            size = int(b.get("size", 0))
            blk = {**b, "state": b.get("state", "active_allocated")}
            orphans.append(
                {
                    "device": dev,
                    "address": addr,
                    "total_size": size,
                    "stream": 0,
                    "segment_type": "large",
                    "blocks": [blk],
                }
            )
        elif id(home) in redo:
            contents.setdefault(id(home), []).append(b)
    out: list[dict[str, Any]] = []
    for dev in sorted(by_dev):
        for addr, seg in by_dev[dev]:
            if id(seg) in redo:
                seg["blocks"] = _layout(addr, seg.get("total_size", 0), contents.get(id(seg), []))
                active = [b for b in seg["blocks"] if b["state"] in _LIVE_STATES]
                seg["allocated_size"] = seg["active_size"] = sum(int(b["size"]) for b in active)
                seg["requested_size"] = sum(int(b.get("requested_size", b["size"])) for b in active)
            out.append(seg)
    return out + orphans


def _layout(base: int, total: int, blocks: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pos = base
    for b in sorted(blocks, key=lambda b: b["address"]):
        if b["address"] > pos:
            out.append({"address": pos, "size": b["address"] - pos, "requested_size": 0, "state": "inactive"})
        out.append(dict(b))
        pos = max(pos, b["address"] + int(b.get("size", 0)))
    if pos < base + total:
        out.append({"address": pos, "size": base + total - pos, "requested_size": 0, "state": "inactive"})
    return out
