"""What memprofiler costs a training step, beside torch's own memory tools, on CPU and on CUDA.

Models: residual MLPs of 24 and 200 blocks (122 and 1,002 modules; autograd saves 241 and 2,001
tensors per forward) whose widths keep the FLOPs of a step equal (``scaling.width_for``). One
model per size and device serves every variant, in both loops:

* ``plain``: ``training_step`` (``@memprofilable``) then backward and an SGD step, in a loop;
* ``trainer``: one long Lightning ``fit`` in which a callback picks each step's variant at its
  batch start and times the step to its batch end (``scaling.py --modes trainer_paired``).

Variants, one step each, interleaved in a fresh random order every round:

* ``baseline`` and ``baseline_again``: nothing attached (their ratio is the noise floor);
* ``bare_hooks``: saved-tensor hooks that only return the tensor, in pack and in unpack: the
  floor any saved-tensor collection in Python pays (calling Python twice per saved tensor);
* ``outside_window``: a memprofiler profiler attached whose schedule has finished;
* ``inside_window``: memprofiler collecting every call (host RSS and its peak, saved tensors
  with per-module attribution; on CUDA also the allocator's statistics);
* ``inside_window_py_tensors``: the same, with the compiled pack hook reading each tensor through
  Python instead of from the C++ tensor (``memprofiler._tensor_facts``): what those reads save;
* ``torch_profiler``: ``torch.profiler.profile(profile_memory=True)`` (CPU, and CUDA activity
  on a GPU) around the step;
* ``memory_history`` (CUDA only): ``torch.cuda.memory._record_memory_history`` on around the step.

A step is timed from after its variant is set up to the end of the step (synchronised on CUDA): the
profiler's start and stop, trace processing included, and the history's switch on and off are timed
apart (``setup_teardown_ms``). Each variant's teardown ends with ``gc.collect()`` then
``gc.freeze()`` (timed with it; frozen, what survived is not walked again): the objects
``torch_profiler`` leaves when it stops (its events) were otherwise collected inside whichever later
step first allocated enough objects the collector tracks, which is never a ``baseline`` or
``bare_hooks`` step and often an ``inside_window`` one: about 5 ms per collection at 122 modules,
charged to the wrong variant. The collector's time inside the timed steps is given per variant
(``gc_in_step``: milliseconds per step, and collections per generation over all its steps), so what
a variant's own allocations cost it is still seen. Both the wall time and the main thread's CPU time
are given; with ``torch.set_num_threads(1)`` the CPU time holds all of a CPU step's work and is the
steadier figure on a shared machine. ``ratio_to_bare_hooks`` of ``inside_window`` is the figure the
saved-tensor collector aims to keep within 1.02. The load average is recorded before and after every
repeat (``--repeats``): an A/A pair far from 1 says the machine was too busy.

Run as ``python benchmarks/overhead.py [--out benchmarks/results]`` (it sets
``MALLOC_ARENA_MAX=1`` and fixes glibc's mmap and trim thresholds, ``MALLOC_ENV``, by starting
itself again where they are not set): one file per hardware,
``overhead_cpu_<date>.json``, or ``overhead_h200_<date>.json`` on an H200. ``--smoke`` runs tiny
sizes in seconds (the test suite does).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from _emit import emit
from _packer_builds import this_build
from torch import nn

from memprofiler import MemProfiler, MemProfilerCallback, memprofilable
from memprofiler.collectors import saved_tensors


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
    """A plain training loop: ``training_step`` is what memprofiler collects."""

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


VARIANTS = (
    "baseline",
    "baseline_again",
    "bare_hooks",
    "outside_window",
    "inside_window",
    "inside_window_py_tensors",
    "torch_profiler",
    "memory_history",
)
CUDA_ONLY = ("memory_history",)
#: The variant that needs the compiled hook's C++ tensor reads (``saved_tensors.NO_TENSOR_FACTS``).
FACTS_ONLY = ("inside_window_py_tensors",)
INSIDE = {
    "schedule": {"warmup": 0, "active": 1, "repeat": 0},
    "enable_saved_tensors_hooks": True,
    "dump_memory_trace": False,
}
OUTSIDE = {"schedule": {"warmup": 0, "active": 1}, "dump_memory_trace": False}
#: glibc's allocator, fixed for every variant: one arena; and blocks of up to 32 MiB served from
#: the heap and never given back to the kernel. With glibc's defaults each step mapped, faulted
#: in and unmapped its activations (about 5,400 page faults per step at 122 modules): 6-12 ms of
#: kernel time per 55 ms step that moved from step to step by more than the effects measured.
MALLOC_ENV = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_THRESHOLD_": "33554432",
    "MALLOC_TRIM_THRESHOLD_": "17179869184",
}
#: ``--smoke``: sizes and counts that run in seconds.
SMOKE = {"depths": [2, 4], "base_width": 16, "batch": 4, "steps": 2, "warmup": 1, "repeats": 1}


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _bare_hooks() -> AbstractContextManager[Any]:
    """Hooks that only return the tensor. (A Python holder per save is no floor: thousands of
    objects the cyclic garbage collector tracks, living through the step, cost it more than
    what the compiled collector does; `saved_tensor_floor.py` times holders apart.)"""
    return torch.autograd.graph.saved_tensors_hooks(_same, _same)


class Variants:
    """Sets each variant up on one target (a loop or a LightningModule) and takes it down again.

    ``enter(name)`` and ``leave(name)`` return the seconds they took (profiler start and stop,
    history on and off), timed apart from the step.
    """

    def __init__(self, target: Any, model: nn.Module, device: torch.device, tmp: Path) -> None:
        self.target, self.device = target, device
        # In a Trainer, the one of `MemProfilerCallback` once the fit has set it up (`trainer`).
        self.inside: MemProfiler | None = MemProfiler(INSIDE, save_dir=tmp / "inside", rank=0).setup(model)
        self.outside = MemProfiler(OUTSIDE, save_dir=tmp / "outside", rank=0).setup(model)
        self._open: Any = None

    def finish_outside_window(self, step: Callable[[], None]) -> None:
        """Runs the one collected call of ``outside``: every later call is outside its window."""
        self.outside.attach(self.target)
        step()
        MemProfiler.detach(self.target)

    def enter(self, name: str) -> float:
        t0 = time.perf_counter()
        MemProfiler.detach(self.target)
        if name in ("inside_window", "inside_window_py_tensors"):
            assert self.inside is not None
            if name == "inside_window_py_tensors":
                saved_tensors.read_tensors_in_cpp(False)
            self.inside.attach(self.target)
        elif name == "outside_window":
            self.outside.attach(self.target)
        elif name == "bare_hooks":
            self._open = _bare_hooks()
            self._open.__enter__()
        elif name == "torch_profiler":
            acts = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self._open = torch.profiler.profile(activities=acts, profile_memory=True)
            self._open.__enter__()
        elif name == "memory_history":
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        return time.perf_counter() - t0

    def leave(self, name: str) -> float:
        t0 = time.perf_counter()
        if self._open is not None:
            opened, self._open = self._open, None
            opened.__exit__(None, None, None)
            del opened
        if name == "memory_history":
            torch.cuda.memory._record_memory_history(enabled=None)
        MemProfiler.detach(self.target)
        if name == "inside_window_py_tensors":
            saved_tensors.read_tensors_in_cpp(True)
        gc.collect()  # what this variant left is collected here, not in another variant's step
        gc.freeze()  # and the next full collection need not walk it again
        return time.perf_counter() - t0

    def close(self) -> None:
        MemProfiler.detach(self.target)
        if self.inside is not None:
            self.inside.teardown()
        self.outside.teardown()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


Times = dict[str, list[tuple[float, float]]]


class GcClock:
    """The cyclic garbage collector's time and collections (per generation) so far."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._t0 = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.collections[info["generation"]] += 1

    def now(self) -> tuple[float, list[int]]:
        return self.seconds, list(self.collections)

    def close(self) -> None:
        gc.callbacks.remove(self._on)


