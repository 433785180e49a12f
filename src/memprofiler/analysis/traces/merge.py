"""Merge every rank's traces into one Chrome trace, ``pid`` = rank.

Done after the run, from the files, so it never blocks training (Composer's merged-trace
idea, applied to the memory timeline). The input is each rank's
``memory_trace_rank_{rank}.json``, the extended profiler's ``step_timeline_rank_{rank}.json``
(hooks, data-loader waits, host metrics) where present and, on request, its per-cycle
``*.pt.trace.json`` traces (gzip ones too; the rank is read from the name or the file). Timestamps are moved onto the earliest
file's ``baseTimeNanoseconds``, so ranks line up on the shared wall clock.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memprofiler.analysis.files.compressed import read_at_most
from memprofiler.analysis.runs.ids import check_one_run, trace_run_id
from memprofiler.analysis.traces.events import find_traces
from memprofiler.errors import ArtifactError
from memprofiler.output.step_timeline import CATEGORIES as STEP_CATEGORIES
from memprofiler.output.timeline import CATEGORY

_MEMORY_FILE = re.compile(r"^memory_trace_rank_(\d+)\.json$")
_STEP_FILE = re.compile(r"^step_timeline_rank_(\d+)\.json$")
_PROFILER_FILE = re.compile(r"^.+_rank_(\d+)\.\d+\.pt\.trace\.json(\.gz)?$")
#: Process metadata the merge writes itself, so every rank is named the same way.
_PROCESS_META = ("process_name", "process_labels", "process_sort_index")
#: A file merge-traces reads (decompressed) at most: it holds each whole while merging.
MAX_FILE_BYTES = 2**30
#: Flow-event phases: their ids are only unique within one file.
_FLOW_PHASES = ("s", "t", "f")
#: A rank's flow ids move above ``rank << _FLOW_ID_BITS``; per-file ids are far below 2**40.
_FLOW_ID_BITS = 40


def find_rank_traces(run_dir: str | Path) -> dict[int, Path]:
    """Map rank -> ``memory_trace_rank_{rank}.json`` anywhere under ``run_dir``.

    Raises:
        ArtifactError: ``run_dir`` is missing, holds no trace, or holds one rank twice.
    """
    root = _check_dir(run_dir)
    found = _one_per_rank(root, "memory_trace_rank_*.json", _MEMORY_FILE, "traces")
    if not found:
        raise ArtifactError(
            f"no memory_trace_rank_*.json under {str(root)!r}; run with `dump_memory_trace: true`"
        )
    return found


def find_profiler_traces(run_dir: str | Path) -> dict[int, list[Path]]:
    """Map rank -> the extended profiler's ``*.pt.trace.json[.gz]`` traces under ``run_dir``.

    The rank comes from the default name (``{stage}_rank_{rank}.{cycle}``), else from the
    ``memprofiler.rank`` the profiler writes into every trace (custom ``filename`` templates).
    """
    found: dict[int, list[Path]] = {}
    for path in find_traces(_check_dir(run_dir)):
        match = _PROFILER_FILE.match(path.name)
        rank = int(match.group(1)) if match is not None else _written_rank(path)
        if rank is not None:
            found.setdefault(rank, []).append(path)
    return found


def find_step_timelines(run_dir: str | Path) -> dict[int, Path]:
    """Map rank -> ``step_timeline_rank_{rank}.json`` under ``run_dir`` (empty when none)."""
    return _one_per_rank(_check_dir(run_dir), "step_timeline_rank_*.json", _STEP_FILE, "step timelines")


def _one_per_rank(root: Path, glob: str, name: re.Pattern[str], what: str) -> dict[int, Path]:
    """Rank -> the file under ``root`` whose name ``name`` matches (group 1: the rank)."""
    found: dict[int, Path] = {}
    for path in sorted(root.rglob(glob)):
        match = name.match(path.name)
        if match is None:
            continue
        rank = int(match.group(1))
        if rank in found:
            raise ArtifactError(
                f"rank {rank} has two {what}, {str(found[rank])!r} and {str(path)!r}; "
                "point DIR at a single run's directory"
            )
        found[rank] = path
    return found


def _written_rank(path: Path) -> int | None:
    meta = _load(path).get("memprofiler")
    rank = meta.get("rank") if isinstance(meta, dict) else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def _check_dir(run_dir: str | Path) -> Path:
    root = Path(run_dir)
    if not root.is_dir():
        raise ArtifactError(f"{str(root)!r} is not a directory; give the run's output directory")
    return root


def _load(path: Path) -> dict[str, Any]:
    try:
        raw = read_at_most(path, MAX_FILE_BYTES)
        if len(raw) > MAX_FILE_BYTES:
            raise ArtifactError(
                f"{str(path)!r} is refused: longer than {MAX_FILE_BYTES:,} bytes decompressed, what merge-traces "
                "reads whole (MAX_FILE_BYTES; a gzip bomb?); read a large profiler trace alone with "
                "`memprofiler report`, which streams it"
            )
        data = json.loads(raw)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactError(f"{str(path)!r} is not a readable JSON trace ({err})") from None
    except RecursionError:
        raise ArtifactError(f"{str(path)!r} is refused: nested too deep for a Chrome trace") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ArtifactError(f"{str(path)!r} is not a Chrome trace: no `traceEvents` list")
    return data


def _base(data: dict[str, Any], path: Path) -> int:
    """The file's ``baseTimeNanoseconds`` (0 when absent).

    Raises:
        ArtifactError: it is not a non-negative integer (one line naming the file and the field).
    """
    if "baseTimeNanoseconds" not in data:
        return 0
    value = data["baseTimeNanoseconds"]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArtifactError(
            f"{str(path)!r}: `baseTimeNanoseconds` is {value!r}; it must be a non-negative integer "
            "(nanoseconds of the trace's clock): regenerate the file or remove the field"
        )
    return value


def _ts(value: Any, path: Path, index: int) -> float:
    """An event's ``ts`` as a finite float, or one line naming the file, the event and the field."""
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        with contextlib.suppress(OverflowError):
            number = float(value)
    if number is None or not math.isfinite(number):
        raise ArtifactError(
            f"{str(path)!r}: `traceEvents[{index}].ts` is {value!r}; it must be a finite number of "
            "microseconds: regenerate the file or remove that event"
        )
    return number


