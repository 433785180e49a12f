"""Two questions for the GPU: why T5's encoder attention runs the math path, and
what scratch CUDA reductions take. Writes $OUT/why.json."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings

import torch
import torch.nn.functional as F

out = os.environ.get("OUT", "/tmp/why")
os.makedirs(out, exist_ok=True)
res: dict = {"torch": torch.__version__}
p = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
res["props"] = {
    k: getattr(p, k)
    for k in dir(p)
    if p is not None and not k.startswith("_") and isinstance(getattr(p, k), (int, str, float))
}
dev = torch.device(os.environ.get("WHY_DEV", "cuda"))

# 1. sdpa calls of a T5 training step
sys.path.insert(0, "tests")
os.environ["GPU_B"], os.environ["GPU_T"] = "8", "512"
from fixtures.gpu_h200 import panel  # noqa: E402

calls: list = []
orig = F.scaled_dot_product_attention


def meta(t):
    return (
        None
        if t is None
        else {
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "dtype": str(t.dtype),
            "rg": t.requires_grad,
            "contig": t.is_contiguous(),
            "offset": t.storage_offset(),
        }
    )


def wrap(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    rec = {
        "q": meta(q),
        "k": meta(k),
        "v": meta(v),
        "mask": meta(attn_mask),
        "dropout": dropout_p,
        "causal": is_causal,
        "scale": scale,
        "gqa": enable_gqa,
        "grad_mode": torch.is_grad_enabled(),
    }
    try:
        rec["choice"] = int(
            torch._fused_sdp_choice(
                q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )
        )
    except Exception as e:
        rec["choice"] = repr(e)
    params = torch.backends.cuda.SDPAParams(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa)
    for name, fn in (
        ("flash", torch.backends.cuda.can_use_flash_attention),
        ("efficient", torch.backends.cuda.can_use_efficient_attention),
        ("cudnn", getattr(torch.backends.cuda, "can_use_cudnn_attention", None)),
    ):
        if fn is None:
            continue
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                rec[name] = [bool(fn(params, True)), [str(x.message)[:300] for x in w]]
            except Exception as e:
                rec[name] = [repr(e)]
    calls.append(rec)
    return orig(
        q,
        k,
        v,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
    )


F.scaled_dot_product_attention = wrap
try:
    from transformers import T5Config, T5ForConditionalGeneration  # noqa: F401

    torch.manual_seed(0)
    with dev:
        m = panel.t5()
    m.config._attn_implementation = "sdpa"
    with contextlib.suppress(Exception):
        m.set_attn_implementation("sdpa")
    m.train()
    b = {k: v.to(dev) for k, v in panel.t5_batch().items()}
    loss = m(**b).loss
    loss.backward()
    torch.cuda.synchronize()
except Exception as e:
    res["t5_error"] = repr(e)
res["sdpa_calls"] = calls
F.scaled_dot_product_attention = orig
# isolated: encoder-like call with/without dropout, bias grad or not, bias batch 1 or 8
iso = []
for dp in (0.0, 0.1):
    for rg in (False, True):
        for mb in (1, 8):
            for L in (64, 512):
                q = torch.randn(8, 8, L, 64, device=dev, requires_grad=True)
                mask = torch.randn(mb, 8, L, L, device=dev, requires_grad=rg)
                mm = mask.expand(8, 8, L, L) if mb == 1 else mask
                for label, mk in (("raw", mask), ("expanded", mm)):
                    params = torch.backends.cuda.SDPAParams(q, q, q, mk, dp, False, False)
                    with warnings.catch_warnings(record=True) as w:
                        warnings.simplefilter("always")
                        ok = bool(torch.backends.cuda.can_use_efficient_attention(params, True))
                    iso.append(
                        {
                            "dropout": dp,
                            "mask_rg": rg,
                            "mask_b": mb,
                            "L": L,
                            "form": label,
                            "ok": ok,
                            "why": [str(x.message)[:300] for x in w],
                            "choice": int(torch._fused_sdp_choice(q, q, q, mk, dp, False)),
                        }
                    )
res["sdpa_isolated"] = iso

# 2. reduction scratch
torch.cuda.empty_cache()
red = []


def scratch(fn, x):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = fn(x)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    after = torch.cuda.memory_allocated()
    return peak - after, after - base, list(y.shape)


shapes2 = [
    (n, c)
    for n in (1, 2, 5, 16, 100, 197, 512, 1000, 3152, 4096, 6304, 25216, 65536, 262144)
    for c in (1, 3, 8, 64, 384, 512, 768, 1000, 1536, 3072, 32000)
]
for dt in (torch.float32, torch.bfloat16):
    for n, c in shapes2:
        if n * c > 2**28:
            continue
        x = torch.randn(n, c, device=dev).to(dt)
        for name, fn in (
            ("sum0", lambda t: t.sum(0)),
            ("sum1", lambda t: t.sum(1)),
            ("sumall", lambda t: t.sum()),
            ("mean0", lambda t: t.mean(0)),
            ("amax1", lambda t: t.amax(1)),
            ("sum0f", lambda t: t.sum(0, dtype=torch.float32)),
        ):
            s, o, sh = scratch(fn, x)
            red.append({"op": name, "dtype": str(dt)[6:], "shape": [n, c], "scratch": s, "out": o})
        del x
# 3-D: sum over (0, 1) like a bias grad of [B, T, C]
for dt in (torch.float32, torch.bfloat16):
    for b, t, c in (
        (16, 197, 384),
        (16, 197, 1536),
        (8, 512, 512),
        (8, 512, 1024),
        (4, 256, 512),
        (8, 64, 512),
        (8, 512, 32128),
        (2, 7, 3),
    ):
        x = torch.randn(b, t, c, device=dev).to(dt)
        s, o, sh = scratch(lambda z: z.sum((0, 1)), x)
        red.append({"op": "sum01", "dtype": str(dt)[6:], "shape": [b, t, c], "scratch": s, "out": o})
        s, o, sh = scratch(lambda z: z.sum(-1), x)
        red.append({"op": "sum_last", "dtype": str(dt)[6:], "shape": [b, t, c], "scratch": s, "out": o})
        del x
res["reductions"] = red
with open(os.path.join(out, "why.json"), "w") as fh:
    json.dump(res, fh, indent=1)
nz = [r for r in red if r["scratch"]]
print("reductions", len(red), "with scratch", len(nz))
for r in nz[:40]:
    print(r)
for c in calls:
    print(
        c["q"]["shape"],
        c["mask"] and c["mask"]["shape"],
        c["mask"] and c["mask"]["stride"],
        c["mask"] and c["mask"]["rg"],
        c["dropout"],
        c["choice"],
        c["efficient"],
    )
for r in iso:
    if not r["ok"]:
        print(r)