class GcInStep:
    """The collector's work inside each variant's timed steps."""

    def __init__(self, names: list[str]) -> None:
        self.clock = GcClock()
        self.seconds = dict.fromkeys(names, 0.0)
        self.collections = {k: [0, 0, 0] for k in names}
        self.steps = dict.fromkeys(names, 0)

    def add(self, name: str, before: tuple[float, list[int]]) -> None:
        sec, counts = self.clock.now()
        self.seconds[name] += sec - before[0]
        self.collections[name] = [
            a + b - c for a, b, c in zip(self.collections[name], counts, before[1], strict=True)
        ]
        self.steps[name] += 1

    def summary(self) -> dict[str, Any]:
        self.clock.close()
        return {
            k: {
                "ms_per_step": round(self.seconds[k] / n * 1e3, 3),
                "collections_by_generation": self.collections[k],
            }
            for k, n in self.steps.items()
            if n
        }


def _summary(times: Times, rounds: list[dict[str, tuple[float, float]]], setup: Times) -> dict[str, Any]:
    """Medians per variant, their ratios to ``baseline`` and to ``bare_hooks``, and the paired
    ratios (the median over rounds of each round's step over that round's ``baseline``)."""
    names = [k for k in times if times[k]]
    out: dict[str, Any] = {"timed_steps_per_variant": min(len(times[k]) for k in names)}
    for i, clock in enumerate(("wall", "cpu")):
        med = {k: statistics.median(t[i] for t in times[k]) for k in names}
        full = [r for r in rounds if all(k in r for k in names)]
        out[clock] = {
            "median_step_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
            "ratio": {k: round(v / med["baseline"], 4) for k, v in med.items() if k != "baseline"},
            "paired_ratio": {
                k: round(statistics.median(r[k][i] / r["baseline"][i] for r in full), 4)
                for k in names
                if k != "baseline" and full
            },
            "ratio_to_bare_hooks": {
                k: round(med[k] / med["bare_hooks"], 4)
                for k in ("inside_window", "inside_window_py_tensors")
                if "bare_hooks" in med and k in med
            },
        }
    out["setup_teardown_ms"] = {
        k: round(statistics.median(a + b for a, b in v) * 1e3, 3) for k, v in setup.items() if v
    }
    return out


