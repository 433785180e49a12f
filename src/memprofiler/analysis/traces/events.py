"""A PyTorch profiler (Kineto) Chrome trace, event by event: where the files are, their
header (rank, base time), each ``traceEvents`` entry parsed on its own, with limits.

Never ``json.load`` of the whole file (about ten times the file's size in memory); plain and
gzipped files alike. :mod:`memprofiler.analysis.traces.stream` folds the events into the views.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import msgspec

from memprofiler.analysis.files.compressed import open_maybe_gzip
from memprofiler.errors import ArtifactError

#: Names of the trace files the views read: the extended profiler's and ``tensorboard_trace_handler``'s.
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")

#: Host span kinds.
OP, ANNOTATION, MODULE, STEP = 0, 1, 2, 3
#: Device span kinds.
KERNEL, MEMCPY, MEMSET = 0, 1, 2
DEVICE_CATS = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET}
#: c10 ``DeviceType`` numbers a ``[memory]`` event's ``Device Type`` holds.
_DEVICE_TYPES = {0: "CPU", 1: "GPU", 12: "XPU", 13: "MPS", 20: "PrivateUse1"}
#: Lightning's annotations in a trace: each profiler action, and each module's forward
#: (``record_module_names``). Lightning's private naming: ``tests/lightning/test_compat.py``
#: checks these equal ``memprofiler.lightning._compat``'s (this package does not import Lightning).
LIGHTNING_ACTION_PREFIX = "[pl][profile]"
LIGHTNING_MODULE_PREFIX = "[pl][module]"
#: Lightning's module spans and torch's (``with_modules`` / ``with_stack``).
MODULE_PREFIXES = (LIGHTNING_MODULE_PREFIX, "nn.Module: ")
#: ``cpu_op`` spans torch records around every operator a Python dispatch mode sees (a module
#: tracker's: ``track_module_mem``, ``track_fsdp_mem``): wrappers, not operators. The views
#: leave them out and count their own time apart.
DISPATCH_WRAPPERS = frozenset({"PythonDispatchMode"})
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"_rank_(\d+)\.")
_RANK_IN_HEADER = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
_BASE_IN_HEADER = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')
#: One event's text at most (torch's longest are a few KiB: an operator's ``Input Dims``).
MAX_EVENT_CHARS = 16 * 2**20
#: A trace's decompressed content at most (a 6M-event torch trace is about 2 GiB); the
#: environment variable :data:`MAX_TRACE_BYTES_ENV` (bytes) sets another.
MAX_TRACE_BYTES = 16 * 2**30
#: The environment variable that sets the decompressed size a trace may reach.
MAX_TRACE_BYTES_ENV = "MEMPROFILER_MAX_TRACE_BYTES"
#: A gzipped trace's decompressed content at most, as a multiple of the file's size, once past
#: :data:`RATIO_FROM` bytes: torch's traces compress about 10-20 times; gzip's ceiling is about
#: 1,030, which only a crafted file (a gzip bomb) comes near.
MAX_GZIP_RATIO = 200
#: Decompressed bytes below which :data:`MAX_GZIP_RATIO` is not applied.
RATIO_FROM = 256 * 2**20
#: A line on stderr each time this many more decompressed bytes have been read.
PROGRESS_EVERY = 2**30
#: Bytes of the top-level object read before ``traceEvents`` at most (torch writes a few KiB).
MAX_HEADER_BYTES = 64 * 2**20
#: Bytes (characters on the exact path) read at a time.
_BLOCK = 1 << 20
#: Characters from the end of the text within which a decoding error may be a cut word or number.
_TAIL = 16
_FIX_SOURCE = "the file was not written by torch.profiler or was edited; re-export it"


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


#: An operator without ``Input Dims``.
NO_DIMS = msgspec.Raw()


class EventArgs(msgspec.Struct, gc=False):
    """The ``args`` keys the views read (the others are skipped unparsed).

    ``dims`` is the raw JSON text of ``Input Dims`` (a list of lists, built once per distinct
    text by the reader instead of once per operator: building them was a third of the scan),
    or, from the exact path, the list itself.
    """

    ext: Any = msgspec.field(default=None, name="External id")
    dims: msgspec.Raw = msgspec.field(default=NO_DIMS, name="Input Dims")
    nbytes: Any = msgspec.field(default=None, name="Bytes")
    addr: Any = msgspec.field(default=None, name="Addr")
    allocated: Any = msgspec.field(default=None, name="Total Allocated")
    reserved: Any = msgspec.field(default=None, name="Total Reserved")
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")


class Event(msgspec.Struct, gc=False):
    """One ``traceEvents`` entry: the keys the views read, each as the file gives it."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: EventArgs | None = None


