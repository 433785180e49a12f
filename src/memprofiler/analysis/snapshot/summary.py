"""Exact, fast analysis of a CUDA allocator snapshot (``torch.cuda.memory._snapshot()``).

The layout read here is torch's::

    {"segments": [{"device", "address", "total_size", "stream", "blocks": [
                      {"address", "size", "requested_size", "state", "frames"}, ...]}, ...],
     "device_traces": [[{"action", "addr", "size", "stream", "time_us", "frames"}, ...], ...]}

``device_traces[d]`` is a ring buffer of the last allocator events on device ``d``, so memory
allocated before its first entry is invisible in it. We recover that baseline from the
segments (the state at snapshot time): blocks alive at the end that the trace never
allocated, plus blocks the trace frees without having allocated them.

Every byte figure drawn from the trace is **active requested bytes**: torch records the size
the caller asked for in ``alloc``/``free_*`` entries (and ``requested_size`` on blocks), and a
block counts from its ``alloc`` until its ``free_completed`` (a block freed on one stream
but still in use on another, ``active_pending_free``, is still active). That is what the
Active Memory Timeline at pytorch.org/memory_viz plots. It is *not* the allocator's
``allocated_bytes`` counter, which counts rounded block sizes (``SegmentInfo.allocated``)
and drops at ``free_requested``. Active bytes at trace entry ``i`` are
``baseline + sum(alloc) - sum(free_completed)`` up to ``i``. (``torch.cuda._memory_viz
trace`` reuses its byte counter as the loop index, so its ``TOTAL MEM`` line is wrong.)

The trace is read once into numpy columns (:mod:`~memprofiler.analysis.snapshot.columns`, which
the explorer's replay shares): the running totals are cumulative sums, the blocks alive at an
instant follow from pairing the events by address, and no Python step runs per entry.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memprofiler.analysis.files import safe_pickle
from memprofiler.analysis.snapshot.columns import OOM, BadEntry, TraceColumns, read_columns
from memprofiler.analysis.snapshot.frames import NO_STACK, PYTHON, frame_kind, frame_text, readable
from memprofiler.analysis.snapshot.lean import LEAN_BYTES, FrameSharer
from memprofiler.analysis.snapshot.roles import AnnotationSpans, RoleIndex
from memprofiler.errors import ArtifactError

#: Block states that are still active: not yet ``free_completed`` (what memory_viz calls active).
_LIVE_STATES = ("active_allocated", "active_pending_free")
#: Python frames shown per stack group.
STACK_DEPTH = 8


@dataclass
class StackGroup:
    """Active requested bytes at the peak that were allocated from one Python stack."""

    frames: tuple[str, ...]
    """Innermost first, ``"name (file:line)"``; ``(NO_STACK,)`` when none was recorded."""
    bytes: int = 0
    """Sum of the live blocks' requested sizes."""
    count: int = 0
    """Number of live blocks."""


@dataclass
class SegmentInfo:
    """One allocator segment at snapshot time and how fragmented it is."""

    device: int
    address: int
    stream: int
    total_size: int
    allocated: int
    """Bytes in active blocks, rounded block sizes (what the allocator's ``allocated_bytes`` counts)."""
    requested: int
    """Bytes the live blocks' callers asked for."""
    largest_free: int
    """Biggest inactive block: the largest request this segment can still serve."""

    @property
    def free(self) -> int:
        return self.total_size - self.allocated

    @property
    def fragmentation(self) -> float:
        """``1 - largest_free / free``: 0 when the free bytes are one block, near 1 when scattered."""
        return 0.0 if self.free <= 0 else 1.0 - self.largest_free / self.free


@dataclass
class OomEntry:
    """An ``oom`` action in a device trace: an allocation the allocator could not serve."""

    device: int
    index: int
    time_us: int | None
    size: int
    device_free: int | None
    frames: tuple[str, ...]


