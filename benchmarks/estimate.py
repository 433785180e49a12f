"""Cost and accuracy of ``estimate_memory``; prints JSON.

1. Cost: wall time and peak host RSS to estimate a LLaMA-style 1B-parameter config
   (``transformers`` LlamaConfig, random init on the meta device, no download) at FSDP2
   world sizes 8 and 1,024, each in a fresh process so RSS is its own.
2. Accuracy: for each panel model (tests/estimate/models.py), the estimate's tensor peak and
   saved bytes against the same step measured on CPU: saved bytes by memprofiler's
   collector, the peak by torch's ``MemTracker`` on real tensors (the estimate uses the same
   tracker, so this checks that fake tensors allocate exactly what real ones do).
3. FSDP2: the ``world_size=2`` estimate against a real 2-process gloo run's
   ``FSDPMemTracker`` peak.

Run: ``MALLOC_ARENA_MAX=1 PYTHONPATH=src python benchmarks/estimate.py [--out benchmarks/results]``
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "estimate"))

from _emit import emit  # noqa: E402

LLAMA_1B = dict(
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)
SEQ, MICRO_BATCH = 2048, 2


def one_llama(world_size: int) -> dict[str, Any]:
    """Runs in a child process: estimate the 1B config, report time and this process's RSS."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from memprofiler.estimate import estimate_memory

    torch.set_num_threads(1)
    # transformers imports modules lazily in the first forward (seconds): do that first on a
    # tiny config, so wall_s is the estimator's cost; process_s below includes everything.
    tiny = LlamaConfig(
        **{
            **LLAMA_1B,
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
    cfg = LlamaConfig(**LLAMA_1B, attn_implementation="sdpa")
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, cfg.vocab_size, (MICRO_BATCH, SEQ))
    t0 = time.perf_counter()
    est = estimate_memory(
        model,
        ids,
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-4),
        loss_fn=lambda m, b: m(input_ids=b, labels=b).loss,
        strategy="fsdp",
        world_size=world_size,
        precision="bf16-mixed",
        shard_policy=lambda m: type(m).__name__ == "LlamaDecoderLayer",
    )
    wall = time.perf_counter() - t0
    return {
        "world_size": world_size,
        "params": n_params,
        "micro_batch": MICRO_BATCH,
        "seq_len": SEQ,
        "wall_s": round(wall, 2),
        "process_s": round(time.perf_counter() - START, 2),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "estimate_peak_bytes": est.peak_bytes,
        "estimate_reserved_peak_bytes": est.reserved_peak_bytes,
        "peak_module": est.peak_module,
        "peak_phase": est.peak_phase,
        "peak_step": est.peak_step,
        "by_category": est.by_category,
    }


def accuracy() -> dict[str, Any]:
    import torch
    from models import panel
    from torch.distributed._tools.mem_tracker import MemTracker

    from memprofiler import MemProfiler
    from memprofiler.estimate import estimate_memory

    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    for name, (build, make_batch, loss_fn) in panel().items():
        torch.manual_seed(0)
        model, batch = build(), make_batch()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        tracker = MemTracker()
        tracker.track_external(model, opt, batch)
        with tempfile.TemporaryDirectory() as tmp:
            prof = MemProfiler({"schedule": {"warmup": 1, "active": 1}}, save_dir=tmp, rank=0).setup(model)
            with tracker:
                for _ in range(2):  # the same two steps the estimate runs
                    tracker.reset_mod_stats()
                    with prof.profile("training_step", module=model):
                        loss = loss_fn(model, batch)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
            saved = prof.snapshots["0.training_step.2.end"]["saved_tensors.unique_bytes"]
        measured_peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
        with torch.device("meta"):
            meta = build()
        est = estimate_memory(
            meta, batch, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-4), loss_fn=loss_fn, device="cpu"
        )
        out[name] = {
            "estimated_peak_bytes": est.tensor_peak_bytes,
            "measured_peak_bytes": measured_peak,
            "peak_ratio": round(est.tensor_peak_bytes / measured_peak, 4),
            "estimated_saved_bytes": est.saved_bytes,
            "measured_saved_bytes": saved,
            "saved_ratio": round(est.saved_bytes / saved, 4),
        }
    return out


def fsdp_two_ranks() -> dict[str, Any]:
    """The FSDP2 check of tests/estimate/test_fsdp_two_ranks.py, with its figures."""
    import os

    import test_fsdp_two_ranks as t
    import torch

    from memprofiler.estimate import estimate_memory

    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(t._free_port()),
            "WORLD_SIZE": "2",
        }
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests" / "estimate")])
        code = f"import test_fsdp_two_ranks as t; t._worker({tmp!r})"
        procs = [
            subprocess.Popen([sys.executable, "-c", code], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
            for r in range(2)
        ]
        for p in procs:
            p.wait(timeout=300)
        measured = json.loads(Path(tmp, "rank0.json").read_text())["peak"]
    with torch.device("meta"):
        model = t.Stack()
    est = estimate_memory(
        model,
        t.batch(),
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        loss_fn=t.loss_fn,
        strategy="fsdp",
        world_size=2,
        device="cpu",
        steps=t.STEPS,
    )
    return {
        "estimated_peak_bytes": est.tensor_peak_bytes,
        "measured_fsdp_mem_tracker_peak_bytes": measured,
        "ratio": round(est.tensor_peak_bytes / measured, 4),
    }


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--llama":
        print(json.dumps(one_llama(int(sys.argv[2]))))
        return
    cost = []
    for ws in (8, 1024):
        proc = subprocess.run(
            [sys.executable, __file__, "--llama", str(ws)], capture_output=True, text=True, check=True
        )
        cost.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    result = {
        "machine": {"cpus": 2, "torch_threads": 1},
        "llama_1b_fsdp": cost,
        "targets": {"wall_s": 60, "peak_rss_bytes": 2 << 30},
        "accuracy_cpu": accuracy(),
        "fsdp2_world_size_2_vs_gloo": fsdp_two_ranks(),
    }
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else None
    emit(result, out)


if __name__ == "__main__":
    main()
