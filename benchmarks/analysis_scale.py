"""Time ``memprofiler report``, ``diff`` and ``check`` on long synthetic runs.

Writes synthetic runs in the on-disk format (``rank_0_memory_stats.yaml`` as the profiler
writes it: host ``rss``/``vms`` at start, ``rss``/``vms``/``rss_peak`` and ``saved_tensors.*``
with a per-module breakdown of 20 modules at end, optionally every flat CUDA
``memory_stats()`` key at both), then runs each command as its own process, the variants
interleaved in random order, and prints JSON: median wall time, peak RSS (the command's own
``VmHWM``) and the HTML report's size. ``--label`` stores the figures under that name in ``--out``
(e.g. ``before`` with ``PYTHONPATH`` pointing at the old sources, then ``after``).

Usage: ``python benchmarks/analysis_scale.py [--calls 3000 100000] [--cuda] [--format v2]
[--repeats R] [--label after] [--out FILE]``
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

from _emit import machine_info, record, result_path  # noqa: E402

from memprofiler.output.stats_file import entry_yaml  # noqa: E402

#: 20 modules of a small transformer, the shape ``saved_tensors.by_module`` has.
MODULES = ["(outside forward)", "model.tok", "model.pos", "model.ln_f", "model.head"] + [
    f"model.blocks.{b}.{part}" for b in range(3) for part in ("ln1", "qkv", "ln2", "mlp.0", "mlp.2")
]
#: The flat ``torch.cuda.memory_stats()`` keys (6 stats x 3 pools x 4 figures, plus counters).
CUDA_KEYS = [
    f"{stat}.{pool}.{fig}"
    for stat in (
        "active",
        "active_bytes",
        "allocated_bytes",
        "allocation",
        "inactive_split",
        "inactive_split_bytes",
        "requested_bytes",
        "reserved_bytes",
        "segment",
    )
    for pool in ("all", "large_pool", "small_pool")
    for fig in ("current", "peak", "allocated", "freed")
] + ["num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free"]
MiB = 1024**2


def _entry(key: str, metrics: dict[str, Any], fmt: str) -> str:
    """One top-level entry: as the profiler writes it (``v2``), or as block YAML (older files)."""
    if fmt == "v2":
        return entry_yaml(key, metrics)
    lines = [f"{key}:"]
    for k, v in metrics.items():
        if isinstance(v, dict):
            lines.append(f"  {k}:")
            lines.extend(f"    {m}: {b}" for m, b in v.items())
        else:
            lines.append(f"  {k}: {v}")
    return "\n".join(lines) + "\n"


def write_run(root: Path, calls: int, cuda: bool, fmt: str, seed: int, scale: float = 1.0) -> Path:
    """A run of ``calls`` collected calls (5 training steps to 1 validation step), rank 0."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "rank_0_memory_stats.yaml"
    rss = 1200 * MiB
    n_train = n_val = 0
    with path.open("w") as f:
        if fmt != "v0":
            f.write("#memprofiler-yaml v1\n")
        entries = 0
        for i in range(calls):
            fn = "validation_step" if i % 6 == 5 else "training_step"
            if fn == "training_step":
                n_train += 1
                call = n_train
            else:
                n_val += 1
                call = n_val
            rss += rng.randint(-2 * MiB, 2 * MiB) + 4096  # a slow leak under noise
            start: dict[str, Any] = {"rss": rss, "vms": rss * 3}
            by_mod = {m: int(rng.randint(100, 4000) * 1024 * scale) for m in MODULES}
            unique = sum(by_mod.values())
            end: dict[str, Any] = {}
            if fn == "training_step":
                end.update(
                    {
                        "saved_tensors.unique_bytes": unique,
                        "saved_tensors.packed_bytes": unique + unique // 3,
                        "saved_tensors.count": 180,
                        "saved_tensors.by_module": dict(sorted(by_mod.items(), key=lambda kv: -kv[1])),
                    }
                )
            rss_end = rss + rng.randint(0, 8 * MiB)
            end.update({"rss": rss_end, "vms": rss_end * 3, "rss_peak": rss_end + rng.randint(0, 300 * MiB)})
            if cuda:
                base = int(800 * MiB * scale)
                start.update({k: base + j for j, k in enumerate(CUDA_KEYS)})
                end.update({k: base + rng.randint(0, 400 * MiB) for k in CUDA_KEYS})
            f.write(_entry(f"0.{fn}.{call}.start", start, fmt))
            f.write(_entry(f"0.{fn}.{call}.end", end, fmt))
            entries += 2
            if fmt != "v0" and (i % 50 == 49 or i == calls - 1):
                f.write(f"#memprofiler-end entries={entries}\n")
    return root


