"""Measured per-rank peaks of FSDP2 at 8 and 64 ranks, and of TP=2, in ONE process on one GPU.

torch's fake process group (``init_process_group("fake")``) makes this process rank 0 of a
world of any size: ``fully_shard`` keeps rank 0's shard, every all-gather returns an output of
the gathered size (its data left as allocated) and every reduce-scatter one of the shard's, on
real CUDA tensors through the caching allocator. So one GPU measures what each rank of an
8- or 64-GPU job holds: the figures the estimate must meet (issue: "will it fit at scale").

The plans, as a training script writes them:

- ``fsdp``: a Llama-style model (TinyLlama's 1.1B shape: 22 blocks, dim 2048, 32 heads, 4 KV
  heads, SwiGLU 5632, vocabulary 32000), each block and the root ``fully_shard``-ed with
  ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``, every block under
  per-op selective checkpointing (matrix products and attention saved, the rest recomputed),
  AdamW, batch 2 x 2048;
- ``tp``: the same model, tensor parallel over 2 ranks (column-wise q/k/v/w1/w3, row-wise
  o/w2, via ``parallelize_module``), bf16-mixed autocast over fp32 parameters.

Each row holds the allocator's ``max_memory_allocated`` / ``max_memory_reserved`` of each step
(reset before the first), and the bytes of rank 0's parameters. Run on a GPU node:

    PYTHONPATH=src python tools/gpu_fsdp_scale.py --out benchmarks/results

(``benchmarks/_emit.py`` names the file ``fsdp_scale_<hardware>_<yyyymmdd>.json`` and records the
hardware, date, commit and command in it.)

``--cpu-dry-run`` runs the same code on CPU tensors with a tiny model (the peaks are then the
live tensor bytes a dispatch counter sees): the test suite runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _emit import emit  # noqa: E402


@dataclass(frozen=True)
class LlamaShape:
    dim: int = 2048
    layers: int = 22
    heads: int = 32
    kv_heads: int = 4
    ffn: int = 5632
    vocab: int = 32000
    batch: int = 2
    seq: int = 2048


TINY = LlamaShape(dim=64, layers=2, heads=4, kv_heads=2, ffn=160, vocab=128, batch=2, seq=16)


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, 1e-5)


class Block(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.head_dim = s.dim // s.heads
        self.attention_norm = RMSNorm(s.dim)
        self.wq = nn.Linear(s.dim, s.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(s.dim, s.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(s.dim, s.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(s.heads * self.head_dim, s.dim, bias=False)
        self.ffn_norm = RMSNorm(s.dim)
        self.w1 = nn.Linear(s.dim, s.ffn, bias=False)
        self.w3 = nn.Linear(s.dim, s.ffn, bias=False)
        self.w2 = nn.Linear(s.ffn, s.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attention_norm(x)
        # -1 heads: a tensor-parallel shard holds its share of them
        q = self.wq(h).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, s: LlamaShape) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(s.vocab, s.dim)
        self.layers = nn.ModuleList([Block(s) for _ in range(s.layers)])
        self.norm = RMSNorm(s.dim)
        self.output = nn.Linear(s.dim, s.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def _save_products(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """Per-op selective checkpointing: keep matrix products and attention, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    keep = {
        aten.mm.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
    }
    return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE


class Checkpointed(nn.Module):
    """A block run under ``torch.utils.checkpoint`` with the per-op policy."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

        ctx = functools.partial(create_selective_checkpoint_contexts, _save_products)
        return checkpoint(self.block, x, use_reentrant=False, context_fn=ctx)


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    import torch.testing._internal.distributed.fake_pg as fake_pg

    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


class LiveBytes(TorchDispatchMode):
    """CPU stand-in for the allocator's peak: live storages' bytes after each op."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.peak = 0

    def seed(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            self._add(t)

    def _add(self, t: Any) -> None:
        import weakref

        if not isinstance(t, torch.Tensor) or type(t) is not torch.Tensor:
            return
        st = t.untyped_storage()
        if st._cdata not in self.live:
            self.live[st._cdata] = st.nbytes()
            weakref.finalize(st, self.live.pop, st._cdata, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            self._add(t)
        self.peak = max(self.peak, sum(self.live.values()))
        return out


def _local_bytes(model: nn.Module) -> int:
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total


def build(plan: str, world_size: int, shape: LlamaShape, device: str) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh

    with torch.device("meta"):
        model = Llama(shape)
    mesh = init_device_mesh(device, (world_size,))
    if plan == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for i, block in enumerate(model.layers):
            model.layers[i] = Checkpointed(block)
            fully_shard(model.layers[i], mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
    else:
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        col, row = ColwiseParallel(), RowwiseParallel()
        for block in model.layers:
            parallelize_module(
                block, mesh, {"wq": col, "wk": col, "wv": col, "wo": row, "w1": col, "w3": col, "w2": row}
            )
    model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            (p.to_local() if hasattr(p, "to_local") else p).normal_(0, 0.02)
    return model


def measure(plan: str, world_size: int, shape: LlamaShape, device: str, steps: int = 2) -> dict[str, Any]:
    """One plan at one world size: each step's peaks on rank 0."""
    cuda = device == "cuda"
    row: dict[str, Any] = {"plan": plan, "world_size": world_size, "shape": asdict(shape), "steps": []}
    with fake_world(world_size):
        model = build(plan, world_size, shape, device)
        row["param_bytes_rank0"] = _local_bytes(model)
        # DTensors and plain tensors in separate groups: a foreach step (CUDA's default) refuses a mix
        params = list(model.parameters())
        groups = [
            {"params": [p for p in params if hasattr(p, "to_local")]},
            {"params": [p for p in params if not hasattr(p, "to_local")]},
        ]
        opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=1e-4)
        gen = torch.Generator(device=device).manual_seed(0)
        tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq), device=device, generator=gen)
        census = LiveBytes() if not cuda else None
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        elif census is not None:
            census.seed(
                [tokens, *[p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]]
            )
        autocast = torch.autocast(device, dtype=torch.bfloat16) if plan == "tp" else contextlib.nullcontext()
        for _ in range(steps):
            t0 = time.perf_counter()
            with census if census is not None else contextlib.nullcontext():
                with autocast:
                    logits = model(tokens)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten())
                loss.backward()
                opt.step()
                opt.zero_grad()
            del logits, loss
            if cuda:
                torch.cuda.synchronize()
                step = {
                    "max_allocated": torch.cuda.max_memory_allocated(),
                    "max_reserved": torch.cuda.max_memory_reserved(),
                }
                torch.cuda.reset_peak_memory_stats()
            else:
                step = {"max_live_tensor_bytes": census.peak if census is not None else 0}
            step["seconds"] = round(time.perf_counter() - t0, 3)
            row["steps"].append(step)
        del model, opt
    if cuda:
        torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=None, help="result JSON (named by hardware, date, commit)"
    )
    parser.add_argument("--cpu-dry-run", action="store_true", help="CPU tensors, tiny model, 2 and 4 ranks")
    args = parser.parse_args(argv)
    if args.cpu_dry_run:
        device, shape, sizes = "cpu", TINY, (2, 4)
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: run on a GPU node, or pass --cpu-dry-run")
        device, shape, sizes = "cuda", LlamaShape(), (8, 64)
    rows = [measure("fsdp", ws, shape, device) for ws in sizes]
    rows.append(measure("tp", 2, shape, device))
    result = {"device": device, "rows": rows}
    emit(result, args.out, benchmark="fsdp_scale")
    return result


if __name__ == "__main__":
    main()