def _record(
    times: Times, rounds: list[dict[str, tuple[float, float]]], name: str, dt: tuple[float, float]
) -> None:
    times[name].append(dt)
    if not rounds or name in rounds[-1]:
        rounds.append({})
    rounds[-1][name] = dt


def plain(
    loop: Loop, x: torch.Tensor, names: list[str], steps: int, warmup: int, seed: int, tmp: Path
) -> dict[str, Any]:
    device = x.device
    var = Variants(loop, loop.model, device, tmp)
    var.finish_outside_window(lambda: loop.step(x))
    times: Times = {k: [] for k in names}
    setup: Times = {k: [] for k in names}
    rounds: list[dict[str, tuple[float, float]]] = []
    rng = random.Random(seed)
    gcs = GcInStep(names)
    for r in range(warmup + steps):
        for name in rng.sample(names, len(names)):
            up = var.enter(name)
            _sync(device)
            g0 = gcs.clock.now()
            t0, c0 = time.perf_counter(), time.thread_time()
            loop.step(x)
            _sync(device)
            dt = (time.perf_counter() - t0, time.thread_time() - c0)
            if r >= warmup:
                gcs.add(name, g0)
            down = var.leave(name)
            if r >= warmup:
                _record(times, rounds, name, dt)
                setup[name].append((up, down))
    out = _summary(times, rounds, setup)
    out["gc_in_step"] = gcs.summary()
    out["collected_calls_inside"] = var.inside.call_count("training_step")  # type: ignore[union-attr]
    var.close()
    return out


