"""Time ``memprofiler snapshot`` against ``torch.cuda._memory_viz trace`` and ``stats``.

Builds a synthetic allocator snapshot with 1,000,000 trace entries in the real
``torch.cuda.memory._snapshot()`` layout (shared frame dicts as torch emits them, segments
consistent with the trace's end state, pickle protocol 4), then runs the three tools on the
same file as separate processes, interleaved, and prints JSON: median wall time and peak RSS
of each (from ``wait4``), the ratios, and whether our peak matches the generator's truth.

Usage: ``python benchmarks/snapshot_analysis.py [--entries N] [--repeats R] [--out FILE]``
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

ROOT = Path(__file__).resolve().parents[1]
SEGMENT = 20 * 1024 * 1024
#: Block size classes (bytes) and their weights: mostly small activations, a few large buffers.
SIZES = [512 * k for k in (1, 2, 4, 8, 16, 64, 256, 1024, 2048, 4096)]
WEIGHTS = [20, 15, 15, 12, 10, 10, 8, 5, 3, 2]


def _entry(action: str, addr: int, size: int, t: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": frames}


def _block(addr: int, size: int, state: str, frames: list[dict[str, Any]]) -> dict[str, Any]:
    requested = size if state != "inactive" else 0
    return {"address": addr, "size": size, "requested_size": requested, "state": state, "frames": frames}


def make_snapshot(entries: int, seed: int = 0) -> tuple[dict[str, Any], int]:
    """Return ``(snapshot, true peak allocated bytes)``.

    Blocks of a few size classes are carved from 20 MiB segments, freed blocks are reused by
    size, and every free is a ``free_requested`` / ``free_completed`` pair, as the caching
    allocator records them. Entries from the same call site share one frames list, so the
    pickle memoizes it; 1M entries come to about 57 MB (a real 1M-entry history is about
    40 MB), so the file is, if anything, harder on the tools than a real one.
    """
    rng = random.Random(seed)
    files = [f"/workspace/model/{n}.py" for n in ("train", "model", "attention", "mlp", "optim", "data")]
    unique_frames = [
        {"filename": rng.choice(files), "line": rng.randint(1, 900), "name": f"fn_{i}"} for i in range(240)
    ]
    cpp = {"filename": "c10/cuda/CUDACachingAllocator.cpp", "line": 0, "name": "malloc"}
    stacks = [[cpp, *rng.sample(unique_frames, 6)] for _ in range(64)]

    free_by_size: dict[int, list[int]] = {s: [] for s in SIZES}
    seg_base, seg_used = 0x7F0000000000, SEGMENT  # force a first segment_alloc
    segments: list[int] = []
    live: dict[int, tuple[int, int]] = {}  # addr -> (size, stack index)
    live_list: list[int] = []
    trace: list[dict[str, Any]] = []
    t = 1_700_000_000_000_000
    cur = peak = 0
    target_live = 2000
    while len(trace) < entries:
        t += rng.randint(1, 50)
        grow = len(live_list) < target_live * (0.5 + rng.random())
        if grow or not live_list:
            size = rng.choices(SIZES, WEIGHTS)[0]
            if free_by_size[size]:
                addr = free_by_size[size].pop()
            else:
                if seg_used + size > SEGMENT:
                    seg_base += SEGMENT
                    seg_used = 0
                    segments.append(seg_base)
                    trace.append(_entry("segment_alloc", seg_base, SEGMENT, t, []))
                addr = seg_base + seg_used
                seg_used += size
            sidx = rng.randrange(len(stacks))
            live[addr] = (size, sidx)
            live_list.append(addr)
            cur += size
            peak = max(peak, cur)
            trace.append(_entry("alloc", addr, size, t, stacks[sidx]))
        else:
            i = rng.randrange(len(live_list))
            live_list[i], live_list[-1] = live_list[-1], live_list[i]
            addr = live_list.pop()
            size, sidx = live.pop(addr)
            free_by_size[size].append(addr)
            cur -= size
            for action in ("free_requested", "free_completed"):
                trace.append(_entry(action, addr, size, t, stacks[sidx]))
    del trace[entries:]
    # Recompute truth over exactly the kept entries (the last pair may have been cut).
    cur = peak = 0
    alive: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    for e in trace:
        if e["action"] == "alloc":
            cur += e["size"]
            peak = max(peak, cur)
            alive[e["addr"]] = (e["size"], e["frames"])
        elif e["action"] == "free_completed":
            cur -= e["size"]
            alive.pop(e["addr"], None)
    seg_list = []
    for base in segments:
        blocks = []
        pos = base
        for addr in sorted(a for a in alive if base <= a < base + SEGMENT):
            if addr > pos:
                blocks.append(_block(pos, addr - pos, "inactive", []))
            size, frames = alive[addr]
            blocks.append(_block(addr, size, "active_allocated", frames))
            pos = addr + size
        if pos < base + SEGMENT:
            blocks.append(_block(pos, base + SEGMENT - pos, "inactive", []))
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        seg_list.append(
            {
                "device": 0,
                "address": base,
                "total_size": SEGMENT,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": allocated,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )
    return {"segments": seg_list, "device_traces": [trace], "allocator_settings": {}}, peak


def run_tool(cmd: list[str], env: dict[str, str]) -> tuple[float, int, bytes]:
    """Wall seconds, peak RSS bytes (``wait4``'s ``ru_maxrss``) and stdout of one process."""
    with tempfile.TemporaryFile() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read() if proc.stderr else b""
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.decode()[-2000:]}")
        out.seek(0)
        return wall, usage.ru_maxrss * 1024, out.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "snapshot.pickle"
        t0 = time.perf_counter()
        snap, true_peak = make_snapshot(args.entries)
        path.write_bytes(pickle.dumps(snap, protocol=4))
        del snap
        gen_s = time.perf_counter() - t0

        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        }
        py = sys.executable
        tools = {
            "memprofiler_snapshot": [py, "-m", "memprofiler", "snapshot", str(path)],
            "memory_viz_trace": [py, "-m", "torch.cuda._memory_viz", "trace", str(path)],
            "memory_viz_stats": [py, "-m", "torch.cuda._memory_viz", "stats", str(path)],
        }
        times: dict[str, list[float]] = {k: [] for k in tools}
        rss: dict[str, list[int]] = {k: [] for k in tools}
        ours_out = b""
        for _ in range(args.repeats):  # interleaved, so machine load hits all three alike
            for name, cmd in tools.items():
                wall, peak_rss, out = run_tool(cmd, env)
                times[name].append(wall)
                rss[name].append(peak_rss)
                if name == "memprofiler_snapshot":
                    ours_out = out

        sys.path.insert(0, str(ROOT / "src"))
        from memprofiler.analysis.snapshot.summary import analyze, load_snapshot
        from memprofiler.units import format_bytes

        ours_peak = analyze(load_snapshot(path)).devices[0].peak_allocated
        med = {k: statistics.median(v) for k, v in times.items()}
        peak_rss = {k: max(v) for k, v in rss.items()}
        result = {
            "benchmark": "snapshot_analysis",
            "entries": args.entries,
            "file_mb": round(path.stat().st_size / 1e6, 1),
            "generate_s": round(gen_s, 2),
            "repeats": args.repeats,
            "median_s": {k: round(v, 3) for k, v in med.items()},
            "runs_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
            "peak_rss_mb": {k: round(v / 2**20, 1) for k, v in peak_rss.items()},
            "speedup_vs_trace": round(med["memory_viz_trace"] / med["memprofiler_snapshot"], 2),
            "speedup_vs_stats": round(med["memory_viz_stats"] / med["memprofiler_snapshot"], 2),
            "rss_ratio_vs_trace": round(peak_rss["memprofiler_snapshot"] / peak_rss["memory_viz_trace"], 3),
            "true_peak_allocated": true_peak,
            "memprofiler_peak_allocated": ours_peak,
            "peak_correct": ours_peak == true_peak,
            "peak_printed": f"peak active {format_bytes(true_peak)}" in ours_out.decode(),
            "target_met": med["memory_viz_trace"] >= 2 * med["memprofiler_snapshot"]
            and peak_rss["memprofiler_snapshot"] <= peak_rss["memory_viz_trace"],
            "cpus": os.cpu_count(),
        }
    from _emit import emit  # here, not at the top: the tests import this file's generator

    emit(result, args.out)


if __name__ == "__main__":
    main()
