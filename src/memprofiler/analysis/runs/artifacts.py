"""Find and load every file a memprofiler run wrote, wherever under the run directory it sits.

``save_dir`` usually lies under ``lightning_logs/version_N/memprofiler``, so the search is
recursive. A directory can hold several runs (a second run into the same ``save_dir``
writes into ``version_N`` under it): the newest is read, and :attr:`RunArtifacts.selection`
says which and how to read another, rather than a silent mix of their numbers.

File names are matched with patterns built from the templates in :mod:`memprofiler.layout`,
so a name changed there is read here without a second copy.
"""

from __future__ import annotations

import datetime as dt
import errno
import fnmatch
import os
import re
import socket
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memprofiler import layout
from memprofiler.analysis.files import safe_pickle
from memprofiler.analysis.files.yaml_read import Cut, read_yaml
from memprofiler.analysis.runs.ids import check_one_run, stats_run_id
from memprofiler.analysis.runs.stats_stream import iter_stats
from memprofiler.errors import ArtifactError, NoRunFilesError

#: What each template field may match in a file name.
_FIELDS = {
    "rank": r"(?P<rank>\d+)",
    "fn": r"(?P<fn>.+)",
    "call": r"(?P<call>\d+)",
    "phase": r"(?P<phase>start|end)",
    "n": r"(?P<n>\d+)",
    "stage": r"(?P<stage>.+?)",
    "cycle": r"(?P<cycle>\d+)",
}


def name_pattern(template: str) -> re.Pattern[str]:
    """A regex for file names made from a :mod:`memprofiler.layout` template.

    Example:
        >>> name_pattern(layout.OOM_PICKLE).match("oom_rank_1_0.pickle")["rank"]
        '1'
    """
    parts = re.split(r"\{(\w+)\}", template)
    regex = "".join(_FIELDS[p] if i % 2 else re.escape(p) for i, p in enumerate(parts))
    return re.compile(f"^{regex}$")


#: Every file name a run holds, by kind. The reports are a ``.yaml`` and a ``.log`` per call.
NAME_PATTERNS: dict[str, re.Pattern[str]] = {
    "stats_yaml": name_pattern(layout.MEMORY_STATS_YAML),
    "stats_pickle": name_pattern(layout.MEMORY_STATS_PICKLE),
    "summary": name_pattern(layout.MEMORY_SUMMARY_YAML),
    "fsdp_yaml": name_pattern(layout.FSDP_MEM_REPORT + ".yaml"),
    "fsdp_log": name_pattern(layout.FSDP_MEM_REPORT + ".log"),
    "module_yaml": name_pattern(layout.MODULE_MEM_REPORT + ".yaml"),
    "module_log": name_pattern(layout.MODULE_MEM_REPORT + ".log"),
    "alloc": name_pattern(layout.CUDA_ALLOC_PICKLE),
    "alloc_window": name_pattern(layout.CUDA_ALLOC_WINDOW_PICKLE),
    "alloc_window_index": name_pattern(layout.CUDA_ALLOC_WINDOW_INDEX),
    "oom_pickle": name_pattern(layout.OOM_PICKLE),
    "oom_yaml": name_pattern(layout.OOM_YAML),
    "oom_roles": name_pattern(layout.OOM_ROLES),
    "manifest": name_pattern(layout.RUN_MANIFEST),
    "trace": name_pattern(layout.MEMORY_TRACE_JSON),
    "profiler_trace": name_pattern(layout.PROFILER_TRACE_JSON),
    "profiler_summary": name_pattern(layout.PROFILER_SUMMARY_TXT),
    "profiler_memory_categories": name_pattern(layout.PROFILER_MEMORY_CATEGORIES_JSON),
    "step_timeline": name_pattern(layout.STEP_TIMELINE_JSON),
    "estimate": name_pattern(layout.MEMORY_ESTIMATE_YAML),
}
#: Kinds the report reads (traces are for ``merge-traces``, the estimate for
#: ``analysis.estimate``; an OOM record's role map is read with its pickle), and that mark a
#: directory as a run.
_READ = frozenset(NAME_PATTERNS) - {
    "trace",
    "profiler_trace",
    "profiler_summary",
    "profiler_memory_categories",
    "step_timeline",
    "estimate",
    "oom_roles",
}


