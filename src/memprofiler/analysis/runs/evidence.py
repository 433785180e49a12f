"""Whether rank files without a run id belong with the others: the evidence besides the id.

A rank that never learned its run's id (no process group store, or rank 0 did not answer in
time) writes its files without one, as memprofiler did before ids existed. When such files are
merged with other directories' (one per node), what the files do carry decides:

* **world sizes** that disagree (the manifest's, the cross-rank summary's, each memory trace's):
  two sizes above 1 are two runs; a size of 1 is what a rank without a process group writes, so
  against it a difference only warns;
* **a rank beyond the world size** of the run (rank 3 of a 2-rank run) is another run's;
* **the cross-rank summary** lists every reporting rank's range of every metric: a rank file whose
  figures fall outside it is not the file that was summarised;
* **times**: a memory trace that ends before the manifest's run started, or starts after it
  ended, by more than the run lasted, is another run's; by less (beyond :data:`SKEW_S`), or
  between two traces without a manifest, it only warns.

What is certain refuses in one line naming both files, why and the fix; what is suggestive is a
warning line and the merge goes on. A rank file without an id that nothing could be checked
against is merged with a warning too: never silently.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memprofiler import layout
from memprofiler.analysis.files.yaml_read import read_yaml
from memprofiler.analysis.runs.artifacts import flatten_metrics, is_number, parse_name, posix_time
from memprofiler.analysis.runs.ids import stats_run_id
from memprofiler.analysis.runs.stats_stream import iter_stats
from memprofiler.errors import ArtifactError

#: Two nodes' clocks, and one rank's set-up against rank 0's, may differ by this much without
#: meaning anything (NTP keeps clocks within milliseconds; a rank waits at most a minute for rank 0).
SKEW_S = 300.0
#: Bytes read from each end of a memory trace for its times and ``otherData``: never the whole file.
PEEK_BYTES = 64 * 1024
#: The fix every line of this module ends with.
FIX = "pass the directories of one run (or move the other run's files out)"

_BASE = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')
_TS = re.compile(rb'"ts"\s*:\s*(-?[0-9][0-9.eE+-]*)(?:\s*,\s*"dur"\s*:\s*([0-9][0-9.eE+-]*))?')


@dataclass(frozen=True)
class FileEvidence:
    """What one file says about the run it belongs to."""

    file: str
    rank: int | None
    """``None`` for the run's own files (the manifest, the cross-rank summary)."""
    run_id: str | None
    world_size: int | None = None
    start: float | None = None
    """POSIX seconds: the manifest's ``started``, a memory trace's first record."""
    end: float | None = None
    """The manifest's ``finished`` (``None`` while running), a memory trace's last record."""


@dataclass
class DirEvidence:
    """One run directory's (one node's) files that carry evidence, found by name, not yet read."""

    manifest: Path | None = None
    summary: Path | None = None
    summary_doc: Mapping[str, Any] | None = None
    """The summary as already loaded (``report`` has read it), else read when needed."""
    stats: dict[int, Path] = field(default_factory=dict)
    """rank -> stats YAML: its run id (second line) and first block (the summary check)."""
    pickles: dict[int, Path] = field(default_factory=dict)
    """rank -> stats pickle without a YAML beside it (no run id: written before ids existed)."""
    traces: dict[int, Path] = field(default_factory=dict)


def gather(root: Path, summary: Mapping[str, Any] | None = None) -> DirEvidence:
    """The evidence files in ``root`` itself (one run's directory; not its subdirectories).

    Args:
        summary: ``root``'s cross-rank summary when the caller has loaded it already.
    """
    found = DirEvidence(summary_doc=summary)
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        parsed = parse_name(path.name)
        if parsed is None or not path.is_file():
            continue
        kind, fields = parsed
        rank = int(fields["rank"]) if "rank" in fields else -1
        if kind == "manifest":
            found.manifest = path
        elif kind == "summary":
            found.summary = path
        elif kind == "stats_yaml":
            found.stats[rank] = path
        elif kind == "stats_pickle" and not path.with_suffix(".yaml").is_file():
            found.pickles[rank] = path
        elif kind == "trace":
            found.traces[rank] = path
    return found


