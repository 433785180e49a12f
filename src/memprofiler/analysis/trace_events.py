"""Stream a PyTorch profiler (Kineto) Chrome trace into compact columns, held in memory.

A trace is read event by event with ``ijson`` (never ``json.load`` of the whole file, which
takes about ten times the file's size in memory); plain and gzipped files alike. Only the
events the profiler views use are kept, as typed arrays of about 50 bytes each:
host spans (operators, annotations, ``nn.Module`` spans, ``ProfilerStep#N``), device spans
(kernels, memcpy, memset), CUDA runtime calls and ``[memory]`` instant events. Python stack
frames (``with_stack``), usually the bulk of a trace, are dropped. Memory grows with the
trace: the views read it with :mod:`memprofiler.analysis.trace_stream` (bounded) and come
here only for a trace too far out of time order to stream.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ijson

from memprofiler.analysis.compressed import open_maybe_gzip
from memprofiler.errors import ArtifactError

#: Names of the trace files the views read: the extended profiler's and ``tensorboard_trace_handler``'s.
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")

#: Host span kinds.
OP, ANNOTATION, MODULE, STEP = 0, 1, 2, 3
#: Device span kinds.
KERNEL, MEMCPY, MEMSET = 0, 1, 2
_DEVICE_CATS = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET}
#: c10 ``DeviceType`` numbers a ``[memory]`` event's ``Device Type`` holds.
_DEVICE_TYPES = {0: "CPU", 1: "GPU", 12: "XPU", 13: "MPS", 20: "PrivateUse1"}
#: Lightning's annotations in a trace: each profiler action, and each module's forward
#: (``record_module_names``). Lightning's private naming: ``tests/lightning/test_compat.py``
#: checks these equal ``memprofiler.lightning._compat``'s (this package does not import Lightning).
LIGHTNING_ACTION_PREFIX = "[pl][profile]"
LIGHTNING_MODULE_PREFIX = "[pl][module]"
#: Lightning's module spans and torch's (``with_modules`` / ``with_stack``).
MODULE_PREFIXES = (LIGHTNING_MODULE_PREFIX, "nn.Module: ")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"_rank_(\d+)\.")
_RANK_IN_HEADER = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
_BASE_IN_HEADER = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')


def _ints() -> array[int]:
    return array("q")


def _floats() -> array[float]:
    return array("d")


@dataclass
class HostSpans:
    """Operators, annotations, modules and steps on the host: one entry per ``X`` event."""

    ts: array[float] = field(default_factory=_floats)
    dur: array[float] = field(default_factory=_floats)
    thread: array[int] = field(default_factory=_ints)
    name: array[int] = field(default_factory=_ints)
    kind: array[int] = field(default_factory=lambda: array("b"))
    ext: array[int] = field(default_factory=_ints)
    """``External id`` (links an operator to the kernels it launched); -1 when absent."""
    shapes: array[int] = field(default_factory=_ints)
    """Index of the ``Input Dims`` text in :attr:`Trace.names`; -1 when not recorded."""


@dataclass
class DeviceSpans:
    """Kernels, memcpy and memset on a device."""

    ts: array[float] = field(default_factory=_floats)
    dur: array[float] = field(default_factory=_floats)
    kind: array[int] = field(default_factory=lambda: array("b"))
    ext: array[int] = field(default_factory=_ints)
    comm: array[int] = field(default_factory=lambda: array("b"))
    """1 for a collective (NCCL/RCCL) kernel."""


@dataclass
class MemoryEvents:
    """``[memory]`` instant events: one allocation (bytes > 0) or release (bytes < 0) each."""

    ts: array[float] = field(default_factory=_floats)
    thread: array[int] = field(default_factory=_ints)
    nbytes: array[int] = field(default_factory=_ints)
    addr: array[int] = field(default_factory=_ints)
    device: array[int] = field(default_factory=_ints)
    """Index into :attr:`Trace.devices`."""
    allocated: array[int] = field(default_factory=_ints)
    reserved: array[int] = field(default_factory=_ints)


@dataclass
class Trace:
    """One trace file, in columns."""

    path: Path
    rank: int | None
    names: list[str] = field(default_factory=list)
    host: HostSpans = field(default_factory=HostSpans)
    device: DeviceSpans = field(default_factory=DeviceSpans)
    runtime: tuple[array[float], array[float]] = field(default_factory=lambda: (_floats(), _floats()))
    """``(ts, dur)`` of CUDA runtime and driver calls."""
    memory: MemoryEvents = field(default_factory=MemoryEvents)
    devices: list[str] = field(default_factory=list)
    """Memory devices in order of appearance: ``CPU``, ``GPU0``..."""
    events: int = 0
    """Every event read, kept or not."""
    start: float = 0.0
    """Earliest timestamp (µs) of any event read: the views' time zero."""
    base_ns: int = 0
    """``baseTimeNanoseconds``: add it (as µs) to a timestamp for the wall clock torch's memory
    profiler uses; 0 when the trace does not say."""
    modules_from_lightning: bool = False
    """Whether Lightning's ``[pl][module]`` spans are present (then torch's ``nn.Module:`` spans,
    the same modules under other names, are left out of the module view)."""
    _ix: dict[str, int] = field(default_factory=dict, repr=False)
    _threads: dict[tuple[Any, Any], int] = field(default_factory=dict, repr=False)

    def intern(self, text: str) -> int:
        i = self._ix.get(text)
        if i is None:
            i = self._ix[text] = len(self.names)
            self.names.append(text)
        return i

    def thread_of(self, pid: Any, tid: Any) -> int:
        return self._threads.setdefault((pid, tid), len(self._threads))

    @property
    def has_memory(self) -> bool:
        return len(self.memory.ts) > 0