def parse_name(name: str) -> tuple[str, dict[str, str]] | None:
    """``(kind, fields)`` for a file name memprofiler writes, else ``None``.

    Example:
        >>> parse_name("cuda_alloc_rank_0.training_step.2.end.pickle")
        ('alloc', {'rank': '0', 'fn': 'training_step', 'call': '2', 'phase': 'end'})
    """
    for kind, pattern in NAME_PATTERNS.items():
        if m := pattern.match(name):
            return kind, m.groupdict()
    return None


@dataclass
class ModuleReport:
    """An FSDP (``fsdp_mem_rank_*``) or module-wise (``module_mem_rank_*``) report of one call."""

    kind: str
    """``fsdp`` or ``module``."""
    rank: int
    fn: str
    call: int
    data: Any = None
    """The ``.yaml`` contents, or ``None`` when only the ``.log`` exists."""
    log_path: Path | None = None
    yaml_path: Path | None = None


@dataclass
class AllocPickle:
    """An allocator-history snapshot: ``cuda_alloc_rank_{r}.{fn}.{call}.{phase}.pickle``."""

    path: Path
    rank: int
    fn: str
    call: int
    phase: str


@dataclass
class AllocWindow:
    """One recording of a collected window: ``cuda_alloc_rank_{r}.window_{n}.pickle``; its calls
    and role map are in the ``.json`` beside it (:func:`~memprofiler.analysis.snapshot.calls.read_index`)."""

    path: Path
    rank: int
    n: int


@dataclass
class OomRecord:
    """An OOM flight-recorder dump: ``oom_rank_{r}_{n}.pickle`` and its ``.yaml``."""

    rank: int
    n: int
    pickle_path: Path | None = None
    info: dict[str, Any] | None = None
    repeated_by: OomRecord | None = None
    """The exception handler's record of this same OOM (written after the allocator's, with
    the exception's text), folded into this one so that each OOM is shown once."""

    def repeats(self, earlier: OomRecord) -> bool:
        """Whether this record is the exception handler's record of the OOM ``earlier`` recorded.

        The allocator's observer writes ``reason: cuda_oom`` when the allocation fails; the
        exception that follows ends training and writes ``reason: exception`` with the same
        failed size on the same device, as the next record of the rank.
        """
        mine, theirs = self.info or {}, earlier.info or {}
        return (
            self.rank == earlier.rank
            and self.n == earlier.n + 1
            and mine.get("reason") == "exception"
            and theirs.get("reason") == "cuda_oom"
            and mine.get("failed_alloc_bytes") is not None
            and mine.get("failed_alloc_bytes") == theirs.get("failed_alloc_bytes")
            and mine.get("device") == theirs.get("device")
        )


