"""Summarize every rank's snapshots across ranks into ``memory_summary.yaml`` (rank 0 writes it).

For each ``{fn}.{call}.{phase}`` and each numeric metric the file gives ``min``, ``max``,
``mean``, ``argmax_rank`` (lowest rank on ties), ``imbalance`` (``max / mean``; null when the
mean is not positive) and ``n_ranks`` (how many ranks reported it), plus ``world_size``,
``ranks`` (those that reported) and ``missing_ranks``. Nested mappings (e.g.
``saved_tensors.by_module``) are flattened with dots.

Ranks never send their snapshots: each flattens its own to a vector and the vectors are
reduced (:mod:`memprofiler.core.summary_stats`), through collectives normally and through the
process group's store after an exception (:mod:`memprofiler.core.summary_exchange`). Rank 0's
time and memory grow with the number of metrics, not with the world size
(``benchmarks/summary_scale.py``). Nothing here imports Lightning.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from memprofiler import layout
from memprofiler.core.summary_exchange import (
    dist_ready,
    post_to_store,
    reduce_collective,
    reduce_from_store,
)
from memprofiler.core.summary_stats import Accumulator, Partial, RankMetrics, Snapshots, summary_from_partial
from memprofiler.output.writers import write_yaml

__all__ = [
    "dist_ready",
    "gather_and_write_summary",
    "reduce_collective",
    "summarize",
    "write_cross_rank_summary",
    "write_summary",
]


def summarize(per_rank: Mapping[int, Snapshots]) -> dict[str, Any]:
    """Cross-rank statistics of every numeric metric of every snapshot, from in-memory snapshots.

    The same reduction the transports apply, fed directly (tests, benchmarks, offline use).

    Args:
        per_rank: global rank -> that rank's snapshots (keys ``{rank}.{fn}.{call}.{phase}``).

    Returns:
        ``{"world_size", "ranks", "snapshots": {"{fn}.{call}.{phase}": {metric: stats}}}``.

    Example:
        >>> s = summarize({0: {"0.f.1.end": {"rss": 10}}, 1: {"1.f.1.end": {"rss": 30}}})
        >>> s["snapshots"]["f.1.end"]["rss"]["imbalance"]
        1.5
    """
    return _document(_reduce_in_memory(per_rank), sorted(per_rank), len(per_rank))


def _reduce_in_memory(per_rank: Mapping[int, Snapshots]) -> Partial:
    acc = Accumulator()
    for rank in sorted(per_rank):
        acc.add(rank, RankMetrics.from_snapshots(per_rank[rank]))
    return acc.partial


def _document(partial: Partial, ranks: list[int], world_size: int) -> dict[str, Any]:
    return {
        "world_size": world_size,
        "ranks": ranks,
        "snapshots": summary_from_partial(partial),
        "missing_ranks": sorted(set(range(world_size)) - set(ranks)),
    }


def write_summary(save_dir: str | Path, per_rank: Mapping[int, Snapshots], world_size: int) -> Path:
    """Write ``save_dir/memory_summary.yaml`` from in-memory snapshots, atomically.

    Ranks that did not report are listed under ``missing_ranks``.
    """
    return _write(save_dir, _reduce_in_memory(per_rank), sorted(per_rank), world_size)


def _write(save_dir: str | Path, partial: Partial, ranks: list[int], world_size: int) -> Path:
    doc = _document(partial, ranks, world_size)
    return write_yaml(Path(save_dir) / layout.MEMORY_SUMMARY_YAML, doc)


def write_cross_rank_summary(
    snapshots: Snapshots,
    save_dir: str | Path,
    rank: int,
    world_size: int,
    *,
    after_exception: bool = False,
    generation: int = 0,
    timeout_s: float = 15.0,
) -> Path | None:
    """Reduce every rank's snapshots; rank 0 writes ``save_dir/memory_summary.yaml``.

    Every rank of the default process group calls it with its own snapshots. Normally the
    ranks meet in collectives (all must call it). With ``after_exception`` the other ranks may
    be stuck in another collective, so each rank posts to the store without blocking and
    rank 0 waits at most ``timeout_s``; ranks that did not post are ``missing_ranks``.

    Args:
        snapshots: this rank's snapshots (``MemProfiler.snapshots``).
        save_dir: the run's resolved directory (``MemProfiler.save_dir``), the same on every rank.
        rank: this process's global rank (``MemProfiler.rank``).
        world_size: ranks in the run (``torch.distributed.get_world_size()``).
        after_exception: use the bounded store exchange instead of collectives.
        generation: distinguishes successive exchanges in one process group (count them).
        timeout_s: how long rank 0 waits for the other ranks after an exception.

    Returns:
        The summary path on rank 0; ``None`` on other ranks and without a process group.

    Raises:
        RuntimeError: ``rank``/``world_size`` disagree with the process group, or a collective
            or the store failed; the caller warns and keeps the per-rank files.

    Example:
        >>> write_cross_rank_summary(prof.snapshots, prof.save_dir, prof.rank,
        ...                          torch.distributed.get_world_size())  # doctest: +SKIP
    """
    if not dist_ready():
        return None
    dist = torch.distributed
    if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
        raise RuntimeError(
            f"rank {rank} of {world_size} given, but the process group says rank "
            f"{dist.get_rank()} of {dist.get_world_size()}"
        )
    metrics = RankMetrics.from_snapshots(snapshots)
    if after_exception:
        store = dist.distributed_c10d._get_default_store()
        channel = str(save_dir)
        if rank != 0:
            post_to_store(store, metrics, rank, generation, channel)
            return None
        partial, ranks = reduce_from_store(store, metrics, world_size, generation, timeout_s, channel)
        return _write(save_dir, partial, ranks, world_size)
    reduced = reduce_collective(metrics)
    if reduced is None:
        return None
    return _write(save_dir, reduced, list(range(world_size)), world_size)


def gather_and_write_summary(
    snapshots: Snapshots,
    save_dir: str | Path,
    *,
    after_exception: bool = False,
    generation: int = 0,
    timeout_s: float = 15.0,
) -> Path | None:
    """:func:`write_cross_rank_summary` with rank and world size read from the process group.

    Returns:
        The summary path on rank 0, else ``None`` (also without a process group).
    """
    if not dist_ready():
        return None
    return write_cross_rank_summary(
        snapshots,
        save_dir,
        torch.distributed.get_rank(),
        torch.distributed.get_world_size(),
        after_exception=after_exception,
        generation=generation,
        timeout_s=timeout_s,
    )
