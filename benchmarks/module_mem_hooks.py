"""Step time of module-wise tracking (``track_module_mem``) with torch's own module-tracker
backward hooks and with memprofiler's gradient-free ones (``memprofiler.tracker_hooks``), side
by side in one process.

Model: 24 residual MLP blocks (122 modules), as ``overhead.py``. Every step is collected (the
MemTracker window opens at the call and closes at ``step_end()`` after backward and the SGD
step). One model and one profiler serve every variant; only the hook registration differs:

* ``torch_hooks`` and ``torch_hooks_again``: torch's ``register_multi_grad_hook(mode="all")``,
  which keeps each module input's gradient until the module's last input has one (an A/A pair:
  the noise floor);
* ``gradient_free``: the hooks memprofiler registers (the same counting, no gradients held).

Variants run interleaved in a new random order every round. Prints one JSON object.
Usage: ``MALLOC_ARENA_MAX=1 python benchmarks/module_mem_hooks.py [--steps N] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from _emit import emit
from overhead import Loop, ResMLP

from memprofiler import MemProfiler
from memprofiler.collectors import tracker_window


@contextlib.contextmanager
def _torch_hooks() -> Iterator[bool]:
    yield False  # leave torch's module tracker as it is


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loop = Loop(ResMLP(args.width, 24))
    prof = MemProfiler(
        {
            "schedule": {"warmup": 0, "active": 1, "repeat": 0},
            "track_module_mem": True,
            "enable_saved_tensors_hooks": False,
            "dump_memory_trace": False,
        },
        save_dir=Path(tempfile.mkdtemp(prefix="memprofiler-bench-")),
        rank=0,
    )
    prof.setup(loop.model)
    prof.bind(loop.model, [loop.opt])
    prof.attach(loop)
    x = torch.randn(args.batch, args.width)
    ours = tracker_window.gradient_free_module_hooks
    variants = {"torch_hooks": _torch_hooks, "torch_hooks_again": _torch_hooks, "gradient_free": ours}
    names = list(variants)
    times: dict[str, list[float]] = {k: [] for k in names}
    rng = random.Random(0)
    try:
        for i in range(args.warmup + args.steps):
            for name in rng.sample(names, len(names)):
                tracker_window.gradient_free_module_hooks = variants[name]  # type: ignore[assignment]
                t0 = time.perf_counter()
                loop.step(x)
                prof.step_end()
                dt = time.perf_counter() - t0
                if i >= args.warmup:
                    times[name].append(dt)
    finally:
        tracker_window.gradient_free_module_hooks = ours
        MemProfiler.detach(loop)
        prof.teardown()
    med = {k: statistics.median(v) for k, v in times.items()}
    emit(
        {
            "benchmark": "module_mem_hooks",
            "model": f"24 residual MLP blocks, width {args.width}, "
            f"{sum(1 for _ in loop.model.modules())} modules, batch {args.batch}",
            "steps_per_variant": args.steps,
            "median_step_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
            "ratio_noise_floor_a_a": round(med["torch_hooks_again"] / med["torch_hooks"], 4),
            "ratio_gradient_free_vs_torch": round(med["gradient_free"] / med["torch_hooks"], 4),
            "threads": torch.get_num_threads(),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
