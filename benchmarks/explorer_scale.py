"""The allocation explorer at scale: conversion time against a bare ``pickle.load``, HTML size,
peak RSS, and first paint and redraw (60 zoom and pan steps) times in headless Chromium.

A synthetic trace in torch's ``_snapshot()`` layout: training steps whose forward allocates
activations (1-64 MiB) freed in reverse in the backward, short-lived temporaries, and
parameters allocated before the trace. Each allocation has its own list of 64 frames, each
free one that its free_requested and free_completed entries share (allocator and unwinder
internals, an operator's C++ frames, Python frames between interpreter ones; ~200 distinct
stacks), and the frame dicts are shared objects, as torch writes them.

Each variant runs in a fresh subprocess (so peak RSS is its own), in random order, with an
A/A pair of the bare load as the noise floor::

    MALLOC_ARENA_MAX=1 python benchmarks/explorer_scale.py --entries 1000000 --rounds 5 \
        --out benchmarks/results/explorer_scale-1M_cpu_YYYYMMDD.json
    # peak RSS of a bare load and of the conversion of an existing (5M-entry) trace:
    python benchmarks/explorer_scale.py --pickle /tmp/t5M.pickle --rounds 1 --variants load,convert
    # against the conversion of an earlier revision (its src/ from git archive), side by side:
    python benchmarks/explorer_scale.py --variants load,load_aa,load_nogc,convert,convert_base --base REV

Each child reports wall and CPU seconds (its own, from the same start); on a shared machine
compare by CPU seconds, and read the load average recorded at each run.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _emit import emit

MiB = 1 << 20


def synthetic(entries: int, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    files = [f"/home/user/project/model_{k}.py" for k in range(20)]
    # As torch writes them (and the real capture in tests/fixtures/gpu_transformer_forward_mixed.pickle holds: 429 frame
    # dicts for 438,814 frame references): each distinct frame is one dict object that every
    # stack naming it shares (the pickle memoizes it), each entry has its own list, and a stack
    # is deep: the unwinder and allocator, an operator's C++ frames, then Python frames with
    # the interpreter's between them (64 frames here; the real capture has about 70).
    pool: dict[tuple[str, str, int], dict[str, Any]] = {}

    def frame(name: str, filename: str, line: int) -> dict[str, Any]:
        key = (name, filename, line)
        if key not in pool:
            pool[key] = {"name": name, "filename": filename, "line": line}
        return pool[key]

    internal = [
        frame("torch::unwind::unwind()", "??", 0),
        frame("torch::CapturedTraceback::gather(bool, bool, bool)", "??", 0),
        frame("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp", 0),
        frame(
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int)",
            "CUDACachingAllocator.cpp",
            0,
        ),
        frame("at::detail::empty_generic(c10::ArrayRef<long>)", "??", 0),
        frame("at::detail::empty_cuda(c10::ArrayRef<long>)", "??", 0),
    ]
    stacks: list[list[dict[str, Any]]] = []
    for k in range(200):
        op = f"at::native::op_{k % 25}(at::Tensor const&)"
        cpp = [frame(op, "Ops.cpp", 0), frame(f"at::_ops::op_{k % 25}::call(at::Tensor const&)", "??", 0)]
        py = [
            ("linear", "/venv/lib/python3.11/site-packages/torch/nn/functional.py", 100 + k % 7),
            (f"layer_{k}", files[k % 20], 10 + k),
            ("_call_impl", "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1750),
            ("forward", files[(k * 7) % 20], 50 + k % 13),
            ("_call_impl", "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1750),
            ("forward", "/home/user/project/model.py", 200 + k % 5),
            ("training_step", "/home/user/project/train.py", 80),
            ("fit", "/venv/lib/python3.11/site-packages/lightning/trainer.py", 500),
            ("<module>", "/home/user/project/train.py", 120),
        ]
        chain = []
        for name, f, ln in py:
            chain += [frame(name, f, ln), frame("_PyEval_EvalFrameDefault", "??", 0)]
            chain += [
                frame(n, "??", 0) for n in ("method_vectorcall", "_PyObject_Call_Prepend", "slot_tp_call")
            ]
        tail = [frame(n, "??", 0) for n in ("PyEval_EvalCode", "run_eval_code_obj", "run_mod", "pyrun_file")]
        tail += [frame(n, "??", 0) for n in ("_PyRun_SimpleFileObject", "_PyRun_AnyFileObject", "Py_RunMain")]
        tail += [frame(n, "??", 0) for n in ("pymain_main", "Py_BytesMain", "__libc_start_main", "_start")]
        stacks.append([*internal, *cpp, *chain, *tail])  # 6 + 2 + 45 + 11 = 64 frames

    def frames(k: int) -> list[dict[str, Any]]:
        return list(stacks[k])

    trace: list[dict[str, Any]] = []
    addr = 1 << 40
    t = 1_700_000_000_000_000
    while len(trace) < entries:
        live = []
        for _ in range(rng.randint(50, 400)):  # forward
            addr += 64 * MiB
            size = rng.choice((1, 2, 4, 8, 16, 64)) * MiB - rng.randint(0, 4096)
            k = rng.randrange(200)
            fl = frames(k)
            trace.append(
                {
                    "action": "alloc",
                    "addr": addr,
                    "size": size,
                    "stream": 0,
                    "time_us": t,
                    "frames": fl,
                }
            )
            live.append((addr, size, k))
            t += 3
            if rng.random() < 0.5:  # a temporary
                tmp = addr + 32 * MiB
                tl = frames(k)
                fl = frames((k + 1) % 200)  # where it is freed
                trace.append(
                    {
                        "action": "alloc",
                        "addr": tmp,
                        "size": 512 * 1024,
                        "stream": 0,
                        "time_us": t,
                        "frames": tl,
                    }
                )
                trace.append(
                    {
                        "action": "free_completed",
                        "addr": tmp,
                        "size": 512 * 1024,
                        "stream": 0,
                        "time_us": t + 1,
                        "frames": fl,
                    }
                )
                t += 2
        for a, size, k in reversed(live):  # backward
            fl = frames((k + 100) % 200)  # the freeing stack, one list for both entries
            trace.append(
                {
                    "action": "free_requested",
                    "addr": a,
                    "size": size,
                    "stream": 0,
                    "time_us": t,
                    "frames": fl,
                }
            )
            trace.append(
                {
                    "action": "free_completed",
                    "addr": a,
                    "size": size,
                    "stream": 0,
                    "time_us": t + 1,
                    "frames": fl,
                }
            )
            t += 2
    del trace[entries:]
    # keep it consistent: what the cut left allocated stays alive at the end
    alive: dict[int, int] = {}
    for e in trace:
        if e["action"] == "alloc":
            alive[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            alive.pop(e["addr"], None)
    blocks = [
        {"address": a, "size": s, "requested_size": s, "state": "active_allocated", "frames": []}
        for a, s in alive.items()
    ]
    blocks.append(
        {
            "address": 1 << 39,
            "size": 2048 * MiB,
            "requested_size": 2048 * MiB,
            "state": "active_allocated",
            "frames": [],
        }
    )
    segment = {"device": 0, "address": 1 << 39, "total_size": 1 << 42, "stream": 0, "blocks": blocks}
    return {"segments": [segment], "device_traces": [trace]}


CHILD = {
    "load": "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))",
    # the floor: a load with the cyclic GC off, as the conversion itself loads
    "load_nogc": "import gc,pickle,sys; gc.disable(); pickle.load(open(sys.argv[1],'rb'))",
    "convert": (
        "import sys; from memprofiler.__main__ import main; "
        "assert main(['snapshot', sys.argv[1], '--html', sys.argv[2], '--top', '5']) == 0"
    ),
}


def base_src(rev: str, tmp: Path) -> Path:
    """``src/`` of revision ``rev`` (``git archive``), extracted under ``tmp``."""
    root = Path(__file__).resolve().parents[1]
    dest = tmp / "base"
    dest.mkdir()
    archive = subprocess.run(["git", "archive", rev, "src"], cwd=root, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


def compiled(src: Path) -> None:
    """Byte-compile ``src`` once, so that every run of either side imports compiled modules (as
    an installed package does), whatever ``PYTHONDONTWRITEBYTECODE`` says."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(src)], check=True, env=env, stdout=subprocess.DEVNULL
    )


