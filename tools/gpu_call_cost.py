"""One collected call of the profiler on a GPU, part by part and whole: what it costs the
training thread in CPU time, and the GPU in idle time.

A ``@memprofilable`` window pays, per collected call, for ``torch.cuda.memory_stats()``
(start and end), ``torch.cuda.reset_peak_memory_stats()``, the host RSS and its peak
(``clear_refs`` and ``/proc/self/status``), the allocator history's ``record_function``
marks, the memory hooks on the model's modules, the window's own bookkeeping (schedule,
dispatch, the snapshot's record), and the writes: the stats file's entries and the memory
trace's rows, flushed every ``flush_every`` calls. This probe times

- **each part alone** (``parts``): each primitive called the way the collectors call it, many
  times, training-thread CPU and wall microseconds per call (median of rounds);
- **the whole call and each part's share** (``steps``): real training steps (forward in the
  collected window, backward, AdamW) of each model, one variant of the profiler per run of
  steps, variants interleaved in a new random order every round, with an A/A pair:
  ``bare`` (no profiler), ``outside`` (a profiler, the call not collected), ``collected`` /
  ``collected_again`` (the defaults: host RSS and peak, CUDA statistics, stats file, memory
  trace), ``no_host``, ``no_cuda_stats``, ``no_yaml``, ``no_trace`` (``collected`` less that
  part), ``no_collectors`` (the bookkeeping alone), ``history`` (plus allocator history and
  its marks), ``module_hooks`` (plus the memory hooks), ``saved_tensors`` (the defaults with
  the saved-tensor hooks on: the whole default window) and ``torch_profiler``
  (``torch.profiler.profile(profile_memory=True)``, CPU and CUDA activity, on around the run's
  steps; its start and its stop, trace processing included, are left out of the step times, as
  the profiler's own set-up). Per step: the training thread's CPU
  time, the wall time and, on a GPU, the device time between consecutive steps' starts and
  the device's idle gap between a step's last queued work and the next step's first (CUDA
  events: a gap is the host falling behind the device);
- **the host-device waits** (``host_device_syncs``): one more step of each variant but
  ``torch_profiler`` under torch's sync debug mode (``torch.cuda.set_sync_debug_mode("warn")``), which tells every
  operation that makes the host wait for the device: how many there were, and where in
  memprofiler's own code any of them was made (none is the goal: a wait in a collected call
  would cost the host its lead over the device, whatever its CPU time).

Models: ``gpt2`` (GPT-2 124M in bf16-mixed: float32 weights, the forward under bf16 autocast, as
Lightning's ``precision="bf16-mixed"``; ``--precision bf16`` for bf16 weights; written in plain
torch so the GPU node needs nothing more, batch 8 x 1,024 tokens) and ``modules600`` (600 modules:
99 blocks of layer norm, two linears, GELU and dropout, width 1,024, bf16, a batch of 8,192 rows).
``--dry-run`` runs every part on CPU with tiny sizes and the test suite's fake allocator
(``tests/fake_cuda.py``) in place of CUDA's: the code paths are the GPU run's, the figures are not
(``tests/test_gpu_call_cost.py`` runs it). ``ratios`` gives per model the step-time ratios the
performance goal reads: the window with memory hooks off (``collected``), the whole window
(``saved_tensors``) and ``torch_profiler``, each over ``bare``, beside the A/A pair; by device time
on a GPU, by training- thread CPU time otherwise. The result is written through
``benchmarks/_emit.py`` (``gpu_call_cost_<hardware>_<yyyymmdd>.json``).

    PYTHONPATH=src:tests python tools/gpu_call_cost.py --out benchmarks/results        # on a GPU
    PYTHONPATH=src:tests python tools/gpu_call_cost.py --dry-run --out /tmp            # anywhere
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import random
import statistics
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn

import memprofiler
from memprofiler import MemProfiler
from memprofiler.collectors import saved_tensors
from memprofiler.collectors.cuda_backend import CudaBackend, default_backend
from memprofiler.collectors.host import HostCollector
from memprofiler.errors import MemProfilerWarning

ROOT = Path(__file__).resolve().parents[1]


def _emit_module() -> Any:
    """``benchmarks/_emit.py``, loaded by path (benchmarks/ on sys.path would shadow packages)."""
    spec = importlib.util.spec_from_file_location("_emit", ROOT / "benchmarks" / "_emit.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


#: The profiler's options every variant starts from: every call collected, saved-tensor hooks
#: off (their cost grows with the model and is measured by benchmarks/scaling.py).
BASE: dict[str, Any] = {
    "schedule": {"warmup": 0, "active": 10**9},
    "enable_saved_tensors_hooks": False,
    "enable_memory_hooks": False,
    "collect_funcs": {"default": ["training_step"]},
}
#: Each variant: (options added to BASE, collectors removed, the function profiled).
VARIANTS: dict[str, tuple[dict[str, Any], tuple[str, ...], str]] = {
    "bare": ({}, (), ""),
    "outside": ({}, (), "not_collected"),
    "collected": ({}, (), "training_step"),
    "collected_again": ({}, (), "training_step"),
    "no_host": ({}, ("cpu",), "training_step"),
    "no_cuda_stats": ({}, ("cuda",), "training_step"),
    "no_yaml": ({"dump_memorystats_yaml": False}, (), "training_step"),
    "no_trace": ({"dump_memory_trace": False}, (), "training_step"),
    "no_collectors": ({}, ("*",), "training_step"),
    "history": ({"cuda_allocator_history": True}, (), "training_step"),
    "module_hooks": ({"enable_memory_hooks": True}, (), "training_step"),
    "saved_tensors": ({"enable_saved_tensors_hooks": True}, (), "training_step"),
    "torch_profiler": ({}, (), ""),
}
#: Variants that run no memprofiler: nothing, or torch's profiler around their steps.
NO_PROFILER = ("bare", "torch_profiler")
#: The ratios the performance goal reads (variant, over variant).
RATIOS = {
    "aa": ("collected_again", "collected"),
    "window_memory_hooks_off": ("collected", "bare"),
    "window_whole": ("saved_tensors", "bare"),
    "torch_profiler": ("torch_profiler", "bare"),
}
#: What each part costs, as the difference of two variants' step times.
SHARES = {
    "collected_call": ("collected", "bare"),
    "aa_noise": ("collected_again", "collected"),
    "outside_window": ("outside", "bare"),
    "host_rss_and_peak": ("collected", "no_host"),
    "cuda_stats_and_peak_reset": ("collected", "no_cuda_stats"),
    "stats_file_entries_and_flushes": ("collected", "no_yaml"),
    "memory_trace_rows_and_flushes": ("collected", "no_trace"),
    "window_bookkeeping": ("no_collectors", "bare"),
    "allocator_history_and_marks": ("history", "collected"),
    "module_hooks": ("module_hooks", "collected"),
    "saved_tensor_hooks": ("saved_tensors", "collected"),
}


@dataclass(frozen=True)
class Sizes:
    """A run's sizes: the real ones, or ``--dry-run``'s tiny ones."""

    gpt2_layers: int
    gpt2_width: int
    gpt2_heads: int
    gpt2_vocab: int
    gpt2_batch: tuple[int, int]
    width: int
    rows: int


REAL = Sizes(12, 768, 12, 50257, (8, 1024), 1024, 8192)
TINY = Sizes(2, 32, 2, 128, (2, 16), 8, 4)


class _Block(nn.Module):
    """A GPT-2 block: layer norm, causal self-attention, layer norm, a 4x MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 in plain torch (no dependency on the GPU node): token and position embeddings,
    the blocks, a final layer norm, the head tied to the token embedding; 124,439,808
    parameters at GPT-2 small's sizes, as ``transformers``' ``GPT2LMHeadModel``."""

    def __init__(self, s: Sizes) -> None:
        super().__init__()
        self.wte = nn.Embedding(s.gpt2_vocab, s.gpt2_width)
        self.wpe = nn.Embedding(1024, s.gpt2_width)
        self.blocks = nn.ModuleList(_Block(s.gpt2_width, s.gpt2_heads) for _ in range(s.gpt2_layers))
        self.ln_f = nn.LayerNorm(s.gpt2_width)
        self.head = nn.Linear(s.gpt2_width, s.gpt2_vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


#: ``--precision``: GPT-2's weights and forward (``modules600`` is bf16 either way).
PRECISIONS = ("bf16-mixed", "bf16")


def gpt2(
    s: Sizes, device: torch.device, precision: str = "bf16-mixed"
) -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    """GPT-2 (124M at the real sizes) and its next-token loss on a fixed token batch: float32
    weights and the forward under bf16 autocast (``bf16-mixed``), or bf16 weights (``bf16``)."""
    tokens = torch.randint(0, s.gpt2_vocab, s.gpt2_batch, device=device)
    if precision == "bf16":
        return GPT2(s).to(device=device, dtype=torch.bfloat16), lambda m: m(tokens)

    def loss(m: nn.Module) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return m(tokens)

    return GPT2(s).to(device=device), loss


def modules600(
    s: Sizes, device: torch.device, precision: str = "bf16"
) -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    """600 modules (the root, 99 blocks of six, five linears) in bf16, and a loss on a fixed batch."""
    w = s.width
    blocks = [nn.Sequential(nn.LayerNorm(w), nn.Linear(w, w), nn.GELU(), nn.Linear(w, w), nn.Dropout(0.0))
              for _ in range(99)]  # fmt: skip
    model = nn.Sequential(*blocks, *[nn.Linear(w, w) for _ in range(5)]).to(
        device=device, dtype=torch.bfloat16
    )
    assert len(list(model.modules())) == 600
    x = torch.randn(s.rows, w, device=device, dtype=torch.bfloat16)
    return model, lambda m: m(x).float().square().mean()


MODELS = {"gpt2": gpt2, "modules600": modules600}


def _backend(dry_run: bool) -> CudaBackend:
    if not dry_run:
        return default_backend()
    from fake_cuda import FakeCudaBackend  # the test suite's allocator stand-in (tests/ on the path)

    return FakeCudaBackend()


def _profiler(root: Path, name: str, variant: str, model: nn.Module, cuda: CudaBackend) -> MemProfiler | None:
    extra, drop, _ = VARIANTS[variant]
    if variant in NO_PROFILER:
        return None
    d = root / name
    d.mkdir()
    prof = MemProfiler({**BASE, **extra}, save_dir=d, rank=0, cuda=cuda, module=model)
    prof.setup()
    if drop:
        regs = prof._collectors._regs
        prof._collectors._regs = [r for r in regs if drop != ("*",) and r.collector.name not in drop]
    return prof


class _Clock:
    """Training-thread CPU time, wall time and (on a GPU) device events around each step."""

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        self.cpu: list[float] = []
        self.wall: list[float] = []
        self.starts: list[Any] = []
        self.ends: list[Any] = []

    def event(self) -> Any:
        if not self.gpu:
            return None
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def device_ms(self) -> tuple[list[float], list[float]]:
        """Per pair of consecutive steps: device time between their starts, and the idle gap
        between the first's end and the next's start."""
        if not self.gpu or len(self.starts) < 2:
            return [], []
        torch.cuda.synchronize()
        step = [a.elapsed_time(b) for a, b in zip(self.starts, self.starts[1:], strict=False)]
        gap = [a.elapsed_time(b) for a, b in zip(self.ends, self.starts[1:], strict=False)]
        return step, gap


#: What torch's sync debug mode warns of an operation that makes the host wait for the device.
SYNC_WARNING = "called a synchronizing CUDA operation"
#: memprofiler's own code: a wait made from a frame in here is the profiler's.
PACKAGE = Path(memprofiler.__file__).resolve().parent


class SyncWatch:
    """The host-device waits while it is on, told by torch's sync debug mode on a GPU (on CPU
    nothing turns it on, and only warnings raised otherwise are seen): their count and, for each
    made from memprofiler's code, its innermost frame there (``collectors/x.py:12 f``)."""

    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu
        self.count = 0
        self.ours: set[str] = set()
        self._caught = warnings.catch_warnings()

    def __enter__(self) -> SyncWatch:
        self._caught.__enter__()
        warnings.simplefilter("always")
        show = warnings.showwarning

        def seen(
            message: Warning | str, category: type[Warning], filename: str, lineno: int,
            file: TextIO | None = None, line: str | None = None,
        ) -> None:  # fmt: skip
            if SYNC_WARNING not in str(message):
                show(message, category, filename, lineno, file, line)
                return
            self.count += 1
            for fr in reversed(traceback.extract_stack()[:-1]):
                where = Path(fr.filename).resolve()
                if where.is_relative_to(PACKAGE):
                    self.ours.add(f"{where.relative_to(PACKAGE)}:{fr.lineno} {fr.name}")
                    break

        warnings.showwarning = seen
        if self.gpu:
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.gpu:
                torch.cuda.set_sync_debug_mode("default")
        finally:
            self._caught.__exit__(*exc)

    def result(self) -> dict[str, Any] | None:
        """What was seen; None on CPU, where torch tells no wait."""
        return {"count": self.count, "from_memprofiler": sorted(self.ours)} if self.gpu else None


