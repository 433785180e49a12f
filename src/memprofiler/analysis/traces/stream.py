"""The one profiler trace reader: every view's figures from one pass over the file, then one
ordered pass over what it kept, in bounded memory, whatever the order of the events.

Torch writes every ``[memory]`` event after the last operator; merged or edited traces put
them first, interleave them, or mix threads and ranks out of order. So the reader does not
rely on the file's order:

1. **Scan** (file order): each event parsed on its own
   (:func:`~memprofiler.analysis.traces.events.iter_events`); what needs no order is folded at
   once (device time by ``External id``, busy periods of each step category, operators'
   shapes, call times); each operator, module span and memory event becomes one fixed-width
   record (:data:`RECORD`, 65 bytes). Records are sorted in runs of :data:`RUN` by
   ``(time, span before memory event, longer span first, file order)`` and the runs spilled
   to one temporary file.
2. **Attribute** (time order): the runs are merged by time windows (each window holds at
   most about :data:`RUN` records, sorted in numpy) and each record is folded in: per thread
   the spans open at its time (a stack), so a memory event counts for every enclosing
   operator and module; per device the curve, peak, allocation / release pairs by address.

Held while reading: one run or window of records, the allocations not yet released (by
address), the :data:`PAIRS_KEPT` largest pairs, the first :data:`RANGE_KEPT` memory events per
device, one row per operator, module, device and call path, and the open spans. The memory
curve, each memory event's bytes and call path, the operators' ``External id`` and call
times and the kernels' durations go to temporary files, read back at the end: the curve
thinned to :data:`~memprofiler.analysis.traces.memory.CURVE_POINTS` points; past
:data:`RANGE_KEPT` events, the events in :data:`RANGE_BINS` bins for a range selection on
whole bins; kernels joined to the operators that launched them in numpy batches. Every
temporary file is closed on every path, errors included.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
import tempfile
from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from msgspec import Raw

from memprofiler.analysis.traces.events import (
    DEVICE_CATS,
    DISPATCH_WRAPPERS,
    KERNEL,
    MEMCPY,
    MEMSET,
    MODULE_PREFIXES,
    STEP_NAME,
    Event,
    EventArgs,
    checked_header,
    dims_list,
    int_or,
    iter_events,
    memory_device,
    number,
    shapes_text,
)
from memprofiler.analysis.traces.memory import CURVE_POINTS, DeviceMemory, MemPair, MemStat
from memprofiler.analysis.traces.ops import FACTORIES, OpRow, module_name
from memprofiler.analysis.traces.steps import (
    COMM_OPS,
    DATA_LOADING,
    STEP_PARTS,
    RankRow,
    StepRow,
)
from memprofiler.errors import ArtifactError

#: Records sorted per run in the scan, and held per window in the ordered pass.
RUN = 1 << 16
#: One operator, module span or ``[memory]`` event: sort keys (time, 0 for a span / 1 for a
#: memory event, minus duration, file order), thread, then a span's kind, name and
#: ``External id``, or a memory event's device, address, bytes, allocated and reserved.
RECORD = np.dtype(
    [("ts", "f8"), ("what", "i1"), ("negdur", "f8"), ("idx", "i8"), ("thread", "i4"), ("kind", "i1"),
     ("name", "i4"), ("ext", "i8"), ("nbytes", "i8"), ("allocated", "i8"), ("reserved", "i8")],
)  # fmt: skip
#: Allocation / release pairs kept per device (the largest); the rest are counted.
PAIRS_KEPT = 20_000
#: Memory events per device kept for the page's range selection (beyond: none).
RANGE_KEPT = 20_000
#: Bins of a device's memory events past :data:`RANGE_KEPT`: the range selection then
#: works on whole bins (per bin and call path: bytes, allocation count and size).
RANGE_BINS = 2000
#: (bin, call path) entries the page carries at most for one device (beyond: no range selection).
RANGE_GROUPS = 100_000

_OP, _MOD = 0, 1
#: torch's ``nn.Module:`` span: a module unless Lightning's ``[pl][module]`` spans are present.
_TORCH_MOD = 2
#: A dispatch-mode wrapper (:data:`~memprofiler.analysis.traces.events.DISPATCH_WRAPPERS`): its
#: time is taken from the operator around it, it is no operator row and no part of a call path.
_WRAPPER = 3
#: Kernels joined to their operators at a time.
_JOIN = 1 << 18
#: Span categories read (``python_function`` too, for ``nn.Module:`` spans).
_WANTED = frozenset({*DEVICE_CATS, "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation"})
_CHUNK = 65536


_NO_ARGS = EventArgs()


def _hashable(v: Any) -> Any:
    """A ``pid`` / ``tid`` as a dictionary key (a hostile trace may give a list)."""
    return v if v is None or isinstance(v, (str, int, float)) else repr(v)


def _float(v: Any) -> float | None:
    """A time or duration as a float (a string holding a number converted); ``None`` for one
    that is not a number or past float's range."""
    n = number(v)
    if n is None:
        return None
    try:
        return float(n)
    except OverflowError:
        return None


def _clamp(v: int) -> int:
    """``v`` within int64 (a hostile trace may write any integer)."""
    return v if -_I64 <= v < _I64 else (_I64 - 1 if v > 0 else -_I64)


_I64 = 1 << 63


def _spill_write(data: Any, file: Any) -> None:
    """Append an ``array`` or numpy array to a temporary file (the one seam through which the
    reader writes to disk: a test makes it fail as a full disk would).

    Raises:
        OSError: ``ENOSPC`` for a short write on a full filesystem (numpy's own error names
            no errno: "N requested and M written").
    """
    try:
        data.tofile(file)
    except OSError as err:
        free = None
        if err.errno is None:
            with contextlib.suppress(OSError, ValueError):
                st = os.fstatvfs(file.fileno())
                free = st.f_bavail * st.f_frsize
        if free is not None and free < max(getattr(data, "nbytes", 0), 2**20):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from err
        raise


class _Intervals:
    """A union of intervals, merged as they come when they come in order; the merged ones
    go to a temporary file (16 bytes each), only the last is held."""

    __slots__ = ("ce", "cs", "ordered", "spill")

    def __init__(self) -> None:
        self.cs = self.ce = float("-inf")
        self.spill: _Spill | None = None
        self.ordered = True

    def add(self, s: float, e: float) -> None:
        if e <= s:
            return
        ce = self.ce
        if self.cs <= s <= ce:
            if e > ce:
                self.ce = e
            return
        if ce > float("-inf"):
            if s < self.cs:
                self.ordered = False
            if self.spill is None:
                self.spill = _Spill(2, "d")
            self.spill.add(self.cs, ce)
        self.cs, self.ce = s, e

    def stream(self) -> Iterator[tuple[float, float]]:
        """The union, sorted and disjoint (an interval ends before the next starts)."""
        if self.ce == float("-inf"):
            return
        if not self.ordered:  # read back whole and merged in memory
            chunks = [np.frombuffer(c, dtype=np.float64) for c in self.spill.read()] if self.spill else []
            flat = np.concatenate([*chunks, np.array([self.cs, self.ce])])
            yield from zip(*(x.tolist() for x in _merged(flat[0::2], flat[1::2])), strict=True)
            return
        if self.spill is not None:
            for chunk in self.spill.read():
                it = iter(chunk)
                yield from zip(it, it, strict=True)
        yield self.cs, self.ce

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()