def trace_evidence(path: Path, rank: int) -> FileEvidence:
    """A memory trace's run id, world size and first and last times, from its two ends."""
    try:
        with open(path, "rb") as f:
            head = f.read(PEEK_BYTES)
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - PEEK_BYTES))
            tail = f.read()
    except OSError:
        return FileEvidence(str(path), rank, None)  # its reader says what is wrong
    other = _other_data(tail)
    run_id = other.get(layout.TRACE_RUN_ID_KEY)
    world = other.get(layout.TRACE_WORLD_SIZE_KEY)
    base_match = _BASE.search(head)
    base_s = int(base_match.group(1)) / 1e9 if base_match else 0.0
    if len(head) < size:  # a number cut at the end of the head would read smaller
        head = head[: max(0, head.rfind(b","))]
    first = [_num(m.group(1)) for m in _TS.finditer(head)]
    last = [_num(m.group(1)) + (_num(m.group(2)) if m.group(2) else 0.0) for m in _TS.finditer(tail)]
    starts, ends = [v for v in first if math.isfinite(v)], [v for v in last if math.isfinite(v)]
    return FileEvidence(
        str(path),
        rank,
        run_id if isinstance(run_id, str) and run_id else None,
        world if _count(world) else None,
        base_s + min(starts) / 1e6 if starts else None,
        base_s + max(ends) / 1e6 if ends else None,
    )


def check_merge(dirs: Sequence[DirEvidence]) -> list[str]:
    """Refuse directories that are certainly two runs; the warnings where it is only likely.

    Only rank files without a run id are judged (ids decide the others: :mod:`~memprofiler.analysis.runs.ids`). When
    every rank file carries one, only their stats files' first line is read.

    Returns:
        One line per warning (none when every rank file carries an id or every check passed).

    Raises:
        ArtifactError: one line naming a file of each run, why, and the fix.
    """
    stats = [FileEvidence(str(p), r, stats_run_id(p)) for d in dirs for r, p in d.stats.items()]
    traces = [trace_evidence(p, r) for d in dirs for r, p in d.traces.items() if r not in d.stats]
    pickles = [FileEvidence(str(p), r, None) for d in dirs for r, p in d.pickles.items()]
    if all(e.run_id is not None for e in [*stats, *traces, *pickles]):
        return []
    traces = [trace_evidence(p, r) for d in dirs for r, p in d.traces.items()]  # their times too
    files = [*_run_files(dirs), *stats, *pickles, *traces]
    undecided = [e for e in files if e.rank is not None and e.run_id is None]
    warnings: list[str] = []
    checked: set[str] = set()  # files a check passed, or that a warning line already names
    world = _world_size(files, warnings)
    _ranks_in_world(undecided, world, checked, warnings)
    _against_summary(dirs, undecided, checked, warnings)
    _times(files, undecided, checked, warnings)
    done = {e.rank for e in undecided if e.file in checked}
    unchecked = sorted({e.rank: e.file for e in reversed(undecided) if e.rank not in done}.items())
    if unchecked:
        more = f" (and {len(unchecked) - 1} more rank(s))" if len(unchecked) > 1 else ""
        warnings.append(
            f"{unchecked[0][1]!r}{more} carries no run id and nothing to check it against (no "
            "world size, cross-rank summary or run times beside it): merged as one run on trust; "
            "make sure the directories are of one run"
        )
    return warnings


def _run_files(dirs: Sequence[DirEvidence]) -> list[FileEvidence]:
    """The manifests' and the summaries' evidence (``rank`` ``None``)."""
    out = [_manifest(d.manifest) for d in dirs if d.manifest is not None]
    for d in dirs:
        doc = _summary(d)
        if d.summary is not None and doc is not None:
            size = doc.get("world_size")
            out.append(FileEvidence(str(d.summary), None, None, size if _count(size) else None))
    return out


