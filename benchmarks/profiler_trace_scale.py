"""Read a large profiler trace: events per second, peak RSS, HTML page size; and the JSON scan alone.

Traces: ``--source torch`` writes one with torch's own profiler (an MLP trained with shapes,
memory and modules recorded; every ``[memory]`` event after the last operator, as torch 2.13
writes them; :func:`write_torch_trace`), ``synthetic`` a Kineto-shaped one (operators, memory
events interleaved in time, Python frames, CUDA kernels; :func:`write_trace`). ``--trace
PATH`` reads a trace written before instead (kept: write big ones once and reuse them; never
commit them).

The torch traces come in mixes (``--mix``, one or several, comma-separated; :data:`MIXES`),
since what an event costs the reader depends on its kind: an operator costs more than a
Python frame, a memory event more than either:

- ``sgd``: an 8-module MLP, SGD, with stacks (a third of the events are Python frames, a
  tenth memory events);
- ``adam``: a 12-module MLP, Adam (one kernel per parameter), shapes, no stacks: two thirds
  operators, a third memory events (the densest mix);
- ``adam_foreach``: the same with Adam's ``foreach`` step (fewer, larger operators);
- ``adam_stack``: ``adam`` with stacks (Python frames among them).

Each variant runs as its own process (``MALLOC_ARENA_MAX=1``; one torch thread is moot: no
torch is imported), variants (and mixes) interleaved in random order; the JSON printed has per
mix and variant the median wall time, events per wall second and per CPU second (the
process's CPU time, user + system, from the start of the work, as the wall time: the fair
figure on a shared machine), peak RSS (the process's own ``VmHWM``), and the load average
seen at each run's start. Variants:

- ``views`` / ``views_again``: the A/A pair; memprofiler's trace reader, every view, the page;
- ``views_base``: the same with the reader of revision ``--base`` (its ``src/`` from ``git
  archive``), for a before / after side by side;
- ``report``: ``memprofiler report TRACE -o PAGE`` as a user runs it (the terminal summary and
  the HTML report);
- ``scan_msgspec``: the reader's JSON scan alone (msgspec on blocks of events);
- ``scan_stdlib``: the same scan on its exact path only (the standard library's scanner, one
  event at a time);
- ``scan_ijson``: ``ijson.items`` (yajl2 C backend), as the reader scanned before;
- ``scan_orjson``: ``orjson.loads`` on the same blocks (dicts of every key);
- ``json_load``: ``json.load`` of the whole file (the memory it would take without streaming).

Usage: ``python benchmarks/profiler_trace_scale.py [--source torch|synthetic] [--mix sgd,adam,...]
[--events N] [--trace PATH] [--repeats 2] [--variants views,views_again,scan_msgspec,...]
[--base REV] [--tmp DIR] [--keep DIR] [--out FILE]``
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
import json, sys, time
from pathlib import Path
variant, path, page = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
t = time.perf_counter()
c = time.process_time()
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
elif variant == "report":
    import contextlib, io
    from memprofiler.__main__ import main
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["report", str(path), "-o", str(page)]) == 0
    n = int(sys.argv[4])
    size = page.stat().st_size
else:
    from memprofiler.analysis.traces.views import build_views
    from memprofiler.reporters.traces.html import profiler_page
    views = build_views([path])
    n = views.traces[0].events
    text = profiler_page(views, "bench")
    page.write_text(text)
    size = len(text.encode())
wall = time.perf_counter() - t
cpu = time.process_time() - c
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) * 1024
print(json.dumps({"events": n, "wall_s": wall, "cpu_s": cpu, "peak_rss": hwm, "page_bytes": size}))
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
                {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_64x32", "pid": 0, "tid": 7,
                 "ts": ts + 50, "dur": 30.0,
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
path, steps, mix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
torch.set_num_threads(1)
layers = 4 if mix == "sgd" else 6
model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(64, 64), torch.nn.ReLU())])
if mix == "sgd":
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
else:
    opt = torch.optim.Adam(model.parameters(), lr=0.01, foreach=mix == "adam_foreach")
x = torch.randn(32, 64)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
             with_stack=mix in ("sgd", "adam_stack"), with_modules=True) as p:
    for _ in range(steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        p.step()
p.export_chrome_trace(path)
"""
#: The torch traces' mixes (see the module): each a model, optimizer and recorded fields.
MIXES = ("sgd", "adam", "adam_foreach", "adam_stack")
#: Events torch writes per profiled session of a mix at most (one session of 400 SGD steps,
#: 212,000 events, peaks near 1.5 GiB while torch holds its events).
_EVENTS_PER_CHUNK = 200_000
#: Events per profiled step of each mix (measured; the first session's own count is used after it).
_EVENTS_PER_STEP = {"sgd": 530, "adam": 970, "adam_foreach": 800, "adam_stack": 1530}
_EVENT_SEP = "\n  },\n  {"


