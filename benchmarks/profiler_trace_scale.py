"""Read a large profiler trace: events per second, peak RSS, HTML page size; and the JSON scan alone.

Traces: ``--source torch`` writes one with torch's own profiler (an MLP trained with shapes,
memory, stacks and modules recorded; every ``[memory]`` event after the last operator, as
torch 2.13 writes them; :func:`write_torch_trace`), ``synthetic`` a Kineto-shaped one
(operators, memory events interleaved in time, Python frames, CUDA kernels;
:func:`write_trace`). ``--trace PATH`` reads a trace written before instead (kept: write big
ones once and reuse them; never commit them).

Each variant runs as its own process (``MALLOC_ARENA_MAX=1``; one torch thread is moot: no
torch is imported), variants interleaved in random order; the JSON printed has per variant
the median wall time, events per wall second and per CPU second (user + system: the fair
figure on a shared machine), and peak RSS (the process's own ``VmHWM``). Variants:

- ``views`` / ``views_again``: the A/A pair; memprofiler's trace reader, every view, the page;
- ``scan_msgspec``: the reader's JSON scan alone (msgspec on blocks of events);
- ``scan_stdlib``: the same scan on its exact path only (the standard library's scanner, one
  event at a time);
- ``scan_ijson``: ``ijson.items`` (yajl2 C backend), as the reader scanned before;
- ``scan_orjson``: ``orjson.loads`` on the same blocks (dicts of every key);
- ``json_load``: ``json.load`` of the whole file (the memory it would take without streaming).

Usage: ``python benchmarks/profiler_trace_scale.py [--source torch|synthetic] [--events N]
[--trace PATH] [--repeats 2] [--variants views,views_again,scan_msgspec,...] [--tmp DIR] [--out FILE]``
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _emit import emit  # noqa: E402

_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
variant, path, page = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
t = time.perf_counter()
size = 0
if variant == "json_load":
    with open(path) as f:
        n = len(json.load(f)["traceEvents"])
elif variant.startswith("scan_"):
    import re
    from memprofiler.analysis.traces import events as te
    if variant == "scan_msgspec":
        n = sum(1 for _ in te.iter_events(path))
    elif variant == "scan_stdlib":
        te._SEP = re.compile(rb"(?!)")  # no block cut: every event on the exact path
        n = sum(1 for _ in te.iter_events(path))
    elif variant == "scan_ijson":
        import ijson
        with open(path, "rb") as f:
            n = sum(1 for _ in ijson.items(f, "traceEvents.item", use_float=True))
    else:  # scan_orjson: the blocks msgspec decodes, as dicts of every key
        import orjson
        n = 0
        with open(path, "rb") as f:
            buf = f.read(te._BLOCK)
            pos = te._OPEN.search(buf).end()
            while True:
                more = f.read(te._BLOCK)
                buf = buf[pos:] + more
                pos = 0
                cut = te._last_separator(buf, 0)
                if cut < 0 or not more:
                    break
                n += len(orjson.loads(b"[" + buf[:cut + 1] + b"]"))
                pos = buf.index(b"{", cut + 1)
            n += len(orjson.loads(b"[" + buf[pos:buf.rindex(b"]")] + b"]"))
else:
    from memprofiler.analysis.traces.views import build_views
    from memprofiler.reporters.traces.html import profiler_page
    views = build_views([path])
    n = views.traces[0].events
    text = profiler_page(views, "bench")
    page.write_text(text)
    size = len(text.encode())
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_SELF)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) * 1024
print(json.dumps({"events": n, "wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "peak_rss": hwm, "page_bytes": size}))
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


_TORCH_CHUNK = r"""
import sys, torch
from torch.profiler import ProfilerActivity, profile
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
             with_stack=True, with_modules=True) as p:
    for _ in range(int(sys.argv[2])):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        p.step()
