"""torchtitan's published Llama 3.1 8B FSDP2 memory, estimated through ``estimate_plan``; prints JSON.

The published figures (torchtitan ``benchmarks/llama3_h100_202412_torchtitan.md``, Tables 1 and
3: "FSDP", no torch.compile, no Float8) are the per-GPU memory of 1D FSDP on H100s (96 GB HBM),
local batch 2 x 8,192 tokens, selective per-op activation checkpointing: 82.4 GiB on 8 GPUs
and 67.0 GiB on 128. torchtitan logs the caching allocator's ``max_memory_reserved``.

The plan, as torchtitan's ``parallelize_llama`` writes it (``apply_ac``, ``apply_fsdp``):

- every transformer block wrapped by ``checkpoint_wrapper`` with the per-op policy: the outputs
  of ``mm`` (every second one recomputed), the attention kernels and ``max`` kept, the rest
  recomputed;
- every block ``fully_shard``-ed with ``MixedPrecisionPolicy(param_dtype=bfloat16,
  reduce_dtype=float32)``, ``reshard_after_forward`` for all but the last block, then the root;
- AdamW (lr 3e-4, weight decay 0.1, foreach), the loss ``cross_entropy`` of the logits cast to
  float32.

The model is Llama 3.1 8B's shape (dim 4096, 32 layers, 32 heads, 8 KV heads, SwiGLU 14,336,
vocabulary 128,256, rotary frequencies for 2 x 8,192 positions as a complex64 buffer), written
here to torchtitan's ``models/llama/model.py`` design, built on the meta device. Nothing is
fitted: the figures come from the estimate's rules for an H100 and torch's own FSDP2, checkpoint
and autograd code as installed.

Run (a CPU-only machine; minutes per size):
``PYTHONPATH=src python benchmarks/estimate_torchtitan.py --out benchmarks/results``
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _emit import emit

GiB = 1 << 30
#: World size -> torchtitan's published memory (GiB), Tables 1 and 3, plain FSDP.
PUBLISHED = {8: 82.4, 128: 67.0}
BATCH, SEQ = 2, 8192


class Args:
    dim = 4096
    layers = 32
    heads = 32
    kv_heads = 8
    ffn = 14336  # int(2 * 4 * 4096 / 3) * 1.3, rounded up to a multiple of 1024
    vocab = 128256
    eps = 1e-5
    theta = 500000.0


def rotary(dim: int, end: int, theta: float) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, device=freqs.device).float()
    angles = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(angles), angles)


def rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    f = freqs[: x.shape[1]].view(1, x.shape[1], 1, xc.shape[-1])
    return torch.view_as_real(xc * f).flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, a: Args) -> None:
        super().__init__()
        self.head_dim = a.dim // a.heads
        self.rep = a.heads // a.kv_heads
        self.wq = nn.Linear(a.dim, a.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(a.heads * self.head_dim, a.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, -1, self.head_dim)
        k = self.wk(x).view(b, t, -1, self.head_dim)
        v = self.wv(x).view(b, t, -1, self.head_dim)
        q, k = rope(q, freqs), rope(k, freqs)
        k = k.unsqueeze(3).expand(b, t, k.shape[2], self.rep, self.head_dim).reshape(b, t, -1, self.head_dim)
        v = v.unsqueeze(3).expand(b, t, v.shape[2], self.rep, self.head_dim).reshape(b, t, -1, self.head_dim)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).contiguous().view(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, a: Args) -> None:
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.ffn, bias=False)
        self.w2 = nn.Linear(a.ffn, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, a: Args) -> None:
        super().__init__()
        self.attention = Attention(a)
        self.feed_forward = FeedForward(a)
        self.attention_norm = nn.RMSNorm(a.dim, eps=a.eps)
        self.ffn_norm = nn.RMSNorm(a.dim, eps=a.eps)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, a: Args) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(a.vocab, a.dim)
        self.register_buffer("freqs_cis", rotary(a.dim // a.heads, SEQ * 2, a.theta), persistent=True)
        self.layers = nn.ModuleDict({str(i): Block(a) for i in range(a.layers)})
        self.norm = nn.RMSNorm(a.dim, eps=a.eps)
        self.output = nn.Linear(a.dim, a.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))


#: torchtitan's per-op selective checkpointing: what is kept (``_save_list``).
SAVE = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.max.default,
}


def _policy_context() -> Any:
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    counts: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            counts[mode] += 1
        keep = func in SAVE and not (func == torch.ops.aten.mm.default and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def parallelize(model: nn.Module, mesh: Any) -> None:
    """torchtitan's ``apply_ac`` (selective, per op) then ``apply_fsdp`` (bf16 / fp32)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    layers = model.layers
    assert isinstance(layers, nn.ModuleDict)
    for name, block in list(layers.items()):
        layers.register_module(
            name, checkpoint_wrapper(block, context_fn=_policy_context, preserve_rng_state=False)
        )
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for name, block in layers.items():
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=int(name) < len(layers) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=True)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    tokens, labels = batch
    pred = model(tokens)
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def one(world_size: int) -> dict[str, Any]:
    from memprofiler.estimate import EstimatePlan, estimate_plan

    with torch.device("meta"):
        model = Llama(Args())
    batch = (torch.randint(0, Args.vocab, (BATCH, SEQ)), torch.randint(0, Args.vocab, (BATCH, SEQ)))
    plan = EstimatePlan(
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=3e-4, weight_decay=0.1, foreach=True),
        loss_fn=loss_fn,
        strategy="fsdp",
        world_size=world_size,
        parallelize=parallelize,
        device="cuda",
        gpu="H100",
    )
    start = time.perf_counter()
    est = estimate_plan(model, batch, plan)
    published = PUBLISHED[world_size]
    return {
        "world_size": world_size,
        "published_gib": published,
        "estimate_reserved_gib": round(est.reserved_peak_bytes / GiB, 2),
        "estimate_allocated_gib": round(est.peak_bytes / GiB, 2),
        "reserved_over_published": round(est.reserved_peak_bytes / GiB / published, 4),
        "estimate_reserved": est.reserved_peak_bytes,
        "estimate_allocated": est.peak_bytes,
        "margin_bytes": est.margin_bytes,
        "by_category": est.by_category,
        "peak_at": f"{est.peak_module} ({est.peak_phase}, step {est.peak_step})",
        "target": est.target,
        "notes": est.notes,
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--world-size", type=int, nargs="*", default=sorted(PUBLISHED))
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for ws in args.world_size:
        rows.append(one(ws))
        print(f"{ws} ranks: {rows[-1]['estimate_reserved_gib']} GiB / {PUBLISHED[ws]}", file=sys.stderr)
    emit(
        {
            "what": "torchtitan Llama 3.1 8B, 1D FSDP2 on H100s, batch 2 x 8192, per-op selective AC: "
            "estimate (CPU-only machine, H100 target) / published max reserved",
            "published": "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3 (FSDP)",
            "rows": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
