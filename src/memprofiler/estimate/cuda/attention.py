"""Scaled-dot-product attention as CUDA would run it, wherever the estimate runs.

``F.scaled_dot_product_attention`` picks a kernel per call, and the kernels save very different
tensors for backward: flash and memory-efficient attention keep their log-sum-exp (bytes of
batch x heads x queries), the math path keeps the attention matrix (batch x heads x queries x
keys). The CPU picks by its own rules (with dropout it takes the math path), so an estimate
run on CPU tensors would save what the CPU saves. For a CUDA target this module replays
torch's CUDA selection (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``: flash, then
memory-efficient, then math; each with its dtype, architecture, mask, head-size, GQA and
causal-shape filters, and the user's ``torch.backends.cuda.enable_*_sdp`` switches) and calls
that backend's own op, whose fake kernel gives the tensors CUDA would save.

The one choice it cannot know: where torch would prefer cuDNN attention (sm90 / sm100 with a
recent cuDNN, half precision). cuDNN saves the same statistics as flash (one float per query
and head), so the note gives both figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from memprofiler.estimate.cuda.target import CudaTarget

_aten = torch.ops.aten
HALF = (torch.float16, torch.bfloat16)


def _switch(name: str, unknown: bool = True) -> bool:
    """``torch.backends.cuda.<name>()``, or ``unknown`` where this torch lacks it or cannot read it."""
    fn: Callable[[], bool] | None = getattr(torch.backends.cuda, name, None)
    try:
        return bool(fn()) if fn is not None else unknown
    except (RuntimeError, AttributeError):
        return unknown


@dataclass
class Call:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None
    dropout: float
    causal: bool
    scale: float | None
    gqa: bool

    @property
    def head_dim(self) -> int:
        return int(self.q.shape[-1])


def _dense_ok(c: Call, gqa_ok: bool, singleton_ok: bool) -> str | None:
    if any(t.dim() != 4 for t in (c.q, c.k, c.v)):
        return "inputs are not 4-D"
    if c.q.shape[0] != c.k.shape[0] or c.k.shape[0] != c.v.shape[0]:
        return "batch sizes differ"
    hq, hk = int(c.q.shape[1]), int(c.k.shape[1])
    if (hq != hk or hk != int(c.v.shape[1])) and not (gqa_ok and c.gqa and hq % hk == 0):
        return "query and key/value head counts differ (grouped-query attention)"
    if any(int(t.shape[-2]) == 0 for t in (c.q, c.k, c.v)):
        return "a sequence length is 0"
    # check_last_dim_stride_equals_1_dense: flash forgives a head size of 1, memory-efficient does
    # not; on the GPU the mask's last dimension needs stride 1 too (a permuted position bias, as
    # T5's, has stride = heads and sends the call to the math path)
    if any(t.stride(-1) != 1 for t in (c.q, c.k, c.v)) and not (singleton_ok and c.q.shape[-1] == 1):
        return "the last dimension of query, key or value is not contiguous"
    if c.mask is not None and c.mask.stride(-1) != 1:
        return f"the mask's last dimension has stride {c.mask.stride(-1)} (fused kernels need 1)"
    return None


def why_not_flash(c: Call, target: CudaTarget, grad: bool) -> str | None:
    """``use_flash_attention``'s first failing filter, or None when flash runs."""
    if not _switch("flash_sdp_enabled"):
        return "disabled (torch.backends.cuda.enable_flash_sdp)"
    if c.mask is not None:
        return "an attention mask is given"
    if not (c.q.shape[-1] == c.k.shape[-1] == c.v.shape[-1]) or c.head_dim > 256:
        return f"head size {c.head_dim} (equal sizes up to 256)"
    if target.capability < (8, 0):
        return f"{target.sm} (sm80+ only)"
    if target.capability in ((8, 6), (8, 9)) and grad and c.head_dim > 192:
        return "head size over 192 with gradients on sm86/sm89"
    if c.causal and c.q.shape[-2] != c.k.shape[-2]:
        return "causal with different query and key lengths"
    if c.q.dtype not in HALF:
        return f"{str(c.q.dtype).removeprefix('torch.')} (float16 / bfloat16 only)"
    return _dense_ok(c, gqa_ok=True, singleton_ok=True)