@dataclass
class DeviceAnalysis:
    """Peaks and the live blocks at the active peak for one device's trace.

    The ``*_allocated`` figures are active requested bytes (see the module docstring), not
    the allocator's rounded ``allocated_bytes``; ``*_reserved`` are segment bytes.
    """

    device: int
    entries: int
    baseline_allocated: int
    """Active requested bytes before the first trace entry."""
    peak_allocated: int
    peak_allocated_index: int
    """Trace index at which the peak was reached; ``-1`` means before the first entry."""
    peak_allocated_time_us: int | None
    end_allocated: int
    peak_reserved: int
    peak_reserved_index: int
    peak_reserved_time_us: int | None
    end_reserved: int
    top_stacks: list[StackGroup]
    live_blocks_at_peak: int
    timeline: list[tuple[int, int, int]] = field(default_factory=list)
    """``(index, allocated, reserved)``, downsampled, keeping each bucket's maximum."""
    ooms: list[OomEntry] = field(default_factory=list)
    oom_stacks: list[StackGroup] = field(default_factory=list)
    """Live at the last OOM by stack (what held the memory when the allocation failed); empty
    without an OOM."""
    live_blocks_at_oom: int = 0
    allocated_at_oom: int | None = None
    """Active requested bytes when the last OOM's allocation failed; ``None`` without an OOM."""


@dataclass
class SnapshotAnalysis:
    """Everything :func:`analyze` finds in one snapshot."""

    source: str
    devices: list[DeviceAnalysis]
    segments: list[SegmentInfo]

    @property
    def total_reserved(self) -> int:
        return sum(s.total_size for s in self.segments)

    @property
    def total_allocated(self) -> int:
        """Rounded bytes in active blocks now (the allocator's ``allocated_bytes``)."""
        return sum(s.allocated for s in self.segments)

    @property
    def total_requested(self) -> int:
        """Requested bytes in active blocks now: what the trace figures end at."""
        return sum(s.requested for s in self.segments)

    @property
    def ooms(self) -> list[OomEntry]:
        return [o for d in self.devices for o in d.ooms]


