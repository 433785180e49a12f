"""Cost of CUDA allocator-history recording and of its memory_viz dumps (GPU only).

For a small transformer, measures the median training-step time with no recording, with
``stacks="python"`` and with ``stacks="all"``, and, with the ring filled to ``max_entries``
(100k by default), the time to take and write one dump and the file's size. Uses the same
seam and writer as the collector.

Then, side by side in interleaved rounds (a new random order each round, an A/A pair as
the noise floor), the step time of: ``torch_recording`` (``_record_memory_history`` alone),
``memprofiler_window`` (a MemProfiler window collecting every step with
``cuda_allocator_history: true``, saved-tensor and memory hooks off: one recording, each call
marked in it), and ``per_call_dumps`` (the recording plus a snapshot written at the start and
end of every step, what memprofiler did before). The target: ``memprofiler_window`` within
1.15x of ``torch_recording``. Each round runs its steps inside one window; the window's one
write at its close is outside the timed steps, as it falls outside the user's steps.

Prints one JSON object; on a machine without CUDA it prints ``{"skipped": "no CUDA"}`` and
exits 0.

Usage:
    python benchmarks/allocator_history.py [--steps 30] [--max-entries 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memprofiler import MemProfiler
from memprofiler.collectors.allocator_history import trace_entries
from memprofiler.collectors.cuda_backend import CudaBackend
from memprofiler.output.writers import write_pickle


def _model() -> nn.Module:
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
    return nn.Sequential(nn.TransformerEncoder(layer, num_layers=4), nn.Linear(256, 256)).cuda()


def _step_times(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int) -> list[float]:
    return [_timed_step(model, opt, x) for _ in range(steps)]


def _dump(backend: CudaBackend, out: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    snap = backend.snapshot()
    t1 = time.perf_counter()
    write_pickle(out, snap, plain=False)
    t2 = time.perf_counter()
    return {
        "entries": trace_entries(snap),
        "snapshot_s": round(t1 - t0, 4),
        "write_s": round(t2 - t1, 4),
        "dump_s": round(t2 - t0, 4),
        "file_mib": round(out.stat().st_size / 2**20, 2),
    }


def _timed_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _round(
    variant: str, model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int, tmp: Path
) -> float:
    """Median step seconds of one round of ``variant``."""
    backend = CudaBackend()
    times: list[float] = []
    if variant in ("none", "none_again"):
        times = [_timed_step(model, opt, x) for _ in range(steps)]
    elif variant in ("torch_recording", "torch_recording_again", "per_call_dumps"):
        backend.record_memory_history("all", context="all", stacks="python", max_entries=100_000)
        try:
            for n in range(steps):
                if variant == "per_call_dumps":
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    write_pickle(tmp / f"start{n}.pickle", backend.snapshot(), plain=False)
                    loss = model(x).pow(2).mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    torch.cuda.synchronize()
                    write_pickle(tmp / f"end{n}.pickle", backend.snapshot(), plain=False)
                    times.append(time.perf_counter() - t0)
                else:
                    times.append(_timed_step(model, opt, x))
        finally:
            backend.record_memory_history(None)
    else:  # memprofiler_window
        save = tmp / f"mp{random.random()}"
        cfg = {
            "schedule": {"warmup": 0, "active": steps},
            "cuda_allocator_history": True,
            "enable_saved_tensors_hooks": False,
            "enable_memory_hooks": False,
            "collect_funcs": {"default": ["step"]},
        }
        with MemProfiler(cfg, save_dir=save, rank=0, module=model) as prof:
            for _ in range(steps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                with prof.profile("step"):
                    loss = model(x).pow(2).mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _side_by_side(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: int, rounds: int
) -> dict[str, Any]:
    variants = [
        "none",
        "none_again",
        "torch_recording",
        "torch_recording_again",
        "memprofiler_window",
        "per_call_dumps",
    ]
    meds: dict[str, list[float]] = {v: [] for v in variants}
    random.seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            order = list(variants)
            random.shuffle(order)
            for v in order:
                meds[v].append(_round(v, model, opt, x, steps, Path(tmp)))
    ms = {v: round(statistics.median(m) * 1e3, 3) for v, m in meds.items()}
    return {
        "step_ms": ms,
        "aa_none": round(ms["none_again"] / ms["none"], 3),
        "aa_torch_recording": round(ms["torch_recording_again"] / ms["torch_recording"], 3),
        "torch_recording_over_none": round(ms["torch_recording"] / ms["none"], 3),
        "memprofiler_window_over_torch_recording": round(ms["memprofiler_window"] / ms["torch_recording"], 3),
        "per_call_dumps_over_torch_recording": round(ms["per_call_dumps"] / ms["torch_recording"], 3),
        "target": "memprofiler_window_over_torch_recording <= 1.15",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per setting")
    parser.add_argument("--max-entries", type=int, default=100_000, help="ring size for the dumps")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the side-by-side")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    backend = CudaBackend()
    if backend.ensure_initialized() is not None or not backend.supports_history():
        print(json.dumps({"skipped": "no CUDA"}))
        return 0

    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(16, 128, 256, device="cuda")
    _step_times(model, opt, x, 5)  # warm up kernels and the caching allocator

    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "model": "4-layer TransformerEncoder d=256, batch 16 x 128",
        "steps": args.steps,
        "max_entries": args.max_entries,
    }
    base = statistics.median(_step_times(model, opt, x, args.steps))
    result["step_ms"] = {"none": round(base * 1e3, 3)}
    with tempfile.TemporaryDirectory() as tmp:
        for stacks in ("python", "all"):
            backend.record_memory_history("all", context="all", stacks=stacks, max_entries=args.max_entries)
            try:
                med = statistics.median(_step_times(model, opt, x, args.steps))
                result["step_ms"][stacks] = round(med * 1e3, 3)
                result.setdefault("step_ratio", {})[stacks] = round(med / base, 3)
                # Fill the ring so the dump is measured at its bound.
                per_step = max(1, trace_entries(backend.snapshot()) // (args.steps + 1))
                fill = args.max_entries // per_step + 1
                _step_times(model, opt, x, min(fill, 5000))
                result.setdefault("dump", {})[stacks] = _dump(backend, Path(tmp) / f"{stacks}.pickle")
            finally:
                backend.record_memory_history(None)
    result["side_by_side"] = _side_by_side(model, opt, x, args.steps, args.rounds)
    from _emit import emit  # here, not at the top: the tests import this file as a module

    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
