"""The fixed cost of one collected call, in microseconds, on CPU: an empty step, hooks off.

A collected call pays, besides the collectors' hooks, a fixed cost: the schedule and the
collector dispatch, each collector's start and end (the host RSS peak method, the CUDA
``memory_stats()`` reads and peak reset, allocator-history marks) and the record of the
snapshot (stats YAML entry, memory-trace counters). Each variant times ``with
prof.profile("training_step"): pass`` over its own profiler, in a new random order every round:

* ``bare``: the empty function alone (no profiler);
* ``outside``: a profiled function that is not collected (counted only);
* ``collected`` / ``collected_again``: every default collector (host RSS and peak, CUDA stats
  through the fake allocator), stats YAML and memory trace on, hooks off (A/A pair);
* ``no_host`` / ``no_cuda_stats``: ``collected`` without that collector;
* ``sampler``: ``rss_peak_method: sampler`` (a polling thread per call) instead of clear_refs;
* ``no_yaml`` / ``no_trace``: ``dump_memorystats_yaml`` / ``dump_memory_trace`` off;
* ``no_collectors``: every collector removed: the schedule, dispatch and record alone;
* ``history``: ``collected`` plus ``cuda_allocator_history`` (two marks per call);
* ``module_hooks_164``: ``collected`` plus the memory hooks, the step calling a GPT-2-shaped
  model of 164 modules (16 blocks of layer norms, attention and MLP linears, nested four
  levels deep, as GPT-2 124M's 164), minus ``collected`` on the same step without hooks
  (``module_hooks_164_base``): what the hooks add per call at that size;
  ``module_hooks_164_every_module`` hooks every module, as before the hooks were limited to
  the first two levels below the profiled module.

Prints one JSON object (median process CPU microseconds per call, and each part's share as
the difference of two variants). Run as
``MALLOC_ARENA_MAX=1 PYTHONPATH=src:tests python benchmarks/call_fixed_cost.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _emit import emit
from torch import nn

from fake_cuda import FakeCudaBackend
from memprofiler import MemProfiler
from memprofiler.collectors.module_hooks import ModuleHooksCollector

BASE: dict[str, Any] = {
    "schedule": {"warmup": 0, "active": 10**9},
    "enable_saved_tensors_hooks": False,
    "enable_memory_hooks": False,
    "collect_funcs": {"default": ["training_step"]},
    # flush as rarely as the defaults would over a window of this many calls
}


def _model() -> nn.Module:
    """164 modules nested like GPT-2's: root -> blocks -> block -> attention/MLP -> linear."""

    def block() -> nn.Module:
        attn = nn.Sequential(nn.Linear(1, 1), nn.Linear(1, 1))
        mlp = nn.Sequential(nn.Linear(1, 1), nn.GELU(), nn.Linear(1, 1))
        return nn.Sequential(nn.LayerNorm(1), attn, nn.LayerNorm(1), mlp)

    model = nn.Sequential(nn.Linear(1, 1), nn.Sequential(*[block() for _ in range(16)]), nn.LayerNorm(1))
    assert len(list(model.modules())) == 164
    return model


def _profiler(root: Path, name: str, extra: dict[str, Any], drop: tuple[str, ...] = ()) -> MemProfiler:
    d = root / name
    d.mkdir()
    fake = FakeCudaBackend()
    prof = MemProfiler({**BASE, **extra}, save_dir=d, rank=0, cuda=fake, module=_MODEL)
    prof.setup()
    if drop:
        regs = prof._collectors._regs
        prof._collectors._regs = [r for r in regs if drop != ("*",) and r.collector.name not in drop]
    return prof


_MODEL = _model()
_X = torch.ones(1, 1)


def _every_module(prof: MemProfiler) -> MemProfiler:
    for reg in prof._collectors:
        if isinstance(reg.collector, ModuleHooksCollector):
            reg.collector.hook_depth = None
    return prof


def _step_empty() -> None:
    return None


def _step_model() -> None:
    with torch.no_grad():
        _MODEL(_X)


