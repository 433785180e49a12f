"""CUDA autocast's casts that CPU autocast does not make, for a CUDA target estimated on CPU.

The fake step runs under CPU autocast (fake CUDA tensors cannot run autograd on a CPU-only
torch). Both autocasts run matrix products and convolutions in the low precision, but CUDA's
also runs a list of ops in float32 that CPU's leaves alone (``autocast_mode.cpp``,
``KERNEL_CUDA``): ``pow``, ``exp``, ``log``, ``rsqrt``, ``layer_norm``, ``rms_norm``, ``group_norm``,
``softplus``, the losses, ``logsumexp``, ...; and it runs ``softmax``, ``log_softmax``,
``sum``, ``prod``, ``cumsum``, ``cumprod`` and the vector/matrix norms with a float32 output
(``fp32_set_opt_dtype``) unless a dtype is given. Those float32 results are what backward
keeps: GPT-2's tanh-GELU (``pow`` inside) keeps float32 activations on the GPU, bfloat16 ones
under CPU autocast. This module makes those casts, and only while autocast is on, so code that
turns autocast off is honoured.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map_only

#: CUDA autocast's ``fp32`` list, by Python function name (``torch.pow``, ``Tensor.pow``, ``F.layer_norm``).
FP32 = frozenset(
    [
        "acos",
        "asin",
        "cosh",
        "erfinv",
        "exp",
        "expm1",
        "log",
        "log10",
        "log2",
        "log1p",
        "reciprocal",
        "rsqrt",
        "sinh",
        "tan",
        "pow",
        "__pow__",
        "__rpow__",
        "float_power",
        "softplus",
        "layer_norm",
        "rms_norm",
        "group_norm",
        "frobenius_norm",
        "nuclear_norm",
        "cosine_similarity",
        "poisson_nll_loss",
        "cosine_embedding_loss",
        "nll_loss",
        "hinge_embedding_loss",
        "kl_div",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "mse_loss",
        "margin_ranking_loss",
        "multilabel_margin_loss",
        "soft_margin_loss",
        "triplet_margin_loss",
        "multi_margin_loss",
        "binary_cross_entropy_with_logits",
        "dist",
        "pdist",
        "cdist",
        "renorm",
        "logsumexp",
    ]
)
#: CUDA autocast's ``fp32_set_opt_dtype`` list: a float32 output unless the call names a dtype.
FP32_OUTPUT = frozenset(
    ["prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm", "sum"]
)
_LOW = (torch.float16, torch.bfloat16)


def _name(func: Any) -> str:
    return str(getattr(func, "__name__", ""))


def _up(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in _LOW else t


#: Every name :func:`cast` may change the arguments of.
_CAST_NAMES = FP32 | FP32_OUTPUT


def casts(func: Any) -> bool:
    """Whether :func:`cast` may change ``func``'s arguments (autocast on, ``func`` in its lists)."""
    return _name(func) in _CAST_NAMES and torch.is_autocast_enabled("cpu")


def cast(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args``/``kwargs`` as CUDA autocast would pass them to ``func`` (unchanged when autocast is off)."""
    if not torch.is_autocast_enabled("cpu"):
        return args, kwargs
    name = _name(func)
    if name in FP32:
        return tree_map_only(torch.Tensor, _up, (args, kwargs))
    if name in FP32_OUTPUT and kwargs.get("dtype") is None:
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if first is not None and first.dtype in _LOW:
            return args, {**kwargs, "dtype": torch.float32}
    return args, kwargs
