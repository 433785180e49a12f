"""Merge every rank's ``memory_trace_rank_{rank}.json`` into one Chrome trace, ``pid`` = rank.

Done after the run, from the files, so it never blocks training (Composer's merged-trace
idea, applied to the memory timeline). Each file keeps its events; timestamps are moved onto
the earliest file's ``baseTimeNanoseconds``, so ranks line up on the shared wall clock.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from memprofiler.errors import ArtifactError

_RANK_FILE = re.compile(r"^memory_trace_rank_(\d+)\.json$")


def find_rank_traces(run_dir: str | Path) -> dict[int, Path]:
    """Map rank -> ``memory_trace_rank_{rank}.json`` anywhere under ``run_dir``.

    Raises:
        ArtifactError: ``run_dir`` is missing, holds no trace, or holds one rank twice.
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise ArtifactError(f"{str(root)!r} is not a directory; give the run's output directory")
    found: dict[int, Path] = {}
    for path in sorted(root.rglob("memory_trace_rank_*.json")):
        match = _RANK_FILE.match(path.name)
        if match is None:
            continue
        rank = int(match.group(1))
        if rank in found:
            raise ArtifactError(
                f"rank {rank} has two traces, {str(found[rank])!r} and {str(path)!r}; "
                "point DIR at a single run's directory"
            )
        found[rank] = path
    if not found:
        raise ArtifactError(
            f"no memory_trace_rank_*.json under {str(root)!r}; run with `dump_memory_trace: true`"
        )
    return found


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactError(f"{str(path)!r} is not a readable JSON trace ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ArtifactError(f"{str(path)!r} is not a Chrome trace: no `traceEvents` list")
    return data


def merge_rank_traces(traces: dict[int, Path]) -> dict[str, Any]:
    """Load and merge per-rank traces; every event's ``pid`` becomes its rank.

    Raises:
        ArtifactError: a file is not valid JSON or not a Chrome trace.
    """
    loaded = {rank: _load(path) for rank, path in sorted(traces.items())}
    bases = {rank: int(data.get("baseTimeNanoseconds", 0) or 0) for rank, data in loaded.items()}
    base = min(bases.values())
    events: list[dict[str, Any]] = []
    for rank, data in loaded.items():
        shift_us = (bases[rank] - base) / 1000.0
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        for event in data["traceEvents"]:
            if not isinstance(event, dict):
                continue
            if event.get("ph") == "M" and event.get("name") in ("process_name", "process_sort_index"):
                continue  # replaced above, so every rank is named the same way
            moved = dict(event, pid=rank)
            if "ts" in moved:
                moved["ts"] = float(moved["ts"]) + shift_us
            events.append(moved)
    return {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": base,
        "traceEvents": events,
        "memprofiler": {"ranks": sorted(loaded), "sources": [str(traces[r]) for r in sorted(loaded)]},
    }