def is_trace_file(path: str | Path) -> bool:
    """Whether ``path`` is named as a profiler trace (``*.pt.trace.json`` or ``.gz``)."""
    return str(path).endswith(TRACE_SUFFIXES)


def find_traces(root: Path) -> list[Path]:
    """Every profiler trace under ``root`` (recursively), sorted by path."""
    return sorted(p for p in root.rglob("*.pt.trace.json*") if is_trace_file(p) and p.is_file())


def _header(path: Path) -> tuple[int | None, int]:
    """Rank and ``baseTimeNanoseconds``: Kineto writes both before ``traceEvents``, so the
    first 64 KiB hold them when present; the rank in the file name wins."""
    with open_maybe_gzip(path) as f:
        head = f.read(65536)
    rank = _RANK_IN_NAME.search(path.name) or _RANK_IN_HEADER.search(head)
    base = _BASE_IN_HEADER.search(head)
    return (int(rank.group(1)) if rank else None), (int(base.group(1)) if base else 0)


def checked_header(p: Path) -> tuple[int | None, int]:
    """The rank and ``baseTimeNanoseconds`` of trace file ``p`` (see :func:`_header`).

    Raises:
        ArtifactError: the file is missing or unreadable.
    """
    if not p.is_file():
        raise ArtifactError(f"{p}: no such trace file; pass a *.pt.trace.json[.gz] the profiler wrote")
    try:
        return _header(p)
    except (OSError, EOFError) as err:
        raise ArtifactError(f"{p}: not a readable profiler trace ({err})") from None


def iter_events(path: Path) -> Iterator[dict[str, Any]]:
    """Each entry of ``traceEvents``, parsed one at a time.

    Raises:
        ArtifactError: the file is unreadable or not a JSON trace.
    """
    try:
        with open_maybe_gzip(path) as f:
            yield from ijson.items(f, "traceEvents.item", use_float=True)
    except (OSError, EOFError, ijson.JSONError, UnicodeDecodeError) as err:
        raise ArtifactError(
            f"{path}: not a readable profiler trace ({err}); pass a *.pt.trace.json[.gz]"
        ) from None