def _summary(d: DirEvidence) -> Mapping[str, Any] | None:
    if d.summary_doc is None and d.summary is not None:
        doc = read_yaml(d.summary, [])
        d.summary_doc = doc if isinstance(doc, Mapping) else {}
    return d.summary_doc


# ---------------------------------------------------------------------------- the checks
def _world_size(files: Sequence[FileEvidence], warnings: list[str]) -> tuple[str, int] | None:
    """The run's world size and the file saying it; two sizes above 1 refuse."""
    sizes = [(e.file, e.world_size) for e in files if e.world_size is not None]
    group = [(f, n) for f, n in sizes if n > 1]
    for f, n in group[1:]:
        if n != group[0][1]:
            raise ArtifactError(
                f"{group[0][0]!r} says world size {group[0][1]} but {f!r} world size {n}: two runs' "
                f"files would be merged as one; {FIX}"
            )
    ones = [(f, n) for f, n in sizes if n == 1]
    if group and ones:
        warnings.append(
            f"{ones[0][0]!r} says world size 1 but {group[0][0]!r} world size {group[0][1]}: perhaps "
            f"two runs (1 is also what a rank without a process group writes); merged anyway; if so, {FIX}"
        )
    return group[0] if group else (ones[0] if ones else None)


def _ranks_in_world(
    undecided: Sequence[FileEvidence], world: tuple[str, int] | None, checked: set[str], warnings: list[str]
) -> None:
    if world is None:
        return
    where, size = world
    beyond = [e for e in undecided if e.rank is not None and e.rank >= size]
    if size > 1:
        checked.update(e.file for e in undecided if e not in beyond)
        for e in beyond:
            raise ArtifactError(
                f"{e.file!r} is rank {e.rank}'s but {where!r} says the run had {size} ranks "
                f"(0..{size - 1}): two runs' files would be merged as one; {FIX}"
            )
    elif beyond:
        checked.update(e.file for e in beyond)
        ranks = sorted({e.rank for e in beyond if e.rank is not None})
        more = f" (and {len(ranks) - 1} more rank(s))" if len(ranks) > 1 else ""
        warnings.append(
            f"{beyond[0].file!r}{more} is rank {beyond[0].rank}'s but {where!r} says world size 1 (as a "
            f"run without a process group writes): perhaps two runs; merged anyway; if so, {FIX}"
        )


def _against_summary(
    dirs: Sequence[DirEvidence], undecided: Sequence[FileEvidence], checked: set[str], warnings: list[str]
) -> None:
    """Each undecided stats file's first block within the summary's range of its rank's figures."""
    summaries = [(str(d.summary), _summary(d)) for d in dirs if d.summary is not None]
    if not summaries or summaries[0][1] is None:
        return
    where, doc = summaries[0]
    assert doc is not None
    ranks = doc.get("ranks")
    snapshots = doc.get("snapshots")
    if not isinstance(ranks, list) or not isinstance(snapshots, Mapping):
        return
    paths = {str(p) for d in dirs for p in d.stats.values()}
    for e in undecided:
        if e.file not in paths or e.rank not in ranks:
            continue
        compared = _compare(Path(e.file), where, snapshots)
        checked.add(e.file)
        if not compared:
            warnings.append(
                f"{e.file!r}: none of its first snapshots is in the cross-rank summary {where!r}, "
                f"which counts rank {e.rank}: perhaps two runs; merged anyway; if so, {FIX}"
            )


