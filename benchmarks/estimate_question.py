"""The 7B question in one command, timed as a user runs it; prints JSON.

``memprofiler estimate llama-7b --gpu H100 --world-size 8 --checkpointing both --batch-size auto``
on transformers' ``LlamaConfig()`` (32 layers, hidden 4,096, 6.74 B parameters, made locally: no
download), FSDP2, AdamW, bf16-mixed, 4,096 tokens a row. Each repeat is a fresh process, so the
figures include Python's start and the imports; CPU time counts the forked children that estimate
side by side. The load average before and after each repeat is recorded beside it: the figures are
only as quiet as the machine.

Run: ``MALLOC_ARENA_MAX=1 PYTHONPATH=src python benchmarks/estimate_question.py [--repeats 2]
[--out benchmarks/results]``
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from _emit import emit

COMMAND = ["--gpu", "H100", "--world-size", "8", "--checkpointing", "both", "--batch-size", "auto"]


def _config(where: Path) -> Path:
    from transformers import LlamaConfig

    LlamaConfig().save_pretrained(where / "llama-7b")
    return where / "llama-7b"


def one_run(model: Path, out: Path, jobs: int | None) -> dict[str, Any]:
    """One fresh process of the command: wall, CPU (its children too), peak RSS, the answer."""
    argv = [sys.executable, "-m", "memprofiler", "estimate", str(model), *COMMAND, "--save-dir", str(out)]
    if jobs is not None:
        argv += ["--jobs", str(jobs)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    data = yaml.safe_load((out / "memory_estimate.yaml").read_text())
    rows = data["estimates"]
    largest = {
        ckpt: max((r["batch_size"] for r in rows if r["checkpointing"] is ckpt and _fits(r, data)), default=0)
        for ckpt in (False, True)
    }
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), 1),
        "max_rss_mib": round(after.ru_maxrss / 1024),
        "estimates": len(rows),
        "largest_rows_without_checkpointing": largest[False],
        "largest_rows_with_checkpointing": largest[True],
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def _fits(row: dict[str, Any], data: dict[str, Any]) -> bool:
    peak = max(row["reserved_peak_bytes"], row["peak_bytes"]) + row["margin_bytes"]
    return bool(peak + data["reserve_bytes"] <= data["device_memory_bytes"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = _config(Path(tmp))
        runs = [one_run(model, Path(tmp) / f"run{i}", args.jobs) for i in range(args.repeats)]
    result = {
        "command": "memprofiler estimate llama-7b " + " ".join(COMMAND),
        "cores": len(os.sched_getaffinity(0)),
        "runs": runs,
        "best_wall_s": min(r["wall_s"] for r in runs),
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
