"""Rank 0's time and peak memory to build ``memory_summary.yaml`` at 8, 512 and 4,096 ranks.

Two designs, each rank holding the snapshots of a realistic run: ``--calls`` collected calls
(default 20) of an FSDP2 job on a GPU, every ``.start`` with host RSS/VMS and the 122
``torch.cuda.memory_stats()`` keys, every ``.end`` with those, ``rss_peak``, the 12
``fsdp.peak.*`` categories of ``FSDPMemTracker`` (plus ``fsdp.peak_device``) and the
saved-tensor totals with ``saved_tensors.by_module`` over ``--modules`` modules (default
147: a 24-layer transformer with 6 modules a layer, embedding, final norm and head).

* ``before`` (the design up to 0.x): ``gather_object`` of every rank's snapshots to rank 0,
  then one dict per metric of every rank's value. Simulated on rank 0 as what it does: the
  receive buffer of ``world x largest pickle`` bytes, unpickling each rank, summarizing,
  writing. The other ranks' pickling is theirs and not timed.
* ``after`` (reductions): rank 0 flattens its own snapshots, takes part in an all-gather of
  one 64-bit key hash per rank and in three reductions of fixed-length float64 vectors, and
  writes the file. Simulated by feeding the reduction (``Accumulator``) every rank's vector
  one after the other in this one process, so ``fold_s`` is the arithmetic of the whole
  all-reduce done serially (a real ring all-reduce spreads it over the ranks and adds
  network time); ``rank0_local_s`` is what rank 0 does besides, independent of world size.
* ``after_store`` (after an exception): rank 0 decodes and folds every rank's store post.

Each (design, ranks) runs in a fresh process, in random order, ``MALLOC_ARENA_MAX=1``, one
thread; peak memory is the rise of the peak RSS (``VmHWM``, reset through
``/proc/self/clear_refs``) over the RSS just before rank 0's share starts.
``after_aa`` repeats ``after``: an A/A pair for the noise floor. Then ``--real-world`` gloo
processes on CPU (default 4) time both designs for real, interleaved in random order.

Prints one JSON object. Usage:
``MALLOC_ARENA_MAX=1 python benchmarks/summary_scale.py [--ranks 8 512 4096] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import yaml
from _emit import emit

from memprofiler import layout
from memprofiler.core import summary
from memprofiler.core.summary_exchange import decode_values, encode_values
from memprofiler.core.summary_stats import Accumulator, RankMetrics
from memprofiler.output.writers import to_plain, write_yaml
from memprofiler.units import CUDA_MEMORY_STATS

_CUDA_STATS = list(CUDA_MEMORY_STATS)
_FSDP = [
    "sharded_param",
    "unsharded_param",
    "buffer",
    "sharded_grad",
    "unsharded_grad",
    "activation",
    "temp",
    "all_gather",
    "reduce_scatter",
    "optstate",
    "inputs",
    "total",
]


def _modules(n: int) -> list[str]:
    per_layer = ("attn.qkv", "attn.proj", "attn.softmax", "mlp.fc1", "mlp.act", "mlp.fc2")
    names = ["model.embed", "model.norm", "model.head"]
    layer = 0
    while len(names) < n:
        names += [f"model.layers.{layer}.{m}" for m in per_layer]
        layer += 1
    return names[:n]


def snapshots(rank: int, calls: int, modules: int, kind: int | None = None) -> dict[str, dict[str, Any]]:
    """One rank's snapshots, with plausible byte counts that vary by rank (its kind) and call."""
    out: dict[str, dict[str, Any]] = {}
    wobble = 1 + (_kind(rank) if kind is None else kind) / 2_510  # up to 10% imbalance
    for call in range(1, calls + 1):
        base = int(2**30 * wobble) + call * 4096
        cuda = {k: base + i * 1024 for i, k in enumerate(_CUDA_STATS)}
        out[f"{rank}.training_step.{call}.start"] = {"rss": base * 8, "vms": base * 40, **cuda}
        out[f"{rank}.training_step.{call}.end"] = {
            "rss": base * 8 + 4096,
            "vms": base * 40,
            "rss_peak": base * 9,
            **cuda,
            **{f"fsdp.peak.{c}": base // (i + 1) for i, c in enumerate(_FSDP)},
            "fsdp.peak_device": "cuda:0",
            "saved_tensors.unique_bytes": base * 3,
            "saved_tensors.packed_bytes": base * 4,
            "saved_tensors.count": 1000 + call,
            "saved_tensors.by_module": {m: base // (j + 2) for j, m in enumerate(_modules(modules))},
        }
    return out


def _kind(rank: int) -> int:
    """Ranks of one kind hold the same numbers (251 kinds): the simulation builds each once."""
    return rank * 7919 % 251


def _by_kind(calls: int, modules: int) -> dict[int, dict[str, dict[str, Any]]]:
    """Snapshots of each kind, keyed without the rank (built before any measurement)."""
    return {
        k: {key.split(".", 1)[1]: v for key, v in snapshots(0, calls, modules, kind=k).items()}
        for k in range(251)
    }


def _with_rank(rank: int, kinds: dict[int, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {f"{rank}.{key}": v for key, v in kinds[_kind(rank)].items()}


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> int:
    """Reset the peak RSS (VmHWM) to the current RSS, which is returned (Linux)."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_bytes("VmRSS")


def _peak_mb_since(base: int) -> float:
    return (_status_bytes("VmHWM") - base) / 1e6


# --------------------------------------------------------------------- the "before" design
def before_summarize(per_rank: Mapping[int, Any]) -> dict[str, Any]:
    """The summary as it was built before: one ``{rank: value}`` dict per metric."""
    table: dict[str, dict[str, dict[int, float]]] = {}
    for rank in sorted(per_rank):
        for key, metrics in per_rank[rank].items():
            _, fn, call, phase = layout.parse_snapshot_key(key)
            per_metric = table.setdefault(f"{fn}.{call}.{phase}", {})
            for name, value in _leaves(metrics):
                per_metric.setdefault(name, {})[rank] = value
    return {
        "world_size": len(per_rank),
        "ranks": sorted(per_rank),
        "snapshots": {s: {n: _stats(b) for n, b in m.items()} for s, m in table.items()},
    }


def _leaves(metrics: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    for name, value in metrics.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{prefix}{name}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{name}", value


def _stats(by_rank: Mapping[int, float]) -> dict[str, Any]:
    values = list(by_rank.values())
    hi, lo = max(values), min(values)
    mean = sum(values) / len(values)
    arg = min(r for r, v in by_rank.items() if v == hi)
    return {
        "min": lo,
        "max": hi,
        "mean": mean,
        "argmax_rank": arg,
        "imbalance": (hi / mean) if mean > 0 else None,
        "n_ranks": len(values),
    }


def _before_document(per_rank: Mapping[int, Any], world: int) -> dict[str, Any]:
    doc = before_summarize(per_rank)
    doc["world_size"] = world
    doc["missing_ranks"] = sorted(set(range(world)) - set(per_rank))
    return doc


def _before_write(save_dir: Path, per_rank: Mapping[int, Any], world: int) -> Path:
    return write_yaml(save_dir / layout.MEMORY_SUMMARY_YAML, _before_document(per_rank, world))


def run_before(world: int, calls: int, modules: int, save_dir: Path) -> dict[str, float]:
    kinds = _by_kind(calls, modules)
    base = _reset_peak()
    # What gather_object leaves on rank 0: one byte tensor of world x the largest pickle
    # (every rank's snapshots have the same keys here, so the sizes hardly differ).
    size = len(pickle.dumps(_with_rank(world - 1, kinds))) + 64
    buffer = torch.empty(world * size, dtype=torch.uint8)
    lengths = []
    for r in range(world):
        blob = pickle.dumps(_with_rank(r, kinds))  # the snapshots are plain already
        buffer[r * size : r * size + len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        lengths.append(len(blob))
    t0 = time.perf_counter()
    per_rank = {
        r: pickle.loads(buffer[r * size : r * size + n].numpy().tobytes()) for r, n in enumerate(lengths)
    }
    doc = _before_document(per_rank, world)
    reduce_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    write_yaml(save_dir / layout.MEMORY_SUMMARY_YAML, doc)
    write_s = time.perf_counter() - t1
    return {
        "reduce_s": reduce_s,
        "write_s": write_s,
        "rank0_s": reduce_s + write_s,
        "rank0_peak_mb": _peak_mb_since(base),
        "pickle_bytes_per_rank": size,
    }


# ---------------------------------------------------------------------- the "after" design
def run_after(world: int, calls: int, modules: int, save_dir: Path) -> dict[str, float]:
    own = snapshots(0, calls, modules)
    kinds = {}
    for k in range(251):  # one at a time: no large block freed just before measuring
        m = RankMetrics.from_snapshots(snapshots(0, calls, modules, kind=k))
        kinds[k] = RankMetrics([], m.values, m.not_int)
    gc.collect()
    base = _reset_peak()
    t0 = time.perf_counter()
    metrics = RankMetrics.from_snapshots(own)  # rank 0's own share, as on a cluster
    digest = metrics.digest()
    acc = Accumulator()
    acc.add(0, metrics, digest)
    local_s = time.perf_counter() - t0
    # The reduction over all ranks, serially. Each rank flattens its own snapshots on a
    # cluster, so only the fold is timed here.
    fold_s = 0.0
    for r in range(1, world):
        other = kinds[_kind(r)]  # what rank r flattens from its own snapshots
        t1 = time.perf_counter()
        acc.add_values(r, acc.index_of([], digest), other.values, other.not_int)
        fold_s += time.perf_counter() - t1
    t2 = time.perf_counter()
    summary._write(save_dir, acc.partial, list(range(world)), world)
    write_s = time.perf_counter() - t2
    return {
        "rank0_local_s": local_s,
        "fold_s": fold_s,
        "reduce_s": local_s + fold_s,
        "write_s": write_s,
        "rank0_s": local_s + fold_s + write_s,
        "rank0_peak_mb": _peak_mb_since(base),
        "metrics_per_rank": len(metrics.keys),
        "reduced_bytes_per_rank": 8 * 5 * len(metrics.keys),
    }


def run_after_store(world: int, calls: int, modules: int, save_dir: Path) -> dict[str, float]:
    own = RankMetrics.from_snapshots(snapshots(0, calls, modules))
    posts = {
        k: encode_values(RankMetrics.from_snapshots(snapshots(0, calls, modules, kind=k))) for k in range(251)
    }
    gc.collect()
    base = _reset_peak()
    t0 = time.perf_counter()
    acc = Accumulator()
    acc.add(0, own)
    elapsed = time.perf_counter() - t0
    post_bytes = 0
    for r in range(1, world):
        post = posts[_kind(r)]  # what rank r posts
        post_bytes = len(post)
        t1 = time.perf_counter()
        digest, values, not_int = decode_values(post)
        acc.add_values(r, acc.index_of([], digest), values, not_int)
        elapsed += time.perf_counter() - t1
    t2 = time.perf_counter()
    summary._write(save_dir, acc.partial, list(range(world)), world)
    write_s = time.perf_counter() - t2
    return {
        "reduce_s": elapsed,
        "write_s": write_s,
        "rank0_s": elapsed + write_s,
        "rank0_peak_mb": _peak_mb_since(base),
        "post_bytes_per_rank": post_bytes,
    }


_RUNNERS = {"before": run_before, "after": run_after, "after_aa": run_after, "after_store": run_after_store}


def _one(variant: str, world: int, calls: int, modules: int, keep: Path | None) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        result = _RUNNERS[variant](world, calls, modules, out)
        if keep is not None:
            keep.write_bytes((out / layout.MEMORY_SUMMARY_YAML).read_bytes())
    print(json.dumps(result))


def _spawn_one(variant: str, world: int, args: argparse.Namespace, keep: Path | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", variant, str(world), "--calls", str(args.calls)]
    cmd += ["--modules", str(args.modules)]
    if keep is not None:
        cmd += ["--keep", str(keep)]
    env = {**os.environ, "MALLOC_ARENA_MAX": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# ------------------------------------------------------------------ real gloo processes
def _real_worker(rank: int, world: int, port: int, calls: int, modules: int, repeats: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    snaps = snapshots(rank, calls, modules)
    order = ["before", "after", "after_aa"] * repeats
    random.Random(0).shuffle(order)  # the same order on every rank
    times: dict[str, list[float]] = {v: [] for v in ("before", "after", "after_aa")}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in order:
            dist.barrier()
            t0 = time.perf_counter()
            if variant == "before":
                got: list[Any] | None = [None] * world if rank == 0 else None
                dist.gather_object(to_plain(snaps), got, dst=0)
                if got is not None:
                    _before_write(Path(tmp), dict(enumerate(got)), world)
            else:
                summary.write_cross_rank_summary(snaps, tmp, rank, world)
            dist.barrier()  # every rank done: the time of the whole exchange
            times[variant].append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def real_run(args: argparse.Namespace) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "times.json")
        mp.spawn(
            _real_worker,
            args=(args.real_world, port, args.calls, args.modules, args.repeats, out),
            nprocs=args.real_world,
        )
        times = json.loads(Path(out).read_text())
    med = {v: statistics.median(t) for v, t in times.items()}
    return {
        "world": args.real_world,
        "repeats": args.repeats,
        "median_s": med,
        "after_over_before": med["after"] / med["before"],
        "aa_ratio": med["after_aa"] / med["after"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 512, 4096])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--modules", type=int, default=147)
    parser.add_argument("--repeats", type=int, default=3, help="runs per (design, ranks) and real run")
    parser.add_argument("--once-above", type=int, default=1024, help="above this many ranks, one run each")
    parser.add_argument("--real-world", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--one", nargs=2, metavar=("VARIANT", "RANKS"), help=argparse.SUPPRESS)
    parser.add_argument("--keep", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _one(args.one[0], int(args.one[1]), args.calls, args.modules, args.keep)
        return
    plan = []
    for world in args.ranks:
        for variant in _RUNNERS:
            n = 1 if world > args.once_above else args.repeats
            plan += [(variant, world)] * n
    random.Random(0).shuffle(plan)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant, world in plan:
            keep = Path(tmp) / f"{variant}_{world}.yaml"
            print(f"{variant} at {world} ranks", file=sys.stderr, flush=True)
            runs.setdefault(str(world), {}).setdefault(variant, []).append(
                _spawn_one(variant, world, args, keep)
            )
        same = {
            str(w): yaml.safe_load((Path(tmp) / f"before_{w}.yaml").read_text())
            == yaml.safe_load((Path(tmp) / f"after_{w}.yaml").read_text())
            for w in args.ranks
        }
    table: dict[str, Any] = {}
    for world, by_variant in runs.items():
        row: dict[str, Any] = {}
        for variant, results in by_variant.items():
            row[variant] = {
                k: statistics.median(r[k] for r in results)
                for k in results[0]
                if isinstance(results[0][k], float)
            }
            row[variant].update({k: v for k, v in results[0].items() if isinstance(v, int)})
            row[variant]["runs"] = len(results)
        row["after_over_before_time"] = row["after"]["rank0_s"] / row["before"]["rank0_s"]
        row["after_over_before_reduce_time"] = row["after"]["reduce_s"] / row["before"]["reduce_s"]
        row["aa_time_ratio"] = row["after_aa"]["rank0_s"] / row["after"]["rank0_s"]
        row["same_summary_as_before"] = same[world]
        table[world] = row
    result = {
        "benchmark": "summary_scale",
        "calls": args.calls,
        "modules": args.modules,
        "simulated": table,
        "real_gloo_cpu": real_run(args),
        "cpu_count": os.cpu_count(),
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
