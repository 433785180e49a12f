"""A run's beginning and end: the run directory all ranks agree on, and what it failed to collect.

Rank 0 claims the directory (``output.run_dir.claim``) and tells the other ranks through the
process group's key-value store, with a bounded wait: a collective here would hang every
rank whose peers never build a profiler (a user profiling rank 0 only).
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path

import torch

from memprofiler import layout
from memprofiler.config import MemProfilerConfig
from memprofiler.core import schedule
from memprofiler.output import remote, run_dir
from memprofiler.output.remote import RemoteDir
from memprofiler.output.run_dir import RunManifest
from memprofiler.output.writers import yaml_document

#: How long a rank waits for rank 0 to name the run directory before deciding alone.
SHARE_TIMEOUT_S = 60.0
_generation = itertools.count()  # n-th profiler set up in this process: the same n on every rank


def _store() -> object | None:
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    try:
        return torch.distributed.distributed_c10d._get_default_store()
    except Exception:
        return None


def world_size() -> int:
    return group_size() or 1


def group_size() -> int | None:
    """The default process group's size; ``None`` without one (where :func:`world_size` says 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_world_size())
    return None


def _agree(name: str, rank: int, on_rank0: Callable[[], str]) -> str | None:
    """Rank 0 runs ``on_rank0`` and posts its answer; the others read it (``None``: no store,
    or rank 0 never answered within ``SHARE_TIMEOUT_S``)."""
    store = _store()
    key = f"memprofiler/run_dir/{name}/{next(_generation)}"
    if rank == 0:
        answer = on_rank0()
        if store is not None:
            store.set(key, answer)  # type: ignore[attr-defined]
        return answer
    return _from_rank0(store, key)


def _say_moved(warn: Callable[..., None], requested: str, chosen: str) -> None:
    if chosen != requested:
        warn(
            f"`save_dir` {requested!r} already holds a run; this run writes to {chosen!r} "
            "(nothing is overwritten; give each run its own `save_dir` to choose the name)"
        )


def claim_run_dir(requested: Path, rank: int, warn: Callable[..., None]) -> tuple[Path, RunManifest | None]:
    """The directory this run writes to, the same on every rank; rank 0's manifest.

    Raises:
        ArtifactError: the directory cannot be created or written (one line naming it).
    """
    manifest = RunManifest.new(requested, world_size()) if rank == 0 else None
    shared = _agree(str(requested), rank, lambda: str(run_dir.claim(requested, manifest)))  # type: ignore[arg-type]
    path = Path(str(shared)) if shared is not None else run_dir.follow(requested, rank)
    if rank != 0:
        run_dir.check_writable(path)
    _say_moved(warn, str(requested), str(path))
    free = run_dir.free_bytes(path)
    if free is not None and free < run_dir.LOW_SPACE_BYTES:
        warn(
            f"`save_dir` {str(path)!r} has only {free // 2**20} MiB free; files may be cut short",
            all_ranks=True,
        )
    return path, manifest


def claim_remote_run_dir(
    url: str, rank: int, warn: Callable[..., None]
) -> tuple[RemoteDir, RunManifest | None]:
    """:func:`claim_run_dir` for a ``save_dir`` on object storage: rank 0 claims it on the store.

    Raises:
        ArtifactError: the store cannot be reached or written (one line naming the URL and the fix).
    """
    requested = RemoteDir.from_url(url)
    manifest = None
    if rank == 0:
        manifest = dataclasses.replace(RunManifest.new(Path(), world_size()), save_dir=requested.url)
    document = yaml_document(manifest.to_dict()).encode() if manifest is not None else b""
    shared = _agree(requested.url, rank, lambda: remote.claim(requested, document).url)
    if rank == 0 or shared is not None:
        run = RemoteDir.from_url(str(shared))
        if rank != 0:
            remote.check_writable(run)
    else:
        run = remote.follow(requested, rank)
    _say_moved(warn, requested.url, run.url)
    return run, manifest


def share_run_id(rank: int, manifest: RunManifest | None) -> str | None:
    """The run id every rank writes into its files: rank 0's manifest's, posted like the
    directory (``None`` on a rank with no process group to ask through)."""
    return _agree("run_id", rank, lambda: manifest.run_id if manifest is not None else "")


def share_new_id(rank: int) -> str | None:
    """A new run id, rank 0's on every rank that can ask it (a process group's store); for a
    run without memprofiler's run directory (the extended profiler alone). ``None`` on a rank
    that cannot ask: an id of its own would tell its files apart from its run's."""
    return _agree("profiler_run_id", rank, lambda: uuid.uuid4().hex[:12]) or None


def _from_rank0(store: object | None, key: str) -> str | None:
    if store is None:
        return None
    try:
        store.wait([key], timedelta(seconds=SHARE_TIMEOUT_S))  # type: ignore[attr-defined]
        return str(store.get(key).decode())  # type: ignore[attr-defined]
    except Exception:
        return None


def collection_notes(
    cfg: MemProfilerConfig,
    calls: Mapping[str, int],
    collected: Mapping[str, int],
    collected_funcs: frozenset[str],
    unresolved: Mapping[str, str] | None = None,
) -> list[str]:
    """One line for each configured function that collected nothing, saying why.

    ``unresolved``: name -> why no method of that name could be wrapped (set-up's warning),
    which says more than "never called".
    """
    seen = ", ".join(f"{fn} x{n}" for fn, n in sorted(calls.items())) or "none"
    notes: list[str] = []
    for fn in sorted(collected_funcs):
        if collected.get(fn):
            continue
        n = calls.get(fn, 0)
        if n == 0:
            why = (unresolved or {}).get(fn)
            if why is not None:
                notes.append(why)  # the set-up warning's words: warned once, kept in the manifest
            else:
                notes.append(f"`{fn}` (in `collect_funcs`) was never called; calls seen: {seen}")
            continue
        s = cfg.schedule
        bound = n + s.skip_first + s.wait + s.warmup + (s.warmup_iters or 0) + 2
        first = next((c for c in range(1, bound) if schedule.action(s, c).collects), None)
        notes.append(
            f"`{fn}` was called {n} time(s) but the schedule collects no call before "
            f"call {first if first is not None else '?'}; lower `schedule.skip_first`/`wait`/`warmup` "
            f"(nothing is in `{layout.MEMORY_STATS_YAML.format(rank=0)}` for it)"
        )
    return notes
