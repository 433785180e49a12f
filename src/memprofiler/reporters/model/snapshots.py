"""The allocator pickles (history and OOM) of a run, each loaded and analysed for the report."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memprofiler.analysis.runs.artifacts import AllocPickle, AllocWindow, OomRecord, RunArtifacts
from memprofiler.analysis.snapshot.calls import call_ranges, checked_index
from memprofiler.analysis.snapshot.oom_roles import oom_role_index
from memprofiler.analysis.snapshot.roles import with_roles
from memprofiler.analysis.snapshot.summary import SnapshotAnalysis, analyze, load_snapshot


@dataclass
class SnapshotEntry:
    """An allocator pickle (history and OOM) with its analysis."""

    title: str
    path: str
    analysis: SnapshotAnalysis
    record: Mapping[str, Any] | None = None
    """An OOM pickle's record (its YAML): the device's total, the step, the call counts."""


def snapshot_entries(run: RunArtifacts, top: int = 10) -> list[SnapshotEntry]:
    """Load and analyse every allocator-history and OOM pickle of ``run``.

    A window's recording is analysed with its role map, and titled with the calls marked in it;
    an OOM record with the role map written beside it (a record without one is one warning).

    Raises:
        ArtifactError: a pickle is unreadable, unsafe or not an allocator snapshot.
    """
    entries = []
    items: list[AllocPickle | AllocWindow | OomRecord] = [
        *run.alloc_windows,
        *run.alloc_pickles,
        *[o for o in run.ooms if o.pickle_path],
    ]
    run_id = str((run.manifest or {}).get("run_id") or "") or None
    for item in items:
        path = item.pickle_path if isinstance(item, OomRecord) else item.path
        assert path is not None
        data = load_snapshot(path)
        title = snapshot_title(item)
        roles = None
        if isinstance(item, (AllocWindow, OomRecord)):
            # a window's index, or the role map written with an OOM record: the blocks it names
            find = checked_index if isinstance(item, AllocWindow) else oom_role_index
            index, note = find(path, data, run_id)
            if note is not None:
                run.warnings.append(note)
            data, roles = with_roles(data, index)
            if isinstance(item, AllocWindow):
                title = window_title(item, [r.key for r in call_ranges(data, index)])
        analysis = analyze(data, str(path), top=top, roles=roles)
        record = item.info if isinstance(item, OomRecord) else None
        entries.append(SnapshotEntry(title, str(path), analysis, record))
    return entries


def window_title(item: AllocWindow, calls: list[str]) -> str:
    """``rank 0 window 0: training_step:2 .. training_step:4 (3 calls)``."""
    if not calls:
        return f"rank {item.rank} window {item.n} (no call marked)"
    span = calls[0] if len(calls) == 1 else f"{calls[0]} .. {calls[-1]}"
    return f"rank {item.rank} window {item.n}: {span} ({len(calls)} call{'s' if len(calls) > 1 else ''})"


def snapshot_title(item: AllocPickle | AllocWindow | OomRecord) -> str:
    if isinstance(item, AllocPickle):
        return f"rank {item.rank} {item.fn} #{item.call} {item.phase}"
    if isinstance(item, AllocWindow):
        return f"rank {item.rank} window {item.n}"
    return f"rank {item.rank} OOM #{item.n}"
