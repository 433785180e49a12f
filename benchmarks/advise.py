"""Cost of ``advise`` on a Llama-3-8B-shaped model built on the meta device: 8 ranks, an 80 GiB budget.

The plan (FSDP2 over 8 ranks, ``bf16-mixed``, AdamW, 2 x 4,096 tokens per rank, an H100 target)
does not fit; every candidate change is estimated, and sets of them when no single one fits.
Prints JSON: wall time, process CPU time, peak host RSS, the number of estimates, the answer.
The process CPU time is what a quiet two-core laptop takes (the estimate runs on one thread);
wall time also counts whatever else the machine was running.

Run: ``MALLOC_ARENA_MAX=1 PYTHONPATH=src python benchmarks/advise.py --out benchmarks/results/advise_cpu_20261128.json``
"""

from __future__ import annotations

import argparse
import resource
import sys
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


def run(candidates: list[str] | None) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from memprofiler import advise

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
    )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
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
        "process_cpu_s": round(cpu, 1),
        "per_estimate_cpu_s": round(cpu / max(advice.estimates, 1), 1),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
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
        "note": "wall time includes the load of other jobs on the machine; the process CPU time is this run's own",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--candidates", nargs="*", default=None)
    args = ap.parse_args()
    emit(run(args.candidates), args.out)


if __name__ == "__main__":
    main()
