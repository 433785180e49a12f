"""Find and load every file a memprofiler run wrote, wherever under the run directory it sits.

``save_dir`` usually lies under ``lightning_logs/version_N/memprofiler``, so the search is
recursive. A directory holding several runs is an error that lists them, rather than a
silent mix of their numbers.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from memprofiler import layout
from memprofiler.analysis import safe_pickle
from memprofiler.errors import ArtifactError

_STATS = re.compile(r"^rank_(\d+)_memory_stats\.(yaml|pickle)$")
_SUMMARY = "memory_summary.yaml"
_REPORT = re.compile(r"^(fsdp|module)_mem_rank_(\d+)_(.+)_(\d+)\.(yaml|log)$")
_ALLOC = re.compile(r"^cuda_alloc_rank_(\d+)\.(.+)\.(\d+)\.(start|end)\.pickle$")
_OOM = re.compile(r"^oom_rank_(\d+)_(\d+)\.(pickle|yaml)$")


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
class OomRecord:
    """An OOM flight-recorder dump: ``oom_rank_{r}_{n}.pickle`` and its ``.yaml``."""

    rank: int
    n: int
    pickle_path: Path | None = None
    info: dict[str, Any] | None = None


@dataclass
class RunArtifacts:
    """Everything found under one run directory. Allocator pickles are only listed, not loaded."""

    root: Path
    stats: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """rank -> snapshot key -> metric dict (as in ``rank_{r}_memory_stats.yaml``)."""
    summary: dict[str, Any] | None = None
    reports: list[ModuleReport] = field(default_factory=list)
    alloc_pickles: list[AllocPickle] = field(default_factory=list)
    ooms: list[OomRecord] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.stats)

    def snapshots(self) -> dict[str, dict[str, Any]]:
        """Every rank's snapshots in one dict; keys already carry the rank."""
        out: dict[str, dict[str, Any]] = {}
        for rank in self.ranks:
            out.update(self.stats[rank])
        return out


def load_run(root: str | os.PathLike[str]) -> RunArtifacts:
    """Discover and load the artifacts under ``root`` (recursively).

    Args:
        root: a ``save_dir``, or any directory above exactly one.

    Raises:
        ArtifactError: ``root`` is missing or not a directory, holds no memprofiler files,
            holds several runs, or a file in it is empty, truncated or malformed.

    Example:
        >>> run = load_run("lightning_logs/version_0")  # doctest: +SKIP
        >>> run.stats[0]["0.training_step.2.end"]["rss_peak"]
    """
    base = Path(root)
    if not base.exists():
        raise ArtifactError(f"{base}: no such directory; pass the run's save_dir or a directory above it")
    if not base.is_dir():
        raise ArtifactError(f"{base}: not a directory; pass the run's save_dir or a directory above it")
    found = [p for p in sorted(base.rglob("*")) if p.is_file() and _is_artifact(p.name)]
    if not found:
        raise ArtifactError(
            f"{base}: no memprofiler files found (looked for {layout.MEMORY_STATS_YAML.format(rank='*')}, "
            f"{_SUMMARY}, cuda_alloc_rank_*.pickle, oom_rank_*); did the run collect any call?"
        )
    dirs = sorted({p.parent for p in found})
    if len(dirs) > 1:
        listed = ", ".join(str(d) for d in dirs[:5]) + (" ..." if len(dirs) > 5 else "")
        raise ArtifactError(f"{base}: holds {len(dirs)} runs ({listed}); pass one of them")
    run = RunArtifacts(root=dirs[0], files=found)
    reports: dict[tuple[str, int, str, int], ModuleReport] = {}
    ooms: dict[tuple[int, int], OomRecord] = {}
    for path in found:
        _add(run, path, reports, ooms)
    run.reports = sorted(reports.values(), key=lambda r: (r.kind, r.rank, r.fn, r.call))
    run.ooms = sorted(ooms.values(), key=lambda o: (o.rank, o.n))
    run.alloc_pickles.sort(key=lambda a: (a.rank, a.fn, a.call, a.phase != "start"))
    return run


