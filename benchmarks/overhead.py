"""Step-time overhead of memprofiler on CPU, measured side by side in one process.

Model: 24 residual MLP blocks (122 modules). Each timed step is forward + loss inside a
``@memprofilable`` method, then backward and an SGD step outside it (as Lightning runs
``training_step``). Three variants are interleaved round-robin so drift and noise hit them
alike, and the median step times are compared:

* ``baseline``: no profiler attached;
* ``outside_window``: a profiler attached whose schedule has finished (the normal state
  for almost every step of a run);
* ``inside_window``: every call collected with host (RSS + peak) and saved-tensor collection.

Prints one JSON object. Usage: ``python benchmarks/overhead.py [--steps N] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
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
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    tmp = Path(tempfile.mkdtemp(prefix="memprofiler-bench-"))
    loops: dict[str, Loop] = {}
    for name in ("baseline", "outside_window", "inside_window"):
        model = ResMLP(args.width, 24)
        loops[name] = Loop(model)
    n_modules = sum(1 for _ in loops["baseline"].model.modules())

    outside = MemProfiler({"schedule": {"warmup": 0, "active": 1}}, save_dir=tmp / "outside", rank=0)
    outside.setup(loops["outside_window"].model)
    outside.attach(loops["outside_window"])
    inside = MemProfiler(
        {"schedule": {"warmup": 0, "active": 1, "repeat": 0}, "enable_saved_tensors_hooks": True},
        save_dir=tmp / "inside",
        rank=0,
    )
    inside.setup(loops["inside_window"].model)
    inside.attach(loops["inside_window"])

    x = torch.randn(args.batch, args.width)
    times: dict[str, list[float]] = {k: [] for k in loops}
    runners: list[tuple[str, Callable[[], None]]] = [
        (k, (lambda lp=lp: lp.step(x))) for k, lp in loops.items()
    ]
    for i in range(args.warmup + args.steps):
        order = runners[i % 3 :] + runners[: i % 3]  # rotate who goes first
        for name, run in order:
            t0 = time.perf_counter()
            run()
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
        "ratio_outside_window": round(med["outside_window"] / med["baseline"], 4),
        "ratio_inside_window": round(med["inside_window"] / med["baseline"], 4),
        "targets": {"ratio_outside_window": 1.01, "ratio_inside_window": 1.05},
        "collected_calls_inside": inside.call_count("training_step"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
    }
    inside.teardown()
    outside.teardown()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