def _moved(
    events: Iterable[Any], rank: int, shift_us: float, skip: frozenset[str], path: Path
) -> Iterable[dict[str, Any]]:
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            continue
        if event.get("ph") == "M" and event.get("name") in _PROCESS_META:
            continue
        if event.get("cat") in skip:
            continue  # the profiler trace's copy of events a whole-run file of the rank holds
        moved = dict(event, pid=rank)
        if "ts" in moved:
            moved["ts"] = _ts(moved["ts"], path, index) + shift_us
        if moved.get("ph") in _FLOW_PHASES and "id" in moved:
            moved["id"] = _flow_id(rank, moved["id"])
        yield moved


def _flow_id(rank: int, flow_id: Any) -> Any:
    """A flow id unique across ranks that stays a number.

    Perfetto's JSON importer reads a string id as hex and drops ``"0:17"``, so ``rank:id``
    strings would lose every arrow; ``(rank << 40) | id`` keeps it numeric. A string id is
    read as hex, as Perfetto reads it (or, if not hex, by its CRC-32).
    """
    try:
        value = int(flow_id)
    except (TypeError, ValueError, OverflowError):
        try:
            value = int(str(flow_id), 16)  # how Perfetto itself reads a string id
        except ValueError:
            value = zlib.crc32(str(flow_id).encode())
    return (rank << _FLOW_ID_BITS) | (value & ((1 << _FLOW_ID_BITS) - 1))


def merge_rank_traces(
    traces: dict[int, Path],
    profiler_traces: dict[int, list[Path]] | None = None,
    step_timelines: dict[int, Path] | None = None,
) -> dict[str, Any]:
    """Load and merge per-rank traces; every event's ``pid`` becomes its rank.

    Args:
        traces: rank -> memory trace, from :func:`find_rank_traces`.
        profiler_traces: rank -> extended-profiler traces to fold in (operators, kernels);
            their own copies of the memory events (and of the step timeline's, where
            ``step_timelines`` has the rank) are dropped.
        step_timelines: rank -> the extended profiler's whole-run step timeline.

    Raises:
        ArtifactError: a file is not valid JSON or not a Chrome trace.
    """
    sources: dict[int, list[tuple[Path, dict[str, Any], frozenset[str]]]] = {}
    none: frozenset[str] = frozenset()
    for rank, path in sorted(traces.items()):
        sources[rank] = [(path, _load(path), none)]
    check_one_run((str(p), trace_run_id(data)) for files in sources.values() for p, data, _ in files)
    for rank, path in sorted((step_timelines or {}).items()):
        sources.setdefault(rank, []).append((path, _load(path), none))
    for rank, paths in sorted((profiler_traces or {}).items()):
        skip = frozenset({CATEGORY, *(STEP_CATEGORIES if rank in (step_timelines or {}) else ())})
        sources.setdefault(rank, []).extend((p, _load(p), skip) for p in paths)
    base = min(_base(data, path) for files in sources.values() for path, data, _ in files)
    events: list[dict[str, Any]] = []
    for rank, files in sources.items():
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        for path, data, skip in files:
            shift_us = (_base(data, path) - base) / 1000.0
            events.extend(_moved(data["traceEvents"], rank, shift_us, skip, path))
    return {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": base,
        "traceEvents": events,
        "otherData": {
            "memprofiler_ranks": sorted(sources),
            "memprofiler_sources": [str(path) for files in sources.values() for path, _, _ in files],
        },
    }
