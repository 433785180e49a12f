"""Cost of ``advise`` on a Llama-3-8B-shaped model built on the meta device: 8 ranks, an 80 GiB budget.

The plan (FSDP2 over 8 ranks, ``bf16-mixed``, AdamW, 2 x 4,096 tokens per rank, an H100 target)
does not fit; every candidate change is estimated, and sets of them when no single one fits.
Prints JSON: wall time, CPU time (this process and the forked processes that ran estimates side
by side), peak host RSS (this process, and the largest child), the number of estimates, the
pools of estimates side by side (tasks in each, those a search asked for as others ended among
them), the answer, and the load average before, during (every 10 s) and after. ``--jobs`` sets
how many estimates run at once (default: one per core); wall time also counts whatever else the
machine was running.

Run: ``MALLOC_ARENA_MAX=1 PYTHONPATH=src python benchmarks/advise.py --name advise-side_by_side``
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _emit import emit

LLAMA_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=8192,
    rope_theta=500000.0,
    use_cache=False,
)
SEQ, MICRO_BATCH, RANKS, BUDGET = 4096, 2, 8, "80GiB"
TARGETS = {"wall_s": 180, "peak_rss_bytes": 2 << 30}


def run(candidates: list[str] | None, jobs: int | None) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from memprofiler import advise
    from memprofiler.estimate import workers

    torch.set_num_threads(1)
    # transformers imports modules lazily in the first forward: do that on a tiny config first.
    tiny = LlamaConfig(
        **{
            **LLAMA_8B,
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "vocab_size": 64,
        }
    )
    LlamaForCausalLM(tiny)(
        input_ids=torch.zeros(1, 4, dtype=torch.long), labels=torch.zeros(1, 4, dtype=torch.long)
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA_8B, attn_implementation="sdpa"))
    ids = torch.randint(0, LLAMA_8B["vocab_size"], (MICRO_BATCH, SEQ))
    pools: list[dict[str, int]] = []
    prefetch = workers.prefetch

    def counted(tasks: Any, jobs: Any = None, **kw: Any) -> Any:
        got = prefetch(tasks, jobs, **kw)
        pools.append({"tasks": len(got), "asked_as_others_ended": len(got) - len(tasks)})
        return got

    workers.prefetch = counted  # type: ignore[assignment]
    loads: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(10.0):
            loads.append(os.getloadavg()[0])

    threading.Thread(target=sample, daemon=True).start()
    load0 = os.getloadavg()
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    advice = advise(
        model,
        ids,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=3e-4),
        loss_fn=lambda m, b: m(input_ids=b, labels=b).loss,
        strategy="fsdp",
        world_size=RANKS,
        precision="bf16-mixed",
        gpu="H100",
        budget=BUDGET,
        candidates=candidates,
        progress=True,
        jobs=jobs,
    )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    stop.set()
    workers.prefetch = prefetch
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    kids_cpu = kids.ru_utime + kids.ru_stime - kids0.ru_utime - kids0.ru_stime
    best = advice.best or advice.closest
    return {
        "model": "Llama-3-8B shape (transformers LlamaConfig), meta device",
        "params": sum(p.numel() for p in model.parameters()),
        "plan": {
            "strategy": "fsdp",
            "world_size": RANKS,
            "precision": "bf16-mixed",
            "micro_batch": MICRO_BATCH,
            "seq_len": SEQ,
            "optimizer": "AdamW",
            "gpu": "H100",
            "budget": BUDGET,
        },
        "candidates": candidates or "all",
        "estimates": advice.estimates,
        "wall_s": round(wall, 1),
        "jobs": jobs or workers.default_jobs(),
        "process_cpu_s": round(cpu, 1),
        "children_cpu_s": round(kids_cpu, 1),
        "per_estimate_cpu_s": round((cpu + kids_cpu) / max(advice.estimates, 1), 1),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "largest_child_rss_bytes": kids.ru_maxrss * 1024,
        "pools_side_by_side": pools,
        "loadavg_before_after": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
        "loadavg_during_mean": round(sum(loads) / len(loads), 2) if loads else None,
        "base_reserved_bytes": advice.base.reserved_bytes,
        "answer": None
        if best is None
        else {
            "change": best.change,
            "reserved_bytes": best.reserved_bytes,
            "fits": best.fits,
            "cost": best.cost.words,
        },
        "rows": [
            {"change": r.change, "reserved_bytes": r.reserved_bytes, "fits": r.fits} for r in advice.rows
        ],
        "combinations": [
            {"change": r.change, "reserved_bytes": r.reserved_bytes, "fits": r.fits}
            for r in advice.combinations
        ],
        "targets": TARGETS,
        "note": "wall time includes the load of other jobs on the machine (the load average says how much); "
        "the CPU times are this run's own, the children's being the estimates run side by side",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--candidates", nargs="*", default=None)
    ap.add_argument("--jobs", type=int, default=None, help="estimates at once (default: one per core)")
    ap.add_argument("--name", default=None, help="the result's benchmark name (a variant: advise-...)")
    args = ap.parse_args()
    out = args.out if args.out is not None or not args.name else Path(__file__).parent / "results"
    emit(run(args.candidates, args.jobs), out, args.name)


if __name__ == "__main__":
    main()
