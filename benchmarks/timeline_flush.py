"""The memory trace's writer against an earlier revision's, side by side in one process.

Loads ``src/memprofiler/output/timeline.py`` as it was at ``--base`` (``git show``) beside the
current one and times, interleaved in a new random order every round with an A/A pair of the
base: one flush render of 10 calls (20 marks of 7 counters), ``events()`` over 300 of 500+ calls
(what a merged profiler trace reads once per cycle), a whole ``to_json`` and a flush ``dump``
appending 10 calls to its own file. Process CPU microseconds, medians over rounds; prints JSON
ratios (current / base, and base-again / base as the noise floor).

``MALLOC_ARENA_MAX=1 PYTHONPATH=src:tests python benchmarks/timeline_flush.py --base cbeaa4c [--out FILE]``

With ``--merge``: a profiler trace cycle's merge instead, the way ``--base`` did it (parse
Kineto's trace, extend ``traceEvents`` with our rows as dicts, write the tree again; the base's
``timeline.py`` and ``step_timeline.py``) against the current splice of our rows' text
(``output/trace_splice.py``), with an A/A pair of the base, on real Kineto traces of two sizes
written by ``torch.profiler`` here; also the rows alone, the base's ``events()`` against the
current ``events_json()``. Both merges' outputs are checked to parse to the same trace.

``MALLOC_ARENA_MAX=1 PYTHONPATH=src:tests python benchmarks/timeline_flush.py --merge --base cc311b2 [--out FILE]``
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _emit import emit

ROOT = Path(__file__).resolve().parents[1]
METRICS = {
    "rss": 123456789,
    "rss_peak": 223456789,
    "allocated_bytes.all.current": 3 << 20,
    "reserved_bytes.all.current": 8 << 20,
    "allocated_bytes.all.peak": 5 << 20,
    "reserved_bytes.all.peak": 10 << 20,
    "saved_tensors.unique_bytes": 4096,
}
T0 = 1_700_000_000_123_456_789
CALLS_PER_FLUSH = 10


def _base_module(rev: str, tmp: Path, name: str = "timeline") -> Any:
    text = subprocess.run(
        ["git", "show", f"{rev}:src/memprofiler/output/{name}.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = tmp / f"{name}_base.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"memprofiler.output._{name}_base", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _feed(tl: Any, first: int, n: int) -> None:
    from memprofiler.output.events import SnapshotEvent

    for call in range(first, first + n):
        for phase in ("start", "end"):
            t = T0 + call * 1_000_000 + (400_000 if phase == "end" else 0)
            tl.on_snapshot(
                SnapshotEvent(f"0.training_step.{call}.{phase}", 0, "training_step", call, phase, t, METRICS)
            )


def _render(mod: Any, tl: Any, marks: list[Any]) -> str:
    # the base had a module-level builder; the current one a method
    if hasattr(mod, "_events_json"):
        return str(mod._events_json(marks, tl.rank, tl._base_ns(), {}))
    return str(tl._events_json(marks, tl.rank, tl._base_ns(), {}))


def _kineto_trace(path: Path, layers: int, steps: int) -> bytes:
    """A real trace as Kineto writes it: ``steps`` steps of an MLP of ``layers`` layers."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(layers)])
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, profile_memory=True
    ) as prof:
        for step in range(steps):
            with torch.profiler.record_function(f"ProfilerStep#{step}"):
                model(torch.randn(32, 64)).sum().backward()
    prof.export_chrome_trace(str(path))
    return path.read_bytes()


class _Samples:
    def __init__(self, samples: list[tuple[int, dict[str, float]]]) -> None:
        self.samples = samples

    def between(self, lo: int, hi: int) -> list[tuple[int, dict[str, float]]]:
        return [(t, v) for t, v in self.samples if lo <= t <= hi]


