"""A PyTorch profiler (Kineto) Chrome trace, event by event: where the files are, their
header (rank, base time), each ``traceEvents`` entry parsed on its own, with limits.

Never ``json.load`` of the whole file (about ten times the file's size in memory); plain and
gzipped files alike. :mod:`memprofiler.analysis.trace_stream` folds the events into the views.
"""

from __future__ import annotations

import io
import json
import re
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

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
#: One event's text at most (torch's longest are a few KiB: an operator's ``Input Dims``).
MAX_EVENT_CHARS = 16 * 2**20
#: A trace's decompressed text at most (a 6M-event torch trace is about 2 GiB).
MAX_TRACE_CHARS = 256 * 2**30
#: Characters read at a time.
_BLOCK = 1 << 20
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


def iter_events(path: Path) -> Iterator[Any]:
    """Each entry of ``traceEvents``, parsed one at a time (``dict`` for a well-formed event;
    a number or a string is yielded as is, for the caller to skip).

    The text is read in blocks and each event decoded on its own by the standard library's C
    scanner, so memory holds one block and one event. Limits (a hostile or broken file gets
    one line, not a parser traceback or an exhausted memory): an event longer than
    :data:`MAX_EVENT_CHARS`, nested deeper than the JSON scanner allows (Python's recursion
    limit, 1,000 levels by default), ``NaN`` / ``Infinity``, a file whose decompressed text is
    longer than :data:`MAX_TRACE_CHARS`, a cut or corrupt gzip stream.

    Raises:
        ArtifactError: the file is unreadable, not a JSON trace, or past a limit.
    """
    fail = f"{path}: not a readable profiler trace"
    try:
        with open_maybe_gzip(path) as raw, io.TextIOWrapper(raw, encoding="utf-8") as f:
            yield from _scan(f, fail)
    except (OSError, EOFError, zlib.error) as err:
        raise ArtifactError(f"{fail} ({_one_line(err)}); re-copy the file or re-export it") from None
    except UnicodeDecodeError:
        raise ArtifactError(f"{fail} (not UTF-8 text); {_FIX_SOURCE}") from None


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


class _NotFinite(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NotFinite(name)


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_GAP = re.compile(r"[ \t\n\r]*(,?)[ \t\n\r]*")
_OPEN = re.compile(r'"traceEvents"[ \t\n\r]*:[ \t\n\r]*\[')


def _scan(f: IO[str], fail: str) -> Iterator[Any]:
    buf = f.read(_BLOCK)
    total = len(buf)  # characters read so far; buf holds the last len(buf) of them
    while (m := _OPEN.search(buf)) is None:
        more = f.read(_BLOCK)
        total += len(more)
        if not more or total > MAX_EVENT_CHARS:
            raise ArtifactError(f"{fail} (no traceEvents list); pass a trace written by torch.profiler")
        buf = buf[-64:] + more
    pos = m.end()
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
            total += len(more)
            if total > MAX_TRACE_CHARS:
                raise ArtifactError(
                    f"{fail} (longer than {MAX_TRACE_CHARS:,} characters decompressed, the reader's limit "
                    "MAX_TRACE_CHARS; a gzip bomb?)"
                )
            buf = buf[pos:] + more
            pos = 0
            continue
        if buf[p] == "]":
            return
        if not comma:
            raise ArtifactError(
                f"{fail} (no ',' between events at character {total - len(buf) + p:,}); {_FIX_SOURCE}"
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
            where = f"{err.msg} at character {total - len(buf) + err.pos:,}"
            if len(buf) - p > MAX_EVENT_CHARS:
                raise ArtifactError(
                    f"{fail} ({where}: not JSON, or an event longer than {MAX_EVENT_CHARS:,} characters, "
                    f"the reader's limit MAX_EVENT_CHARS); {_FIX_SOURCE}"
                ) from None
            more = f.read(_BLOCK)
            if not more:
                raise ArtifactError(
                    f"{fail} ({where}: cut short or not JSON); re-copy the file or re-export it"
                ) from None
            total += len(more)
            if total > MAX_TRACE_CHARS:
                raise ArtifactError(
                    f"{fail} (longer than {MAX_TRACE_CHARS:,} characters decompressed, the reader's limit "
                    "MAX_TRACE_CHARS; a gzip bomb?)"
                ) from None
            buf = buf[p:] + more
            pos = 0
            continue
        comma = False
        pos = end
        yield ev


def _args(ev: dict[str, Any]) -> dict[str, Any]:
    a = ev.get("args")
    return a if isinstance(a, dict) else {}


def _int(v: Any, default: int = -1) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def _shapes_text(dims: list[Any]) -> str:
    return "[" + ", ".join(str([_int(x, 0) for x in d]) if isinstance(d, list) else "[]" for d in dims) + "]"


def memory_device(args: dict[str, Any]) -> str:
    """The device of a ``[memory]`` event from its ``args``: ``CPU``, ``GPU0``, ``MPS0``..."""
    dtype, did = _int(args.get("Device Type"), 0), _int(args.get("Device Id"))
    label = _DEVICE_TYPES.get(dtype, f"device type {dtype} ")
    return label if dtype == 0 else f"{label}{max(did, 0)}"