p.export_chrome_trace(sys.argv[1])
"""
#: Training steps profiled per torch profiler session (about 530 events each; one session of
#: 400 steps peaks near 1.5 GiB while torch holds its events).
_STEPS_PER_CHUNK = 400
#: Events torch writes per profiled step of that MLP (measured: 530).
_EVENTS_PER_STEP = 530
_EVENT_SEP = "\n  },\n  {"


def _torch_events(text: str) -> tuple[str, list[str], str]:
    """A torch chrome trace's text as (head up to ``[``, each event's text, tail after ``]``)."""
    head, _, rest = text.partition('"traceEvents": [')
    body, _, tail = rest.rpartition("\n  }\n  ]")
    start = body.index("{")
    events = body[start + 1 :].split(_EVENT_SEP)
    return head + '"traceEvents": [', ["{" + e + "\n  }" for e in events], "\n  ]" + tail


def write_torch_trace(path: Path, events: int, tmp: Path) -> int:
    """A trace of about ``events`` events written by torch's own profiler (an 8-layer MLP
    trained with shapes, memory, stacks and modules recorded), in torch's own text, every
    ``[memory]`` event after the last operator as torch 2.13 writes them. Longer than one
    profiler session holds comfortably, it is profiled in sessions of :data:`_STEPS_PER_CHUNK`
    steps, one after the other in time, and their events joined: operators of every session,
    then the memory events of every session. Whole sessions are kept, so the count is about
    ``events`` (within a few hundred). Returns the exact event count."""
    mem_path = tmp / "memory_events.part"
    n = 0
    head = tail = ""
    written = {"out": 0, "mem": 0}
    with open(path, "w") as out, open(mem_path, "w") as mem:
        while n < events:
            chunk = tmp / "chunk.json"
            steps = min(_STEPS_PER_CHUNK, max(1, -(-(events - n) // _EVENTS_PER_STEP)))
            subprocess.run([sys.executable, "-c", _TORCH_CHUNK, str(chunk), str(steps)], check=True,
                           capture_output=True)  # fmt: skip
            h, evs, t = _torch_events(chunk.read_text())
            chunk.unlink()
            if not head:
                head, tail = h, t
                out.write(head)
            for ev in evs:
                key = "mem" if '"name": "[memory]"' in ev else "out"
                (mem if key == "mem" else out).write(("," if written[key] else "") + "\n  " + ev)
                written[key] += 1
                n += 1
    with open(path, "a") as out, open(mem_path) as mem:
        if written["out"] and written["mem"]:
            out.write(",")
        while block := mem.read(1 << 24):
            out.write(block)
        out.write(tail)
    mem_path.unlink()
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", choices=("torch", "synthetic"), default="torch")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--trace", type=Path, default=None, help="read this trace instead of writing one")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--variants", default="views,views_again,scan_msgspec,scan_stdlib,scan_ijson,scan_orjson"
    )
    parser.add_argument("--tmp", default=None, help="directory for the trace (default: the system's)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    env = {**os.environ, "MALLOC_ARENA_MAX": "1", "PYTHONPATH": str(ROOT / "src")}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        if args.trace is not None:
            trace = args.trace
            source = "given"
        else:
            trace = Path(tmp) / "big_rank_0.1.pt.trace.json"
            source = args.source
            if source == "torch":
                write_torch_trace(trace, args.events, Path(tmp))
            else:
                write_trace(trace, args.events)
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants.split(",")}
        order = [v for _ in range(args.repeats) for v in runs]
        random.Random(1).shuffle(order)
        for variant in order:
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, variant, str(trace), str(Path(tmp) / "page.html")],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
        n = max(r["events"] for rs in runs.values() for r in rs)
        result: dict[str, Any] = {
            "benchmark": "profiler_trace_scale",
            "machine_note": f"{os.cpu_count()}-CPU machine, no GPU, load average "
            f"{os.getloadavg()[0]:.1f} at the end (on a loaded machine compare variants by CPU seconds)",
            "source": source,
            "trace": str(trace.name),
            "events": n,
            "trace_bytes": trace.stat().st_size,
            "variants": {},
        }
        for variant, rs in runs.items():
            wall = statistics.median(r["wall_s"] for r in rs)
            cpu = statistics.median(r["cpu_s"] for r in rs)
            result["variants"][variant] = {
                "median_wall_s": round(wall, 3),
                "median_cpu_s": round(cpu, 3),
                "events_per_s": round(n / wall),
                "events_per_cpu_s": round(n / cpu),
                "peak_rss_mib": round(max(r["peak_rss"] for r in rs) / 2**20, 1),
                "page_bytes": max(r["page_bytes"] for r in rs),
            }
        if "views" in runs and "views_again" in runs:
            a, b = (result["variants"][v]["median_cpu_s"] for v in ("views", "views_again"))
            result["aa_ratio_cpu"] = round(b / a, 3)
    emit(result, args.out)


if __name__ == "__main__":
    main()