@dataclass
class RunArtifacts:
    """Everything found under one run directory. Allocator pickles are only listed, not loaded."""

    root: Path
    stats: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """rank -> snapshot key -> metric dict (as in ``rank_{r}_memory_stats.yaml``)."""
    summary: dict[str, Any] | None = None
    reports: list[ModuleReport] = field(default_factory=list)
    alloc_pickles: list[AllocPickle] = field(default_factory=list)
    """Per-call pickles, as runs before one recording per window wrote them."""
    alloc_windows: list[AllocWindow] = field(default_factory=list)
    ooms: list[OomRecord] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    """``memprofiler_run.yaml`` (run id, start and end, status, notes); ``None`` for older runs."""
    cuts: list[Cut] = field(default_factory=list)
    """Files cut after their last block-end: only their verified entries were read."""
    selection: str | None = None
    """When the directory given held several runs: which one was read and how to pick another."""
    run_ids: dict[str, str | None] = field(default_factory=dict)
    """File -> the run id it carries (stats YAML, manifest): the input of
    :func:`~memprofiler.analysis.runs.ids.check_one_run`."""
    stats_files: dict[int, Path] = field(default_factory=dict)
    """rank -> stats YAML not loaded (``load_run(streamed=True)``): :meth:`iter_snapshots`
    reads it a block at a time."""
    stats_paths: dict[int, Path] = field(default_factory=dict)
    """rank -> the stats file its snapshots come from, loaded or streamed (what a line about a
    value in it names: :meth:`stats_file`)."""
    warnings: list[str] = field(default_factory=list)
    """What reading found that does not hold together, one line each, shown before the
    report's other lines: a run that ended without finishing, a window index without its
    recording, an index that is not its recording's."""
    merge_warnings: list[str] = field(default_factory=list)
    """Directories merged as one run (:func:`~memprofiler.analysis.runs.multi_dir.merge_runs`) whose rank
    files without a
    run id only probably belong together, or could not be checked: one line each, for the
    command to print (:mod:`~memprofiler.analysis.runs.evidence`)."""

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self.stats) | set(self.stats_files))

    def stats_file(self, rank: int) -> str:
        """The stats file of ``rank``, as a line names it (the run and the rank where none was read)."""
        path = self.stats_paths.get(rank)
        return str(path) if path is not None else f"{self.root} (rank {rank})"

    def iter_snapshots(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(key, metrics)`` of every rank, in file order; a streamed file is read a block at
        a time (its cut, if any, lands in :attr:`cuts` once it was read to the end)."""
        for rank in self.ranks:
            if rank in self.stats:
                yield from self.stats[rank].items()
                continue
            path = self.stats_files[rank]
            for block in iter_stats(path, self.cuts):
                yield from _check_stats(block, path).items()

    @property
    def notes(self) -> list[str]:
        """The manifest's ``notes`` (e.g. a hooked function that was never called)."""
        notes = (self.manifest or {}).get("notes") or []
        return [str(n) for n in notes] if isinstance(notes, list) else [str(notes)]

    @property
    def crash(self) -> str | None:
        """What ended the run when its manifest says ``status: crashed``: the exception as the
        profiler recorded it, or a line saying it was not recorded (older runs)."""
        manifest = self.manifest or {}
        if manifest.get("status") != "crashed":
            return None
        error = manifest.get("error")
        return str(error) if error else "the exception was not recorded"

    def collected_nothing(self) -> bool:
        """Whether the run has stats files and none holds a single snapshot.

        A streamed file is read only up to its first entry (one block).
        """
        if not self.ranks or any(self.stats.get(r) for r in self.stats):
            return False
        for path in self.stats_files.values():
            for block in iter_stats(path, []):
                if block:
                    return False
        return True

    def nothing_collected(self, notes_shown: bool = False) -> str:
        """One line: the run collected no call, and why in its own words (the manifest's notes).

        Args:
            notes_shown: the notes were printed just above; point to them instead of repeating.
        """
        status = (self.manifest or {}).get("status")
        crashed = ""
        if status == "crashed":
            crashed = f"the run crashed ({self.crash}) before any call was collected"
            if not self.notes:
                return f"no call was collected: {crashed}"
            crashed += "; "
        if self.notes:
            return f"no call was collected: {crashed}" + (
                "see the note above" if notes_shown else "; ".join(self.notes)
            )
        if status is None:
            why = f"it has no readable `{layout.RUN_MANIFEST}` (written by an older memprofiler?)"
        elif status == "running":
            why = f"its `{layout.RUN_MANIFEST}` says `status: running`: killed before it ended, or still running"
        else:
            why = f"its `{layout.RUN_MANIFEST}` says `status: {status}`; check `collect_funcs` and `schedule`"
        return f"no call was collected, and the run left no note why: {why}"

    def snapshots(self) -> dict[str, dict[str, Any]]:
        """Every rank's snapshots in one dict; keys already carry the rank."""
        if self.stats_files:
            return dict(self.iter_snapshots())
        out: dict[str, dict[str, Any]] = {}
        for rank in self.ranks:
            out.update(self.stats[rank])
        return out


@dataclass
class RunDir:
    """A directory holding one run's files (not loaded)."""

    path: Path
    files: list[Path]
    manifest: dict[str, Any] | None
    started: float
    """The manifest's ``started`` as a POSIX time; else the newest file's mtime."""


def find_runs(root: str | os.PathLike[str]) -> list[RunDir]:
    """Every run under ``root`` (recursively), oldest first.

    A run is a directory holding :data:`memprofiler.layout.RUN_MANIFEST` or any file the
    report reads; runs written before the manifest existed are found by their files.

    Raises:
        ArtifactError: ``root`` is missing or not a directory.
        NoRunFilesError: ``root`` holds no run.
    """
    base = Path(root)
    if not base.exists():
        raise ArtifactError(f"{base}: no such directory; pass the run's save_dir or a directory above it")
    if not base.is_dir():
        raise ArtifactError(f"{base}: not a directory; pass the run's save_dir or a directory above it")
    by_dir: dict[Path, list[Path]] = {}
    for p in sorted(base.rglob("*")):
        parsed = parse_name(p.name)
        if parsed is not None and parsed[0] in _READ and p.is_file():
            by_dir.setdefault(p.parent, []).append(p)
    if not by_dir:
        raise NoRunFilesError(
            f"{base}: no memprofiler files found (looked for {layout.RUN_MANIFEST}, "
            f"{layout.MEMORY_STATS_YAML.format(rank='*')}, {layout.MEMORY_SUMMARY_YAML}, "
            "cuda_alloc_rank_*.pickle, oom_rank_*); did the run collect any call?"
        )
    runs = []
    for path, files in by_dir.items():
        manifest_path = path / layout.RUN_MANIFEST
        manifest = _mapping(read_yaml(manifest_path), manifest_path) if manifest_path in files else None
        started = posix_time((manifest or {}).get("started"))
        if started is None:
            started = max(f.stat().st_mtime for f in files)
        runs.append(RunDir(path, [f for f in files if f != manifest_path], manifest, started))
    return sorted(runs, key=lambda r: (r.started, str(r.path)))


def posix_time(v: Any) -> float | None:
    """A manifest's time (an ISO string, or the datetime YAML reads it as) in POSIX seconds, or ``None``."""
    if isinstance(v, dt.datetime):  # YAML reads an unquoted ISO timestamp as a datetime
        return (v if v.tzinfo else v.replace(tzinfo=dt.UTC)).timestamp()
    if is_number(v):
        return float(v)
    if isinstance(v, str):
        try:
            return posix_time(dt.datetime.fromisoformat(v.replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


def fold_repeats(ooms: list[OomRecord]) -> list[OomRecord]:
    """``ooms`` (sorted by rank and number) with each exception handler's record of an OOM
    already recorded folded into that record (:attr:`OomRecord.repeated_by`)."""
    out: list[OomRecord] = []
    for o in ooms:
        if out and o.repeats(out[-1]):
            out[-1].repeated_by = o
        else:
            out.append(o)
    return out


def load_run(root: str | os.PathLike[str], streamed: bool = False) -> RunArtifacts:
    """Discover and load the artifacts of the newest run under ``root`` (recursively).

    Args:
        root: a ``save_dir``, or any directory above one or more runs.
        streamed: leave the per-rank stats YAML files unread, for
            :meth:`RunArtifacts.iter_snapshots` to read a block at a time (memory bounded
            by a block, however long the run).

    Raises:
        ArtifactError: ``root`` is missing or not a directory, holds no memprofiler files
            (:class:`~memprofiler.errors.NoRunFilesError`),
            or a file in it is empty, cut before its first block-end, or malformed.

    Example:
        >>> run = load_run("lightning_logs/version_0")  # doctest: +SKIP
        >>> run.stats[0]["0.training_step.2.end"]["rss_peak"]
    """
    runs = find_runs(root)
    chosen = runs[-1]
    run = RunArtifacts(root=chosen.path, files=chosen.files, manifest=chosen.manifest)
    if len(runs) > 1:
        when = dt.datetime.fromtimestamp(chosen.started, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        others = ", ".join(str(r.path) for r in reversed(runs[:-1][-3:])) + (" ..." if len(runs) > 4 else "")
        run.selection = (
            f"{root} holds {len(runs)} runs; reading the newest, {chosen.path} (started {when}); "
            f"pass another's directory to read it: {others}"
        )
    reports: dict[tuple[str, int, str, int], ModuleReport] = {}
    ooms: dict[tuple[int, int], OomRecord] = {}
    for path in chosen.files:
        _add(run, path, reports, ooms, streamed)
    if chosen.manifest is not None:
        run.run_ids[str(chosen.path / layout.RUN_MANIFEST)] = str(chosen.manifest.get("run_id") or "") or None
    check_one_run(run.run_ids.items())
    run.reports = sorted(reports.values(), key=lambda r: (r.kind, r.rank, r.fn, r.call))
    run.ooms = fold_repeats(sorted(ooms.values(), key=lambda o: (o.rank, o.n)))
    run.alloc_pickles.sort(key=lambda a: (a.rank, a.fn, a.call, a.phase != "start"))
    run.alloc_windows.sort(key=lambda w: (w.rank, w.n))
    if (line := ended_without_finishing(chosen.manifest)) is not None:
        run.warnings.insert(0, line)
    return run


def ended_without_finishing(manifest: Mapping[str, Any] | None) -> str | None:
    """One line when a run's manifest still says ``status: running`` but no process of this
    host holds it (its ``pid`` is gone: killed by SIGKILL or the OOM killer, or the machine
    went down); ``None`` otherwise (finished, crashed and said so, or still running)."""
    if not manifest or manifest.get("status") != "running":
        return None
    host, pid = manifest.get("host"), manifest.get("pid")
    started = manifest.get("started")
    since = f" (started {started})" if started else ""
    if host == socket.gethostname() and type(pid) is int and pid > 0:
        if _alive(pid):
            return None  # still running: the report shows what is on disk so far
        return (
            f"this run ended without finishing{since}: its `{layout.RUN_MANIFEST}` still says `status: "
            f"running` and its process ({pid}) is gone (killed by SIGKILL or the OOM killer?); what "
            "was flushed before is shown"
        )
    return (
        f"this run has not finished{since}: its `{layout.RUN_MANIFEST}` says `status: running` (on host "
        f"{host}, pid {pid}): still running there, or it ended without finishing; what was flushed is shown"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as err:
        return err.errno == errno.EPERM  # a process of another user holds the pid
    return True


def _add(
    run: RunArtifacts,
    path: Path,
    reports: dict[tuple[str, int, str, int], ModuleReport],
    ooms: dict[tuple[int, int], OomRecord],
    streamed: bool = False,
) -> None:
    parsed = parse_name(path.name)
    assert parsed is not None
    kind, f = parsed
    if kind in ("stats_yaml", "stats_pickle"):
        rank = int(f["rank"])
        if kind == "stats_yaml":
            run.run_ids[str(path)] = stats_run_id(path)
        if streamed and kind == "stats_yaml":
            run.stats_files[rank] = run.stats_paths[rank] = path
            return
        if kind == "stats_pickle":
            yaml_twin = path.with_name(layout.MEMORY_STATS_YAML.format(rank=rank))
            if rank in run.stats or rank in run.stats_files or yaml_twin.is_file():
                return  # the YAML beside it holds the same data and is the one we read
            data = safe_pickle.load(path)
        else:
            data = read_yaml(path, run.cuts)
        run.stats[rank] = _check_stats(data, path)
        run.stats_paths[rank] = path
    elif kind == "summary":
        run.summary = _mapping(read_yaml(path, run.cuts), path)
    elif kind in ("fsdp_yaml", "fsdp_log", "module_yaml", "module_log"):
        rep_kind, ext = kind.split("_")
        key = (rep_kind, int(f["rank"]), f["fn"], int(f["call"]))
        rep = reports.setdefault(key, ModuleReport(*key))
        if ext == "yaml":
            rep.data, rep.yaml_path = read_yaml(path, run.cuts), path
        else:
            rep.log_path = path
    elif kind == "alloc":
        run.alloc_pickles.append(AllocPickle(path, int(f["rank"]), f["fn"], int(f["call"]), f["phase"]))
    elif kind == "alloc_window":
        run.alloc_windows.append(AllocWindow(path, int(f["rank"]), int(f["n"])))
    elif kind == "alloc_window_index":
        # read with its recording (snapshot_calls.checked_index); alone, its recording is missing
        pickle = path.with_name(layout.CUDA_ALLOC_WINDOW_PICKLE.format(rank=f["rank"], n=f["n"]))
        if not pickle.is_file():
            run.warnings.append(
                f"{path.name}: the recording of rank {f['rank']} window {f['n']} ({pickle.name}) is "
                "missing: its allocator views cannot be shown; copy the pickle back beside its index"
            )
    elif kind in ("oom_pickle", "oom_yaml"):
        rank, n = int(f["rank"]), int(f["n"])
        rec = ooms.setdefault((rank, n), OomRecord(rank, n))
        if kind == "oom_pickle":
            rec.pickle_path = path
        else:
            rec.info = _mapping(read_yaml(path, run.cuts), path)


def _mapping(data: Any, path: Path) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


#: Snapshot keys ``parse_snapshot_key`` takes, one per line: a 100,000-call file's keys are
#: checked in one C pass (0.5 s one by one).
_SNAPSHOT_KEYS = re.compile(r"(?:[0-9]+\.[^\n]+\.[0-9]+\.[^.\n]+\n)*")


def _check_stats(data: Any, path: Path) -> dict[str, dict[str, Any]]:
    data = _mapping(data, path)
    try:
        keys = "\n".join(data) + "\n"
    except TypeError:  # a key that is not a string
        keys = ""
    if keys and _SNAPSHOT_KEYS.fullmatch(keys) and all(type(m) is dict for m in data.values()):
        return data
    for key, metrics in data.items():
        try:
            layout.parse_snapshot_key(str(key))
        except ValueError:
            raise ArtifactError(
                f"{path}: key {key!r} is not a snapshot key `{{rank}}.{{fn}}.{{call}}.{{start|end}}`"
            ) from None
        if metrics is None:
            data[key] = {}
        elif not isinstance(metrics, dict):
            raise ArtifactError(f"{path}: key {key!r} should map to metrics, got {type(metrics).__name__}")
    return data


def is_number(v: Any) -> bool:
    """Whether ``v`` is a metric value: an int or float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a metric dict; nested dicts (``saved_tensors.by_module``) join with dots."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        t = type(v)
        if t is int or t is float:  # the common case first: a long run holds millions
            out[f"{prefix}{k}"] = v
        elif isinstance(v, Mapping):
            out.update(flatten_metrics(v, f"{prefix}{k}."))
        elif is_number(v):
            out[f"{prefix}{k}"] = v
    return out


def match_any(name: str, patterns: Iterable[str]) -> bool:
    """Whether ``name`` matches one of the shell-style ``patterns`` (all names match no patterns)."""
    pats = list(patterns)
    return not pats or any(fnmatch.fnmatchcase(name, p) for p in pats)
