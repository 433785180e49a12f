"""The write path over long runs: window-close cost, final dump and profiler memory at 3k and 100k calls.

Two runs of a plain loop with the host and saved-tensor collectors on (a tiny model: the
figures are the profiler's own, not the model's):

* ``wait: 1`` (a window closes every other call): the cost of ``finish()`` on the calls that
  close a window, over the first and the last 200 windows. Flat means each close costs what
  it adds, not what the run has collected.
* collect every call (``warmup: 0, active: 1, repeat: 0``): the time of the final
  ``teardown()`` (what a SIGTERM grace period must fit), the profiler's RSS growth and its
  in-memory snapshot count, and the stats file's size, after ``--calls`` calls.

Prints one JSON object. Usage:
``MALLOC_ARENA_MAX=1 python benchmarks/long_run.py [--calls 3000 100000] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import torch
from _emit import emit
from torch import nn

from memprofiler import MemProfiler


def _step(prof: MemProfiler, model: nn.Module, x: torch.Tensor) -> float:
    """One step; returns the seconds spent leaving the profiled call (the window close)."""
    run = prof.begin("training_step", model)
    loss = model(x).sum()
    t0 = time.perf_counter()
    if run is not None:
        prof.finish(run, True)
    spent = time.perf_counter() - t0
    loss.backward()
    prof.step_end()
    return spent


def window_closes(windows: int, model: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    cfg = {"schedule": {"wait": 1, "warmup": 0, "active": 1, "repeat": 0}}
    with tempfile.TemporaryDirectory() as tmp, MemProfiler(cfg, save_dir=tmp, rank=0) as prof:
        closes = [_step(prof, model, x) for _ in range(2 * windows)][1::2]
    first, last = statistics.mean(closes[:200]), statistics.mean(closes[-200:])
    return {
        "windows": windows,
        "close_ms_first_200": round(first * 1e3, 3),
        "close_ms_last_200": round(last * 1e3, 3),
        "last_over_first": round(last / first, 2),
    }


def collect_every_call(calls: int, model: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    cfg = {"schedule": {"warmup": 0, "active": 1, "repeat": 0}}
    proc = psutil.Process()
    with tempfile.TemporaryDirectory() as tmp:
        prof = MemProfiler(cfg, save_dir=tmp, rank=0).setup(model)
        gc.collect()
        rss0 = proc.memory_info().rss
        t0 = time.perf_counter()
        for _ in range(calls):
            _step(prof, model, x)
        run_s = time.perf_counter() - t0
        gc.collect()
        rss1 = proc.memory_info().rss
        t0 = time.perf_counter()
        prof.teardown()
        final_s = time.perf_counter() - t0
        size = (Path(tmp) / "rank_0_memory_stats.yaml").stat().st_size
    return {
        "calls": calls,
        "run_s": round(run_s, 1),
        "final_dump_s": round(final_s, 3),
        "profiler_rss_growth_mib": round((rss1 - rss0) / 2**20, 1),
        "snapshots_in_memory": len(prof.snapshots),
        "stats_yaml_mib": round(size / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[3000, 100_000])
    parser.add_argument("--windows", type=int, default=1500)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    x = torch.randn(4, 16)
    result = {
        "window_closes": window_closes(args.windows, model, x),
        "collect_every_call": [collect_every_call(n, model, x) for n in args.calls],
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
