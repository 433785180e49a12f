"""The allocator pickles (history and OOM) of a run, each loaded and analysed for the report."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memprofiler.analysis.artifacts import AllocPickle, OomRecord, RunArtifacts
from memprofiler.analysis.snapshot import SnapshotAnalysis, analyze, load_snapshot


@dataclass
class SnapshotEntry:
    """An allocator pickle (history or OOM) with its analysis."""

    title: str
    path: str
    analysis: SnapshotAnalysis
    record: Mapping[str, Any] | None = None
    """An OOM pickle's record (its YAML): the device's total, the step, the call counts."""


def snapshot_entries(run: RunArtifacts, top: int = 10) -> list[SnapshotEntry]:
    """Load and analyse every allocator-history and OOM pickle of ``run``.

    Raises:
        ArtifactError: a pickle is unreadable, unsafe or not an allocator snapshot.
    """
    entries = []
    items: list[AllocPickle | OomRecord] = [*run.alloc_pickles, *[o for o in run.ooms if o.pickle_path]]
    for item in items:
        path = item.path if isinstance(item, AllocPickle) else item.pickle_path
        assert path is not None
        analysis = analyze(load_snapshot(path), str(path), top=top)
        record = item.info if isinstance(item, OomRecord) else None
        entries.append(SnapshotEntry(snapshot_title(item), str(path), analysis, record))
    return entries


def snapshot_title(item: AllocPickle | OomRecord) -> str:
    if isinstance(item, AllocPickle):
        return f"rank {item.rank} {item.fn} #{item.call} {item.phase}"
    return f"rank {item.rank} OOM #{item.n}"