def run_child(
    kind: str, pickle_path: Path, html: Path, src: Path | None = None
) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (MiB) and CPU seconds (the process's, from the same start) of one
    run; ``src``: the package's sources to import (default: as this process finds them)."""
    code = (
        "import resource,time,sys,io,contextlib; t=time.perf_counter(); c=time.process_time()\n"
        f"with contextlib.redirect_stdout(io.StringIO()):\n    exec({CHILD[kind]!r})\n"
        "print(time.perf_counter()-t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024, "
        "time.process_time()-c)"
    )
    env = {**os.environ, "PYTHONPATH": str(src)} if src is not None else None
    out = subprocess.run(
        [sys.executable, "-c", code, str(pickle_path), str(html)],
        check=True, capture_output=True, text=True, env=env,
    ).stdout.split()  # fmt: skip
    return float(out[-3]), float(out[-2]), float(out[-1])


# 30 zoom steps (a view 1 to 2**11 times narrower than the trace, at a pseudo-random place),
# each followed by a pan of a tenth of the view: 60 redraws, each timed inside the page.
BROWSER = """
async () => {
  const X = window.mpExplorer, n = X.view[1], zoom = [], pan = [], drawn = [];
  for (let k = 0; k < 30; k++) {
    const span = n / Math.pow(2, k % 12), a = (n - span) * ((k * 37) % 100) / 100;
    X.setView(a, a + span); zoom.push(X.redraw()); drawn.push(X.drawn);
    X.setView(a + span / 10, a + span * 1.1); pan.push(X.redraw());
  }
  return {first_paint_ms: X.firstPaintMs, warm_ms: X.warmMs, zoom, pan, max_drawn: Math.max(...drawn)};
}
"""


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * len(v)))], 1)