def load_snapshot(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read an allocator snapshot pickle with the restricted unpickler and check its layout.

    Raises:
        ArtifactError: unreadable, unsafe, or not in the ``_snapshot()`` layout.
    """
    data = safe_pickle.load(path, FrameSharer if _lean(path) else None)
    return check_layout(data, str(path))


def _lean(path: str | os.PathLike[str]) -> bool:
    """A large protocol 4-5 pickle (framed: the sharer's reads come every 64 KB, not per opcode)."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            return os.fstat(f.fileno()).st_size >= LEAN_BYTES and head[:1] == b"\x80" and head[1:] >= b"\x04"
    except OSError:
        return False  # the plain load reports it


def check_layout(data: Any, source: str) -> dict[str, Any]:
    """Accept a ``_snapshot()`` dict (or memory_viz's bare segment list); reject anything else."""
    if isinstance(data, list):  # memory_viz also accepts a bare segment list
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or not ("segments" in data or "device_traces" in data):
        raise ArtifactError(
            f"{source}: not a CUDA allocator snapshot (expected a dict with `segments` and "
            "`device_traces`, as written by torch.cuda.memory._snapshot())"
        )
    if not isinstance(data.get("segments", []), list) or not isinstance(data.get("device_traces", []), list):
        raise ArtifactError(f"{source}: `segments` and `device_traces` must be lists")
    return data


def analyze(
    data: Mapping[str, Any],
    source: str = "<snapshot>",
    top: int = 10,
    points: int = 600,
    roles: RoleIndex | None = None,
) -> SnapshotAnalysis:
    """Analyse a snapshot dict.

    Args:
        data: the ``_snapshot()`` dict.
        source: file name for error messages.
        top: how many stack groups to keep per device.
        points: timeline resolution.
        roles: the role map written beside a recording (:mod:`~memprofiler.analysis.snapshot.roles`): blocks alive
            before the trace that it names are grouped by their role (``parameter``,
            ``optimizer state (exp_avg)``...) instead of as having no stack.

    Raises:
        ArtifactError: an entry lacks a field the analysis needs.

    Example:
        >>> result = analyze(load_snapshot("oom_rank_0_0.pickle"))  # doctest: +SKIP
        >>> result.devices[0].peak_allocated
    """
    return analyze_columns(data, source, top, points, roles)[0]


def analyze_columns(
    data: Mapping[str, Any],
    source: str = "<snapshot>",
    top: int = 10,
    points: int = 600,
    roles: RoleIndex | None = None,
) -> tuple[SnapshotAnalysis, dict[int, TraceColumns]]:
    """:func:`analyze`, and the columns it read of each device's trace (by device), which the
    explorer's replay of the same ``data`` shares (:func:`~memprofiler.analysis.snapshot.replay.replay`).

    Raises:
        ArtifactError: an entry lacks a field the analysis needs.
    """
    columns: dict[int, TraceColumns] = {}
    try:
        _refuse_shared(data, source)
        segments = [_segment_info(s, k) for k, s in enumerate(data.get("segments", []))]
        traces = data.get("device_traces", []) or []
        spans = AnnotationSpans(data.get("external_annotations"))
        devices = []
        for dev, entries in enumerate(traces):
            if entries:
                cols = columns[dev] = read_columns(entries, f"device_traces[{dev}]")
                devices.append(
                    _analyze_device(dev, cols, entries, data.get("segments", []), top, points, roles, spans)
                )
        # Devices with segments but no trace (history off): the current state is all we know.
        for dev in sorted({s.device for s in segments} - set(columns)):
            cols = read_columns([])
            devices.append(_analyze_device(dev, cols, [], data.get("segments", []), top, points, roles))
    except BadEntry as err:  # (a field no allocator writes: the message names it)
        raise ArtifactError(f"{source}: malformed allocator snapshot ({err})") from None
    except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as err:
        raise ArtifactError(f"{source}: malformed allocator snapshot (missing or bad field {err})") from None
    return SnapshotAnalysis(source=source, devices=devices, segments=segments), columns


def _refuse_shared(data: Mapping[str, Any], source: str) -> None:
    """Refuse a snapshot that names one trace, segment or block list more than once.

    A pickle stores a repeated object once and refers back to it in a few bytes, so a 24 KB
    file listing one 1000-entry trace 2000 times would make us replay two million entries.
    torch builds every trace, segment and block list afresh, so a repeat means a crafted file.
    """
    seen: set[int] = set()
    containers: list[Any] = [*(data.get("device_traces") or []), *(data.get("segments") or [])]
    containers += [s.get("blocks") for s in data.get("segments") or [] if isinstance(s, Mapping)]
    for obj in containers:
        if isinstance(obj, (list, dict)) and obj:
            if id(obj) in seen:
                raise ArtifactError(
                    f"{source}: refused: the snapshot repeats one trace, segment or block list "
                    "(a small file that would expand to far more entries than it holds); "
                    "torch never writes that, so the file was crafted or corrupted"
                )
            seen.add(id(obj))


def _int(value: Any, what: str) -> int:
    # torch writes every size, address, device and time as a Python int; a string or a
    # float (NaN, inf) would otherwise surface as a traceback far from the file.
    if type(value) is not int:
        raise BadEntry(f"{what} must be an integer, got {value!r}"[:200])
    return value


def _size(value: Any, what: str) -> int:
    # A byte count below zero is no allocator state: it would draw a negative memory curve
    # and a peak below what was live.
    if _int(value, what) < 0:
        raise BadEntry(f"{what} must be >= 0 bytes, got {value}"[:200])
    return value


def _opt_int(value: Any, what: str) -> int | None:
    return None if value is None else _int(value, what)


def _segment_info(seg: Mapping[str, Any], k: int) -> SegmentInfo:
    allocated = requested = largest_free = 0
    where = f"segments[{k}]"
    blocks_total = 0
    for b in seg.get("blocks", []):
        size = _size(b["size"], f"{where}: block size")
        blocks_total += size
        if b["state"] in _LIVE_STATES:
            allocated += size
            requested += _size(b.get("requested_size", size), f"{where}: block requested_size")
        elif size > largest_free:
            largest_free = size
    total_size = _size(seg["total_size"], f"{where}: total_size")
    if blocks_total > total_size:
        raise BadEntry(
            f"{where}: its blocks hold {blocks_total} bytes, more than its total_size {total_size}"
        )
    return SegmentInfo(
        device=_size(seg.get("device", 0), f"{where}: device"),
        address=_size(seg.get("address", 0), f"{where}: address"),
        stream=_int(seg.get("stream", 0), f"{where}: stream"),
        total_size=total_size,
        allocated=allocated,
        requested=requested,
        largest_free=largest_free,
    )


def _analyze_device(
    dev: int,
    cols: TraceColumns,
    entries: Sequence[Mapping[str, Any]],
    segments: Sequence[Mapping[str, Any]],
    top: int,
    points: int,
    roles: RoleIndex | None = None,
    spans: AnnotationSpans | None = None,
) -> DeviceAnalysis:
    n = cols.entries
    # Running totals relative to the trace start (cumulative sums of the columns), their
    # peaks (the first entry to reach each) and a timeline keeping each bucket's maximum.
    cur, res = cols.active(), cols.reserved()
    peak_i = int(np.argmax(cur)) if n and cur.max() > 0 else -1
    res_peak_i = int(np.argmax(res)) if n and res.max() > 0 else -1
    peak = int(cur[peak_i]) if peak_i >= 0 else 0
    res_peak = int(res[res_peak_i]) if res_peak_i >= 0 else 0
    res_min = min(0, int(res.min())) if n else 0
    end_cur, end_res = (int(cur[-1]), int(res[-1])) if n else (0, 0)
    ooms = [_oom(dev, i, entries[i]) for i in np.flatnonzero(cols.code == OOM).tolist()]

    # Who is alive at the peak (and at the last OOM), and what existed before the trace began.
    end_blocks: dict[int, Mapping[str, Any]] = {}
    end_reserved = 0
    for seg in segments:
        if seg.get("device", 0) != dev:
            continue
        end_reserved += seg["total_size"]
        for b in seg.get("blocks", []):
            if b["state"] in _LIVE_STATES:
                end_blocks[b["address"]] = b
    # The last OOM: the allocation that failed, after which the live set is what held the memory.
    oom_i = ooms[-1].index if ooms else None
    older = cols.older_frees()  # freed but never allocated in the trace: they predate it
    older_at = cols.index[older]
    pre_freed_bytes = int(cols.size[older].sum())
    live_at_peak = cols.pick(entries, cols.live_at(peak_i)) if peak_i >= 0 else []
    pre_live_at_peak = cols.pick(entries, older[older_at > peak_i])
    live_at_oom = cols.pick(entries, cols.live_at(oom_i)) if oom_i is not None else []
    pre_live_at_oom = cols.pick(entries, older[older_at > oom_i]) if oom_i is not None else []
    # Alive at the end but never allocated in the trace: predates it, so alive at the peak too.
    # (With no positive step the peak is the trace start, index -1: only these and the
    # pre-trace blocks freed later are alive then.)
    live = cols.alive_at_end()
    pre_alive = [b for addr, b in end_blocks.items() if addr not in live]
    # Trace sizes are requested bytes, so the blocks count theirs too (not the rounded size).
    baseline = pre_freed_bytes + sum(_requested(b) for b in pre_alive)
    pre_live_at_peak.extend(pre_alive)
    pre_live_at_oom.extend(pre_alive)
    res_baseline = max(end_reserved - end_res, -res_min)
    frame_cache: dict[Any, tuple[str, ...]] = {}
    ranked, at_peak_count = _by_stack(live_at_peak, pre_live_at_peak, roles, spans, frame_cache)
    oom_ranked, at_oom_count = (
        _by_stack(live_at_oom, pre_live_at_oom, roles, spans, frame_cache) if ooms else ([], 0)
    )

    def _time(idx: int) -> int | None:
        if not 0 <= idx < n:
            return None
        return _opt_int(entries[idx].get("time_us"), f"device_traces[{dev}][{idx}]: time_us")

    return DeviceAnalysis(
        device=dev,
        entries=n,
        baseline_allocated=baseline,
        peak_allocated=baseline + peak,
        peak_allocated_index=peak_i,
        peak_allocated_time_us=_time(peak_i),
        end_allocated=baseline + end_cur,
        peak_reserved=res_baseline + res_peak,
        peak_reserved_index=res_peak_i,
        peak_reserved_time_us=_time(res_peak_i),
        end_reserved=res_baseline + end_res,
        top_stacks=ranked[:top],
        live_blocks_at_peak=at_peak_count,
        timeline=_timeline(cur, res, points, baseline, res_baseline),
        ooms=ooms,
        oom_stacks=oom_ranked[:top],
        live_blocks_at_oom=at_oom_count,
        allocated_at_oom=sum(g.bytes for g in oom_ranked) if ooms else None,
    )


def _timeline(
    cur: np.ndarray, res: np.ndarray, points: int, baseline: int, res_baseline: int
) -> list[tuple[int, int, int]]:
    """``(last entry, allocated, reserved)`` per bucket of ``ceil(entries / points)`` entries:
    each the bucket's maximum of the state after its entries."""
    n = cur.size
    if not n:
        return []
    starts = np.arange(0, n, max(1, -(-n // max(1, points))))
    last = np.append(starts[1:] - 1, n - 1).tolist()
    allocated = (np.maximum.reduceat(cur, starts) + baseline).tolist()
    reserved = (np.maximum.reduceat(res, starts) + res_baseline).tolist()
    return list(zip(last, allocated, reserved, strict=True))


def _oom(dev: int, i: int, e: Mapping[str, Any]) -> OomEntry:
    where = f"device_traces[{dev}][{i}] (oom)"
    return OomEntry(
        device=dev,
        index=i,
        time_us=_opt_int(e.get("time_us"), f"{where}: time_us"),
        size=_int(e.get("size", 0), f"{where}: size"),
        device_free=_opt_int(e.get("device_free"), f"{where}: device_free"),
        frames=_format_frames(e.get("frames")),
    )


def _by_stack(
    live: Sequence[Mapping[str, Any]],
    older: Sequence[Mapping[str, Any]],
    roles: RoleIndex | None,
    spans: AnnotationSpans | None,
    frame_cache: dict[Any, tuple[str, ...]],
) -> tuple[list[StackGroup], int]:
    """The blocks alive at an instant grouped by allocating stack, largest first, and their count.

    Args:
        live: blocks allocated in the trace and alive then.
        older: blocks older than the trace and alive then.
        roles: names the older blocks by role (parameters, optimizer state) where it can, and
            groups the blocks of the trace it named by category.
        spans: names allocations without a Python stack by the span they ran in.
        frame_cache: formatted frames by the ids of their frames (torch shares each frame's
            dict between the stacks that name it, each entry holding its own list of them),
            shared across calls.
    """
    if roles is not None:
        # Blocks older than the trace that the role map names: grouped by their role.
        older = [
            b if (f := roles.category_frames(b.get("addr", b.get("address")))) is None else {**b, "frames": f}
            for b in older
        ]
    at: list[Mapping[str, Any]] = list(live)
    if roles is not None:
        # Blocks of the trace that an OOM record's role map named (roles.with_roles): by role too.
        at = [b if (f := roles.group_frames(b.get("frames"))) is None else {**b, "frames": f} for b in at]
    if spans:
        # Allocations with no Python stack (the autograd engine's thread): named by their span.
        bare = [k for k, e in enumerate(at) if not e.get("frames")]
        bare.sort(key=lambda k: at[k].get("time_us") or 0)
        for k, name in zip(bare, spans.names(at[k].get("time_us") or 0 for k in bare), strict=True):
            f = spans.frames(name)
            if f is not None:
                at[k] = {**at[k], "frames": f}
    groups: dict[tuple[str, ...], StackGroup] = {}
    for block in [*at, *older]:
        frames_obj = block.get("frames")
        ids = tuple(map(id, frames_obj)) if isinstance(frames_obj, (list, tuple)) else id(frames_obj)
        key = frame_cache.get(ids) if frames_obj is not None else None
        if key is None:
            key = _format_frames(frames_obj) or (NO_STACK,)
            if frames_obj is not None:
                frame_cache[ids] = key
        g = groups.get(key)
        if g is None:
            g = groups[key] = StackGroup(frames=key)
        g.bytes += _requested(block)
        g.count += 1
    ranked = sorted(groups.values(), key=lambda g: (-g.bytes, g.frames))
    return ranked, sum(g.count for g in groups.values())


def _requested(block: Mapping[str, Any]) -> int:
    """A block's requested bytes; a trace entry's ``size`` already is (it has no ``requested_size``)."""
    return int(block.get("requested_size", block["size"]))


def _format_frames(frames: Any) -> tuple[str, ...]:
    """The readable frames, innermost first, as ``name (file:line)``.

    Python frames when there are any; otherwise the C++ frames that are not allocator,
    unwinder, dispatcher or interpreter internals (see :mod:`~memprofiler.analysis.snapshot.frames`), so a gradient
    made by the autograd engine shows its backward function rather than ``torch::unwind``.
    """
    if not frames:
        return ()
    shown = readable(frames)
    kinds = [frame_kind(str(f.get("name", "")), str(f.get("filename", ""))) for f in shown]
    if any(k & PYTHON for k in kinds):
        shown = [f for f, k in zip(shown, kinds, strict=False) if k & PYTHON]
    return tuple(frame_text(f) for f in shown[:STACK_DEPTH])
