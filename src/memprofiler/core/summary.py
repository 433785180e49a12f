"""Gather every rank's snapshots and summarize them across ranks (``memory_summary.yaml``).

Ranks exchange their consolidated snapshots through ``torch.distributed``, never through
files (other ranks' files may sit on other nodes). Two transports:

* :func:`gather_collective` (normal end of a run): ``gather_object`` to rank 0 over the
  default process group (gloo or NCCL). Every rank must call it.
* :func:`gather_via_store` (after an exception): each rank posts its snapshots to the
  process group's key-value store without blocking, and rank 0 waits a bounded time for the
  others. A collective here could hang forever when the other ranks are blocked in a
  different collective (one rank failed, the others still train); the store cannot.

:func:`summarize` is a pure function: for each ``{fn}.{call}.{start|end}`` and each numeric
metric it gives ``min``, ``max``, ``mean``, ``argmax_rank`` (lowest rank on ties),
``imbalance`` (``max / mean``; null when the mean is not positive) and ``n_ranks`` (how many
ranks reported it). Nested mappings (e.g. ``saved_tensors.by_module``) are flattened with
dots. Nothing here imports Lightning.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from memprofiler import layout
from memprofiler.output.writers import to_plain, write_yaml

Snapshots = Mapping[str, Mapping[str, Any]]

_STORE_PREFIX = "memprofiler/snapshots"


def dist_ready() -> bool:
    """Whether a default process group exists to gather through."""
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


def _numeric_leaves(metrics: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    for name, value in metrics.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping):
            yield from _numeric_leaves(value, f"{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield key, value


def _stats(by_rank: Mapping[int, float]) -> dict[str, Any]:
    values = list(by_rank.values())
    hi, lo = max(values), min(values)
    mean = sum(values) / len(values)
    return {
        "min": lo,
        "max": hi,
        "mean": mean,
        "argmax_rank": min(r for r, v in by_rank.items() if v == hi),
        "imbalance": (hi / mean) if mean > 0 else None,
        "n_ranks": len(values),
    }


def summarize(per_rank: Mapping[int, Snapshots]) -> dict[str, Any]:
    """Cross-rank statistics of every numeric metric of every snapshot.

    Args:
        per_rank: global rank -> that rank's snapshots (keys ``{rank}.{fn}.{call}.{phase}``).

    Returns:
        ``{"world_size", "ranks", "snapshots": {"{fn}.{call}.{phase}": {metric: stats}}}``.

    Example:
        >>> s = summarize({0: {"0.f.1.end": {"rss": 10}}, 1: {"1.f.1.end": {"rss": 30}}})
        >>> s["snapshots"]["f.1.end"]["rss"]["imbalance"]
        1.5
    """
    table: dict[str, dict[str, dict[int, float]]] = {}
    for rank in sorted(per_rank):
        for key, metrics in per_rank[rank].items():
            _, fn, call, phase = layout.parse_snapshot_key(key)
            per_metric = table.setdefault(f"{fn}.{call}.{phase}", {})
            for name, value in _numeric_leaves(metrics):
                per_metric.setdefault(name, {})[rank] = value
    return {
        "world_size": len(per_rank),
        "ranks": sorted(per_rank),
        "snapshots": {
            skey: {name: _stats(by_rank) for name, by_rank in metrics.items()}
            for skey, metrics in table.items()
        },
    }


def gather_collective(snapshots: Snapshots) -> dict[int, Snapshots] | None:
    """``gather_object`` every rank's snapshots to rank 0; all ranks must call it.

    Returns:
        On rank 0, global rank -> snapshots; elsewhere ``None``.

    Raises:
        RuntimeError: no process group, or the collective failed.
    """
    if not dist_ready():
        raise RuntimeError("torch.distributed is not initialized")
    dist = torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()
    out: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(to_plain(snapshots), out, dst=0)
    if out is None:
        return None
    return dict(enumerate(out))


def gather_via_store(
    snapshots: Snapshots, generation: int, timeout_s: float, channel: str = ""
) -> dict[int, Snapshots] | None:
    """Post this rank's snapshots to the default store; rank 0 collects what arrives in time.

    Never blocks a rank other than 0; rank 0 waits at most ``timeout_s``.

    Args:
        snapshots: this rank's snapshots.
        generation: distinguishes successive exchanges in one process group.
        channel: further distinguishes exchanges (the callback passes its ``save_dir``).
        timeout_s: how long rank 0 waits for the other ranks.

    Returns:
        On rank 0, global rank -> snapshots for the ranks that posted; elsewhere ``None``.

    Raises:
        RuntimeError: no process group or no store.
    """
    if not dist_ready():
        raise RuntimeError("torch.distributed is not initialized")
    dist = torch.distributed
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    prefix = f"{_STORE_PREFIX}/{generation}/{channel}"
    store.set(f"{prefix}/{rank}", json.dumps(to_plain(snapshots)))
    if rank != 0:
        return None
    got: dict[int, Snapshots] = {0: snapshots}
    deadline = time.monotonic() + timeout_s
    missing = set(range(1, world))
    while missing:
        for r in sorted(missing):
            key = f"{prefix}/{r}"
            if store.check([key]):
                store.wait([key], timedelta(seconds=max(timeout_s, 1.0)))
                got[r] = json.loads(store.get(key))
                store.delete_key(key)  # consumed: a later exchange never reads it again
                missing.discard(r)
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return got


def write_summary(save_dir: str | Path, per_rank: Mapping[int, Snapshots], world_size: int) -> Path:
    """Write ``save_dir/memory_summary.yaml`` from gathered snapshots, atomically.

    Ranks that did not report are listed under ``missing_ranks``.
    """
    summary = summarize(per_rank)
    summary["world_size"] = world_size
    summary["missing_ranks"] = sorted(set(range(world_size)) - set(per_rank))
    return write_yaml(Path(save_dir) / layout.MEMORY_SUMMARY_YAML, summary)


def gather_and_write_summary(
    snapshots: Snapshots,
    save_dir: str | Path,
    *,
    after_exception: bool = False,
    generation: int = 0,
    timeout_s: float = 15.0,
) -> Path | None:
    """Gather every rank's snapshots and have rank 0 write ``memory_summary.yaml``.

    Uses :func:`gather_collective` normally and :func:`gather_via_store` when
    ``after_exception`` (the other ranks may be stuck elsewhere). Does nothing without a
    process group.

    Returns:
        The summary path on rank 0, else ``None``.

    Raises:
        Exception: whatever the transport raised; the caller warns and keeps the per-rank files.
    """
    if not dist_ready():
        return None
    world = torch.distributed.get_world_size()
    if after_exception:
        per_rank = gather_via_store(snapshots, generation, timeout_s, channel=str(save_dir))
    else:
        per_rank = gather_collective(snapshots)
    if per_rank is None:
        return None
    return write_summary(save_dir, per_rank, world)