def _torch_profiler(gpu: bool) -> AbstractContextManager[Any]:
    """torch's profiler with memory profiling, as a user would turn it on around training steps."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if gpu:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=acts, profile_memory=True)


def _steps(
    model: nn.Module, loss_of: Callable[[nn.Module], torch.Tensor], opt: torch.optim.Optimizer,
    prof: MemProfiler | None, fn: str, n: int, gpu: bool, torch_profiler: bool = False,
) -> dict[str, float | None]:  # fmt: skip
    """``n`` training steps (the forward inside ``prof``'s window for ``fn``; with
    ``torch_profiler``, every step inside torch's profiler, whose start and stop are not timed):
    medians per step. What the run left is collected after it, outside the timed steps: the
    profiler's events would otherwise be collected inside whichever later run allocates first."""
    clock = _Clock(gpu)
    outer = _torch_profiler(gpu) if torch_profiler else nullcontext()
    with outer:
        for _ in range(n):
            window: AbstractContextManager[Any] = prof.profile(fn) if prof is not None else nullcontext()
            t, c = time.perf_counter_ns(), time.thread_time_ns()
            clock.starts.append(clock.event())
            with window:
                loss = loss_of(model)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            clock.ends.append(clock.event())
            clock.cpu.append((time.thread_time_ns() - c) / 1e3)
            clock.wall.append((time.perf_counter_ns() - t) / 1e3)
        step, gap = clock.device_ms()
    del outer
    gc.collect()
    gc.freeze()  # what survived is not walked again by the next full collection
    return {
        "thread_cpu_us": statistics.median(clock.cpu),
        "wall_us": statistics.median(clock.wall),
        "device_step_ms": statistics.median(step) if step else None,
        "device_idle_gap_ms": statistics.median(gap) if gap else None,
    }


def _per_call(f: Callable[[], Any], calls: int) -> tuple[float, float]:
    """Training-thread CPU and wall microseconds per call of ``f``."""
    t, c = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(calls):
        f()
    return (time.thread_time_ns() - c) / calls / 1e3, (time.perf_counter_ns() - t) / calls / 1e3


def parts(cuda: CudaBackend, rounds: int, calls: int) -> dict[str, dict[str, float]]:
    """Each primitive of a collected call alone: median per call over ``rounds``."""
    host = HostCollector()

    def host_peak() -> None:
        host._begin_peak()
        rss, _ = host._memory()
        host._end_peak(rss)

    def marks() -> None:
        cuda.mark_end(cuda.mark_start("training_step#0"))

    cuda.ensure_initialized()
    prims: dict[str, Callable[[], Any]] = {
        "memory_stats": cuda.memory_stats,
        "reset_peak_memory_stats": cuda.reset_peak_memory_stats,
        "host_rss": host._memory,
        "host_rss_peak_begin_and_end": host_peak,
        "record_function_mark_pair": marks,
    }
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in prims}
    try:
        for _ in range(rounds):
            order = list(prims)
            random.shuffle(order)
            for k in order:
                samples[k].append(_per_call(prims[k], calls))
    finally:
        host.close()
    return {
        k: {
            "thread_cpu_us": round(statistics.median(c for c, _ in v), 2),
            "wall_us": round(statistics.median(w for _, w in v), 2),
        }
        for k, v in samples.items()
    }