def _event(d: Any) -> Event | None:
    """A decoded entry as an :class:`Event` (``None`` for one that is not an object)."""
    if not isinstance(d, dict):
        return None
    a = d.get("args")
    args = None
    if isinstance(a, dict):
        g = a.get
        args = EventArgs(
            g("External id"), cast(msgspec.Raw, g("Input Dims", NO_DIMS)), g("Bytes"), g("Addr"),
            g("Total Allocated"), g("Total Reserved"), g("Device Type"), g("Device Id"),
        )  # fmt: skip
    g = d.get
    return Event(g("ph"), g("cat"), g("name"), g("pid"), g("tid"), g("ts"), g("dur"), args)


def iter_events(path: Path) -> Iterator[Event | None]:
    """Each entry of ``traceEvents`` as an :class:`Event` (``None`` for an entry that is not
    an object: a number or a string, for the caller to count and skip).

    Fast path: the decompressed bytes are read in blocks of :data:`_BLOCK`, cut after the last
    ``}, {`` between two events, and each cut decoded at once by ``msgspec`` into
    :class:`Event` (the keys the views do not read are skipped, not built). A cut that does not
    decode (a ``}, {`` inside an event, or a malformed file) and the last event go to the exact
    path: each event decoded on its own by the standard library's scanner, which names what is
    wrong. Limits, each one line (never a parser traceback, nor an exhausted memory): an event
    longer than :data:`MAX_EVENT_CHARS`, nested deeper than the JSON scanner's limit (Python's
    recursion limit, 1,000 levels by default), ``NaN`` / ``Infinity`` / out-of-range numbers,
    decompressed content longer than :data:`MAX_TRACE_BYTES`, a cut or corrupt gzip stream,
    text that is not UTF-8.

    Raises:
        ArtifactError: the file is unreadable, not a JSON trace, or past a limit.
    """
    fail = f"{path}: not a readable profiler trace"
    try:
        with open_maybe_gzip(path) as f:
            yield from _scan(_Limited(f, fail, path), fail)
    except (OSError, EOFError, zlib.error) as err:
        raise ArtifactError(f"{fail} ({_one_line(err)}); re-copy the file or re-export it") from None
    except UnicodeDecodeError:
        raise ArtifactError(f"{fail} (not UTF-8 text); {_FIX_SOURCE}") from None


def max_trace_bytes() -> int:
    """The decompressed size a trace may reach: :data:`MAX_TRACE_BYTES_ENV` when set, else
    :data:`MAX_TRACE_BYTES`.

    Raises:
        ArtifactError: the variable is set to something other than a positive whole number.
    """
    raw = os.environ.get(MAX_TRACE_BYTES_ENV, "").strip()
    if not raw:
        return MAX_TRACE_BYTES
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise ArtifactError(
            f"{MAX_TRACE_BYTES_ENV}={raw!r}: not a positive number of bytes; set it to a whole number "
            f"(the default is {MAX_TRACE_BYTES:,}) or unset it"
        )
    return value


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class _Limited(io.RawIOBase):
    """Bytes of ``f``, with the bytes taken back by :meth:`unread` first; past
    :func:`max_trace_bytes` in all (or, for a gzipped file, past :data:`MAX_GZIP_RATIO` times
    its size), an :class:`ArtifactError`; a line on stderr every :data:`PROGRESS_EVERY` bytes."""

    def __init__(self, f: IO[bytes], fail: str, path: Path | None = None) -> None:
        self.f, self.fail, self.total, self.head = f, fail, 0, b""
        self.path = path
        self.limit = max_trace_bytes()
        self.next_progress = PROGRESS_EVERY
        compressed = path.stat().st_size if path is not None and isinstance(f, gzip.GzipFile) else 0
        self.ratio_cap = max(RATIO_FROM, MAX_GZIP_RATIO * compressed) if compressed else 0

    def readable(self) -> bool:
        return True

    def unread(self, data: bytes) -> None:
        self.head = data + self.head

    def read(self, n: int = -1) -> bytes:
        if self.head:
            out, self.head = self.head[:n], self.head[n:]
            return out
        out = self.f.read(n)
        self.total += len(out)
        if self.total > self.limit:
            raise ArtifactError(
                f"{self.fail} (longer than {self.limit:,} bytes decompressed, the reader's limit "
                f"MAX_TRACE_BYTES; a gzip bomb? to read a larger trace set {MAX_TRACE_BYTES_ENV} to its size "
                "in bytes)"
            )
        if self.ratio_cap and self.total > self.ratio_cap:
            raise ArtifactError(
                f"{self.fail} (expands past {self.ratio_cap:,} bytes, {MAX_GZIP_RATIO} times the gzip file's "
                "size, the reader's limit MAX_GZIP_RATIO: a gzip bomb, not a profiler trace); "
                "re-export it, or pass the trace decompressed"
            )
        if self.total >= self.next_progress:
            self.next_progress += PROGRESS_EVERY
            print(
                f"memprofiler: {self.path}: {_size(self.total)} read (the limit: {_size(self.limit)}, "
                f"{MAX_TRACE_BYTES_ENV})",
                file=sys.stderr,
                flush=True,
            )
        return out

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