def why_not_efficient(c: Call, target: CudaTarget) -> str | None:
    """``use_mem_efficient_attention``'s first failing filter, or None when it runs."""
    if not _switch("mem_efficient_sdp_enabled"):
        return "disabled (torch.backends.cuda.enable_mem_efficient_sdp)"
    if target.capability < (5, 0):
        return f"{target.sm} (sm50+ only)"
    half = c.q.dtype in HALF
    align = 8 if half else (4 if target.capability >= (8, 0) else 1)
    if c.q.shape[-1] != c.k.shape[-1] or c.head_dim % align or int(c.v.shape[-1]) % align:
        return f"head size {c.head_dim} not a multiple of {align}"
    ok = (torch.float32, torch.float16) + ((torch.bfloat16,) if target.capability >= (8, 0) else ())
    if c.q.dtype not in ok:
        return f"{c.q.dtype} on {target.sm}"
    return _dense_ok(c, gqa_ok=False, singleton_ok=False)


def choose(c: Call, target: CudaTarget, grad: bool) -> tuple[str, str]:
    """(backend, why the faster ones were refused) as torch's CUDA ``select_sdp_backend`` picks."""
    no_flash = why_not_flash(c, target, grad)
    if no_flash is None:
        return "flash", ""
    no_eff = why_not_efficient(c, target)
    if no_eff is None:
        return "efficient", f"flash: {no_flash}"
    return "math", f"flash: {no_flash}; memory-efficient: {no_eff}"