class _Spill:
    """Fixed-width records (int64 ``q`` or float64 ``d``) appended to a temporary file in chunks."""

    def __init__(self, width: int, code: str = "q") -> None:
        self.width = width
        self.code = code
        self.buf: array[Any] = array(code)
        fd, name = tempfile.mkstemp(prefix="memprofiler-trace-", suffix=".bin")
        self.file = os.fdopen(fd, "w+b")
        os.unlink(name)

    def add(self, *values: Any) -> None:
        self.buf.extend(values)
        if len(self.buf) >= _CHUNK * self.width:
            _spill_write(self.buf, self.file)
            del self.buf[:]

    def add_array(self, a: Any) -> None:
        """Append the values of numpy array ``a`` (flat, of this spill's type), after those added."""
        if self.buf:
            _spill_write(self.buf, self.file)
            del self.buf[:]
        _spill_write(a, self.file)

    def written(self) -> int:
        """Values added so far."""
        return self.file.tell() // self.buf.itemsize + len(self.buf)

    def read(self) -> Any:
        """Yield the records back, chunk by chunk, as flat arrays."""
        _spill_write(self.buf, self.file)
        del self.buf[:]
        self.file.seek(0)
        size = _CHUNK * self.width
        while True:
            chunk: array[Any] = array(self.code)
            with contextlib.suppress(EOFError):
                chunk.fromfile(self.file, size)
            if not chunk:
                return
            yield chunk

    def close(self) -> None:
        self.file.close()


