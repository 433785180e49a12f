"""Step-time cost of the step timeline: the host sampler thread and the per-hook span recording.

A plain CPU training loop (an MLP of 12 residual blocks, forward + backward + SGD, one thread),
timed side by side in one process. Variants run interleaved, in a new random order every
round, each round long enough for several host samples. A round's time is the total of its
steps (so every sample taken during it counts: a median step would hide a sample landing in one
step in fifty); the figure is the median over rounds of each variant's round time over the
baseline's in the same round, which keeps load spikes of a shared host out of it:

* ``baseline`` and ``baseline_again``: nothing running (their ratio is the noise floor);
* ``sampler_default``: :class:`HostSampler` at the default interval (0.5 s), every metric;
* ``sampler_fast``: the same at 0.05 s, ten times the default rate, to show how cost scales;
* ``hook_spans``: 40 ``StepTimeline.begin``/``end`` pairs per step, about what Lightning's
  profiler actions amount to per training step (hooks, callbacks, strategy, data loader).

The process's CPU time (all its threads, the sampler's included) is compared the same way
(``cpu_time_ratio``): another job's load on a shared host moves it far less than wall time.
``sampler_cpu_share_at_default`` is one sample's median cost over the interval: the most the
sampler can take from training even if every sample stalled the training thread.

Prints one JSON object with ``ratio`` = variant / baseline. Usage:
``MALLOC_ARENA_MAX=1 python benchmarks/host_sampler.py [--rounds N] [--round-s S] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _emit import emit
from torch import nn

from memprofiler.config.timeline import TimelineConfig
from memprofiler.core.host_sampler import HostSampler
from memprofiler.output.step_timeline import StepTimeline

#: Lightning profiler actions per training step, as counted on a tiny model (see the docs).
HOOKS_PER_STEP = 40


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


def _model(width: int = 256, depth: int = 12) -> nn.Module:
    return nn.Sequential(*(_Block(width) for _ in range(depth)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--round-s", type=float, default=2.0, help="seconds per variant per round")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256)
    timeline = StepTimeline()
    default_interval = TimelineConfig().host_interval_s

    def step(hooks: bool) -> None:
        if hooks:
            for i in range(HOOKS_PER_STEP // 2):
                timeline.begin(f"[Callback]Hook{i}.on_train_batch_end")
                timeline.end(f"[Callback]Hook{i}.on_train_batch_end")
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if hooks:
            for i in range(HOOKS_PER_STEP // 2):
                timeline.begin(f"[Strategy]Hook{i}.backward")
                timeline.end(f"[Strategy]Hook{i}.backward")
        opt.step()

    for _ in range(20):  # warm-up: allocator, kernels
        step(False)
    t0 = time.perf_counter()
    for _ in range(20):
        step(False)
    steps_per_round = max(10, int(args.round_s / ((time.perf_counter() - t0) / 20)))

    def run(sampler_interval: float | None, hooks: bool) -> Callable[[], tuple[float, float]]:
        def go() -> tuple[float, float]:
            sampler = HostSampler(sampler_interval) if sampler_interval else None
            if sampler is not None:
                sampler.start()
            t, c = time.perf_counter(), time.process_time()
            for _ in range(steps_per_round):
                step(hooks)
            elapsed, cpu = time.perf_counter() - t, time.process_time() - c  # cpu: every thread's
            if sampler is not None:
                sampler.stop()
            return elapsed, cpu

        return go

    variants = {
        "baseline": run(None, False),
        "baseline_again": run(None, False),
        "sampler_default": run(default_interval, False),
        "sampler_fast": run(default_interval / 10, False),
        "hook_spans": run(None, True),
    }
    totals = dict.fromkeys(variants, 0.0)
    per_round: dict[str, list[float]] = {k: [] for k in variants}
    cpu_round: dict[str, list[float]] = {k: [] for k in variants}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(variants)
        rng.shuffle(order)
        times = {name: variants[name]() for name in order}
        for name, (elapsed, cpu) in times.items():
            totals[name] += elapsed
            per_round[name].append(elapsed / times["baseline"][0])
            cpu_round[name].append(cpu / times["baseline"][1])
    n = args.rounds * steps_per_round
    probe = HostSampler(default_interval)
    costs = []
    for _ in range(200):
        t = time.perf_counter()
        probe.sample()
        costs.append(time.perf_counter() - t)
    sample_ms = sorted(costs)[len(costs) // 2] * 1000
    mean_ms = {k: v / n * 1000 for k, v in totals.items()}
    emit(
        {
            "benchmark": "host_sampler",
            "host": "2-CPU VM shared with other jobs, no GPU; torch.set_num_threads(1)",
            "default_interval_s": default_interval,
            "steps_per_round": steps_per_round,
            "rounds": args.rounds,
            "one_sample_ms_median": round(sample_ms, 4),
            "sampler_cpu_share_at_default": round(sample_ms / 1000 / default_interval, 6),
            "mean_step_ms": {k: round(v, 4) for k, v in mean_ms.items()},
            "ratio": {k: round(statistics.median(v), 4) for k, v in per_round.items()},
            "cpu_time_ratio": {k: round(statistics.median(v), 4) for k, v in cpu_round.items()},
            "ratio_of_means": {k: round(v / mean_ms["baseline"], 4) for k, v in mean_ms.items()},
            "target": "sampler_default ratio <= 1.01 (with the A/A ratio baseline_again as noise floor)",
        },
        args.out,
    )


if __name__ == "__main__":
    main()
