"""Read a large synthetic profiler trace: events parsed per second, peak RSS, HTML page size.

Writes one Kineto-shaped Chrome trace of ``--events`` events (operators nested two deep,
``[memory]`` alloc/free pairs, Python frames as ``with_stack`` adds them, CUDA kernels), then
runs each variant as its own process (``MALLOC_ARENA_MAX=1``, one torch thread is moot: no
torch is imported), variants interleaved in random order, and prints JSON: median wall time,
events per second and peak RSS (the process's own ``VmHWM``) per variant, and the page size.
Variants: ``views`` and ``views_again`` (the A/A pair: memprofiler's streaming reader and every
view, the page rendered) and ``json_load`` (``json.load`` of the whole file, the memory it
would take without streaming).

``held`` reads the trace the in-memory way (every event kept, then nested), as the views did
before they streamed. ``--variants`` picks some (``json_load`` of a 1 GB trace takes about
10 GB). The trace is written under ``--tmp`` (default: the system's temporary directory) and
deleted afterwards.

Usage: ``python benchmarks/profiler_trace_scale.py [--events 2000000] [--repeats 2]
[--variants views,views_again,held,json_load] [--tmp DIR] [--out FILE]``
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _emit import emit  # noqa: E402

_CHILD = r"""
import json, sys, time
from pathlib import Path
variant, path, page = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
t = time.perf_counter()
if variant == "json_load":
    with open(path) as f:
        n = len(json.load(f)["traceEvents"])
    size = 0
elif variant == "held":
    from memprofiler.analysis.profiler_views import held_trace_view
    n = held_trace_view(path).events
    size = 0
else:
    from memprofiler.analysis.profiler_views import build_views
    from memprofiler.reporters.profiler_html import profiler_page
    views = build_views([path])
    n = views.traces[0].events
    text = profiler_page(views, "bench")
    page.write_text(text)
    size = len(text.encode())
wall = time.perf_counter() - t
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) * 1024
print(json.dumps({"events": n, "wall_s": wall, "peak_rss": hwm, "page_bytes": size}))
"""


def write_trace(path: Path, events: int) -> int:
    """A trace of about ``events`` events, written as a stream; returns the exact count."""
    rnd = random.Random(0)
    n = 0
    ts = 1000.0
    with open(path, "w") as f:
        f.write('{"schemaVersion": 1, "baseTimeNanoseconds": 1700000000000000000, "traceEvents": [\n')
        first = True
        ext = 0
        while n < events:
            ext += 1
            chunk = [
                {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": ts, "dur": 40.0,
                 "args": {"External id": ext, "Input Dims": [[64, 256], [256, 256], [256]]}},
                {"ph": "X", "cat": "cpu_op", "name": f"aten::op{rnd.randrange(40)}", "pid": 1, "tid": 1, "ts": ts + 5,
                 "dur": 20.0, "args": {"External id": ext + 10**9, "Input Dims": [[64, 256]]}},
                {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts + 6,
                 "args": {"Bytes": 65536, "Addr": 4096 * (ext % 512), "Total Allocated": 65536, "Total Reserved": 2**21,
                          "Device Type": 1, "Device Id": 0}},
                {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts + 30,
                 "args": {"Bytes": -65536, "Addr": 4096 * (ext % 512), "Total Allocated": 0, "Total Reserved": 2**21,
                          "Device Type": 1, "Device Id": 0}},
                {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_64x32", "pid": 0, "tid": 7, "ts": ts + 50, "dur": 30.0,
                 "args": {"External id": ext + 10**9, "device": 0, "stream": 7}},
            ] + [
                {"ph": "X", "cat": "python_function", "name": f"model.py({k}): forward", "pid": 1, "tid": 1,
                 "ts": ts + k, "dur": 1.0, "args": {"Python id": k}}
                for k in range(5)
            ]  # fmt: skip
            for ev in chunk:
                f.write(("" if first else ",\n") + json.dumps(ev))
                first = False
            n += len(chunk)
            ts += 100.0
        f.write("\n]}\n")
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default="views,views_again,held,json_load")
    parser.add_argument("--tmp", default=None, help="directory for the trace (default: the system's)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    env = {**os.environ, "MALLOC_ARENA_MAX": "1", "PYTHONPATH": str(ROOT / "src")}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        trace = Path(tmp) / "big_rank_0.1.pt.trace.json"
        n = write_trace(trace, args.events)
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants.split(",")}
        order = [v for _ in range(args.repeats) for v in runs]
        random.Random(1).shuffle(order)
        for variant in order:
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, variant, str(trace), str(Path(tmp) / "page.html")],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
        result: dict[str, Any] = {
            "benchmark": "profiler_trace_scale",
            "machine_note": "2-CPU shared VM, no GPU; other engineers' jobs ran beside it",
            "events": n,
            "trace_bytes": trace.stat().st_size,
            "variants": {},
        }
        for variant, rs in runs.items():
            wall = statistics.median(r["wall_s"] for r in rs)
            result["variants"][variant] = {
                "median_wall_s": round(wall, 3),
                "events_per_s": round(n / wall),
                "peak_rss_mib": round(max(r["peak_rss"] for r in rs) / 2**20, 1),
                "page_bytes": max(r["page_bytes"] for r in rs),
            }
        if "views" in runs and "views_again" in runs:
            a, b = (result["variants"][v]["median_wall_s"] for v in ("views", "views_again"))
            result["aa_ratio"] = round(b / a, 3)
    emit(result, args.out)


if __name__ == "__main__":
    time0 = time.time()
    main()
