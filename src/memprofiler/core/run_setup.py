"""A run's beginning and end: the run directory all ranks agree on, and what it failed to collect.

Rank 0 claims the directory (``output.run_dir.claim``) and tells the other ranks through the
process group's key-value store, with a bounded wait: a collective here would hang every
rank whose peers never build a profiler (a user profiling rank 0 only).
"""

from __future__ import annotations

import dataclasses
import itertools
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
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_world_size())
    return 1


def claim_run_dir(requested: Path, rank: int, warn: Callable[..., None]) -> tuple[Path, RunManifest | None]:
    """The directory this run writes to, the same on every rank; rank 0's manifest.

    Raises:
        ArtifactError: the directory cannot be created or written (one line naming it).
    """
    store = _store()
    key = f"memprofiler/run_dir/{requested}/{next(_generation)}"
    manifest: RunManifest | None = None
    if rank == 0:
        manifest = RunManifest.new(requested, world_size())
        path = run_dir.claim(requested, manifest)
        if store is not None:
            store.set(key, str(path))  # type: ignore[attr-defined]
    else:
        shared = _from_rank0(store, key)
        path = Path(shared) if shared is not None else run_dir.follow(requested, rank)
        run_dir.check_writable(path)
    if path != requested:
        warn(
            f"`save_dir` {str(requested)!r} already holds a run; this run writes to {str(path)!r} "
            "(nothing is overwritten; give each run its own `save_dir` to choose the name)"
        )
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
    store = _store()
    key = f"memprofiler/run_dir/{requested.url}/{next(_generation)}"
    manifest: RunManifest | None = None
    if rank == 0:
        manifest = dataclasses.replace(RunManifest.new(Path(), world_size()), save_dir=requested.url)
        run = remote.claim(requested, yaml_document(manifest.to_dict()).encode())
        if store is not None:
            store.set(key, run.url)  # type: ignore[attr-defined]
    else:
        shared = _from_rank0(store, key)
        if shared is not None:
            run = RemoteDir.from_url(shared)
            remote.check_writable(run)
        else:
            run = remote.follow(requested, rank)
    if run.url != requested.url:
        warn(
            f"`save_dir` {requested.url!r} already holds a run; this run writes to {run.url!r} "
            "(nothing is overwritten; give each run its own `save_dir` to choose the name)"
        )
    return run, manifest


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
) -> list[str]:
    """One line for each configured function that collected nothing, saying why."""
    seen = ", ".join(f"{fn} x{n}" for fn, n in sorted(calls.items())) or "none"
    notes: list[str] = []
    for fn in sorted(collected_funcs):
        if collected.get(fn):
            continue
        n = calls.get(fn, 0)
        if n == 0:
            notes.append(f"`{fn}` (in `collect_funcs`) was never called; `@memprofilable` calls seen: {seen}")
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