#: Runs ``memprofiler`` and, at exit, prints its own peak RSS (``VmHWM``). ``wait4``'s
#: ``ru_maxrss`` would not do: it keeps the high-water mark across ``exec``, so a child forked
#: from this process (tens of MB after writing a 100,000-call run) starts at this process's size.
_MEASURED = (
    "import atexit, sys\n"
    "def _peak():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            sys.stderr.write('\\nbench-vmhwm-kb ' + line.split()[1] + '\\n')\n"
    "atexit.register(_peak)\n"
    "from memprofiler.__main__ import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _run(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """``(wall s, peak RSS MiB, CPU s)`` of ``memprofiler`` with the arguments ``cmd``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _MEASURED, *cmd], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode not in (0, 1):
        raise SystemExit(f"memprofiler {' '.join(cmd)} failed ({proc.returncode}): {err[-500:]}")
    peak_kb = float(err.rsplit("bench-vmhwm-kb ", 1)[1].split()[0])
    return wall, peak_kb / 1024, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, nargs="+", default=[3000, 100000])
    ap.add_argument("--cuda", action="store_true", help="also write every CUDA memory_stats key")
    ap.add_argument(
        "--format",
        choices=("v0", "v1", "v2"),
        default="v2",
        help="v2: one line per entry, as written now; v1: block YAML with integrity lines; v0: without",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--commands", nargs="+", default=["report", "diff", "check"])
    ap.add_argument("--timeout", type=float, default=0, help="skip larger sizes once a run took this long")
    ap.add_argument("--label", default="after")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    env = {**os.environ, "MALLOC_ARENA_MAX": "1"}
    result: dict[str, Any] = {
        "load_avg_at_start": os.getloadavg()[0],
        "cuda": args.cuda,
        "format": args.format,
        "repeats": args.repeats,
        "peak_rss": "VmHWM of the command (earlier labels: wait4 ru_maxrss, which counts this process's size at fork)",
        "sizes": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for calls in args.calls:
            t0 = time.perf_counter()
            a = write_run(Path(tmp) / f"a{calls}", calls, args.cuda, args.format, seed=1)
            b = write_run(Path(tmp) / f"b{calls}", calls, args.cuda, args.format, seed=2, scale=1.1)
            gen_s = time.perf_counter() - t0
            html = Path(tmp) / f"report{calls}.html"
            cmds = {
                "report": ["report", str(a), "-o", str(html)],
                "diff": ["diff", str(a), str(b)],
                "check": ["check", str(a), "--max", "rss_peak=64GiB"],
            }
            runs: dict[str, list[tuple[float, float]]] = {c: [] for c in args.commands}
            cpu: dict[str, list[float]] = {c: [] for c in args.commands}
            order = [c for _ in range(args.repeats) for c in args.commands]
            random.Random(0).shuffle(order)
            for c in order:
                wall, rss_mb, cpu_s = _run(cmds[c], env)
                runs[c].append((wall, rss_mb))
                cpu[c].append(cpu_s)
            size = {
                "file_mb": round((a / "rank_0_memory_stats.yaml").stat().st_size / MiB, 1),
                "generate_s": round(gen_s, 2),
                "median_s": {c: round(statistics.median(w for w, _ in r), 3) for c, r in runs.items()},
                "runs_s": {c: [round(w, 3) for w, _ in r] for c, r in runs.items()},
                # CPU seconds (user + system) vary less than wall time on a shared machine.
                "median_cpu_s": {c: round(statistics.median(t), 3) for c, t in cpu.items()},
                "peak_rss_mb": {c: round(max(m for _, m in r), 1) for c, r in runs.items()},
            }
            if html.exists():
                size["html_mb"] = round(html.stat().st_size / MiB, 2)
            result["sizes"][str(calls)] = size
            print(json.dumps({calls: size}), file=sys.stderr)
            if args.timeout and max(w for r in runs.values() for w, _ in r) > args.timeout:
                break
    # Each --label adds its figures to the same record (a file of today's date, or a new one).
    out = None if args.out is None else result_path(record("analysis_scale", {}), args.out)
    rec = json.loads(out.read_text()) if out is not None and out.exists() else record("analysis_scale", {})
    rec["machine"] = {**machine_info(), "cpus": os.cpu_count()}
    rec["result"][f"{args.label}{'_cuda' if args.cuda else ''}"] = result
    text = json.dumps(rec, indent=2)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


if __name__ == "__main__":
    main()