def _bool_mask_to_float(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``convert_boolean_attn_mask``: True keeps, False is -inf, in the query's dtype."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask, torch.zeros((), dtype=dtype), torch.full((), -math.inf, dtype=dtype))


def run(backend: str, c: Call, grad: bool) -> torch.Tensor:
    """Call the chosen backend's own op (its fake kernel allocates what CUDA's does); ``c.mask`` is
    already additive (:func:`attention` converts a boolean one before the choice)."""
    mask = c.mask
    if backend == "flash":
        pad = (-c.head_dim) % 8  # sdpa pads the head size to a multiple of 8 for flash
        q, k, v = (F.pad(t, (0, pad)) if pad else t for t in (c.q, c.k, c.v))
        scale = c.scale if c.scale is not None else 1 / math.sqrt(c.head_dim)
        out = _aten._scaled_dot_product_flash_attention(q, k, v, c.dropout, c.causal, False, scale=scale)[0]
        return out[..., : c.head_dim] if pad else out
    if backend == "efficient":
        if mask is not None and mask.shape[-1] % 16:  # preprocess_mask: pad the bias to 16 columns
            mask = F.pad(mask, (0, 16 - mask.shape[-1] % 16))[..., : c.k.shape[-2]]
        if mask is not None:
            mask = mask.expand(c.q.shape[0], c.q.shape[1], c.q.shape[-2], c.k.shape[-2])
        return _aten._scaled_dot_product_efficient_attention(
            c.q, c.k, c.v, mask, grad, c.dropout, c.causal, scale=c.scale
        )[0]
    return math_path(c)


def math_path(c: Call) -> torch.Tensor:
    """``_scaled_dot_product_attention_math`` op by op, as it runs on a CUDA device.

    Called as one op on fake CPU tensors it would differ from CUDA in two ways: its dropout
    takes the CPU's noise path (a mask of the attention's dtype kept for backward, 4x CUDA's
    one-byte mask of the fused ``native_dropout``), and a fake tensor counts as a tensor
    subclass, so the mask is added out of place (one more attention matrix, briefly). Here each
    step is the CUDA one: half precision is computed in float32 unless the user allowed reduced
    precision, the scale is split between query and key, a causal mask is made, grouped-query
    heads are repeated, the mask is added in place, ``_safe_softmax``, the fused dropout, and
    both outputs are cast back (the attention weights' copy is dropped, as sdpa drops it).
    """
    q, k, v, mask = c.q, c.k, c.v, c.mask
    origin = q.dtype
    if origin in HALF and not _reduced_math_allowed():
        q, k, v = q.float(), k.float(), v.float()
    factor = math.sqrt(c.scale if c.scale is not None else 1 / math.sqrt(c.head_dim))
    q = q * factor
    if c.causal:
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        mask = _bool_mask_to_float(causal, q.dtype)
    if c.gqa and q.shape[-3] != k.shape[-3]:
        reps = int(q.shape[-3]) // int(k.shape[-3])
        k, v = k.repeat_interleave(reps, dim=-3), v.repeat_interleave(reps, dim=-3)
    attn = torch.matmul(q, k.transpose(-2, -1) * factor)
    if mask is not None:
        in_place = torch.broadcast_shapes(attn.shape, mask.shape) == attn.shape
        in_place = in_place and torch.result_type(attn, mask) == attn.dtype
        attn = attn.add_(mask) if in_place else attn + mask
    attn = _aten._safe_softmax(attn, -1)
    if c.dropout > 0:
        attn = _aten.native_dropout(attn, c.dropout, True)[0]
    out = torch.matmul(attn, v)
    if out.dtype != origin:
        out = out.to(origin)
        attn.to(origin)  # the weights' cast copy, made and dropped
    return out


def _reduced_math_allowed() -> bool:
    return _switch("fp16_bf16_reduction_math_sdp_allowed", unknown=False)


def _autocast(c: Call) -> Call:
    """CUDA autocast runs sdpa in its lower precision: cast the inputs as it would."""
    for dev in ("cuda", "cpu"):
        if torch.is_autocast_enabled(dev):
            dtype = torch.get_autocast_dtype(dev)
            cast = [
                t.to(dtype) if t is not None and t.is_floating_point() else t for t in (c.q, c.k, c.v, c.mask)
            ]
            return Call(cast[0], cast[1], cast[2], cast[3], c.dropout, c.causal, c.scale, c.gqa)  # type: ignore[arg-type]
    return c


def _parse(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    defaults: dict[str, Any] = {
        "attn_mask": None,
        "dropout_p": 0.0,
        "is_causal": False,
        "scale": None,
        "enable_gqa": False,
    }
    got = {**defaults, **dict(zip(names, args, strict=False)), **kwargs}
    return Call(
        got["query"],
        got["key"],
        got["value"],
        got["attn_mask"],
        float(got["dropout_p"]),
        bool(got["is_causal"]),
        got["scale"],
        bool(got["enable_gqa"]),
    )


def saved_stats_bytes(c: Call) -> int:
    """What flash (and cuDNN) keep per call beyond q, k, v and the output: float32 per query and head."""
    return int(c.q.shape[0] * c.q.shape[1] * c.q.shape[-2]) * 4


@dataclass
class AttentionLog:
    """Per (backend, reason): calls and what one call saves, for the estimate's notes."""

    calls: dict[tuple[str, str], int] = field(default_factory=dict)
    cudnn_maybe: dict[str, int] = field(default_factory=dict)

    def notes(self, target: CudaTarget) -> list[str]:
        out = []
        for (backend, why), n in sorted(self.calls.items()):
            name = {"flash": "flash", "efficient": "memory-efficient", "math": "math"}[backend]
            reason = f" ({why})" if why else ""
            out.append(
                f"scaled_dot_product_attention on {target.name}: {n} call(s) as CUDA's {name} kernel{reason}"
            )
        for shape, nbytes in sorted(self.cudnn_maybe.items()):
            out.append(
                f"scaled_dot_product_attention {shape}: torch may prefer cuDNN attention on {target.sm} (it depends "
                f"on the cuDNN version); flash saves {nbytes} B of log-sum-exp per call, cuDNN {nbytes} B of "
                "softmax statistics: the same figure either way"
            )
        return out


def attention(log: AttentionLog, target: CudaTarget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One ``F.scaled_dot_product_attention`` call, run by the backend CUDA would pick on ``target``."""
    c = _autocast(_parse(args, kwargs))
    # sdpa turns a boolean mask into an additive one before it picks a kernel (the choice sees it)
    c.mask = _bool_mask_to_float(c.mask, c.q.dtype)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (c.q, c.k, c.v))
    backend, why = choose(c, target, grad)
    key = (backend, why)
    log.calls[key] = log.calls.get(key, 0) + 1
    if backend == "flash" and target.capability[0] in (9, 10):
        shape = "x".join(str(int(s)) for s in c.q.shape)
        log.cudnn_maybe[shape] = saved_stats_bytes(c)
    with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
        return run(backend, c, grad)