def trainer(
    depth: int,
    width: int,
    batch: int,
    device: torch.device,
    names: list[str],
    steps: int,
    warmup: int,
    seed: int,
    tmp: Path,
    model: nn.Module,
) -> dict[str, Any]:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    class LitResMLP(pl.LightningModule):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.model = net

        @memprofilable
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            (xb,) = batch
            return self.model(xb).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    lit = LitResMLP(model)
    var = Variants(lit, model, device, tmp)
    assert var.inside is not None
    var.inside.teardown()
    var.inside = None  # the callback's, from the fit's set-up on
    inside = MemProfilerCallback({**INSIDE, "save_dir": str(tmp / "callback")})
    xb = torch.randn(batch, width, device=device)

    def one_step() -> None:
        lit.training_step((xb,), 0).backward()
        lit.zero_grad(set_to_none=True)

    var.finish_outside_window(one_step)
    times: Times = {k: [] for k in names}
    setup: Times = {k: [] for k in names}
    rounds: list[dict[str, tuple[float, float]]] = []
    gcs = GcInStep(names)

    class Switch(pl.Callback):
        """Picks each step's variant (one shuffled round of them after another) and times it."""

        def __init__(self) -> None:
            self.rng = random.Random(seed)
            self.order: list[str] = []
            self.seen = 0
            self.now: tuple[str, float, float, float] | None = None
            self.gc0 = gcs.clock.now()

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
            var.inside = inside.profiler
            if not self.order:
                self.order = self.rng.sample(names, len(names))
            name = self.order.pop()
            up = var.enter(name)
            _sync(device)
            self.gc0 = gcs.clock.now()
            self.now = (name, up, time.perf_counter(), time.thread_time())

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int
        ) -> None:
            assert self.now is not None
            name, up, t0, c0 = self.now
            _sync(device)
            dt = (time.perf_counter() - t0, time.thread_time() - c0)
            if self.seen >= warmup * len(names):
                gcs.add(name, self.gc0)
            down = var.leave(name)
            if self.seen >= warmup * len(names):
                _record(times, rounds, name, dt)
                setup[name].append((up, down))
            self.seen += 1

    total = (warmup + steps) * len(names)
    data = DataLoader(TensorDataset(torch.randn(batch * total, width)), batch_size=batch)
    fit = pl.Trainer(
        default_root_dir=tmp,
        max_steps=total,
        callbacks=[inside, Switch()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator=device.type,
        devices=1,
    )
    fit.fit(lit, data)
    out = _summary(times, rounds, setup)
    out["gc_in_step"] = gcs.summary()
    out["collected_calls_inside"] = var.inside.call_count("training_step") if var.inside else 0
    var.inside = None  # the callback tore it down at the fit's end
    var.close()
    return out


def width_for(depth: int, base_width: int) -> int:
    """The width giving ``depth`` blocks the FLOPs of 24 blocks of ``base_width``."""
    return max(1, round(base_width * (24 / depth) ** 0.5))


def saved_per_call(model: nn.Module, x: torch.Tensor) -> int:
    """Tensors autograd saves in one forward and loss of ``model`` on ``x``."""
    n = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        n[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).pow(2).mean()
    return n[0]


def one_repeat(args: argparse.Namespace, devices: list[torch.device], seed: int, tmp: Path) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for device in devices:
        names = [
            v
            for v in VARIANTS
            if (device.type == "cuda" or v not in CUDA_ONLY)
            and (not saved_tensors.NO_TENSOR_FACTS or v not in FACTS_ONLY)
        ]
        for depth in args.depths:
            width = width_for(depth, args.base_width)
            torch.manual_seed(0)
            model = ResMLP(width, depth).to(device)  # one model: every variant, both loops
            x = torch.randn(args.batch, width, device=device)
            row: dict[str, Any] = {
                "device": device.type,
                "blocks": depth,
                "width": width,
                "modules": sum(1 for _ in model.modules()),
                "saved_tensors_per_call": saved_per_call(model, x),
            }
            sub = tmp / f"r{seed}{device.type}{depth}"
            if "plain" in args.modes:
                row["plain"] = plain(Loop(model), x, names, args.steps, args.warmup, seed + depth, sub / "p")
            if "trainer" in args.modes:
                row["trainer"] = trainer(
                    depth,
                    width,
                    args.batch,
                    device,
                    names,
                    args.steps,
                    args.warmup,
                    seed + depth,
                    sub / "t",
                    model,
                )
            rows.append(row)
            print(_line(row), file=sys.stderr, flush=True)
    return {"loadavg_before": _load(load_before), "loadavg_after": _load(os.getloadavg()), "rows": rows}


def _load(la: tuple[float, float, float]) -> list[float]:
    return [round(v, 2) for v in la]


def _line(row: dict[str, Any]) -> str:
    parts = [f"{row['device']} {row['modules']} modules:"]
    for mode in ("plain", "trainer"):
        if mode in row:
            cpu = row[mode]["cpu"]["ratio"]
            parts.append(
                f"{mode} A/A {cpu['baseline_again']:.3f} inside {cpu['inside_window']:.3f}"
                f" bare hooks {cpu['bare_hooks']:.3f} torch.profiler {cpu['torch_profiler']:.3f}"
            )
    return " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[24, 200], help="residual blocks per model")
    parser.add_argument("--base-width", type=int, default=256, help="width of the 24-block model")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100, help="timed steps per variant, loop and repeat")
    parser.add_argument("--warmup", type=int, default=10, help="untimed rounds first")
    parser.add_argument("--repeats", type=int, default=3, help="the whole measurement, again")
    parser.add_argument("--modes", nargs="+", default=["plain", "trainer"], choices=["plain", "trainer"])
    parser.add_argument(
        "--devices", nargs="+", default=None, choices=["cpu", "cuda"], help="default: cpu, and cuda if there"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few steps: seconds")
    parser.add_argument("--out", type=Path, default=None, help="a results folder or a .json file")
    args = parser.parse_args()
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()):
        # glibc reads these at start-up (see MALLOC_ENV)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_ENV})
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # Lightning's advice per fit would drown the record
    for name in ("lightning.pytorch", "lightning.fabric"):
        __import__("logging").getLogger(name).setLevel("ERROR")
    wanted = args.devices or ["cpu", "cuda"]
    skipped: list[str] = []
    if "cuda" in wanted and not torch.cuda.is_available():
        print("CUDA is not available: the CUDA rows and `memory_history` are skipped", file=sys.stderr)
        skipped.append("cuda: not available")
    devices = [torch.device(d) for d in wanted if d == "cpu" or torch.cuda.is_available()]
    tmp = Path(tempfile.mkdtemp(prefix="memprofiler-overhead-"))
    repeats = [one_repeat(args, devices, 1000 * i, tmp) for i in range(args.repeats)]
    result = {
        "benchmark": "overhead",
        "model": "residual MLP blocks (LayerNorm, Linear, GELU, Linear), equal FLOPs at every depth",
        "batch": args.batch,
        "steps_per_variant": args.steps,
        "warmup_rounds": args.warmup,
        "smoke": args.smoke,
        "threads": torch.get_num_threads(),
        "packer": this_build(),
        "malloc_env": {k: os.environ.get(k) for k in MALLOC_ENV},
        "variants": list(VARIANTS),
        "skipped": skipped,
        "targets": {"inside_window ratio_to_bare_hooks": 1.02, "A/A": "within 0.01 of 1"},
        "repeats": repeats,
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
