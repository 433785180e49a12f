"""Memory CUDA kernels take through the caching allocator inside themselves, which no fake kernel shows.

A fake kernel allocates an op's outputs; some CUDA kernels also allocate scratch for the call
and free it before returning, and some keep an output on the host. For a CUDA target this
module replays those, from torch 2.11's CUDA sources (``aten/src/ATen/native/transformers/cuda/``):

- memory-efficient attention forward (``_efficient_attention_forward``, ``attention.cu``): the
  philox seed and offset are CPU scalars unless a CUDA graph is being captured; the fake kernel
  makes them on the device (two 512-byte blocks per call), so they are taken out. The tracker
  does that (``tracker._HOST_RNG_OPS``: it sees the outputs before this mode does); this
  module's log only says so.
- memory-efficient attention backward (``_efficient_attention_backward``,
  ``attention_backward.cu``): a contiguous copy of the output gradient when it is not contiguous
  in (batch, query, head, dim) order; ``delta`` (float32, batch x heads x queries), which for
  float32 inputs is computed as ``(grad_out * out).sum(-1).transpose(-2, -1).contiguous()`` and so
  briefly holds the product (float32, the size of the output) and the sum as well; and the
  kernel's workspace (``kernel_backward.h``, ``workspace_size``): per batch and head, one float32
  tile of dQ per (query block, column block) with a 16-byte lock (split keys are enabled on sm70+),
  plus dK/dV accumulators for half precision where the kernel cannot keep them in registers.
  The tile is the first kernel ``dispatch_cutlassB`` accepts: 64x64 up to head size 64, 128x64 up
  to 128, 64x64 above.
- flash attention backward (``mha_bwd``, ``flash_api.cpp``): contiguous copies of the output
  gradient and of the output where they are not contiguous; ``softmax_d`` (float32, batch x heads
  x queries rounded up to 128); ``dq_accum`` (float32, batch x queries rounded to 128 x heads x
  head size rounded to 32, or 64 above 128); with grouped-query attention, dK and dV expanded to
  every query head before they are summed.

- layer norm forward and backward (``layer_norm_cuda`` / ``layer_norm_backward_cuda``,
  ``native/cuda/layer_norm_kernel.cu``): a contiguous copy of the input where it is not contiguous
  (``input.expect_contiguous()``), and in backward of the output gradient too (``dY.contiguous()``).
  Swin's patch merging normalises a transposed tensor. With many rows and few features (more than
  65,536 rows, fewer than 16 x the SM count features) the weight's gradients are summed in two
  stages (torch 2.8 and later): rows of partial sums, then ``.sum(0)`` over them, with that
  reduction's own scratch (:func:`gamma_beta_rows`).

- dense embedding backward (``embedding_dense_backward_cuda``, ``native/cuda/Embedding.cu``): over
  3,072 indices (or with ``scale_grad_by_freq``) it sorts the indices and sums the gradient rows
  in partial segments, sized by bounds, not by the index values
  (:mod:`memprofiler.estimate.cuda.embedding_scratch`).

- reductions through ``gpu_reduce_kernel`` (sum, mean, amax, max along a dim, norms, var/std...):
  the staging buffer and semaphores of a launch that splits each output's inputs across blocks,
  and the copy of an input the kernel cannot read in its own dtype
  (:mod:`memprofiler.estimate.cuda.reduce_scratch`); a Linear's bias gradient is such a reduction.

Each is a transient: allocated with the op's outputs alive, freed when the op returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from memprofiler.estimate.cuda import embedding_scratch, reduce_scratch
from memprofiler.estimate.cuda.ops import OpHook
from memprofiler.estimate.cuda.target import CudaTarget

_aten = torch.ops.aten
EFFICIENT_FWD = _aten._scaled_dot_product_efficient_attention.default
EFFICIENT_BWD = _aten._scaled_dot_product_efficient_attention_backward.default
FLASH_BWD = _aten._scaled_dot_product_flash_attention_backward.default
LAYER_NORM = _aten.native_layer_norm.default
LAYER_NORM_BWD = _aten.native_layer_norm_backward.default
HALF = (torch.float16, torch.bfloat16)
F32 = 4
#: ``GradQTempStorage``'s lock, counter and padding ahead of each dQ tile.
GQ_HEADER = 16


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _align(a: int, b: int) -> int:
    return _ceil(a, b) * b


def _copy_bytes(t: torch.Tensor) -> int:
    """What ``t.contiguous()`` allocates (nothing when it already is)."""
    return 0 if t.is_contiguous() else t.numel() * t.element_size()


def efficient_tile(head_dim: int) -> tuple[int, int, int]:
    """(kBlockSizeI, kBlockSizeJ, kMaxK) of the backward kernel ``dispatch_cutlassB`` picks on sm80+."""
    if head_dim <= 32:
        return 64, 64, 32
    if head_dim <= 64:
        return 64, 64, 64
    if head_dim <= 128:
        return 128, 64, 128
    return 64, 64, 65536


def efficient_workspace(b: int, h: int, m: int, n: int, k: int, kv: int, half: bool) -> int:
    """``AttentionBackwardKernel::Params::workspace_size()`` for the kernel the dispatch picks."""
    bi, bj, max_k = efficient_tile(max(k, kv))
    gq = _ceil(m, bi) * _ceil(k, bj) * (GQ_HEADER + F32 * bi * bj) // F32
    gkv = 0
    if half and max_k > bi:  # dK/dV accumulate in global memory (not kOutputInRF)
        splits = _ceil(n, bj)
        if b * h >= 256 and n <= 2 * bj:
            splits = 1
        splits = max(1, min(splits, 200 // (b * h)))
        gkv = splits * bj * (_align(k, bi) + _align(kv, bi))
    return b * h * _align(gq + gkv, 4) * F32


def efficient_backward(args: tuple[Any, ...]) -> list[list[int]]:
    """Phases of scratch (each a list of allocations live together) of one memory-efficient backward."""
    grad_out, q, k, v = args[:4]
    g = grad_out.transpose(1, 2)  # the kernel works in (batch, query, head, dim)
    b, m, h, hd = (int(s) for s in q.transpose(1, 2).shape)
    n, kv = int(k.shape[2]), int(v.shape[-1])
    copy = [_copy_bytes(g)] if _copy_bytes(g) else []
    delta = b * h * m * F32
    # half: kKernelComputesDelta; float32: (grad_out * out).sum(-1).transpose(-2, -1).contiguous(),
    # whose temporaries live to the end of the statement
    computed = [] if q.dtype in HALF else [b * m * h * kv * F32, b * m * h * F32]
    first = [*copy, *computed, delta]
    ws = efficient_workspace(b, h, m, n, hd, kv, q.dtype in HALF)
    return [first, [*copy, delta, ws] if ws else [*copy, delta]]


def flash_backward(args: tuple[Any, ...]) -> list[list[int]]:
    """The scratch of one flash-attention backward (``mha_bwd``), all live at the kernel's launch."""
    grad_out, q, k, _v, out = args[:5]
    b, m, h, hd = (int(s) for s in q.transpose(1, 2).shape)
    n, hk = int(k.shape[2]), int(k.shape[1])
    sizes = [_copy_bytes(grad_out.transpose(1, 2)), _copy_bytes(out.transpose(1, 2))]
    m_r = _align(m, 128)
    hd_r = _align(hd, 32 if hd <= 128 else 64)
    sizes.append(b * h * m_r * F32)  # softmax_d
    # dq_accum; deterministic mode keeps one per split (SM count / (batch x heads)): one is counted
    sizes.append(b * m_r * h * hd_r * F32)
    if hk != h:  # dk_expanded, dv_expanded
        sizes += [b * n * h * hd * q.element_size()] * 2
    return [[s for s in sizes if s]]


