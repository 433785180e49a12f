"""Cost of the window-close rewrite of the stats files as windows pile up, on CPU.

A schedule with ``repeat: 0`` closes a collection window every few steps, and every close
rewrites ``rank_{rank}_memory_stats.yaml`` and ``memory_trace_rank_{rank}.json`` atomically so
that a killed process keeps them. This runs a small MLP through ``--windows`` windows
(``wait: 1, active: 1``) and reports the mean step time, window close included, over the
first and the last 100 windows. It then times, side by side on the final snapshots, the
cached rewrite the profiler does against serialising everything from scratch (what it did
before the cache), and prints their ratio.

Prints one JSON object. Usage: ``python benchmarks/window_dumps.py [--windows N] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import yaml
from _emit import emit
from torch import nn

from memprofiler import MemProfiler
from memprofiler.output.writers import to_plain


def _median_s(fn: object, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=1500)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(*(nn.Linear(32, 32) for _ in range(8)))
    x = torch.randn(8, 32)
    cfg = {"schedule": {"wait": 1, "warmup": 0, "active": 1, "repeat": 0}}
    with tempfile.TemporaryDirectory() as tmp:
        prof = MemProfiler(cfg, save_dir=tmp, rank=0)
        with prof:
            step_s: list[float] = []
            for _ in range(2 * args.windows):
                t0 = time.perf_counter()
                with prof.profile("training_step", module=model):
                    loss = model(x).sum()
                loss.backward()
                prof.step_end()
                step_s.append(time.perf_counter() - t0)
            snapshots = prof.snapshots
            cache = prof._snapshot_cache
            timeline = prof.timeline
            assert timeline is not None
            cached = _median_s(lambda: (cache.yaml_text(snapshots), timeline.to_json()))
            scratch = _median_s(
                lambda: (
                    yaml.safe_dump(to_plain(snapshots), sort_keys=False, default_flow_style=False),
                    json.dumps(timeline.to_trace()),
                )
            )
            yaml_bytes = (Path(tmp) / "rank_0_memory_stats.yaml").stat().st_size
    # The collected call is every second step; its window closes inside it.
    first = [t for i, t in enumerate(step_s[:200]) if i % 2 == 1]
    last = [t for i, t in enumerate(step_s[-200:]) if i % 2 == 1]
    result = {
        "benchmark": "window_dumps",
        "windows": args.windows,
        "snapshots": len(snapshots),
        "yaml_bytes": yaml_bytes,
        "collected_step_ms_first_100_windows": round(statistics.mean(first) * 1e3, 3),
        "collected_step_ms_last_100_windows": round(statistics.mean(last) * 1e3, 3),
        "serialise_all_ms": {"cached": round(cached * 1e3, 3), "from_scratch": round(scratch * 1e3, 3)},
        "ratio_from_scratch_over_cached": round(scratch / cached, 1),
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
