"""How the step-time overhead of memprofiler scales with the number of modules, on CPU.

Models: residual MLPs of 6, 24, 100 and 200 blocks (32, 122, 502 and 1,002 modules; autograd
saves 61, 241, 1,001 and 2,001 tensors per forward) whose widths keep the FLOPs of a step
the same (``depth * width**2`` constant), so only the per-module and per-saved-tensor costs
change. Each is timed in these ways (``--modes``; the first two by default):

* ``plain``: forward and loss inside a ``@memprofilable`` method, backward and an SGD step
  outside it (as in ``benchmarks/overhead.py``); each round runs one step per variant;
* ``trainer``: a Lightning ``Trainer`` fitting a LightningModule whose ``training_step`` is
  ``@memprofilable``; each round runs one short ``fit`` per variant (the first steps of each
  fit, set-up included, are not timed) and times the interval between batch starts;
* ``trainer_paired``: one long ``fit`` per size with ``MemProfilerCallback`` in it, where a
  callback picks each step's variant at its batch start (detaching the profiler for the
  baselines, attaching the callback's for ``inside_window``): the Trainer's counterpart of
  the plain loop, without the fit-to-fit noise of ``trainer``. Its absolute extra per step
  (inside minus baseline, ms) set beside the plain loop's says whether Lightning adds
  anything of its own.

Variants, interleaved in a new random order every round so that drift and noise hit them
alike, sharing one model per size: ``baseline`` and ``baseline_again`` (no profiler: their
ratio is the noise floor), ``outside_window`` (a profiler whose schedule has finished) and
``inside_window`` (every call collected, host RSS with its peak and saved tensors with
per-module attribution). Median step-time ratios to ``baseline`` (pooled over all rounds,
and ``paired_*``: the median over rounds of each round's ratio) are printed as one JSON
object, for wall time and for the main thread's CPU time (``time.thread_time``, user and
system, with ``torch.set_num_threads(1)`` all of a step's work): on a shared machine the CPU
time is the steadier figure, as waiting for a core is not counted. Run as ``MALLOC_ARENA_MAX=1 python
benchmarks/scaling.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from _emit import emit
from overhead import Loop, ResMLP
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from memprofiler import MemProfiler, MemProfilerCallback, memprofilable

DEPTHS = (6, 24, 100, 200)
VARIANTS = ("baseline", "baseline_again", "outside_window", "inside_window")
INSIDE = {
    "schedule": {"warmup": 0, "active": 1, "repeat": 0},
    "enable_saved_tensors_hooks": True,
}
OUTSIDE = {"schedule": {"warmup": 0, "active": 1}}


def width_for(depth: int, base_width: int) -> int:
    """The width giving ``depth`` blocks the FLOPs of 24 blocks of ``base_width``."""
    return round(base_width * math.sqrt(24 / depth))


class LitResMLP(pl.LightningModule):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.model = ResMLP(width, depth)

    @memprofilable
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.model(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class _StepTimer(pl.Callback):
    """Intervals between batch starts after the first ``skip`` batches of a fit."""

    def __init__(self, skip: int) -> None:
        self.skip = skip
        self.times: list[tuple[float, float]] = []
        self._last: tuple[float, float] | None = None
        self._seen = 0

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int
    ) -> None:
        now = (time.perf_counter(), time.thread_time())
        if self._seen > self.skip and self._last is not None:
            self.times.append((now[0] - self._last[0], now[1] - self._last[1]))
        self._last = now
        self._seen += 1


Rounds = list[dict[str, list[tuple[float, float]]]]


def _ratios(rounds: Rounds) -> dict[str, Any]:
    """Pooled medians and their ratios to ``baseline``; and the paired ratios: the median over
    rounds of each round's median step over that round's ``baseline`` (a fit that runs slow
    as a whole, Trainer set-up and allocator state, then moves one ratio, not the pool)."""
    rounds = [r for r in rounds if all(r[k] for k in VARIANTS)]
    times = {k: [t for r in rounds for t in r[k]] for k in VARIANTS}
    out: dict[str, Any] = {"timed_steps_per_variant": len(times["baseline"]), "rounds": len(rounds)}
    for i, clock in enumerate(("wall", "cpu")):
        med = {k: statistics.median(t[i] for t in v) for k, v in times.items()}
        out[clock] = {
            "median_step_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
            "ratio_noise_floor_a_a": round(med["baseline_again"] / med["baseline"], 4),
            "ratio_outside_window": round(med["outside_window"] / med["baseline"], 4),
            "ratio_inside_window": round(med["inside_window"] / med["baseline"], 4),
        }
        per_round = [{k: statistics.median(t[i] for t in r[k]) for k in VARIANTS} for r in rounds]
        for name, key in (
            ("baseline_again", "paired_noise_floor_a_a"),
            ("outside_window", "paired_outside_window"),
            ("inside_window", "paired_inside_window"),
        ):
            out[clock][key] = round(statistics.median(m[name] / m["baseline"] for m in per_round), 4)
    return out


def _interleave(rounds: int, run: Callable[[str], list[tuple[float, float]]], seed: int) -> Rounds:
    out: Rounds = []
    rng = random.Random(seed)
    for _ in range(rounds):
        times: dict[str, list[tuple[float, float]]] = {}
        for name in rng.sample(VARIANTS, len(VARIANTS)):  # a fresh order every round
            times[name] = run(name)
        out.append(times)
    return out


def plain(depth: int, width: int, batch: int, steps: int, warmup: int, tmp: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    loop = Loop(ResMLP(width, depth))
    profs: dict[str, MemProfiler | None] = {"baseline": None, "baseline_again": None}
    for name, cfg in (("outside_window", OUTSIDE), ("inside_window", INSIDE)):
        prof = MemProfiler({**cfg, "dump_memory_trace": False}, save_dir=tmp / f"plain{depth}{name}", rank=0)
        profs[name] = prof.setup(loop.model)
    x = torch.randn(batch, width)
    outside = profs["outside_window"]
    assert outside is not None
    outside.attach(loop)
    loop.step(x)  # call 1: the only collected call of `outside`
    step_no = {"n": 0}

    def run(name: str) -> list[tuple[float, float]]:
        prof = profs[name]
        if prof is None:
            MemProfiler.detach(loop)
        else:
            prof.attach(loop)
        t0, c0 = time.perf_counter(), time.thread_time()
        loop.step(x)
        dt = (time.perf_counter() - t0, time.thread_time() - c0)
        step_no["n"] += 1
        return [dt] if step_no["n"] > warmup * len(VARIANTS) else []

    out = _ratios(_interleave(warmup + steps, run, seed=depth))
    out["collected_calls_inside"] = profs["inside_window"].call_count("training_step")  # type: ignore[union-attr]
    for prof in profs.values():
        if prof is not None:
            prof.teardown()
    return out


def trainer(
    depth: int, width: int, batch: int, rounds: int, steps: int, skip: int, tmp: Path
) -> dict[str, Any]:
    torch.manual_seed(0)
    module = LitResMLP(width, depth)
    data = DataLoader(TensorDataset(torch.randn(batch * (steps + skip + 1), width)), batch_size=batch)
    fits = {"n": 0}

    def run(name: str) -> list[tuple[float, float]]:
        timer = _StepTimer(skip)
        callbacks: list[pl.Callback] = [timer]
        if name in ("outside_window", "inside_window"):
            cfg = INSIDE if name == "inside_window" else OUTSIDE
            callbacks.append(MemProfilerCallback({**cfg, "save_dir": str(tmp / f"fit{fits['n']}")}))
        fits["n"] += 1
        _trainer(tmp, steps + skip + 1, callbacks).fit(module, data)
        return timer.times

    return _ratios(_interleave(rounds, run, seed=depth))


def _trainer(tmp: Path, max_steps: int, callbacks: list[pl.Callback]) -> pl.Trainer:
    """A CPU Trainer with nothing of its own that writes or prints (loggers, checkpoints, bars)."""
    return pl.Trainer(
        default_root_dir=tmp,
        max_steps=max_steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )


class _Switch(pl.Callback):
    """Per step: picks the variant (one shuffled round of :data:`VARIANTS` after another) and
    records the interval from this batch start to the next under the variant it ran."""

    def __init__(
        self, profs: dict[str, MemProfiler | None], inside: MemProfilerCallback, skip: int, seed: int
    ) -> None:
        self.profs = profs
        self.inside = inside  # its profiler is made at the Trainer's `setup`
        self.skip = skip
        self.rng = random.Random(seed)
        self.order: list[str] = []
        self.times: dict[str, list[tuple[float, float]]] = {k: [] for k in VARIANTS}
        self._last: tuple[str, float, float] | None = None
        self._seen = 0

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int
    ) -> None:
        now = (time.perf_counter(), time.thread_time())
        if self._last is not None and self._seen > self.skip:
            name, t0, c0 = self._last
            self.times[name].append((now[0] - t0, now[1] - c0))
        self._seen += 1
        if not self.order:
            self.order = self.rng.sample(VARIANTS, len(VARIANTS))
        name = self.order.pop()
        prof = self.inside.profiler if name == "inside_window" else self.profs[name]
        if prof is None:
            MemProfiler.detach(pl_module)
        else:
            prof.attach(pl_module)
        self._last = (name, time.perf_counter(), time.thread_time())


def trainer_paired(depth: int, width: int, batch: int, steps: int, warmup: int, tmp: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    module = LitResMLP(width, depth)
    total = (warmup + steps + 1) * len(VARIANTS)
    data = DataLoader(TensorDataset(torch.randn(batch * total, width)), batch_size=batch)
    inside = MemProfilerCallback(
        {**INSIDE, "dump_memory_trace": False, "save_dir": str(tmp / f"paired{depth}")}
    )
    outside = MemProfiler({**OUTSIDE, "dump_memory_trace": False}, save_dir=tmp / f"paired{depth}out", rank=0)
    outside.setup(module)
    outside.attach(module)
    module.training_step((torch.randn(batch, width),), 0).backward()  # the only collected call of `outside`
    module.zero_grad(set_to_none=True)
    profs: dict[str, MemProfiler | None] = {
        "baseline": None,
        "baseline_again": None,
        "outside_window": outside,
    }
    switch = _Switch(profs, inside, skip=warmup * len(VARIANTS), seed=depth)
    _trainer(tmp, total, [inside, switch]).fit(module, data)
    outside.teardown()
    out = _ratios([switch.times])
    med = out["cpu"]["median_step_ms"]
    out["extra_ms_cpu"] = round(med["inside_window"] - (med["baseline"] + med["baseline_again"]) / 2, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--depths", type=int, nargs="+", default=list(DEPTHS), help="residual blocks per model"
    )
    parser.add_argument("--base-width", type=int, default=256, help="width of the 24-block model")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--steps", type=int, default=200, help="plain loop, trainer_paired: timed steps per variant"
    )
    parser.add_argument(
        "--warmup", type=int, default=20, help="plain loop, trainer_paired: untimed rounds first"
    )
    parser.add_argument("--rounds", type=int, default=20, help="trainer: fits per variant")
    parser.add_argument("--fit-steps", type=int, default=10, help="trainer: timed steps per fit")
    parser.add_argument("--fit-skip", type=int, default=3, help="trainer: untimed first steps per fit")
    parser.add_argument(
        "--modes", nargs="+", default=["plain", "trainer"], choices=["plain", "trainer", "trainer_paired"]
    )
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # Lightning's per-fit advice would drown the JSON
    for name in ("lightning.pytorch", "lightning.fabric"):
        __import__("logging").getLogger(name).setLevel("ERROR")
    tmp = Path(tempfile.mkdtemp(prefix="memprofiler-scaling-"))
    sizes: list[dict[str, Any]] = []
    for depth in args.depths:
        width = width_for(depth, args.base_width)
        probe = ResMLP(width, depth)
        entry: dict[str, Any] = {
            "blocks": depth,
            "width": width,
            "modules": sum(1 for _ in probe.modules()),
            "saved_tensors_per_call": _saved_count(probe, args.batch, width),
        }
        if "plain" in args.modes:
            entry["plain"] = plain(depth, width, args.batch, args.steps, args.warmup, tmp)
        if "trainer_paired" in args.modes:
            entry["trainer_paired"] = trainer_paired(depth, width, args.batch, args.steps, args.warmup, tmp)
        if "trainer" in args.modes:
            entry["trainer"] = trainer(
                depth, width, args.batch, args.rounds, args.fit_steps, args.fit_skip, tmp
            )
        sizes.append(entry)
        print(entry, flush=True)
    result = {
        "benchmark": "scaling",
        "collected": "host RSS + peak, saved tensors with per-module attribution, every call",
        "batch": args.batch,
        "flops": "equal across sizes (depth * width**2 constant)",
        "sizes": sizes,
        "targets": {"ratio_inside_window": {"122 modules": 1.02, "1002 modules": 1.05}},
        "threads": torch.get_num_threads(),
    }
    emit(result, args.out)


def _saved_count(model: nn.Module, batch: int, width: int) -> int:
    n = {"count": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        n["count"] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randn(batch, width)).pow(2).mean()
    return n["count"]


if __name__ == "__main__":
    main()