def _is_artifact(name: str) -> bool:
    return bool(
        _STATS.match(name)
        or name == _SUMMARY
        or _REPORT.match(name)
        or _ALLOC.match(name)
        or _OOM.match(name)
    )


def _add(
    run: RunArtifacts,
    path: Path,
    reports: dict[tuple[str, int, str, int], ModuleReport],
    ooms: dict[tuple[int, int], OomRecord],
) -> None:
    name = path.name
    if m := _STATS.match(name):
        rank, ext = int(m.group(1)), m.group(2)
        if ext == "pickle" and (rank in run.stats or path.with_suffix(".yaml").is_file()):
            return  # the YAML beside it holds the same data and is the one we read
        data = read_yaml(path) if ext == "yaml" else safe_pickle.load(path)
        run.stats[rank] = _check_stats(data, path)
    elif name == _SUMMARY:
        run.summary = _mapping(read_yaml(path), path)
    elif m := _REPORT.match(name):
        kind, rank, fn, call, ext = m.group(1), int(m.group(2)), m.group(3), int(m.group(4)), m.group(5)
        rep = reports.setdefault((kind, rank, fn, call), ModuleReport(kind, rank, fn, call))
        if ext == "yaml":
            rep.data, rep.yaml_path = read_yaml(path), path
        else:
            rep.log_path = path
    elif m := _ALLOC.match(name):
        run.alloc_pickles.append(AllocPickle(path, int(m.group(1)), m.group(2), int(m.group(3)), m.group(4)))
    elif m := _OOM.match(name):
        rec = ooms.setdefault((int(m.group(1)), int(m.group(2))), OomRecord(int(m.group(1)), int(m.group(2))))
        if m.group(3) == "pickle":
            rec.pickle_path = path
        else:
            rec.info = _mapping(read_yaml(path), path)


class _AliasFound(yaml.YAMLError):
    def __init__(self, mark: Any) -> None:
        super().__init__("alias")
        self.problem_mark = mark


class _NoAliasLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses aliases (``*name``).

    Each alias re-uses a whole subtree, so a 760-byte file of nested aliases expands to
    gigabytes (the "billion laughs"). ``memprofiler.output.writers`` never emits aliases, so a file
    with one was written by something else.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise _AliasFound(self.peek_event().start_mark)
        return super().compose_node(parent, index)


def read_yaml(path: Path) -> Any:
    """Load a file as safe YAML without aliases, turning every failure into a one-line :class:`ArtifactError`."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{path}: cannot read as text ({err})") from None
    if not text.strip():
        raise ArtifactError(f"{path}: file is empty; re-run to write it again")
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader subclass: no tags
    except _AliasFound as err:
        raise ArtifactError(
            f"{path}: refused: YAML alias (*name) at line {err.problem_mark.line + 1}; memprofiler "
            "never writes aliases and they can expand a small file to gigabytes"
        ) from None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ArtifactError(f"{path}: not valid YAML{at} (truncated or foreign file?)") from None


def _mapping(data: Any, path: Path) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _check_stats(data: Any, path: Path) -> dict[str, dict[str, Any]]:
    data = _mapping(data, path)
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


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a metric dict; nested dicts (``saved_tensors.by_module``) join with dots."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_metrics(v, name + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = v
    return out


def flat_snapshots(run: RunArtifacts) -> dict[str, dict[str, float]]:
    """Snapshot key -> numeric metrics, every rank."""
    return {key: flatten_metrics(m) for key, m in run.snapshots().items()}


def match_any(name: str, patterns: Iterable[str]) -> bool:
    """Whether ``name`` matches one of the shell-style ``patterns`` (all names match no patterns)."""
    pats = list(patterns)
    return not pats or any(fnmatch.fnmatchcase(name, p) for p in pats)