def _torch_events(text: str) -> tuple[str, list[str], str]:
    """A torch chrome trace's text as (head up to ``[``, each event's text, tail after ``]``)."""
    head, _, rest = text.partition('"traceEvents": [')
    body, _, tail = rest.rpartition("\n  }\n  ]")
    start = body.index("{")
    events = body[start + 1 :].split(_EVENT_SEP)
    return head + '"traceEvents": [', ["{" + e + "\n  }" for e in events], "\n  ]" + tail


def write_torch_trace(path: Path, events: int, tmp: Path, mix: str = "sgd") -> int:
    """A trace of about ``events`` events written by torch's own profiler (the MLP of ``mix``,
    :data:`MIXES`), in torch's own text, every ``[memory]`` event after the last operator as
    torch 2.13 writes them. Longer than one profiler session holds comfortably, it is profiled
    in sessions of at most :data:`_EVENTS_PER_CHUNK` events, one after the other in time, and
    their events joined: operators of every session, then the memory events of every session.
    Whole sessions are kept, so the count is about ``events`` (within a few hundred). Returns
    the exact event count."""
    mem_path = tmp / "memory_events.part"
    n = 0
    head = tail = ""
    written = {"out": 0, "mem": 0}
    per_step = _EVENTS_PER_STEP[mix]
    with open(path, "w") as out, open(mem_path, "w") as mem:
        while n < events:
            chunk = tmp / "chunk.json"
            steps = max(1, min(_EVENTS_PER_CHUNK // per_step, -(-(events - n) // per_step)))
            subprocess.run([sys.executable, "-c", _TORCH_CHUNK, str(chunk), str(steps), mix], check=True,
                           capture_output=True)  # fmt: skip
            h, evs, t = _torch_events(chunk.read_text())
            chunk.unlink()
            per_step = max(1, len(evs) // steps)
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


def _kinds(path: Path) -> dict[str, int]:
    """How many events of each kind a torch trace holds (operators, memory events, Python frames,
    other; torch writes every key of an event on a line of its own)."""
    out = {"cpu_op": 0, "memory": 0, "python_function": 0, "other": 0}
    events = 0
    with open(path, "rb") as f:
        for line in f:
            line = line.strip()
            if line.startswith(b'"ph"'):
                events += 1
            elif line == b'"name": "[memory]",':
                out["memory"] += 1
            elif line == b'"cat": "cpu_op",':
                out["cpu_op"] += 1
            elif line == b'"cat": "python_function",':
                out["python_function"] += 1
    out["other"] = events - out["cpu_op"] - out["memory"] - out["python_function"]
    return out


def _base_src(rev: str, tmp: Path) -> Path:
    """``src/`` of revision ``rev``, extracted under ``tmp``."""
    dest = tmp / "base"
    dest.mkdir()
    archive = subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", choices=("torch", "synthetic"), default="torch")
    parser.add_argument(
        "--mix", default="sgd", help=f"torch traces' mixes, comma-separated: {', '.join(MIXES)}"
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--trace", type=Path, default=None, help="read this trace instead of writing one")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--variants", default="views,views_again,scan_msgspec,scan_stdlib,scan_ijson,scan_orjson"
    )
    parser.add_argument("--base", default=None, help="revision whose reader the views_base variant runs")
    parser.add_argument("--tmp", default=None, help="directory for the trace (default: the system's)")
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="write the mixes' traces here, or read them when already there",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--name",
        default=None,
        help="the record's benchmark name (a variant: profiler_trace_scale-mixes_400k)",
    )
    args = parser.parse_args()
    mixes = args.mix.split(",")
    if unknown := [m for m in mixes if m not in MIXES]:
        parser.error(f"--mix {','.join(unknown)}: not a mix; choose among {', '.join(MIXES)}")
    variants = args.variants.split(",")
    if "views_base" in variants and args.base is None:
        parser.error("--variants views_base needs --base REV (the revision whose reader it runs)")
    env = {**os.environ, "MALLOC_ARENA_MAX": "1", "PYTHONPATH": str(ROOT / "src")}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        base_env = env
        if args.base is not None:
            base_env = {**env, "PYTHONPATH": str(_base_src(args.base, Path(tmp)))}
        traces: dict[str, tuple[Path, str]] = {}
        if args.trace is not None:
            mixes = ["given"]
            traces["given"] = (args.trace, "given")
        elif args.source == "synthetic":
            mixes = ["synthetic"]
            traces["synthetic"] = (Path(tmp) / "synthetic_rank_0.1.pt.trace.json", "synthetic")
            write_trace(traces["synthetic"][0], args.events)
        else:
            for mix in mixes:
                where = args.keep or Path(tmp)
                where.mkdir(parents=True, exist_ok=True)
                traces[mix] = (where / f"{mix}_{args.events}_rank_0.1.pt.trace.json", "torch")
                if not traces[mix][0].exists():
                    write_torch_trace(traces[mix][0], args.events, Path(tmp), mix)
        kinds = {mix: _kinds(path) for mix, (path, _) in traces.items()}
        runs: dict[tuple[str, str], list[dict[str, Any]]] = {(m, v): [] for m in mixes for v in variants}
        order = [key for _ in range(args.repeats) for key in runs]
        random.Random(1).shuffle(order)
        for mix, variant in order:
            trace = traces[mix][0]
            load = os.getloadavg()[0]
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, variant, str(trace), str(Path(tmp) / "page.html"),
                 str(sum(kinds[mix].values()))],
                env=base_env if variant == "views_base" else env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[mix, variant].append({**json.loads(out.stdout.strip().splitlines()[-1]), "load": load})
        loads = [r["load"] for rs in runs.values() for r in rs]
        result: dict[str, Any] = {
            "benchmark": "profiler_trace_scale",
            "machine_note": f"{os.cpu_count()}-CPU machine, no GPU, shared; load average (1 min) at each run's "
            f"start: min {min(loads):.1f}, median {statistics.median(loads):.1f}, max {max(loads):.1f} "
            "(on a loaded machine compare variants by CPU seconds)",
            "base": args.base,
            "mixes": {},
        }
        for mix, (trace, source) in traces.items():
            n = (
                max(r["events"] for v in variants for r in runs[mix, v] if v != "report")
                if any(v != "report" for v in variants)
                else sum(kinds[mix].values())
            )
            entry: dict[str, Any] = {
                "source": source,
                "trace": trace.name,
                "events": n,
                "kinds": kinds[mix],
                "trace_bytes": trace.stat().st_size,
                "variants": {},
            }
            for variant in variants:
                rs = runs[mix, variant]
                wall = statistics.median(r["wall_s"] for r in rs)
                cpu = statistics.median(r["cpu_s"] for r in rs)
                entry["variants"][variant] = {
                    "median_wall_s": round(wall, 3),
                    "median_cpu_s": round(cpu, 3),
                    "events_per_s": round(n / wall),
                    "events_per_cpu_s": round(n / cpu),
                    "peak_rss_mib": round(max(r["peak_rss"] for r in rs) / 2**20, 1),
                    "page_bytes": max(r["page_bytes"] for r in rs),
                    "cpu_s_each": [round(r["cpu_s"], 3) for r in rs],
                }
            cpu_of = {v: entry["variants"][v]["median_cpu_s"] for v in variants}
            if "views" in cpu_of and "views_again" in cpu_of:
                entry["aa_ratio_cpu"] = round(cpu_of["views_again"] / cpu_of["views"], 3)
            if "views" in cpu_of and "views_base" in cpu_of:
                entry["views_over_base_cpu"] = round(cpu_of["views"] / cpu_of["views_base"], 3)
            result["mixes"][mix] = entry
    emit(result, args.out, benchmark=args.name)


if __name__ == "__main__":
    main()