def layer_norm(args: tuple[Any, ...]) -> list[list[int]]:
    """The input's contiguous copy a CUDA layer norm forward makes (none when it is contiguous)."""
    return [[n]] if (n := _copy_bytes(args[0])) else []


def layer_norm_backward(args: tuple[Any, ...]) -> list[list[int]]:
    """The contiguous copies of the input and the output gradient a CUDA layer norm backward makes."""
    sizes = [_copy_bytes(args[1]), _copy_bytes(args[0])]
    return [[s for s in sizes if s]] if any(sizes) else []


#: ``LaunchGammaBetaBackwardCUDAKernel``'s threads along the normalised dimension.
GAMMA_BETA_BLOCK_X = 32
#: The most blocks its two-stage launch spreads over the rows (``64 * 1024 / 2`` over ``blocks.x``).
GAMMA_BETA_MAX_GRID = 64 * 1024 // 2
#: The first torch release with the two-stage weight-gradient launch (pytorch/pytorch#150576).
TWO_STAGE_SINCE = (2, 8)


def gamma_beta_rows(m: int, n: int, sms: int) -> int:
    """Rows of the partial sums (``dgamma_blocks``) a CUDA norm backward over ``m`` rows of ``n``
    features keeps, or 0 where it sums the weight's gradient in one pass.

    With many rows and few features (``M > 64 * 1024`` and ``N / 32 < SMs / 2``) the kernel splits
    the rows over ``min(32768 / ceil(N / 32), ceil(M / 32))`` blocks, each writing a row of partial
    sums, and ``.sum(0)`` adds them up (``layer_norm_kernel.cu``).
    """
    if m <= 64 * 1024 or n // GAMMA_BETA_BLOCK_X >= sms // 2:
        return 0
    blocks_x = -(-n // GAMMA_BETA_BLOCK_X)
    return min(GAMMA_BETA_MAX_GRID // blocks_x, -(-m // 32))


def two_stage_weight_grads(
    rows: int, n: int, weight: torch.Tensor, grads: int, device: reduce_scratch.Device
) -> list[int]:
    """The blocks of the two-stage weight-gradient pass for ``grads`` gradients (gamma, and beta for
    layer norm): each one's partial sums (``rows`` x ``n`` in the weight's dtype), the new gradient
    ``.sum(0)`` makes, and that column reduction's own scratch. All live until the op returns."""
    partial = torch.empty(rows, n, dtype=weight.dtype, device="meta")
    sums = reduce_scratch.op_scratch(_aten.sum.dim_IntList, (partial, [0]), {}, device)
    es = weight.element_size()
    return [rows * n * es] * grads + [n * es] * grads + sums


@dataclass
class ScratchLog:
    """Per op name: calls and the largest transient one call took, for the estimate's notes."""

    calls: dict[str, int] = field(default_factory=dict)
    largest: dict[str, int] = field(default_factory=dict)
    host_scalars: int = 0

    def add(self, name: str, nbytes: int) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        self.largest[name] = max(self.largest.get(name, 0), nbytes)

    def notes(self) -> list[str]:
        out = []
        for name in sorted(self.calls):
            out.append(
                f"{name}: scratch the CUDA kernel allocates inside itself replayed at each of {self.calls[name]} "
                f"call(s), up to {self.largest[name]:,} B at once (torch 2.11's CUDA source)"
            )
        if self.host_scalars:
            out.append(
                f"memory-efficient attention: {self.host_scalars} philox seed/offset scalar(s) kept on the host, "
                "as CUDA keeps them outside graph capture: not in the device's peak"
            )
        return out


class _Call(NamedTuple):
    """One op call as a kernel's scratch rule sees it: its arguments and the device it runs on."""

    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    target: CudaTarget
    device: reduce_scratch.Device


def _layer_norm_backward_on(c: _Call) -> list[list[int]]:
    """The contiguous copies, with the two-stage weight-gradient blocks where the kernel takes
    that path (:func:`gamma_beta_rows`; torch 2.8 and later)."""
    found = layer_norm_backward(c.args)
    if c.target.torch_version < TWO_STAGE_SINCE:
        return found
    x, shape, weight, bias, mask = c.args[1], c.args[2], c.args[5], c.args[6], c.args[7]
    n = math.prod(int(d) for d in shape)
    rows = gamma_beta_rows(x.numel() // max(n, 1), n, c.device.sms)
    grads = int(bool(mask[1]) and weight is not None) + int(bool(mask[2]) and bias is not None)
    if not rows or not grads or weight is None:
        return found
    blocks = two_stage_weight_grads(rows, n, weight, grads, c.device)
    return [[*(found[0] if found else []), *blocks]]


def _reduction(c: _Call) -> list[list[int]]:
    sizes = reduce_scratch.op_scratch(c.func, c.args, c.kwargs, c.device)
    return [sizes] if sizes else []


class _Rule(NamedTuple):
    label: str
    """The op's name in the notes; empty: ``CUDA reduction <op>``."""
    category: str
    """The scratch's category in the peak's breakdown (``<category>_scratch``)."""
    phases: Callable[[_Call], list[list[int]]]


#: Every op whose CUDA kernel takes scratch, and how much, with :data:`_REDUCTION`: what
#: ``KernelScratch`` reads.
_RULES: dict[Any, _Rule] = {
    EFFICIENT_BWD: _Rule(
        "memory-efficient attention backward", "attention", lambda c: efficient_backward(c.args)
    ),
    FLASH_BWD: _Rule("flash attention backward", "attention", lambda c: flash_backward(c.args)),
    LAYER_NORM: _Rule("layer norm", "layer_norm", lambda c: layer_norm(c.args)),
    LAYER_NORM_BWD: _Rule("layer norm backward", "layer_norm", _layer_norm_backward_on),
    embedding_scratch.EMBEDDING_BWD: _Rule(
        "embedding backward",
        "embedding",
        lambda c: embedding_scratch.backward_phases(c.args, c.target.sms, c.target.torch_version),
    ),
}
#: The rule of every op in ``reduce_scratch.OPS`` (looked up there at each call).
_REDUCTION = _Rule("", "reduction", _reduction)


class KernelScratch(OpHook):
    """Calls ``phases(category, [[bytes, ...], ...])`` for each op whose CUDA kernel on ``target``
    takes scratch (:data:`_RULES`), and logs it for the notes."""

    def __init__(self, phases: Callable[[str, list[list[int]]], None], target: CudaTarget) -> None:
        self.phases = phases
        self.log = ScratchLog()
        self.target = target
        self.device = reduce_scratch.Device(target.sms, target.threads_per_sm)

    def after(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        rule = _REDUCTION if func in reduce_scratch.OPS else _RULES.get(func)
        if rule is None:
            return out
        found = rule.phases(_Call(func, args, kwargs, self.target, self.device))
        if found:
            self.log.add(rule.label or f"CUDA reduction {func.__name__}", max(sum(p) for p in found))
            self.phases(rule.category, found)
        return out
