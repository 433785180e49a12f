"""``torch._grouped_mm`` (mixture-of-experts layers) as its kernels allocate, for any dtype.

transformers 5 runs the experts of Mixtral, Qwen-MoE and the like through ``torch._grouped_mm``
(``experts_implementation="grouped_mm"``). Its fake (meta) kernel follows only the CUDA fast
path, which takes bfloat16, and refuses every other dtype; the real kernels accept them (CUDA and
CPU fall back to one matrix product per group). So an estimate of a float32 MoE model stopped at
the first expert layer. Both real paths allocate one output through
``create_grouped_gemm_output_tensor`` (``aten/src/ATen/native/GroupedMMUtils.h``): its last
dimension's stride padded to 16 bytes for the fast path's TMA loads, its storage what
``empty_strided`` makes of that. This module makes the same output, so the estimate keeps the
bytes the kernel does whatever the dtype (the fake kernel, on a CPU build of torch, does not pad).
"""

from __future__ import annotations

from typing import Any

import torch

OP = torch.ops.aten._grouped_mm.default
_NAMES = ("self", "mat2", "offs", "bias", "out_dtype")


def _parse(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    got: dict[str, Any] = {"offs": None, "bias": None, "out_dtype": None}
    got.update(zip(_NAMES, args, strict=False))
    got.update(kwargs)
    return got


def _check_strides(name: str, t: torch.Tensor) -> None:
    """The kernels' operand rule: row or column major in the last two dimensions, the leading
    stride a multiple of 16 bytes (the real CPU and CUDA kernels raise otherwise, so does this)."""
    rows, cols = int(t.shape[-2]), int(t.shape[-1])
    s_rows, s_cols = int(t.stride(-2)), int(t.stride(-1))
    align = max(1, 16 // t.element_size())
    if s_rows == 1 and s_cols >= max(1, rows):
        lead = s_cols
    elif s_cols == 1 and s_rows >= max(1, cols):
        lead = s_rows
    else:
        raise RuntimeError(f"_grouped_mm: {name} is neither row nor column major (strides {t.stride()})")
    if lead % align:
        raise RuntimeError(f"_grouped_mm: {name}'s strides should be multiple of 16 bytes (got {t.stride()})")


def out_layout(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None, dtype: torch.dtype
) -> tuple[list[int], list[int]]:
    """(sizes, strides) of the output, as ``create_grouped_gemm_output_tensor`` lays it out."""
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise RuntimeError(f"_grouped_mm: multiplicands must be 2-D or 3-D, got {a.dim()}-D and {b.dim()}-D")
    a2, b2 = a.dim() == 2, b.dim() == 2
    if (a2 or b2) and offs is None:
        raise RuntimeError("_grouped_mm: a 2-D multiplicand needs offs")
    if not (a2 and b2) and a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"_grouped_mm: contraction dimensions differ ({a.shape[-1]} and {b.shape[-2]})")
    _check_strides("mat_a", a)
    _check_strides("mat_b", b)
    groups = int(offs.shape[0]) if offs is not None else 0
    if a2 and b2:
        size = [groups, int(a.shape[0]), int(b.shape[1])]
    elif a2:
        size = [int(a.shape[0]), int(b.shape[-1])]
    elif b2:
        size = [int(a.shape[1]), int(b.shape[1])]
    else:
        size = [int(a.shape[0]), int(a.shape[1]), int(b.shape[-1])]
    align = max(1, 16 // torch.empty((), dtype=dtype, device="meta").element_size())
    padded = -(-size[-1] // align) * align
    stride = [padded, 1] if len(size) == 2 else [size[1] * padded, padded, 1]
    return size, stride


class Output:
    """Stands in for the op's kernel: the output ``create_grouped_gemm_output_tensor`` makes."""

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        got = _parse(args, kwargs)
        a, b = got["self"], got["mat2"]
        dtype = got["out_dtype"] or a.dtype
        size, stride = out_layout(a, b, got["offs"], dtype)
        return torch.empty_strided(size, stride, dtype=dtype, device=a.device)
