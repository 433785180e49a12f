"""One run spread over several directories (node-local disks): its ranks put back together.

On a multi-node job whose ``save_dir`` is on each node's own disk, every node holds its own
ranks' files, and rank 0's node the manifest and the cross-rank summary. Merging the
directories gives the run as one shared directory would have held it; a rank found twice
means two runs (or one directory given twice) and is refused. Rank files without a run id are
judged by what else they carry (:mod:`memprofiler.analysis.runs.evidence`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from memprofiler.analysis.runs.artifacts import RunArtifacts
from memprofiler.analysis.runs.evidence import check_merge, gather
from memprofiler.analysis.runs.ids import check_one_run
from memprofiler.errors import ArtifactError

T = TypeVar("T")


def _refuse(rank: int, first: str, second: str) -> ArtifactError:
    return ArtifactError(
        f"rank {rank} is in both {first!r} and {second!r}; pass each node's directory of one run once"
    )


def merge_rank_maps(found: Sequence[tuple[str, dict[int, T]]]) -> dict[int, T]:
    """Join per-directory ``rank -> item`` maps (``item``: a trace file, a list of them).

    Raises:
        ArtifactError: a rank appears in two directories.
    """
    out: dict[int, T] = {}
    source: dict[int, str] = {}
    for name, by_rank in found:
        for rank, item in by_rank.items():
            if rank in out:
                raise _refuse(rank, source[rank], name)
            out[rank], source[rank] = item, name
    return out


def merge_runs(runs: Sequence[tuple[str, RunArtifacts]]) -> RunArtifacts:
    """The run made of ``runs`` (given name, loaded directory): every rank once.

    The summary and the manifest come from the directory holding them (rank 0's node); the
    report's root is the first directory's.

    Rank files without a run id that only probably belong with the others (or that nothing
    could be checked against) are merged, with a line each in ``merge_warnings``.

    Raises:
        ArtifactError: a rank has stats in two directories, two directories hold a summary, or
            the files' world sizes, ranks, figures or times prove two runs (one line naming a
            file of each, why, and the fix).
    """
    if len(runs) == 1:
        return runs[0][1]
    check_one_run((f, i) for _, run in runs for f, i in run.run_ids.items())
    merged = RunArtifacts(root=runs[0][1].root)
    merge_rank_maps([(name, dict.fromkeys(run.ranks)) for name, run in runs])  # each rank once
    merged.stats = merge_rank_maps([(name, run.stats) for name, run in runs])
    merged.stats_files = merge_rank_maps([(name, run.stats_files) for name, run in runs])
    merged.stats_paths = merge_rank_maps([(name, run.stats_paths) for name, run in runs])
    merged.cuts = [cut for _, run in runs for cut in run.cuts]
    summaries = [(name, run.summary) for name, run in runs if run.summary is not None]
    if len(summaries) > 1:
        raise ArtifactError(
            f"{summaries[0][0]!r} and {summaries[1][0]!r} both hold a cross-rank summary: two runs, "
            "not one run's nodes; pass the directories of one run"
        )
    merged.summary = summaries[0][1] if summaries else None
    merged.merge_warnings = check_merge([gather(run.root, run.summary) for _, run in runs])
    # rank 0's node holds the manifest (run id, status, the notes a report prints)
    merged.manifest = next((run.manifest for _, run in runs if run.manifest is not None), None)
    for _, run in runs:
        merged.reports.extend(run.reports)
        merged.alloc_pickles.extend(run.alloc_pickles)
        merged.alloc_windows.extend(run.alloc_windows)
        merged.ooms.extend(run.ooms)
        merged.files.extend(run.files)
    merged.reports.sort(key=lambda r: (r.kind, r.rank, r.fn, r.call))
    merged.ooms.sort(key=lambda o: (o.rank, o.n))
    merged.alloc_pickles.sort(key=lambda a: (a.rank, a.fn, a.call, a.phase != "start"))
    merged.alloc_windows.sort(key=lambda w: (w.rank, w.n))
    return merged


def report_root(names: Sequence[str], run: RunArtifacts) -> Path:
    """Where ``report`` writes ``report.html`` by default: in the (first) run directory when it is
    local, else in the current directory (a bucket is read, never written)."""
    from memprofiler.analysis.files.fs import is_url

    return Path(".") if any(is_url(n) for n in names) else run.root
