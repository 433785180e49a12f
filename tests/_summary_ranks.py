"""Four-rank cross-rank summary worker: ``python -m _summary_ranks RANK OUT``.

Kept apart from the tests so the worker processes import torch and the summary only (not
Lightning). The known per-rank numbers live here; the test asserts the statistics.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from memprofiler.core.summary import write_cross_rank_summary

WORLD4 = 4


def snapshots4(rank: int) -> dict[str, Any]:
    """Known numbers: rank r has rss = 1000 * (r + 1); ties and floats on purpose."""
    return {
        f"{rank}.training_step.1.start": {"rss": 1000 * (rank + 1), "vms": 5000},
        f"{rank}.training_step.1.end": {
            "rss": 1000 * (rank + 1) + 7,
            "fsdp.peak.total": [7, 9, 3, 9][rank],  # a tie between ranks 1 and 3
            "fsdp.peak_device": "cpu",
            "frac": 0.5 * rank,
            "saved_tensors.by_module": {"net.0": rank},
        },
    }


def odd_snapshots4(rank: int) -> dict[str, Any]:
    """Key sets that differ: rank 2 collected one more call, rank 3 one more metric."""
    snaps = snapshots4(rank)
    if rank == 2:
        snaps["2.training_step.2.end"] = {"rss": 42}
    if rank == 3:
        snaps["3.training_step.1.end"]["only3"] = 7
    return snaps


def worker4(rank: int, out: Path) -> None:  # pragma: no cover - runs in the subprocesses
    dist.init_process_group("gloo", rank=rank, world_size=WORLD4)
    write_cross_rank_summary(snapshots4(rank), out / "same", rank, WORLD4)
    write_cross_rank_summary(odd_snapshots4(rank), out / "odd", rank, WORLD4)
    if rank != 3:  # rank 3 never reaches the exchange
        write_cross_rank_summary(
            odd_snapshots4(rank),
            out / "crashed",
            rank,
            WORLD4,
            after_exception=True,
            generation=1,
            timeout_s=5.0,
        )
    dist.barrier()
    write_cross_rank_summary(
        odd_snapshots4(rank),
        out / "all_posted",
        rank,
        WORLD4,
        after_exception=True,
        generation=2,
        timeout_s=60.0,
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    worker4(int(sys.argv[1]), Path(sys.argv[2]))
    print("worker finished", flush=True)