def read_trace(path: str | Path) -> Trace:
    """Stream ``path`` into a :class:`Trace`.

    Raises:
        ArtifactError: the file is missing, unreadable, or holds no ``traceEvents``.

    Example:
        >>> t = read_trace("fit_rank_0.1.pt.trace.json")  # doctest: +SKIP
        >>> t.names[t.host.name[0]]
        'ProfilerStep#2'
    """
    p = Path(path)
    rank, base = checked_header(p)
    trace = Trace(path=p, rank=rank, base_ns=base)
    start = float("inf")
    for ev in iter_events(p):
        trace.events += 1
        ts = ev.get("ts")
        if not isinstance(ts, (int, float)):
            continue
        ph = ev.get("ph")
        if ph != "M" and ts < start:
            start = float(ts)
        if ph == "X":
            _add_span(trace, ev, float(ts))
        elif ph == "i" and ev.get("name") == "[memory]":
            _add_memory(trace, ev, float(ts))
    if trace.events == 0:
        raise ArtifactError(f"{p}: no traceEvents; pass a trace written by torch.profiler")
    trace.start = 0.0 if start == float("inf") else start
    trace.modules_from_lightning = any(n.startswith(LIGHTNING_MODULE_PREFIX) for n in trace.names)
    return trace


def _args(ev: dict[str, Any]) -> dict[str, Any]:
    a = ev.get("args")
    return a if isinstance(a, dict) else {}


def _int(v: Any, default: int = -1) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def _add_span(trace: Trace, ev: dict[str, Any], ts: float) -> None:
    cat = ev.get("cat")
    name = str(ev.get("name", ""))
    dur = float(ev["dur"]) if isinstance(ev.get("dur"), (int, float)) else 0.0
    if cat in _DEVICE_CATS:
        d = trace.device
        d.ts.append(ts)
        d.dur.append(dur)
        d.kind.append(_DEVICE_CATS[cat])
        d.ext.append(_int(_args(ev).get("External id")))
        low = name.lower()
        d.comm.append(1 if cat == "kernel" and ("nccl" in low or "rccl" in low) else 0)
        return
    if cat in ("cuda_runtime", "cuda_driver"):
        trace.runtime[0].append(ts)
        trace.runtime[1].append(dur)
        return
    if cat == "cpu_op":
        kind = OP
    elif cat == "user_annotation":
        kind = STEP if _STEP.match(name) else MODULE if name.startswith(MODULE_PREFIXES) else ANNOTATION
    elif cat == "python_function" and name.startswith("nn.Module: "):
        kind = MODULE
    else:
        return
    args = _args(ev)
    h = trace.host
    h.ts.append(ts)
    h.dur.append(dur)
    h.thread.append(trace.thread_of(ev.get("pid"), ev.get("tid")))
    h.name.append(trace.intern(name))
    h.kind.append(kind)
    h.ext.append(_int(args.get("External id")))
    dims = args.get("Input Dims")
    h.shapes.append(trace.intern(_shapes_text(dims)) if isinstance(dims, list) else -1)


def _shapes_text(dims: list[Any]) -> str:
    return "[" + ", ".join(str([_int(x, 0) for x in d]) if isinstance(d, list) else "[]" for d in dims) + "]"


def memory_device(args: dict[str, Any]) -> str:
    """The device of a ``[memory]`` event from its ``args``: ``CPU``, ``GPU0``, ``MPS0``..."""
    dtype, did = _int(args.get("Device Type"), 0), _int(args.get("Device Id"))
    label = _DEVICE_TYPES.get(dtype, f"device type {dtype} ")
    return label if dtype == 0 else f"{label}{max(did, 0)}"


def _add_memory(trace: Trace, ev: dict[str, Any], ts: float) -> None:
    args = _args(ev)
    nbytes = _int(args.get("Bytes"), 0)
    if nbytes == 0:
        return
    label = memory_device(args)
    try:
        dev = trace.devices.index(label)
    except ValueError:
        dev = len(trace.devices)
        trace.devices.append(label)
    m = trace.memory
    m.ts.append(ts)
    m.thread.append(trace.thread_of(ev.get("pid"), ev.get("tid")))
    m.nbytes.append(nbytes)
    # Addresses are unsigned 64-bit: fold them into the signed column.
    m.addr.append(_int(args.get("Addr"), 0) % (1 << 63))
    m.device.append(dev)
    m.allocated.append(_int(args.get("Total Allocated"), 0))
    m.reserved.append(_int(args.get("Total Reserved"), 0))