class _Runs:
    """Records in sorted runs of :data:`RUN`, spilled to one temporary file; merged back in
    time order by :meth:`ordered`."""

    def __init__(self) -> None:
        self.pending: list[tuple[Any, ...]] = []
        self.runs: list[tuple[int, int]] = []  # (first record, count)
        self.count = 0
        self.file: Any = None

    def add(self, rec: tuple[Any, ...]) -> None:
        self.pending.append(rec)
        if len(self.pending) >= RUN:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        a = np.array(self.pending, dtype=RECORD)
        self.pending = []
        a = a[np.lexsort((a["idx"], a["negdur"], a["what"], a["ts"]))]
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="memprofiler-trace-", suffix=".bin")  # noqa: SIM115  # closed by close()
        self.file.seek(self.count * RECORD.itemsize)
        _spill_write(a, self.file)
        self.runs.append((self.count, len(a)))
        self.count += len(a)

    def _read(self, first: int, n: int) -> Any:
        self.file.seek(first * RECORD.itemsize)
        return np.fromfile(self.file, dtype=RECORD, count=n)

    def ordered(self) -> Iterator[Any]:
        """Every record in sort order, in windows of about :data:`RUN` (numpy arrays)."""
        self.flush()
        if not self.runs:
            return
        step = max(1024, RUN // len(self.runs))
        heads = [[first, n, self._read(first, min(n, step))] for first, n in self.runs]
        for h in heads:
            h[0] += len(h[2])
            h[1] -= len(h[2])
        while heads:
            # Records on disk come after each run's buffer: the window ends at the earliest
            # buffer end among runs with more on disk (all records at one time stay together).
            bound = min((h[2]["ts"][-1] for h in heads if h[1]), default=None)
            cuts = [len(h[2]) if bound is None else int(np.searchsorted(h[2]["ts"], bound)) for h in heads]
            if not any(cuts):  # every buffer starts at the bound: read further where it ends there
                for h in heads:
                    if h[1] and h[2]["ts"][-1] == bound:
                        more = self._read(h[0], min(h[1], len(h[2])))
                        h[0] += len(more)
                        h[1] -= len(more)
                        h[2] = np.concatenate([h[2], more])
                continue
            win = np.concatenate([h[2][:c] for h, c in zip(heads, cuts, strict=True)])
            for h, c in zip(heads, cuts, strict=True):
                h[2] = h[2][c:]
                if h[1] and len(h[2]) < step:
                    more = self._read(h[0], min(h[1], step))
                    h[0] += len(more)
                    h[1] -= len(more)
                    h[2] = np.concatenate([h[2], more])
            heads = [h for h in heads if len(h[2])]
            yield win[np.lexsort((win["idx"], win["negdur"], win["what"], win["ts"]))]

    def close(self) -> None:
        self.pending = []
        if self.file is not None:
            self.file.close()


class _Closed:
    """The closed operator and module spans, summed per row in numpy: each span's row key
    (``2 * name + 1`` for a module, ``2 * name`` for an operator), duration and child time,
    held in arrays until :data:`_CHUNK` and then added, in the order they closed, to the
    rows' running sums (``np.add.at`` adds one value at a time, as ``+=`` in a loop would:
    the same sums to the bit)."""

    def __init__(self) -> None:
        self.key: array[int] = array("q")
        self.dur: array[float] = array("d")
        self.child: array[float] = array("d")
        self.calls = np.zeros(0, dtype=np.int64)
        self.total = np.zeros(0)
        self.own = np.zeros(0)
        self.order: list[int] = []
        """Row keys in the order their first span closed (the rows' order)."""

    def fold(self) -> None:
        if not self.key:
            return
        key = np.frombuffer(self.key, dtype=np.int64)
        dur = np.frombuffer(self.dur, dtype=np.float64)
        own = dur - np.frombuffer(self.child, dtype=np.float64)
        own = np.where(own > 0.0, own, 0.0)  # max(0.0, own), NaN included
        size = int(key.max()) + 1
        if size > len(self.calls):
            grow = size - len(self.calls)
            self.calls = np.concatenate([self.calls, np.zeros(grow, dtype=np.int64)])
            self.total = np.concatenate([self.total, np.zeros(grow)])
            self.own = np.concatenate([self.own, np.zeros(grow)])
        new = self.calls[key] == 0
        if new.any():
            u, first = np.unique(key[new], return_index=True)
            self.order += u[np.argsort(first)].tolist()
        np.add.at(self.calls, key, 1)
        np.add.at(self.total, key, dur)
        np.add.at(self.own, key, own)
        del key, dur  # the views of the arrays, which are emptied in place (their appends stay bound)
        del self.key[:], self.dur[:], self.child[:]

    def rows(self, r: _Reader) -> None:
        """The operator and module rows of ``r``, in the order their first span closed."""
        calls, total, own = self.calls.tolist(), self.total.tolist(), self.own.tolist()
        for key in self.order:
            n, module = divmod(key, 2)
            label = r.names[n]
            row = OpRow(module_name(label) if module else label, calls[key], own[key], total[key])
            (r.mods if module else r.ops)[n] = row


@dataclass
class _Device:
    label: str
    curve: _Spill = field(default_factory=lambda: _Spill(4))
    """``(allocated, reserved, bytes, call path)`` of each memory event, in time order."""
    times: _Spill = field(default_factory=lambda: _Spill(1, "d"))
    count: int = 0
    peak: tuple[int, float] = (-1, 0.0)
    peak_reserved: int = 0
    open: dict[int, tuple[int, int, float]] = field(default_factory=dict)
    pairs: list[tuple[Any, ...]] = field(default_factory=list)
    """Heap of the :data:`PAIRS_KEPT` largest pairs: ``(size, rank key, label, alloc, release)``."""
    pair_count: int = 0
    emitted: int = 0
    kept: list[tuple[float, int, int, int]] | None = field(default_factory=list)
    """``(ts, bytes, event index, call path)`` of the first :data:`RANGE_KEPT` events."""
    stats: dict[int, MemStat] = field(default_factory=dict)
    acc: dict[tuple[int, tuple[int, ...]], list[int]] = field(default_factory=dict)
    """(call path, module chain) -> [bytes, allocations, allocated bytes] of its memory events."""


@dataclass
class _Thread:
    stack: list[list[Any]] = field(default_factory=list)
    """Open spans, outermost first: ``[kind, name, dur, end, child time, ext, seq, ops, mods]``."""
    ops: _Intervals = field(default_factory=_Intervals)
    comm: _Intervals = field(default_factory=_Intervals)


@dataclass
class Summary:
    """Everything the views of one trace need, folded in one pass."""

    path: Path
    rank: int | None
    base_ns: int
    events: int = 0
    start: float = 0.0
    names: list[str] = field(default_factory=list)
    devices: list[tuple[DeviceMemory, list[MemPair], int, list[MemStat], dict[str, Any] | None]] = field(
        default_factory=list
    )
    """Per device: the memory view, the kept pairs, how many pairs there are, the statistics
    and the range-selection data (``None`` past :data:`RANGE_KEPT` events)."""
    ops: list[OpRow] = field(default_factory=list)
    modules: list[OpRow] = field(default_factory=list)
    steps: list[StepRow] = field(default_factory=list)
    rank_row: RankRow | None = None
    has_device_time: bool = False
    allocated_at: dict[tuple[str, float], int] = field(default_factory=dict)
    """``(device, probe time) -> allocated bytes`` for the ``probes`` :func:`summarise` was given."""
    wrapper_calls: int = 0
    """Spans of dispatch-mode wrappers (a module tracker's ``PythonDispatchMode``) left out of the
    operator views."""
    wrapper_self_us: float = 0.0
    """Host time of those spans outside the operators inside them: the tracker's own work."""
    notes: list[str] = field(default_factory=list)
    """One line per field of the events that was not a number where one was expected: how
    many were converted from strings, how many could not be read and what was done."""


#: What the reader does with an event whose field it cannot read as a number.
_UNREADABLE = {
    "ts": "the event skipped",
    "dur": "read as 0",
    "Bytes": "the memory event skipped",
    "Total Allocated": "read as 0",
    "Total Reserved": "read as 0",
    "cat": "the event skipped",
    "Input Dims": "its shapes left out",
}


class _Fields:
    """Per event field, how many values were strings converted to numbers and how many could
    not be read (with the first such value), for one line each at the end."""

    def __init__(self) -> None:
        self.converted: Counter[str] = Counter()
        self.unreadable: Counter[str] = Counter()
        self.example: dict[str, str] = {}

    def seen(self, key: str, raw: Any, ok: bool) -> None:
        """``raw``, a value of field ``key`` that was not an ``int`` or ``float``: converted
        when ``ok``."""
        if ok:
            self.converted[key] += 1
            return
        self.unreadable[key] += 1
        if key not in self.example:
            text = repr(raw)
            self.example[key] = text if len(text) <= 40 else text[:37] + "..."

    def lines(self, path: Path) -> list[str]:
        out = []
        for key in _UNREADABLE:
            if n := self.unreadable[key]:
                what = {"cat": "a string", "Input Dims": "a list of shapes"}.get(key, "a finite number")
                out.append(
                    f"{path.name}: {n:,} event(s) with a `{key}` that is not {what} "
                    f"(first: {self.example[key]}): {_UNREADABLE[key]}"
                )
            if n := self.converted[key]:
                out.append(
                    f"{path.name}: {n:,} event(s) with a `{key}` written as a string: read as its number"
                )
        return out


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lightning = False
        self.names: list[str] = []
        self.ix: dict[str, int] = {}
        self.threads: dict[tuple[Any, Any], int] = {}
        self.thread_list: list[_Thread] = []
        self.records = _Runs()
        self.devices: list[_Device] = []
        self.dev_ix: dict[str, int] = {}
        self.dev_of: dict[tuple[Any, Any], int] = {}
        self.comm_names: dict[int, bool] = {}
        self.ops: dict[int, OpRow] = {}
        self.mods: dict[int, OpRow] = {}
        self.shapes: dict[int, Counter[int]] = {}
        self.shape_ids: dict[str | bytes, int] = {}
        self.calls = _Spill(2, "d")  # (time, name) of each operator call
        self.stack_ids: dict[tuple[int, ...], int] = {}
        self.chains: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
        self.ext = _Spill(3)  # (External id, file order, chain)
        self.kernel_ext = _Spill(1)
        self.kernel_dur = _Spill(1, "d")
        self.device_kind = [_Intervals(), _Intervals(), _Intervals()]
        self.comm_kernels = _Intervals()
        self.compute_kernels = _Intervals()
        self.runtime = _Intervals()
        self.loading = _Intervals()
        self.step_windows: list[tuple[str, float, float]] = []
        self.any_device = False
        self.start = float("inf")
        self.end = float("-inf")
        self.events = 0
        self.mem_index = 0
        self.kernels = False
        self.probes: dict[str, list[float]] = {}
        self.allocated_at: dict[tuple[str, float], int] = {}
        self.wrapper_calls = 0
        self.wrapper_self_us = 0.0
        self.fields = _Fields()
        self.closed = _Closed()

    def close(self) -> None:
        """Close every temporary file (each is already unlinked: closing frees its space)."""
        self.records.close()
        for sp in (self.ext, self.calls, self.kernel_ext, self.kernel_dur):
            sp.close()
        for u in (*self.device_kind, self.compute_kernels, self.comm_kernels, self.runtime, self.loading):
            u.close()
        for th in self.thread_list:
            th.ops.close()
            th.comm.close()
        for d in self.devices:
            d.curve.close()
            d.times.close()

    def intern(self, text: str) -> int:
        i = self.ix.get(text)
        if i is None:
            i = self.ix[text] = len(self.names)
            self.names.append(text)
        return i

    # -- reading ---------------------------------------------------------------------------

    def read(self) -> None:
        """The scan (file order): each event folded or turned into a record.

        Operators and memory events, most of a trace, are read in the loop itself when their
        fields are what torch writes (a float time and duration, whole numbers in range); any
        other event, or field, goes through :meth:`_span` / :meth:`_memory`."""
        seq = events = 0
        start, last_end = self.start, self.end
        span, memory, op_name, op_dims, op_args = (
            self._span,
            self._memory,
            self._op_name,
            self._op_dims,
            self._op_args,
        )
        wanted = _WANTED
        records = self.records
        threads, thread_list, dev_of = self.threads, self.thread_list, self.dev_of
        comm_names, shape_ids, shapes = self.comm_names, self.shape_ids, self.shapes
        for ev in iter_events(self.path):
            events += 1
            if ev is None:
                continue
            ts = ev.ts
            if ts.__class__ is not float:
                raw = ts
                ts = _float(raw)
                if (raw.__class__ is not int or ts is None) and (raw is not None or ev.ph != "M"):
                    self.fields.seen("ts", raw, ts is not None)
                if ts is None:
                    continue
            ph = ev.ph
            if ph == "X":
                if ts < start:
                    start = ts
                seq += 1
                cat = ev.cat
                if cat == "cpu_op":
                    # An operator, folded here: most of a trace's spans.
                    name = ev.name
                    dur = ev.dur
                    if dur.__class__ is not float:
                        dur = self._dur(dur)
                    end = ts + dur
                    if end > last_end:
                        last_end = end
                    n = (
                        op_name(name)
                        if name.__class__ is not str or name in DISPATCH_WRAPPERS
                        else self.ix.get(name)
                    )
                    if n is None:
                        n = op_name(name)
                    try:
                        t = threads[ev.pid, ev.tid]
                    except (KeyError, TypeError):
                        t = self._thread(ev)
                    if n < 0:  # a dispatch-mode wrapper
                        records.add((ts, 0, -dur, seq, t, _WRAPPER, -1 - n, -1, 0, 0, 0))
                        continue
                    args = ev.args
                    ext = -1
                    if args is not None:
                        dims = args.dims
                        if dims:
                            # the shapes of a known text, counted here (most operators)
                            sid = shape_ids.get(bytes(dims)) if dims.__class__ is Raw else None
                            if sid is not None and sid >= 0 and (c := shapes.get(n)) is not None:
                                c[sid] += 1
                            else:
                                op_dims(n, dims)
                        ext = args.ext
                        if ext.__class__ is not int or not -_I64 <= ext < _I64:
                            ext = op_args(ext)
                    th = thread_list[t]
                    u = th.comm if comm_names[n] else th.ops
                    if u.cs <= ts <= u.ce:  # inside the busy period so far (most operators)
                        if end > u.ce:
                            u.ce = end
                    else:
                        u.add(ts, end)
                    pending = records.pending
                    pending.append((ts, 0, -dur, seq, t, _OP, n, ext, 0, 0, 0))
                    if len(pending) >= RUN:
                        records.flush()
                    continue
                if cat.__class__ is not str:  # a list or an object: no category the views read
                    self.fields.seen("cat", cat, False)
                    continue
                if cat in wanted or (
                    cat == "python_function"
                    and ev.name.__class__ is str
                    and ev.name.startswith("nn.Module: ")
                ):
                    span(ev, cat, ts, seq)
            elif ph != "M":
                if ts < start:
                    start = ts
                if ph == "i" and ev.name == "[memory]" and (args := ev.args) is not None:
                    b, addr, allocated, reserved = args.nbytes, args.addr, args.allocated, args.reserved
                    if not (
                        b.__class__ is int
                        and addr.__class__ is int
                        and allocated.__class__ is int
                        and reserved.__class__ is int
                        and -_I64 <= b < _I64
                        and -_I64 <= allocated < _I64
                        and -_I64 <= reserved < _I64
                    ):
                        memory(ev, args, ts)
                        continue
                    if not b:
                        continue
                    try:
                        dev = dev_of[args.device_type, args.device_id]
                    except (KeyError, TypeError):
                        dev = self._device(args)
                    try:
                        t = threads[ev.pid, ev.tid]
                    except (KeyError, TypeError):
                        t = self._thread(ev)
                    j = self.mem_index
                    self.mem_index = j + 1
                    pending = records.pending
                    pending.append((ts, 1, 0.0, j, t, 0, dev, addr % (1 << 63), b, allocated, reserved))
                    if len(pending) >= RUN:
                        records.flush()
        self.events, self.start = events, start
        if last_end > self.end:
            self.end = last_end
        self._attribute()

    def _dur(self, d: Any) -> float:
        """A span's ``dur`` that is not a float: its number, noted; 0 when it has none."""
        f = _float(d)
        if d.__class__ is not int or f is None:
            self.fields.seen("dur", d, f is not None)
        return f or 0.0

    def _op_name(self, raw: Any) -> int:
        """The name index of an operator named ``raw`` (interned); ``-1 - index`` for a
        dispatch-mode wrapper's."""
        name = raw if raw.__class__ is str else "" if raw is None else str(raw)
        if name in DISPATCH_WRAPPERS:
            return -1 - self.intern(name)
        n = self.ix.get(name)
        if n is None:
            n = self.intern(name)
            self.comm_names[n] = name.startswith(COMM_OPS)
        return n

    def _op_dims(self, n: int, dims: Any) -> None:
        """Count the shapes ``dims`` (an operator's ``Input Dims``) for operator ``n``."""
        # the same dims give the same text: convert each once
        key = bytes(dims) if dims.__class__ is Raw else repr(dims) if dims.__class__ is list else None
        if not key:
            return
        sid = self.shape_ids.get(key)
        if sid is None:
            try:
                listed = dims_list(dims)
                sid = -1 if listed is None else self.intern(shapes_text(listed))
            except ValueError:
                sid = -2
            self.shape_ids[key] = sid
        if sid == -2:
            self.fields.seen(
                "Input Dims", key.decode("utf-8", "replace") if isinstance(key, bytes) else key, False
            )
        elif sid >= 0:
            c = self.shapes.get(n)
            if c is None:
                c = self.shapes[n] = Counter()
            c[sid] += 1

    @staticmethod
    def _op_args(ext: Any) -> int:
        """An ``External id`` that is not an int in int64's range: -1 past it, else its number clamped."""
        return -1 if ext.__class__ is int else _clamp(int_or(ext))

    def _thread(self, ev: Event) -> int:
        try:
            return self.threads[ev.pid, ev.tid]
        except (KeyError, TypeError):
            pass
        key = (_hashable(ev.pid), _hashable(ev.tid))
        k = self.threads.get(key)
        if k is None:
            k = self.threads[key] = len(self.thread_list)
            self.thread_list.append(_Thread())
        return k

    def _attribute(self) -> None:
        """The ordered pass: every record in sort order, per thread through the stack of its
        open spans (as ``profiler_ops.nest``, one record at a time).

        One loop with the per-record work written out in it (this pass runs once per operator,
        module span and memory event); what needs no stack is done per window in numpy
        (:meth:`_window`): each device's curve, peak and first events, the operators' call
        times; the closed spans' sums are folded in numpy (:class:`_Closed`)."""
        threads, close = self.thread_list, self._close
        lightning = self.lightning
        self.kernels = kernels = self.kernel_ext.written() > 0  # operators' External ids are needed then
        chains, ext_add, devices, where_of, pair = (
            self.chains,
            self.ext.add,
            self.devices,
            self._where,
            self._pair,
        )
        places: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, int, tuple[int, tuple[int, ...]]]]
        places = {}
        closed = self.closed
        closed_key, closed_dur, closed_child = closed.key.append, closed.dur.append, closed.child.append
        for win in self.records.ordered():
            sids: array[int] = array("q")
            sid_add = sids.append
            for k in range(0, len(win), 8192):
                part = win[k : k + 8192]
                # column by column: a structured array's tolist() costs twice as much
                for t, what, negdur, seq, thread, kind, n, ext, b in zip(
                    *(
                        part[f].tolist()
                        for f in ("ts", "what", "negdur", "idx", "thread", "kind", "name", "ext", "nbytes")
                    ),
                    strict=True,
                ):
                    if what == 0 and kind == _TORCH_MOD:
                        if lightning:
                            continue
                        kind = _MOD
                    th = threads[thread]
                    stack = th.stack
                    # Close the spans that end by t (a memory event at a span's end is inside it).
                    while stack and (top := stack[-1])[3] <= t and not (what == 1 and top[3] == t):
                        stack.pop()
                        if top[0] == _WRAPPER:
                            self.wrapper_calls += 1
                            self.wrapper_self_us += max(0.0, top[2] - top[4])
                            continue
                        closed_key(2 * top[1] + (top[0] != _OP))
                        closed_dur(top[2])
                        closed_child(top[4])
                    if len(closed.key) >= _CHUNK:
                        closed.fold()
                    if what == 0:
                        dur = -negdur
                        if stack:
                            top = stack[-1]
                            ops, kmods, op_parent, mod_parent, mods = top[5], top[6], top[7], top[8], top[9]
                        else:
                            ops, kmods, op_parent, mod_parent, mods = (), (), None, None, ()
                        entry: list[Any] = [kind, n, dur, t + dur, 0.0]
                        if kind == _OP:
                            if op_parent is not None:
                                op_parent[4] += dur
                            ops = (n, *ops)
                            if ext >= 0 and kernels:
                                c = chains.get((ops, kmods))
                                if c is None:
                                    c = chains[ops, kmods] = len(chains)
                                ext_add(ext, seq, c)
                            entry += (ops, kmods, entry, mod_parent, mods, None)
                        elif kind == _WRAPPER:
                            # Transparent: the operator around it does not count its time as its
                            # own, the operators inside keep their call path; their time is its
                            # "child" time.
                            if op_parent is not None:
                                op_parent[4] += dur
                            entry += (ops, kmods, entry, mod_parent, mods, None)
                        else:
                            if mod_parent is not None:
                                mod_parent[4] += dur
                            entry += (ops, kmods if ops else (*kmods, n), op_parent, entry, (n, *mods), None)
                        stack.append(entry)
                        continue
                    # A memory event: n is its device, ext its address.
                    if stack:
                        inner = stack[-1]
                        where = inner[10]
                        if where is None:
                            key = (inner[5], inner[9])
                            where = places.get(key)
                            if where is None:
                                where = places[key] = where_of(*key)
                            inner[10] = where
                    else:
                        where = places.get(((), ()))
                        if where is None:
                            where = places[(), ()] = where_of((), ())
                    sid, label, key_ = where
                    sid_add(sid)
                    d = devices[n]
                    # Summed per call path and module chain; spread over the operators and
                    # modules at the end.
                    acc = d.acc.get(key_)
                    if acc is None:
                        acc = d.acc[key_] = [0, 0, 0]
                    acc[0] += b
                    # Allocation / release pairs by address.
                    if b > 0:
                        acc[1] += 1
                        acc[2] += b
                        got = d.open.pop(ext, None)
                        if got is not None:
                            pair(d, got[0], got[1], got[2], None)
                        d.open[ext] = (label, b, t)
                    else:
                        got = d.open.pop(ext, None)
                        if got is None:
                            pair(d, label, -b, None, t)
                        else:
                            pair(d, got[0], got[1], got[2], t)
            self._window(win, sids)
        for th in threads:
            close(th, float("inf"), 0)
        self.closed.fold()
        self.closed.rows(self)
        self._spread()

    def _window(self, win: Any, sids: array[int]) -> None:
        """What a window of records gives without the stack, in numpy: each device's curve,
        times, peak and first events (``sids``: the call path of each memory event, in order),
        the operators' call times."""
        what = win["what"]
        op = win[(what == 0) & (win["kind"] == _OP)]
        if len(op):
            self.calls.add_array(np.column_stack((op["ts"], op["name"].astype(np.float64))).ravel())
        if not sids:
            return
        mem = win[what == 1]
        path = np.frombuffer(sids, dtype=np.int64)
        devs = mem["name"]
        for dev in np.unique(devs).tolist():
            sel = devs == dev
            m, sid = (mem, path) if sel.all() else (mem[sel], path[sel])
            d = self.devices[dev]
            ts, nbytes, allocated, reserved = m["ts"], m["nbytes"], m["allocated"], m["reserved"]
            d.curve.add_array(np.column_stack((allocated, reserved, nbytes, sid)).ravel())
            d.times.add_array(ts)
            d.count += len(m)
            top = int(np.argmax(allocated))  # the first event at the highest point
            if allocated[top] > d.peak[0]:
                d.peak = (int(allocated[top]), float(ts[top]))
            d.peak_reserved = max(d.peak_reserved, int(reserved.max()))
            if d.kept is not None:
                if len(d.kept) + len(m) > RANGE_KEPT:
                    d.kept = None
                else:
                    d.kept += zip(ts.tolist(), nbytes.tolist(), m["idx"].tolist(), sid.tolist(), strict=True)

    def _span(self, ev: Event, cat: Any, ts: float, seq: int) -> None:
        name = ev.name if ev.name.__class__ is str else "" if ev.name is None else str(ev.name)
        d = ev.dur
        dur = d if d.__class__ is float else self._dur(d)
        end = ts + dur
        if cat in DEVICE_CATS:
            self.any_device = True
            if end > self.end:
                self.end = end
            kind = DEVICE_CATS[cat]
            if kind != KERNEL:
                self.device_kind[kind].add(ts, end)
            else:
                low = name.lower()
                comm = "nccl" in low or "rccl" in low
                (self.comm_kernels if comm else self.compute_kernels).add(ts, end)
            e = _clamp(int_or(ev.args.ext)) if ev.args is not None else -1
            if e >= 0:
                self.kernel_ext.add(e)
                self.kernel_dur.add(dur)
            return
        if cat in ("cuda_runtime", "cuda_driver"):
            self.runtime.add(ts, end)
            return
        if cat == "user_annotation":
            if end > self.end:
                self.end = end
            if STEP_NAME.match(name):
                self.step_windows.append((name, ts, end))
                return
            if not name.startswith(MODULE_PREFIXES):
                if name.startswith(DATA_LOADING):
                    self.loading.add(ts, end)
                return
            kind = _MOD
        elif cat == "python_function" and name.startswith("nn.Module: "):
            kind = _MOD
        else:
            return
        if end > self.end:
            self.end = end
        args = ev.args if ev.args is not None else _NO_ARGS
        n = self.intern(name)
        if kind == _MOD:
            if name.startswith("[pl][module]"):
                self.lightning = True
            else:
                kind = _TORCH_MOD  # dropped in the ordered pass when Lightning's spans are present
        ext = args.ext
        ext = (ext if -_I64 <= ext < _I64 else -1) if ext.__class__ is int else _clamp(int_or(ext))
        self.records.add((ts, 0, -dur, seq, self._thread(ev), kind, n, ext, 0, 0, 0))

    def _device(self, args: EventArgs) -> int:
        label = memory_device(args)
        dev = self.dev_ix.get(label)
        if dev is None:
            dev = self.dev_ix[label] = len(self.devices)
            self.devices.append(_Device(label))
        with contextlib.suppress(TypeError):  # an unhashable device type or id: not cached
            self.dev_of[args.device_type, args.device_id] = dev
        return dev

    def _memory(self, ev: Event, args: EventArgs, ts: float) -> None:
        raw = args.nbytes
        if raw.__class__ is not int:
            self.fields.seen("Bytes", raw, number(raw) is not None)
        for key, v in (("Total Allocated", args.allocated), ("Total Reserved", args.reserved)):
            if v.__class__ is not int and v is not None:
                self.fields.seen(key, v, number(v) is not None)
        nbytes = _clamp(int_or(raw, 0))
        if nbytes == 0:
            return
        try:
            dev = self.dev_of[args.device_type, args.device_id]
        except (KeyError, TypeError):
            dev = self._device(args)
        j = self.mem_index
        self.mem_index += 1
        addr, allocated, reserved = args.addr, args.allocated, args.reserved
        self.records.add(
            (
                ts, 1, 0.0, j, self._thread(ev), 0, dev,
                (addr if addr.__class__ is int else int_or(addr, 0)) % (1 << 63),
                nbytes,
                _clamp(allocated if allocated.__class__ is int else int_or(allocated, 0)),
                _clamp(reserved if reserved.__class__ is int else int_or(reserved, 0)),
            )
        )  # fmt: skip

    # -- the per-thread sweep (as profiler_ops.nest, one item at a time) -------------------

    def _close(self, th: _Thread, t: float, what: int) -> None:
        stack = th.stack
        closed = self.closed
        while stack and stack[-1][3] <= t and not (what == 1 and stack[-1][3] == t):
            e = stack.pop()
            kind = e[0]
            if kind == _WRAPPER:
                self.wrapper_calls += 1
                self.wrapper_self_us += max(0.0, e[2] - e[4])
                continue
            closed.key.append(2 * e[1] + (kind != _OP))
            closed.dur.append(e[2])
            closed.child.append(e[4])
        if len(closed.key) >= _CHUNK:
            closed.fold()

    def _where(
        self, ops: tuple[int, ...], mods: tuple[int, ...]
    ) -> tuple[int, int, tuple[int, tuple[int, ...]]]:
        """A memory event's place under open operators ``ops`` and modules ``mods`` (innermost
        first): its call path's id, the label of its pair, the key its bytes are summed under."""
        names = tuple(dict.fromkeys(ops))
        sid = self.stack_ids.get(names)
        if sid is None:
            sid = self.stack_ids[names] = len(self.stack_ids)
        label = -1
        if ops:
            inner = self.names[ops[0]]
            label = (
                self.intern(f"{self.names[ops[1]]} ({inner})")
                if inner in FACTORIES and len(ops) > 1
                else ops[0]
            )
        return sid, label, (sid, mods)

    def _spread(self) -> None:
        """Each device's memory, summed per call path and module chain, to its operators
        (``self``: the innermost), the device's statistics and the modules."""
        stacks = list(self.stack_ids)
        for d in self.devices:
            for (sid, mods), (b, count, size) in d.acc.items():
                for k, n in enumerate(stacks[sid]):
                    r = self.ops.get(n)
                    if r is None:
                        r = self.ops[n] = OpRow(self.names[n])
                    st = d.stats.get(n)
                    if st is None:
                        st = d.stats[n] = MemStat(self.names[n])
                    r.increase += b
                    st.increase += b
                    r.alloc_bytes += size
                    st.alloc_count += count
                    st.alloc_size += size
                    if k == 0:
                        r.self_increase += b
                        st.self_increase += b
                        r.self_alloc_bytes += size
                        st.self_alloc_count += count
                        st.self_alloc_size += size
                for k, mn in enumerate(mods):
                    m = self.mods.get(mn)
                    if m is None:
                        m = self.mods[mn] = OpRow(module_name(self.names[mn]))
                    m.increase += b
                    m.alloc_bytes += size
                    if k == 0:
                        m.self_increase += b
                        m.self_alloc_bytes += size
            d.acc.clear()

    # -- per device, in time order ----------------------------------------------------------

    def _pair(self, d: _Device, label: int, size: int, alloc: float | None, release: float | None) -> None:
        emitted = d.emitted
        d.emitted = emitted + 1
        d.pair_count += 1
        pairs = d.pairs
        full = len(pairs) >= PAIRS_KEPT
        if full and size < pairs[0][0]:  # smaller than every kept pair: not kept
            return
        # The pair's place in the table's order (by allocation time, unpaired releases last,
        # then in the order the pairs were made), negated so that the heap's root is the
        # pair shown last.
        order = (
            -(alloc is None),
            -(alloc or 0.0),
            -(float("-inf") if release is None else release),
            -emitted,
        )
        entry = (size, order, label, alloc, release)
        if not full:
            heapq.heappush(pairs, entry)
        elif entry > pairs[0]:
            heapq.heapreplace(pairs, entry)