def steps(
    name: str, s: Sizes, device: torch.device, cuda: CudaBackend, rounds: int, n: int, root: Path,
    precision: str = "bf16-mixed",
) -> dict[str, Any]:  # fmt: skip
    """Every variant's steps on model ``name``, interleaved; medians over rounds, each part's
    share, and the goal's ratios."""
    torch.manual_seed(0)
    model, loss_of = MODELS[name](s, device, precision)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gpu = device.type == "cuda"
    profs = {v: _profiler(root, f"{name}-{v}", v, model, cuda) for v in VARIANTS}
    got: dict[str, list[dict[str, float | None]]] = {v: [] for v in VARIANTS}
    try:
        for v in VARIANTS:  # warm up: allocator, kernels, first flush
            _steps(model, loss_of, opt, profs[v], VARIANTS[v][2], 2, gpu, v == "torch_profiler")
        for _ in range(rounds):
            order = list(VARIANTS)
            random.shuffle(order)
            for v in order:
                got[v].append(
                    _steps(model, loss_of, opt, profs[v], VARIANTS[v][2], n, gpu, v == "torch_profiler")
                )
        # one step each under the sync debug mode (one: the steps' clock waits for the device
        # after two or more), apart from the timed ones, as the mode's checks cost time
        syncs: dict[str, dict[str, Any] | None] = {}
        for v in VARIANTS:
            if v != "torch_profiler":
                with SyncWatch(gpu) as watch:
                    _steps(model, loss_of, opt, profs[v], VARIANTS[v][2], 1, gpu)
                syncs[v] = watch.result()
    finally:
        with warnings.catch_warnings():  # `outside` never calls the collected function: said at teardown
            warnings.simplefilter("ignore", MemProfilerWarning)
            for p in profs.values():
                if p is not None:
                    p.teardown()

    def med(v: str, key: str) -> float | None:
        xs = [x for r in got[v] if (x := r[key]) is not None]
        return round(statistics.median(xs), 3) if xs else None

    keys = ("thread_cpu_us", "wall_us", "device_step_ms", "device_idle_gap_ms")
    per = {v: {k: med(v, k) for k in keys} for v in VARIANTS}
    shares: dict[str, dict[str, float | None]] = {}
    for part, (a, b) in SHARES.items():
        shares[part] = {
            k: None if (x := per[a][k]) is None or (y := per[b][k]) is None else round(x - y, 3) for k in keys
        }
    clock = "device_step_ms" if gpu else "thread_cpu_us"
    ratios: dict[str, Any] = {"clock": clock}
    for what, (a, b) in RATIOS.items():
        x, y = per[a][clock], per[b][clock]
        ratios[what] = None if x is None or not y else round(x / y, 4)
    return {
        "modules": len(list(model.modules())),
        "parameters": sum(p.numel() for p in model.parameters()),
        "precision": precision if name == "gpt2" else "bf16",
        "per_step": per,
        "shares": shares,
        "ratios": ratios,
        "host_device_syncs": syncs,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="on CPU, tiny sizes, the fake allocator")
    ap.add_argument("--models", default="gpt2,modules600", help=f"comma-separated: {', '.join(MODELS)}")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of every variant (default 7; dry run 2)")
    ap.add_argument(
        "--steps", type=int, default=None, help="steps per variant and round (default 10; dry run 2)"
    )
    ap.add_argument(
        "--calls", type=int, default=None, help="calls per part and round (default 2,000; dry run 20)"
    )
    ap.add_argument(
        "--precision", default="bf16-mixed", choices=PRECISIONS, help="GPT-2's weights and forward"
    )
    ap.add_argument("--out", type=Path, default=None, help="results folder or file (benchmarks/_emit.py)")
    args = ap.parse_args(argv)
    models = args.models.split(",")
    if unknown := [m for m in models if m not in MODELS]:
        ap.error(f"--models {','.join(unknown)}: not a model; choose among {', '.join(MODELS)}")
    dry = args.dry_run
    if not dry and not torch.cuda.is_available():
        ap.error("no CUDA device: run on a GPU node, or pass --dry-run")
    rounds = args.rounds or (2 if dry else 7)
    n = args.steps or (2 if dry else 10)
    calls = args.calls or (20 if dry else 2000)
    device = torch.device("cpu" if dry else "cuda")
    sizes = TINY if dry else REAL
    random.seed(0)
    torch.set_num_threads(1 if dry else torch.get_num_threads())
    cuda = _backend(dry)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        result: dict[str, Any] = {
            "what": "one collected call of @memprofilable: each part alone, then whole training steps per "
            "profiler variant (interleaved, A/A pair); training-thread CPU and wall microseconds, device "
            "milliseconds from CUDA events",
            "dry_run": dry,
            "packer": saved_tensors.packer_build(),
            "device": "cpu (dry run: tiny sizes, the fake allocator)"
            if dry
            else torch.cuda.get_device_name(),
            "sizes": sizes.__dict__,
            "rounds": rounds,
            "steps_per_round": n,
            "parts": parts(cuda, rounds, calls),
            "models": {
                m: steps(m, sizes, device, cuda, rounds, n, Path(tmp), args.precision) for m in models
            },
            "goal": "window_memory_hooks_off <= 1.01 and window_whole <= 1.03 on gpt2 (H200, bf16-mixed), "
            "torch_profiler beside them, A/A near 1; no host-device wait made from memprofiler's code",
        }
    result["machine_load"] = (
        f"1-minute load average {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    )
    _emit_module().emit(result, args.out, benchmark="gpu_call_cost")
    return result


if __name__ == "__main__":
    main()