def _timed(prof: MemProfiler | None, step: Callable[[], None], fn: str, calls: int) -> float:
    """Process CPU time per call (every thread, the flushes' share included), microseconds:
    on a machine shared with other jobs, CPU time is steadier than wall time."""
    t0 = time.process_time_ns()
    if prof is None:
        for _ in range(calls):
            step()
    else:
        for _ in range(calls):
            with prof.profile(fn):
                step()
    return (time.process_time_ns() - t0) / calls / 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200, help="calls per variant and round")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    random.seed(0)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        hooks = {"enable_memory_hooks": True}
        variants: dict[str, tuple[MemProfiler | None, Callable[[], None], str]] = {
            "bare": (None, _step_empty, "training_step"),
            "outside": (_profiler(root, "outside", {}), _step_empty, "not_collected"),
            "collected": (_profiler(root, "collected", {}), _step_empty, "training_step"),
            "collected_again": (_profiler(root, "collected_again", {}), _step_empty, "training_step"),
            "no_host": (_profiler(root, "no_host", {}, ("cpu",)), _step_empty, "training_step"),
            "no_cuda_stats": (_profiler(root, "no_cuda_stats", {}, ("cuda",)), _step_empty, "training_step"),
            "sampler": (
                _profiler(root, "sampler", {"rss_peak_method": "sampler"}),
                _step_empty,
                "training_step",
            ),
            "no_yaml": (
                _profiler(root, "no_yaml", {"dump_memorystats_yaml": False}),
                _step_empty,
                "training_step",
            ),
            "no_trace": (
                _profiler(root, "no_trace", {"dump_memory_trace": False}),
                _step_empty,
                "training_step",
            ),
            "no_collectors": (_profiler(root, "no_collectors", {}, ("*",)), _step_empty, "training_step"),
            "history": (
                _profiler(root, "history", {"cuda_allocator_history": True}),
                _step_empty,
                "training_step",
            ),
            "module_hooks_164": (_profiler(root, "hooks", hooks), _step_model, "training_step"),
            "module_hooks_164_base": (_profiler(root, "hooks_base", {}), _step_model, "training_step"),
            "module_hooks_164_every_module": (
                _every_module(_profiler(root, "hooks_all", hooks)),
                _step_model,
                "training_step",
            ),
        }
        samples: dict[str, list[float]] = {v: [] for v in variants}
        for prof, step, fn in variants.values():  # warm up
            _timed(prof, step, fn, 20)
        for _ in range(args.rounds):
            order = list(variants)
            random.shuffle(order)
            for v in order:
                calls = args.calls if not v.startswith("module_hooks") else max(10, args.calls // 3)
                samples[v].append(_timed(*variants[v], calls))
        for prof, _, _ in variants.values():
            if prof is not None:
                prof.teardown()
    med = {v: round(statistics.median(s), 1) for v, s in samples.items()}
    fixed = round(med["collected"] - med["bare"], 1)
    result = {
        "what": "process CPU microseconds per call, median over rounds of the mean of --calls calls",
        "per_call_us": med,
        "fixed_cost_us": {
            "collected_call": fixed,
            "aa_ratio": round(med["collected_again"] / med["collected"], 3),
            "host_collector": round(med["collected"] - med["no_host"], 1),
            "cuda_stats_collector (fake allocator)": round(med["collected"] - med["no_cuda_stats"], 1),
            "stats_yaml_entry": round(med["collected"] - med["no_yaml"], 1),
            "memory_trace": round(med["collected"] - med["no_trace"], 1),
            "schedule_dispatch_record": round(med["no_collectors"] - med["bare"], 1),
            "sampler_instead_of_clear_refs": round(med["sampler"] - med["collected"], 1),
            "allocator_history_marks": round(med["history"] - med["collected"], 1),
            "memory_hooks_at_164_modules": round(med["module_hooks_164"] - med["module_hooks_164_base"], 1),
            "memory_hooks_at_164_modules_every_module_hooked": round(
                med["module_hooks_164_every_module"] - med["module_hooks_164_base"], 1
            ),
            "outside_window": round(med["outside"] - med["bare"], 1),
        },
        "goal_us": 200,
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "machine_note": f"{os.cpu_count()} CPU cores shared with other jobs; CUDA stats through the fake "
        "allocator (torch.cuda.memory_stats() itself is not timed)",
        "machine_load": f"1-minute load average {load_before[0]:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end",
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