class _NotFinite(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NotFinite(name)


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _NotFinite(text)
    return v


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
_EVENTS = msgspec.json.Decoder(list[Event])
_GAP = re.compile(r"[ \t\n\r]*(,?)[ \t\n\r]*")
#: What moves the depth of the top-level scan, or starts a string.
_TOKEN = re.compile(rb'["{}\[\]]')
#: The rest of a JSON string after its opening quote.
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*"', re.S)
#: After a key: its ':' and a list's '['.
_KEY_LIST = re.compile(rb"[ \t\n\r]*:[ \t\n\r]*\[")
#: Between two events: the end of one, a comma, the start of the next.
_SEP = re.compile(rb"\}[ \t\n\r]*,[ \t\n\r]*\{")


def _open_events(f: _Limited, fail: str) -> tuple[bytes, int]:
    """The bytes read so far and where the top-level ``traceEvents`` list's items start.

    Only a key of the top-level object counts: a ``traceEvents`` nested in another value
    (``deviceProperties``, an event's ``args``) is skipped with that value, strings included.
    """
    buf = f.read(_BLOCK)
    pos = depth = 0
    done = False
    nothing = f"{fail} (no top-level traceEvents list); pass a trace written by torch.profiler"
    while True:
        m = _TOKEN.search(buf, pos)
        if m is not None and m.group() != b'"':
            depth += 1 if m.group() in b"{[" else -1
            pos = m.end()
            if depth <= 0:
                raise ArtifactError(nothing)
            continue
        if m is not None:
            e = _STRING_REST.match(buf, m.end())
            # a key needs its ':' and '[' after it: read on when they may be in the next block
            if e is not None and (done or depth != 1 or len(buf) - e.end() >= 64):
                if depth == 1 and buf[m.end() : e.end() - 1] == b"traceEvents":
                    k = _KEY_LIST.match(buf, e.end())
                    if k is not None:
                        return buf, k.end()
                pos = e.end()
                continue
        if done:
            raise ArtifactError(nothing)
        if f.total > MAX_HEADER_BYTES:
            raise ArtifactError(
                f"{fail} (no top-level traceEvents list in the first {MAX_HEADER_BYTES:,} bytes, the "
                "reader's limit MAX_HEADER_BYTES); pass a trace written by torch.profiler"
            )
        keep = m.start() if m is not None else len(buf)  # a token boundary: the state holds there
        more = f.read(_BLOCK)
        done = not more
        buf = buf[keep:] + more
        pos = 0


def _scan(f: _Limited, fail: str) -> Iterator[Event | None]:
    buf, pos = _open_events(f, fail)
    done = False
    while True:
        if not done and len(buf) - pos < _BLOCK:
            more = f.read(_BLOCK)
            done = not more
            buf = buf[pos:] + more
            pos = 0
        cut = _last_separator(buf, pos)
        if cut < 0:
            break
        try:
            events = _EVENTS.decode(b"[" + buf[pos : cut + 1] + b"]")
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            break  # the exact path says what is wrong, or reads what the cut got wrong
        yield from events
        pos = buf.index(b"{", cut + 1)
    f.unread(buf[pos:])
    with io.TextIOWrapper(io.BufferedReader(f), encoding="utf-8") as text:
        yield from _scan_exact(text, fail)


def _last_separator(buf: bytes, pos: int) -> int:
    """Where the last ``}`` of a ``}, {`` at or after ``pos`` is (searched in the last 64 KiB
    first), or -1."""
    for lo in (max(pos, len(buf) - 65536), pos):
        last = None
        for last in _SEP.finditer(buf, lo):  # noqa: B007  # the last one is wanted
            pass
        if last is not None:
            return last.start()
        if lo == pos:
            break
    return -1


def _scan_exact(f: IO[str], fail: str) -> Iterator[Event | None]:
    """The events from the start of one (or the gap before one) to the end of ``traceEvents``."""
    buf = f.read(_BLOCK)
    pos = base = 0  # base: characters of this text before buf[0]
    decode = _DECODER.raw_decode
    gap = _GAP.match
    comma = True  # the next event may start: first, or a ',' came after the last one
    while True:
        g = gap(buf, pos)
        assert g is not None  # every part of the pattern is optional
        p = g.end()
        if g.group(1):
            comma = True
        if p == len(buf):  # the gap runs to the end of the block: read on
            more = f.read(_BLOCK)
            if not more:
                raise ArtifactError(
                    f"{fail} (cut short: traceEvents never closes); re-copy the file or re-export it"
                )
            base += pos
            buf = buf[pos:] + more
            pos = 0
            continue
        if buf[p] == "]":
            return
        if not comma:
            raise ArtifactError(
                f"{fail} (no ',' between events at character {base + p:,} of the events); {_FIX_SOURCE}"
            )
        try:
            ev, end = decode(buf, p)
        except _NotFinite as err:
            raise ArtifactError(
                f"{fail} ({err} is not JSON: numbers must be finite); {_FIX_SOURCE}"
            ) from None
        except RecursionError:
            raise ArtifactError(
                f"{fail} (an event nested deeper than the JSON scanner's limit, Python's recursion limit "
                f"of {sys.getrecursionlimit():,} levels); {_FIX_SOURCE}"
            ) from None
        except json.JSONDecodeError as err:
            where = f"{err.msg} at character {base + err.pos:,} of the events"
            # The scanner stopped before the end of the text it has, in a way more text cannot
            # change (an unterminated string reports where it starts; a cut word or number ends
            # within a few characters of the end): the event is not JSON.
            if err.pos < len(buf) - _TAIL and not err.msg.startswith("Unterminated string"):
                raise ArtifactError(f"{fail} (not JSON: {where}); {_FIX_SOURCE}") from None
            if len(buf) - p > MAX_EVENT_CHARS:
                raise ArtifactError(
                    f"{fail} ({where}: not JSON, or an event longer than {MAX_EVENT_CHARS:,} characters, "
                    f"the reader's limit MAX_EVENT_CHARS); {_FIX_SOURCE}"
                ) from None
            more = f.read(max(_BLOCK, len(buf) - p))  # doubling: a long event takes few retries
            if not more:
                raise ArtifactError(
                    f"{fail} ({where}: cut short); re-copy the file or re-export it"
                ) from None
            base += p
            buf = buf[p:] + more
            pos = 0
            continue
        comma = False
        pos = end
        yield _event(ev)


def number(v: Any) -> float | int | None:
    """A trace field's number: an ``int`` or ``float`` as it is, a string holding a finite
    number converted (as Chrome's and Perfetto's trace viewers read ``"ts": "12.5"``); ``None``
    for anything else (``True``, a list, ``"late"``, ``"nan"``)."""
    if v.__class__ is bool:
        return None
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, str) and len(v) < 64:
        t = v.strip()
        try:
            return int(t)
        except ValueError:
            pass
        try:
            f = float(t)
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


