"""Step-time overhead of memprofiler on CPU, measured side by side in one process.

Model: 24 residual MLP blocks (122 modules). Each timed step is forward + loss inside a
``@memprofilable`` method, then backward and an SGD step outside it (as Lightning runs
``training_step``). One model serves every variant, only the attached profiler differs. The
variants run interleaved, in a new random order every round, so drift and noise hit them
alike, and the median step times are compared:

* ``baseline`` and ``baseline_again``: no profiler attached (their ratio is the noise floor);
* ``outside_window``: a profiler attached whose schedule has finished (the normal state
  for almost every step of a run);
* ``inside_window``: every call collected with host (RSS + peak) and saved-tensor collection.

Prints one JSON object. Usage: ``python benchmarks/overhead.py [--steps N] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _emit import emit
from torch import nn

from memprofiler import MemProfiler, memprofilable


class ResBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class ResMLP(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(ResBlock(width) for _ in range(depth)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class Loop:
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    @memprofilable
    def training_step(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).pow(2).mean()

    def step(self, x: torch.Tensor) -> None:
        loss = self.training_step(x)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: least jitter)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)

    tmp = Path(tempfile.mkdtemp(prefix="memprofiler-bench-"))
    # One model and one loop for every variant: only the attached profiler differs, so weights,
    # allocations and caches are the same for all three.
    loop = Loop(ResMLP(args.width, 24))
    n_modules = sum(1 for _ in loop.model.modules())
    outside = MemProfiler({"schedule": {"warmup": 0, "active": 1}}, save_dir=tmp / "outside", rank=0)
    outside.setup(loop.model)
    inside = MemProfiler(
        {
            "schedule": {"warmup": 0, "active": 1, "repeat": 0},
            "enable_saved_tensors_hooks": True,
            "dump_memory_trace": False,
        },
        save_dir=tmp / "inside",
        rank=0,
    )
    inside.setup(loop.model)
    x = torch.randn(args.batch, args.width)
    outside.attach(loop)
    loop.step(x)  # call 1: the only collected call of `outside`; every later call is outside
    MemProfiler.detach(loop)

    variants: dict[str, MemProfiler | None] = {
        "baseline": None,
        "baseline_again": None,  # an A/A pair: the noise floor of this machine
        "outside_window": outside,
        "inside_window": inside,
    }
    names = list(variants)
    times: dict[str, list[float]] = {k: [] for k in names}
    rng = random.Random(0)
    for i in range(args.warmup + args.steps):
        order = rng.sample(names, len(names))  # a fresh random order every round: no position bias
        for name in order:
            prof = variants[name]
            if prof is None:
                MemProfiler.detach(loop)
            else:
                prof.attach(loop)
            t0 = time.perf_counter()
            loop.step(x)
            dt = time.perf_counter() - t0
            if i >= args.warmup:
                times[name].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "benchmark": "overhead",
        "model": f"24 residual MLP blocks, width {args.width}, {n_modules} modules",
        "batch": args.batch,
        "steps_per_variant": args.steps,
        "median_step_ms": {k: round(v * 1e3, 4) for k, v in med.items()},
        "ratio_noise_floor_a_a": round(med["baseline_again"] / med["baseline"], 4),
        "ratio_outside_window": round(med["outside_window"] / med["baseline"], 4),
        "ratio_inside_window": round(med["inside_window"] / med["baseline"], 4),
        "targets": {"ratio_outside_window": 1.01, "ratio_inside_window": 1.05},
        "collected_calls_inside": inside.call_count("training_step"),
        "threads": torch.get_num_threads(),
    }
    inside.teardown()
    outside.teardown()
    emit(result, args.out)


if __name__ == "__main__":
    main()
