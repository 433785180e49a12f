"""Per-call cost of allocator history on top of torch's own recording, on CPU (fake allocator).

The window collector marks each collected call in the recording with one ``record_function``
span (its ``START`` and ``END`` annotations) where the per-call collector copied and pickled
the whole ring at the start and at the end of every call. This times one collected call's
history work (the collector's ``start`` + ``end``, the window left open) in microseconds:

* ``marks``: :class:`AllocatorHistoryCollector` with the real backend's marks
  (``torch.ops.profiler._record_function_enter_new`` / ``_exit``; on a GPU the allocator's
  callback adds one annotation to its ring per mark) and the fake allocator for the rest;
* ``marks_again``: the same (its ratio to ``marks`` is the noise floor, A/A);
* ``marks_fake``: the collector with the fake's marks (list appends): its own bookkeeping;
* ``per_call_dumps``: what the per-call collector did: a snapshot of the fake ring holding
  ``--ring`` entries with Python stacks, and its protocol-4 pickle written, at start and end.
  Its figure is the fake's (its stacks are not shared between entries as torch's are, and it
  copies no ring out of an allocator): an order of magnitude, the GPU's own is in
  a run on an NVIDIA H200 (the dumps doubled a 62 ms step).

Variants run interleaved in a new random order every round, ``torch.set_num_threads(1)``.
Prints one JSON object. Run as
``MALLOC_ARENA_MAX=1 PYTHONPATH=src:tests python benchmarks/history_call_cost.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _emit import emit

from fake_cuda import FakeCudaBackend
from memprofiler import layout
from memprofiler.collectors.allocator_history import AllocatorHistoryCollector
from memprofiler.collectors.base import CallContext
from memprofiler.collectors.cuda_backend import CudaBackend
from memprofiler.collectors.history_recording import HistoryOptions, HistoryRecording
from memprofiler.output.writers import write_pickle

VARIANTS = ("marks", "marks_again", "marks_fake", "per_call_dumps")


class _RealMarks(FakeCudaBackend):
    """The fake allocator with the real backend's marks."""

    mark_start = CudaBackend.mark_start  # type: ignore[assignment]
    mark_end = CudaBackend.mark_end  # type: ignore[assignment]


class _View:
    def __init__(self, save_dir: Path) -> None:
        self.save_dir = save_dir
        self.rank = 0


def _filled(backend: FakeCudaBackend, ring: int) -> None:
    """Fill the ring with ``ring`` entries carrying ~25 Python frames each."""

    def nest(k: int) -> None:
        if k:
            nest(k - 1)
            return
        while backend.ring is not None and len(backend.ring) < ring:
            backend.free(backend.alloc(4096))

    nest(20)


def _collector(backend: FakeCudaBackend, save_dir: Path, ring: int) -> AllocatorHistoryCollector:
    opts = HistoryOptions(ring, "python", "all")
    coll = AllocatorHistoryCollector(backend, HistoryRecording(backend, lambda *a, **k: None), opts)
    coll.bind(_View(save_dir))  # type: ignore[arg-type]
    coll.warmup(CallContext("step", 1, 0))
    _filled(backend, ring)
    return coll


def _time_marks(coll: AllocatorHistoryCollector, calls: int, first: int) -> list[float]:
    out = []
    for n in range(first, first + calls):
        ctx = CallContext("step", n, 0)
        t0 = time.perf_counter_ns()
        coll.start(ctx)
        coll.end(ctx, True)
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def _time_dumps(backend: FakeCudaBackend, save_dir: Path, calls: int, first: int) -> list[float]:
    out = []
    for n in range(first, first + calls):
        t0 = time.perf_counter_ns()
        for phase in ("start", "end"):
            name = layout.cuda_alloc_pickle(0, "step", n, phase)
            write_pickle(save_dir / name, backend.snapshot(), plain=False)
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200, help="timed calls per variant and round (marks)")
    parser.add_argument("--dump-calls", type=int, default=3, help="timed calls per round for per_call_dumps")
    parser.add_argument("--ring", type=int, default=10_000, help="entries in the ring for per_call_dumps")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    random.seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        setups = {}
        for v in VARIANTS:
            d = root / v
            d.mkdir()
            backend: FakeCudaBackend = (
                FakeCudaBackend() if v in ("marks_fake", "per_call_dumps") else _RealMarks()
            )
            setups[v] = (backend, d, _collector(backend, d, args.ring))
        samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
        first = 2
        for _ in range(args.rounds):
            order = list(VARIANTS)
            random.shuffle(order)
            for v in order:
                backend, d, coll = setups[v]
                if v == "per_call_dumps":
                    samples[v] += _time_dumps(backend, d, args.dump_calls, first)
                else:
                    samples[v] += _time_marks(coll, args.calls, first)
            first += args.calls
        med = {v: round(statistics.median(s), 2) for v, s in samples.items()}
    result = {
        "what": "history work per collected call (start + end), microseconds, median",
        "per_call_us": med,
        "ratio_aa": round(med["marks_again"] / med["marks"], 3),
        "per_call_dumps_over_marks": round(med["per_call_dumps"] / med["marks"], 1),
        "ring_entries_for_dumps": args.ring,
        "rounds": args.rounds,
        "calls_per_round": {"marks": args.calls, "per_call_dumps": args.dump_calls},
        "machine_note": "2 shared CPU cores (8 jobs in parallel); CPU torch: the mark is record_function "
        "without the allocator's annotation callback",
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