def int_or(v: Any, default: int = -1) -> int:
    n = number(v)
    if n is None:
        return default
    try:
        return int(n)
    except (OverflowError, ValueError):
        return default


def dims_list(dims: Any) -> list[Any] | None:
    """An operator's ``Input Dims`` (:attr:`EventArgs.dims`) as a list, ``None`` when they are
    not one.

    Raises:
        ValueError: their raw text does not decode (a number out of float's range, a string
            that is not UTF-8: the scan skips over ``Input Dims`` without checking them).
    """
    if dims.__class__ is msgspec.Raw:
        try:
            dims = msgspec.json.decode(dims)
        except (msgspec.DecodeError, RecursionError) as err:
            raise ValueError(_one_line(err)) from None
    return dims if dims.__class__ is list else None


def shapes_text(dims: list[Any]) -> str:
    return (
        "[" + ", ".join(str([int_or(x, 0) for x in d]) if isinstance(d, list) else "[]" for d in dims) + "]"
    )


def memory_device(args: EventArgs) -> str:
    """The device of a ``[memory]`` event from its ``args``: ``CPU``, ``GPU0``, ``MPS0``..."""
    dtype, did = int_or(args.device_type, 0), int_or(args.device_id)
    label = _DEVICE_TYPES.get(dtype, f"device type {dtype} ")
    return label if dtype == 0 else f"{label}{max(did, 0)}"