def summarise(path: str | Path, probes: dict[str, list[float]] | None = None) -> Summary:
    """Read ``path`` once and fold it into every view's figures.

    ``probes``: per device label (``CPU``, ``GPU0``), trace times (µs) at which to read the
    allocated bytes (:attr:`Summary.allocated_at`), after every event at or before each.

    Raises:
        ArtifactError: the file is missing, unreadable, or holds no ``traceEvents``.
    """
    p = Path(path)
    rank, base = checked_header(p)
    r = _Reader(p)
    r.probes = probes or {}
    try:
        r.read()
        return _summary(r, p, rank, base)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise ArtifactError(
            f"{p}: no space left in {tempfile.gettempdir()} for the trace reader's temporary files "
            f"(this trace needs about {_space_needed(p) / 2**20:,.0f} MiB there); set TMPDIR to a folder "
            "with room"
        ) from None
    finally:
        r.close()


def _space_needed(p: Path) -> int:
    """About what the reader's temporary files take for trace ``p``: some 120 bytes for each
    event of about 300 bytes of JSON (a gzipped trace's size read from its trailer, which holds
    it modulo 4 GiB, or taken as ten times the file)."""
    size = p.stat().st_size
    with open(p, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            f.seek(-4, os.SEEK_END)
            trailer = int.from_bytes(f.read(4), "little")
            size = trailer if trailer >= size else 10 * size
    return max(2**20, size * 2 // 5)


def _summary(r: _Reader, p: Path, rank: int | None, base: int) -> Summary:
    if r.events == 0:
        raise ArtifactError(
            f"{p}: its traceEvents list is empty (no event to show); pass a trace written by torch.profiler"
        )
    out = Summary(path=p, rank=rank, base_ns=base, events=r.events, names=r.names)
    out.start = 0.0 if r.start == float("inf") else r.start
    out.has_device_time = r.any_device
    _device_time(r)
    out.ops = sorted(r.ops.values(), key=lambda x: (-x.host_self_us, x.name))
    for n, counts in r.shapes.items():
        r.ops[n].shapes = [(r.names[s], c) for s, c in counts.most_common(3)]
    out.modules = sorted(r.mods.values(), key=lambda x: (-x.host_total_us, x.name))
    out.devices = [_device_view(r, d, out.start) for d in r.devices]
    out.steps = _steps(r, out.start)
    out.rank_row = _rank_row(rank or 0, r, out.steps, out.start)
    out.allocated_at = r.allocated_at
    out.wrapper_calls, out.wrapper_self_us = r.wrapper_calls, r.wrapper_self_us
    out.notes = r.fields.lines(p)
    return out


def _device_time(r: _Reader) -> None:
    """Give each kernel's time to the operator with its ``External id`` (the first one read).

    Both sides come back from their temporary files in batches of :data:`_JOIN` kernels, so
    that the join holds one batch (and one chunk of operators) at a time.
    """
    chain_time = np.zeros(len(r.chains))
    batch: list[tuple[Any, Any]] = []
    for ext, dur in zip(r.kernel_ext.read(), r.kernel_dur.read(), strict=True):
        batch.append((np.frombuffer(ext, dtype=np.int64), np.frombuffer(dur, dtype=np.float64)))
        if sum(len(e) for e, _ in batch) >= _JOIN:
            _join(r, batch, chain_time)
            batch = []
    if batch:
        _join(r, batch, chain_time)
    for (ops, mods), dur in zip(r.chains, chain_time.tolist(), strict=True):
        if not dur:
            continue
        r.ops[ops[0]].device_self_us += dur
        for n in ops:
            r.ops[n].device_total_us += dur
        for k, n in enumerate(mods):
            if k == len(mods) - 1:
                r.mods[n].device_self_us += dur
            r.mods[n].device_total_us += dur


def _join(r: _Reader, batch: list[tuple[Any, Any]], chain_time: Any) -> None:
    ext = np.concatenate([e for e, _ in batch])
    dur = np.concatenate([d for _, d in batch])
    uniq, inv = np.unique(ext, return_inverse=True)
    total = np.bincount(inv, weights=dur, minlength=len(uniq))
    first = np.full(len(uniq), np.iinfo(np.int64).max, dtype=np.int64)
    chain = np.full(len(uniq), -1, dtype=np.int64)
    # (External id, file order, chain) of each operator; the operator read first wins, as in
    # the held path: its file order in a first pass, its chain in a second.
    for second in (False, True):
        for rows in r.ext.read():
            a = np.frombuffer(rows, dtype=np.int64).reshape(-1, 3)
            pos = np.searchsorted(uniq, a[:, 0])
            hit = pos < len(uniq)
            hit[hit] = uniq[pos[hit]] == a[hit, 0]
            pos, a = pos[hit], a[hit]
            if second:
                won = a[:, 1] == first[pos]
                chain[pos[won]] = a[won, 2]
            else:
                np.minimum.at(first, pos, a[:, 1])
    ok = chain >= 0
    np.add.at(chain_time, chain[ok], total[ok])


def _ms(start: float, ts: float) -> float:
    return round((ts - start) / 1000.0, 6)


def _device_view(
    r: _Reader, d: _Device, start: float
) -> tuple[DeviceMemory, list[MemPair], int, list[MemStat], dict[str, Any] | None]:
    for lab, size, a in d.open.values():
        r._pair(d, lab, size, a, None)
    d.open.clear()
    curve, bins, groups = _read_curve(
        d, start, binned=d.kept is None, probes=r.probes.get(d.label, []), found=r.allocated_at
    )
    dm = DeviceMemory(
        device=d.label,
        curve=curve,
        peak_allocated=d.peak[0],
        peak_ms=_ms(start, d.peak[1]),
        peak_reserved=d.peak_reserved,
        events=[(_ms(start, t), b, j) for t, b, j, _ in d.kept] if d.kept is not None else [],
        event_count=d.count,
    )

    def label(i: int) -> str:
        return "-" if i < 0 else r.names[i]

    kept = sorted(d.pairs, key=lambda e: e[1], reverse=True)
    pairs = [
        MemPair(
            label(lab),
            size,
            None if a is None else _ms(start, a),
            None if rel is None else _ms(start, rel),
        )
        for size, _, lab, a, rel in kept
    ]
    stats = sorted(d.stats.values(), key=lambda s: (-s.increase, -s.alloc_size, s.name))
    for s in stats:
        row = r.ops.get(r.ix[s.name])
        s.calls = row.calls if row is not None else 0
    stacks_of = list(r.stack_ids)
    names: dict[int, int] = {}
    stacks: dict[int, int] = {}

    def stack(sid: int) -> int:
        k = stacks.get(sid)
        if k is None:
            for n in stacks_of[sid]:
                names.setdefault(n, len(names))
            k = stacks[sid] = len(stacks)
        return k

    out: dict[str, Any]
    if d.kept is not None and d.pair_count == len(pairs):
        out = {"events": [[_ms(start, t), b, stack(sid)] for t, b, _, sid in d.kept]}
        times: dict[int, list[float]] = {names[n]: [] for n in names}
        for ts, k in _calls(r, names):
            for key, at in zip(k.tolist(), _ms_list(start, ts), strict=True):
                times[key].append(at)
        out["calls"] = [sorted(times[k]) for k in range(len(names))]
    elif groups is not None:
        out = {
            "bins": bins,
            "groups": [[g[0], stack(g[1]), g[2], g[3], g[4]] for g in groups],
            "pairs_total": d.pair_count,
        }
        out["calls"] = _call_slots(r, start, names, bins)
    else:
        return dm, pairs, d.pair_count, stats, None
    rdata = {
        "names": [r.names[n] for n in names],
        "stacks": [[names[n] for n in stacks_of[sid]] for sid in stacks],
        **out,
        "pairs": [[p.op, p.size, p.alloc_ms, p.release_ms] for p in pairs],
    }
    return dm, pairs, d.pair_count, stats, rdata


def _calls(r: _Reader, names: dict[int, int]) -> Iterator[tuple[Any, Any]]:
    """Per chunk of operator calls, back from the temporary file: the times (µs, numpy) of the
    calls of the operators in ``names`` and their index there."""
    index = np.full(len(r.names), -1, dtype=np.int64)
    if names:
        index[list(names)] = list(names.values())
    for chunk in r.calls.read():
        a = np.frombuffer(chunk, dtype=np.float64)
        k = index[a[1::2].astype(np.int64)]
        keep = k >= 0
        yield a[0::2][keep], k[keep]


def _ms_list(start: float, ts: Any) -> list[float]:
    """:func:`_ms` of each time of numpy array ``ts`` (Python's correctly rounded ``round``,
    which numpy's does not match to the bit)."""
    return [round(x, 6) for x in ((ts - start) / 1000.0).tolist()]


def _call_slots(
    r: _Reader, start: float, names: dict[int, int], bins: list[list[float]]
) -> list[list[list[int]]]:
    """Per page name: ``[slot, calls]``; slot ``2i`` is inside bin ``i`` (between its first and
    last event), ``2i + 1`` between bins ``i`` and ``i + 1``, -1 before the first bin."""
    firsts = np.array([b[0] for b in bins], dtype=np.float64)
    lasts = np.array([b[1] for b in bins], dtype=np.float64)
    counts: Counter[tuple[int, int]] = Counter()
    for ts, k in _calls(r, names):
        t = np.array(_ms_list(start, ts), dtype=np.float64)
        i = np.searchsorted(firsts, t, side="right") - 1
        inside = t <= lasts[np.maximum(i, 0)]
        slot = np.where(i < 0, -1, np.where(inside, 2 * i, 2 * i + 1))
        pairs, n = np.unique(np.stack([k, slot], axis=1), axis=0, return_counts=True)
        for (key, at), c in zip(pairs.tolist(), n.tolist(), strict=True):
            counts[key, at] += c
    out: list[list[list[int]]] = [[] for _ in names]
    for (name, at), c in sorted(counts.items()):
        out[name].append([at, c])
    return out


def _read_curve(
    d: _Device,
    start: float,
    binned: bool,
    probes: Sequence[float] = (),
    found: dict[tuple[str, float], int] | None = None,
) -> tuple[list[tuple[float, int, int]], list[list[float]], list[list[int]] | None]:
    """The curve back from its temporary files, thinned as ``profiler_memory._thin`` does;
    when ``binned``, also the events in about :data:`RANGE_BINS` bins (``[first ms, last ms]``;
    events at the same time share a bin) and per bin and call path ``[bin, path, bytes,
    allocation count, allocation size]`` (``None`` past :data:`RANGE_GROUPS`)."""
    size = 1 if d.count <= CURVE_POINTS else -(-d.count // CURVE_POINTS)
    bsize = -(-d.count // RANGE_BINS)
    out: list[tuple[float, int, int]] = []
    best: tuple[float, int, int] | None = None
    k = 0
    bins: list[list[float]] = []
    groups: list[list[int]] | None = [] if binned else None
    cur: dict[int, list[int]] = {}
    in_bin = 0
    for times, values in zip(d.times.read(), d.curve.read(), strict=True):
        if probes and found is not None and len(times):
            at = np.searchsorted(np.frombuffer(times, dtype=np.float64), probes, side="right") - 1
            for probe, i in zip(probes, at.tolist(), strict=True):
                if i >= 0:
                    found[d.label, probe] = values[4 * i]
        for i, ts in enumerate(times):
            t = _ms(start, ts)
            p = (t, values[4 * i], values[4 * i + 1])
            if best is None or p[1] > best[1]:
                best = p
            k += 1
            if k == size:
                out.append(best)
                best, k = None, 0
            if groups is None:
                continue
            if not bins or (in_bin >= bsize and t != bins[-1][1]):
                _flush(groups, cur, len(bins) - 1)
                bins.append([t, t])
                in_bin = 0
            bins[-1][1] = t
            in_bin += 1
            b, sid = values[4 * i + 2], values[4 * i + 3]
            g = cur.get(sid)
            if g is None:
                g = cur[sid] = [0, 0, 0]
            g[0] += b
            if b > 0:
                g[1] += 1
                g[2] += b
            if len(groups) > RANGE_GROUPS:
                groups = None
    if best is not None:
        out.append(best)
    if groups is not None:
        _flush(groups, cur, len(bins) - 1)
        if len(groups) > RANGE_GROUPS:
            groups = None
    return out, bins, groups


def _flush(groups: list[list[int]], cur: dict[int, list[int]], b: int) -> None:
    groups.extend([b, sid, *g] for sid, g in cur.items())
    cur.clear()


def _merged(starts: Any, ends: Any) -> tuple[Any, Any]:
    """The union of intervals (touching ones merged, empty ones dropped), sorted."""
    s, e = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    keep = e > s
    s, e = s[keep], e[keep]
    if not len(s):
        return s, e
    order = np.lexsort((e, s))
    s, e = s[order], e[order]
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > np.maximum.accumulate(e)[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def _bounds(label: int, spans: Iterable[tuple[float, float]]) -> Iterator[tuple[float, int, int]]:
    for s, e in spans:
        yield s, 1, label
        yield e, -1, label


def _segments(streams: list[tuple[int, _Intervals]]) -> Iterator[tuple[float, float, list[int]]]:
    """Sweep the streams' boundaries in time order: each stretch ``(a, b, counts)`` between two
    boundaries, with ``counts[label]`` the streams of that label covering it."""
    counts = [0] * (max((lab for lab, _ in streams), default=-1) + 1)
    prev = None
    active = 0
    for t, d, lab in heapq.merge(*(_bounds(lab, u.stream()) for lab, u in streams)):
        if active and prev is not None and t > prev:
            yield prev, t, counts
        counts[lab] += d
        active += d
        prev = t


class _Windows:
    """Overlap of a stretch with sorted windows (by bisection when they do not overlap)."""

    def __init__(self, windows: list[tuple[float, float]]) -> None:
        self.s = [w[0] for w in windows]
        self.e = [w[1] for w in windows]
        self.disjoint = all(self.e[k] <= self.s[k + 1] for k in range(len(windows) - 1))

    def overlaps(self, a: float, b: float) -> Iterator[tuple[int, float]]:
        k = bisect_right(self.e, a) if self.disjoint else 0
        while k < len(self.s) and self.s[k] < b:
            lo, hi = max(a, self.s[k]), min(b, self.e[k])
            if hi > lo:
                yield k, hi - lo
            k += 1


def _steps(r: _Reader, start: float) -> list[StepRow]:
    """As :func:`memprofiler.analysis.traces.steps.steps`, in one sweep over the busy
    periods: each stretch goes to the first category (in priority order) busy in it."""
    windows = sorted(r.step_windows or [("whole trace", start, max(r.end, start))], key=lambda w: w[1])
    host = len(STEP_PARTS) - 2
    streams = [(KERNEL, r.compute_kernels), (KERNEL, r.comm_kernels)]
    streams += [(k, r.device_kind[k]) for k in (MEMCPY, MEMSET)] + [(3, r.runtime), (4, r.loading)]
    streams += [(host, u) for th in r.thread_list for u in (th.ops, th.comm)]
    parts = [[0.0] * (len(STEP_PARTS) - 1) for _ in windows]
    win = _Windows([(s, e) for _, s, e in windows])
    for a, b, counts in _segments(streams):
        first = next(k for k, c in enumerate(counts) if c)
        for w, length in win.overlaps(a, b):
            parts[w][first] += length
    out = []
    for (name, s, e), mine in zip(windows, parts, strict=True):
        row = dict(zip(STEP_PARTS, mine, strict=False))
        row["other"] = (e - s) - sum(mine)
        out.append(StepRow(name, e - s, row))
    return out


def _rank_row(rank: int, r: _Reader, step_rows: list[StepRow], start: float) -> RankRow:
    """As :func:`memprofiler.analysis.traces.steps.rank_row`, in one sweep: computation is
    a thread's operators outside its own collectives (on the device: kernels other than
    collectives), communication any collective."""
    threads = r.thread_list
    if r.any_device:
        source = "device"
        streams = [(0, r.compute_kernels), (1, r.comm_kernels)]
    else:
        source = "host"
        streams = [(2 * k + j, u) for k, th in enumerate(threads) for j, u in enumerate((th.ops, th.comm))]
    steps = [(s, e) for _, s, e in r.step_windows] or [(start, start + sum(x.total_us for x in step_rows))]
    ws, we = _merged([s for s, _ in steps], [e for _, e in steps])
    win = _Windows(list(zip(ws.tolist(), we.tolist(), strict=True)))
    c = m = o = 0.0
    for a, b, counts in _segments(streams):
        comp = (
            any(counts[k] and not counts[k + 1] for k in range(0, len(counts), 2))
            if source == "host"
            else counts[0] > 0
        )
        comm = any(counts[k] for k in range(1, len(counts), 2)) if source == "host" else counts[1] > 0
        if not (comp or comm):
            continue
        for _, length in win.overlaps(a, b):
            c += length if comp else 0.0
            m += length if comm else 0.0
            o += length if comp and comm else 0.0
    step_us = float(np.sum(we - ws))
    return RankRow(rank, source, step_us, c - o, m - o, o, max(0.0, step_us - (c + m - o)))