def _rows(mem_mod: Any, step_mod: Any, lo: int, hi: int, calls: int) -> list[Any]:
    """A memory timeline of ``calls`` calls of 7 counters and a step timeline of 8 hook spans and
    a data wait per call, 4 host metrics every 10 calls, all inside ``[lo, hi]``."""
    from memprofiler.output.events import SnapshotEvent

    mem = mem_mod.MemoryTimeline(0)
    width = (hi - lo) // (calls + 1)
    samples = []
    step = step_mod.StepTimeline(rank=0)
    for call in range(1, calls + 1):
        t = lo + call * width
        for phase, at in (("start", t), ("end", t + width // 2)):
            mem.on_snapshot(
                SnapshotEvent(f"0.training_step.{call}.{phase}", 0, "training_step", call, phase, at, METRICS)
            )
        for hook in range(8):
            step.span(f"[Callback]Hook{hook}.on_train_batch_end", t + hook, t + hook + width // 10)
        step.span("[_TrainingEpochLoop].train_dataloader_next", t - 5, t, track=step_mod.DATA)
        if call % 10 == 0:
            samples.append((t, {"cpu": 51.5, "rss": 123456789.0, "gpu_util": 97.0, "io_read": 1024.0}))
    step.host = _Samples(samples)
    return [mem, step]


def _old_merge(mod: Any, kineto: bytes, rows: list[Any], pid: int, ident: dict[str, Any]) -> bytes:
    """``ExtendedPyTorchProfiler._merged`` of the base revision (its successful path)."""
    trace = json.loads(kineto)
    span = mod.trace_span_ns(trace)
    if span is not None:
        for timeline in rows:
            mod.merge_into_trace(trace, timeline, pid=pid, span=span)
    trace = {"memprofiler": ident, **{k: v for k, v in trace.items() if k != "memprofiler"}}
    return json.dumps(trace).encode()


def _new_merge(kineto: bytes, rows: list[Any], pid: int, ident: dict[str, Any]) -> bytes:
    """``ExtendedPyTorchProfiler._merged`` now (its successful path)."""
    from memprofiler.output.trace_splice import ChromeTrace

    trace = ChromeTrace.read(kineto)
    assert trace.is_object and trace.as_text
    return trace.with_rows(rows, pid, {"memprofiler": ident})


def merge_main(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    from memprofiler.output import step_timeline, timeline
    from memprofiler.output.timeline import trace_span_ns

    tmp = Path(tempfile.mkdtemp())
    base_tl = _base_module(args.base, tmp)
    base_step = _base_module(args.base, tmp, "step_timeline")
    load_before = os.getloadavg()
    ident = {"run_id": "0123456789abcdef", "rank": 0, "cycle": 1, "epoch": 0, "batch": 4}
    pid = os.getpid()
    sizes = {"small": (3, 3), "medium": (20, 5)}  # (layers, steps) of the profiled MLP
    cases: dict[str, dict[str, Any]] = {}
    for size, (layers, steps) in sizes.items():
        kineto = _kineto_trace(tmp / f"{size}.json", layers, steps)
        span = trace_span_ns(json.loads(kineto))
        assert span is not None
        rows = {
            "base": _rows(base_tl, base_step, *span, args.calls),
            "current": _rows(timeline, step_timeline, *span, args.calls),
        }
        old = _old_merge(base_tl, kineto, rows["base"], pid, ident)
        new = _new_merge(kineto, rows["current"], pid, ident)
        assert json.loads(old) == json.loads(new)  # the same trace, read back
        n = len(json.loads(kineto)["traceEvents"])
        ours = len(json.loads(new)["traceEvents"]) - n
        cases[size] = {"kineto": kineto, "rows": rows, "span": span, "bytes": len(kineto), "events": n}
        cases[size]["ours"], cases[size]["out_bytes"] = ours, {"base": len(old), "current": len(new)}
    variants = ("base", "base_again", "current")
    res: dict[str, dict[str, list[float]]] = {
        v: {m: [] for m in ["rows", *(f"merge_{s}" for s in sizes)]} for v in variants
    }
    gc.disable()
    for _ in range(args.rounds):
        order = list(variants)
        random.shuffle(order)
        for v in order:
            kind = "current" if v == "current" else "base"
            for size, case in cases.items():
                kineto, rows = case["kineto"], case["rows"][kind]
                gc.collect()
                t = time.process_time_ns()
                if kind == "base":
                    _old_merge(base_tl, kineto, rows, pid, ident)
                else:
                    _new_merge(kineto, rows, pid, ident)
                res[v][f"merge_{size}"].append((time.process_time_ns() - t) / 1e3)
            lo, hi = cases["medium"]["span"]
            mem = cases["medium"]["rows"][kind][0]
            gc.collect()
            t = time.process_time_ns()
            for _ in range(3):
                if kind == "base":
                    mem.events(pid, 0, lo, hi)
                else:
                    mem.events_json(pid, 0, lo, hi)
            res[v]["rows"].append((time.process_time_ns() - t) / 3 / 1e3)
    gc.enable()
    med = {v: {m: round(statistics.median(x), 1) for m, x in r.items()} for v, r in res.items()}
    emit(
        {
            "what": "a profiler trace cycle's merge: --base's dict merge (json.loads of Kineto's trace, our "
            "rows as dicts, json.dumps) vs the current splice of our rows' text; process CPU microseconds, "
            "medians over rounds",
            "base": args.base,
            "medians_us": med,
            "ratio_current_over_base": {
                m: round(med["current"][m] / med["base"][m], 3) for m in med["current"]
            },
            "ratio_aa": {m: round(med["base_again"][m] / med["base"][m], 3) for m in med["current"]},
            "sizes": {
                size: {
                    "kineto_bytes": case["bytes"],
                    "kineto_events": case["events"],
                    "our_events": case["ours"],
                    "output_bytes": case["out_bytes"],
                    "mlp_layers_steps": sizes[size],
                }
                for size, case in cases.items()
            },
            "rows": f"events() (base) vs events_json() (current) of the memory timeline, {args.calls} calls "
            "of 7 counters inside the medium trace's span",
            "calls": args.calls,
            "rounds": args.rounds,
            "machine_note": "2 CPU cores shared with other jobs (other engineers' tests and benchmarks); "
            f"load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after; torch threads 1, "
            f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX', 'unset')}",
        },
        args.out,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="cbeaa4c")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--merge", action="store_true", help="time a trace cycle's merge (see the module doc)")
    ap.add_argument("--calls", type=int, default=300, help="--merge: collected calls inside the trace's span")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.merge:
        merge_main(args)
        return
    import torch

    torch.set_num_threads(1)
    from memprofiler.output import timeline as current

    tmp = Path(tempfile.mkdtemp())
    base = _base_module(args.base, tmp)
    mods = {"base": base, "base_again": base, "current": current}
    tls = {k: m.MemoryTimeline(0) for k, m in mods.items()}
    for tl in tls.values():
        _feed(tl, 1, 500)
    marks = {k: tl._marks[: 2 * CALLS_PER_FLUSH] for k, tl in tls.items()}
    assert _render(base, tls["base"], marks["base"]) == _render(current, tls["current"], marks["current"])
    res: dict[str, dict[str, list[float]]] = {
        k: {"render": [], "events": [], "to_json": [], "dump": []} for k in tls
    }
    dirs = {k: tmp / k for k in tls}
    for d in dirs.values():
        d.mkdir()
    nxt = 501
    gc.disable()
    for _ in range(args.rounds):
        order = list(tls)
        random.shuffle(order)
        for k in order:
            tl = tls[k]
            gc.collect()
            t = time.process_time_ns()
            for _ in range(200):
                _render(mods[k], tl, marks[k])
            res[k]["render"].append((time.process_time_ns() - t) / 200 / 1e3)
            gc.collect()
            t = time.process_time_ns()
            for _ in range(3):
                tl.events(77, T0, T0, T0 + 300 * 1_000_000)
            res[k]["events"].append((time.process_time_ns() - t) / 3 / 1e3)
            gc.collect()
            t = time.process_time_ns()
            for _ in range(3):
                tl._rendered_base = None
                tl.to_json()
            res[k]["to_json"].append((time.process_time_ns() - t) / 3 / 1e3)
        order = list(tls)
        random.shuffle(order)
        for k in order:
            _feed(tls[k], nxt, CALLS_PER_FLUSH)
            gc.collect()
            t = time.process_time_ns()
            tls[k].dump(str(dirs[k]))
            res[k]["dump"].append((time.process_time_ns() - t) / 1e3)
        nxt += CALLS_PER_FLUSH
    for d in dirs.values():  # every variant wrote a valid trace
        json.loads((d / "memory_trace_rank_0.json").read_text())
    med = {k: {m: round(statistics.median(v), 1) for m, v in r.items()} for k, r in res.items()}
    emit(
        {
            "what": "memory trace writer: current vs --base, process CPU microseconds (medians over rounds)",
            "base": args.base,
            "medians_us": med,
            "ratio_current_over_base": {
                m: round(med["current"][m] / med["base"][m], 3) for m in med["current"]
            },
            "ratio_aa": {m: round(med["base_again"][m] / med["base"][m], 3) for m in med["current"]},
            "sizes": f"{CALLS_PER_FLUSH} calls (20 marks, 7 counters) per flush and render; events() over 300 of "
            "500+ calls; to_json over all",
            "rounds": args.rounds,
            "machine_note": "2 CPU cores shared with other jobs",
        },
        args.out,
    )


if __name__ == "__main__":
    main()