def _compare(path: Path, where: str, snapshots: Mapping[str, Any]) -> int:
    """How many figures of ``path``'s first block were compared with the summary; raises on one
    outside the summary's range."""
    compared = 0
    for block in iter_stats(path, []):
        if not isinstance(block, Mapping):
            return 0
        for key, metrics in block.items():
            try:
                _, fn, call, phase = layout.parse_snapshot_key(str(key))
            except ValueError:
                continue
            ranges = snapshots.get(f"{fn}.{call}.{phase}")
            if not isinstance(ranges, Mapping) or not isinstance(metrics, Mapping):
                continue
            for name, value in flatten_metrics(metrics).items():
                stat = ranges.get(name)
                if not isinstance(stat, Mapping) or not (
                    is_number(stat.get("min")) and is_number(stat.get("max"))
                ):
                    continue
                lo, hi = float(stat["min"]), float(stat["max"])
                slack = 1e-9 * max(1.0, abs(lo), abs(hi))
                if not lo - slack <= value <= hi + slack:
                    raise ArtifactError(
                        f"{str(path)!r} does not match the cross-rank summary {where!r}: its `{name}` "
                        f"at {fn}.{call}.{phase} is {_figure(value)}, outside the run's range "
                        f"{_figure(lo)}..{_figure(hi)} over its ranks: two runs' files would be merged "
                        f"as one; {FIX}"
                    )
                compared += 1
        return compared  # the first block is enough: one contradiction is proof
    return compared


def _times(
    files: Sequence[FileEvidence], undecided: Sequence[FileEvidence], checked: set[str], warnings: list[str]
) -> None:
    """Each undecided trace's times against the manifest's run, else against the other traces."""
    runs = [e for e in files if e.rank is None and e.start is not None]
    traces = [e for e in files if e.rank is not None and e.start is not None and e.end is not None]
    for e in undecided:
        if e.start is None or e.end is None:
            continue
        for run in runs:
            gap, before = _apart(e, run)
            if gap <= SKEW_S:
                checked.add(e.file)
                continue
            when = (
                f"ends {_duration(gap)} before the run of {run.file!r} started"
                if before
                else f"starts {_duration(gap)} after the run of {run.file!r} ended"
            )
            assert run.start is not None
            lasted = run.end - run.start if run.end is not None else None
            if lasted is not None and gap > max(lasted, SKEW_S):
                raise ArtifactError(
                    f"{e.file!r} {when}, more than the run lasted ({_duration(lasted)}): two runs' "
                    f"files would be merged as one; {FIX}"
                )
            checked.add(e.file)
            warnings.append(f"{e.file!r} {when}: perhaps two runs; merged anyway; if so, {FIX}")
            return  # one line is enough
        if runs:
            continue
        for other in traces:
            if other.rank == e.rank:
                continue
            gap, before = _apart(e, other)
            if gap > SKEW_S:
                checked.add(e.file)
                when = "ends" if before else "starts"
                then = "starts" if before else "ends"
                warnings.append(
                    f"{e.file!r} {when} {_duration(gap)} {'before' if before else 'after'} {other.file!r} "
                    f"{then}, though one run's ranks run together: perhaps two runs; merged anyway; "
                    f"if so, {FIX}"
                )
                return


def _apart(a: FileEvidence, b: FileEvidence) -> tuple[float, bool]:
    """How far ``a``'s times lie outside ``b``'s (0 or less: they overlap), and whether before."""
    assert a.start is not None and a.end is not None and b.start is not None
    before = b.start - a.end
    after = a.start - b.end if b.end is not None else -math.inf  # a run still running: no end
    return (before, True) if before >= after else (after, False)


# ---------------------------------------------------------------------------- reading
def _manifest(path: Path) -> FileEvidence:
    doc = read_yaml(path, [])
    if not isinstance(doc, Mapping):
        return FileEvidence(str(path), None, None)
    run_id, size = doc.get("run_id"), doc.get("world_size")
    return FileEvidence(
        str(path),
        None,
        str(run_id) if run_id else None,
        size if _count(size) else None,
        posix_time(doc.get("started")),
        posix_time(doc.get("finished")),
    )


def _other_data(tail: bytes) -> Mapping[str, Any]:
    at = tail.rfind(b'"otherData"')
    if at < 0:
        return {}
    brace = tail.find(b"{", at)
    try:
        value, _ = json.JSONDecoder().raw_decode(tail[brace:].decode("utf-8", "replace"))
    except (ValueError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _num(raw: bytes) -> float:
    try:
        return float(raw)
    except ValueError:
        return math.nan


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _figure(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,.6g}"


def _duration(seconds: float) -> str:
    """``"45 s"``, ``"12 min"``, ``"3.5 h"``, ``"2.0 days"``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