def browser_times(html: Path, sessions: int) -> dict[str, Any]:
    """Open the page ``sessions`` times (a fresh browser each), and time 60 redraws in each."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
    from browser import open_page, skip_reason

    if skip_reason():
        return {"skipped": skip_reason()}
    runs = []
    for _ in range(sessions):
        with open_page(html, wait_ms=0) as view:
            t = time.perf_counter()
            # (polled from here: the page's policy forbids the eval that wait_for_function uses)
            while not view.eval("() => !!(window.mpExplorer && window.mpExplorer.ready)"):
                if view.errors or time.perf_counter() - t > 600:
                    break
                view.page.wait_for_timeout(50)
            r = view.eval(BROWSER) if not view.errors else {}
        redraws = r.get("zoom", []) + r.get("pan", [])
        runs.append(
            {
                "first_paint_ms": round(r.get("first_paint_ms") or -1),
                "warm_ms": round(r.get("warm_ms") or -1),
                "redraw_ms": {
                    "median": _pct(redraws, 0.5) if redraws else None,
                    "p95": _pct(redraws, 0.95) if redraws else None,
                    "max": _pct(redraws, 1.0) if redraws else None,
                },
                "over_50ms": sum(x >= 50 for x in redraws),
                "max_blocks_drawn": r.get("max_drawn"),
                "errors": view.errors,
            }
        )
    return {"sessions": runs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sessions", type=int, default=3, help="browser sessions (0: none)")
    ap.add_argument("--pickle", type=Path, default=None, help="an existing trace (default: generate one)")
    ap.add_argument("--variants", default="load,load_aa,load_nogc,convert")
    ap.add_argument("--base", default=None, help="revision whose sources the convert_base variant runs")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--name",
        default=None,
        help="the record's benchmark name (a variant: explorer_scale-1M)",
    )
    ap.add_argument("--generate", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:
        with open(args.generate, "wb") as f:
            pickle.dump(synthetic(args.entries), f, protocol=4)
        return
    with tempfile.TemporaryDirectory() as tmp:
        src = args.pickle or Path(tmp) / "trace.pickle"
        html = Path(tmp) / "trace.html"
        made = None
        if args.pickle is None:
            t = time.perf_counter()
            # In its own process: Linux keeps a process's peak RSS across fork and exec, so the
            # children timed below must not be forked from one that held the whole trace.
            subprocess.run(
                [sys.executable, __file__, "--generate", str(src), "--entries", str(args.entries)], check=True
            )
            made = round(time.perf_counter() - t, 1)
        base = base_src(args.base, Path(tmp)) if args.base else None
        for tree in (base, Path(__file__).resolve().parents[1] / "src"):
            if tree is not None:
                compiled(tree)
        load_before = os.getloadavg()
        names = args.variants.split(",")
        times: dict[str, list[float]] = {v: [] for v in names}
        cpu: dict[str, list[float]] = {v: [] for v in names}
        rss: dict[str, list[float]] = {v: [] for v in names}
        loads: list[float] = []
        rng = random.Random(1)
        for _ in range(args.rounds):  # every round runs each variant once, in a fresh order
            order = list(names)
            rng.shuffle(order)
            for v in order:
                loads.append(os.getloadavg()[0])
                kind = {"load_aa": "load", "convert_base": "convert"}.get(v, v)
                secs, mib, cpu_s = run_child(kind, src, html, base if v == "convert_base" else None)
                times[v].append(secs)
                cpu[v].append(cpu_s)
                rss[v].append(mib)
        med = {k: statistics.median(v) for k, v in times.items()}
        med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
        result: dict[str, Any] = {
            "benchmark": "explorer_scale",
            "host": (
                "2-CPU VM shared with other jobs (noisy), no GPU; each variant a fresh subprocess, "
                "variants interleaved in a fresh random order each round; figures are medians"
            ),
            "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            "load_average_at_runs": {
                "min": round(min(loads), 2),
                "median": round(statistics.median(loads), 2),
                "max": round(max(loads), 2),
            },
            "entries": args.entries,
            "pickle_mb": round(src.stat().st_size / 1e6, 1),
            "generate_s": made,
            "seconds": {k: [round(x, 2) for x in v] for k, v in times.items()},
            "median_s": {k: round(v, 2) for k, v in med.items()},
            "cpu_seconds": {k: [round(x, 2) for x in v] for k, v in cpu.items()},
            "median_cpu_s": {k: round(v, 2) for k, v in med_cpu.items()},
            "peak_rss_mib": {k: round(max(v)) for k, v in rss.items()},
        }
        if "load" in med and "load_aa" in med:
            result["aa_ratio"] = round(med["load_aa"] / med["load"], 3)
        if "load" in med and "convert" in med:
            paired = [c / b for c, b in zip(times["convert"], times["load"], strict=True)]
            result["convert_over_load"] = round(med["convert"] / med["load"], 3)
            result["convert_over_load_paired_median"] = round(statistics.median(paired), 3)
        if "load_nogc" in med and "convert" in med:
            result["convert_over_load_nogc"] = round(med["convert"] / med["load_nogc"], 3)
            result["convert_over_load_nogc_cpu"] = round(med_cpu["convert"] / med_cpu["load_nogc"], 3)
            paired = [c / b for c, b in zip(times["convert"], times["load_nogc"], strict=True)]
            result["convert_over_load_nogc_paired_median"] = round(statistics.median(paired), 3)
        if "convert_base" in med and "convert" in med:
            result["base"] = args.base
            result["convert_over_base_cpu"] = round(med_cpu["convert"] / med_cpu["convert_base"], 3)
        if html.exists():
            result["html_mb"] = round(html.stat().st_size / 1e6, 2)
        result["targets"] = {
            "convert_over_load": "<= 2",
            "html_mb": "<= 25 (1M entries)",
            "first_paint_ms": "< 2000",
            "redraw_ms": "< 50",
            "peak_rss_5M": "< 3 GiB",
        }
        if html.exists() and args.sessions:
            result["browser"] = browser_times(html, args.sessions)
    emit(result, args.out, benchmark=args.name)


if __name__ == "__main__":
    os.environ.setdefault("MALLOC_ARENA_MAX", "1")
    main()
