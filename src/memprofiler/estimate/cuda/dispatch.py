"""Run a fake step on CPU tensors as CUDA would dispatch it, for a CUDA target.

Where torch's CPU and CUDA code take different paths that keep different tensors, the
estimate takes CUDA's, so a laptop's answer is the GPU node's answer:

- ``F.scaled_dot_product_attention``: the kernel CUDA's selection rules pick, see
  :mod:`memprofiler.estimate.cuda.attention`.
- autocast: the casts CUDA autocast makes and CPU autocast does not, see
  :mod:`memprofiler.estimate.cuda.autocast`.
- ``F.dropout`` (training, 0 < p < 1, not in place): CUDA runs the fused ``native_dropout`` and
  keeps a one-byte mask per element for backward; the CPU multiplies by a noise tensor of the
  input's dtype and keeps that (four bytes per element in float32), so on CPU rules GPT-2's nine
  dropouts at batch 8 x 512 keep 54 MiB more than on the GPU (``aten/src/ATen/native/Dropout.cpp``,
  ``is_fused_kernel_acceptable``). In-place, alpha and feature dropout take the noise path on
  CUDA too and are left as they are.
- ``F.rms_norm``: CUDA's fused kernel keeps the input, the weight and a float32 ``rstd`` per row;
  the CPU's composite keeps the normalised input too, see :mod:`memprofiler.estimate.cuda.fused_norms`.
- ``F.batch_norm`` and ``torch.lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu``: run as on the CPU, and
  logged where CUDA would hand them to cuDNN, which keeps a reserve space of its own size for
  backward (a stated margin, :mod:`memprofiler.estimate.cuda.cudnn_state`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from memprofiler.estimate.cuda import autocast as cuda_autocast
from memprofiler.estimate.cuda.attention import AttentionLog, attention
from memprofiler.estimate.cuda.cudnn_state import GATES, CudnnStateLog
from memprofiler.estimate.cuda.fused_norms import fused_rms_norm
from memprofiler.estimate.cuda.target import CudaTarget

_SDPA = (F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)
_DROPOUT = (F.dropout, torch.dropout)
_RMS_NORM = tuple(
    f for f in (getattr(F, "rms_norm", None), getattr(torch, "rms_norm", None)) if f is not None
)
_RNN = {getattr(torch, name): name for name in GATES}
#: ``loss.backward()``: a mode is off while it handles a call, and the call's own work would find
#: no mode; so the backward is run through the engine with the mode back on, or a checkpointed
#: block's recomputation (run by backward) would dispatch as the CPU does and save other tensors
#: than its forward did (``CheckpointError`` on LLaMA with gradient checkpointing).
_BACKWARD = (torch.Tensor.backward, torch.autograd.backward)


#: The calls this mode routes or logs itself (autocast's casts aside).
_ROUTED = frozenset([*_BACKWARD, *_SDPA, *_DROPOUT, F.batch_norm, *_RNN, *_RMS_NORM])


def _run_backward(mode: TorchFunctionMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func`` (``Tensor.backward`` or ``torch.autograd.backward``) with ``mode`` on during the engine's run."""
    try:
        from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
        from torch.autograd.graph import _engine_run_backward
    except ImportError:  # a torch without these: backward runs as before, without the mode
        return func(*args, **kwargs)
    if func is torch.Tensor.backward:
        names: tuple[str, ...] = ("gradient", "retain_graph", "create_graph", "inputs")
        got = {**dict(zip(names, args[1:], strict=False)), **kwargs}
        tensors, grads = (args[0],), got.get("gradient")
    else:
        names = ("tensors", "grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")
        got = {**dict(zip(names, args, strict=False)), **kwargs}
        tensors = (got["tensors"],) if isinstance(got["tensors"], torch.Tensor) else tuple(got["tensors"])
        grads = got.get("grad_tensors")
    inputs = got.get("inputs")
    if not all(isinstance(t, torch.Tensor) for t in tensors) or (
        inputs is not None and not isinstance(inputs, (tuple, list))
    ):
        return func(*args, **kwargs)  # gradient edges, a single input tensor: left to torch
    create = bool(got.get("create_graph") or False)
    retain = got.get("retain_graph")
    with mode:
        grads_ = _make_grads(
            tensors, _tensor_or_tensors_to_tuple(grads, len(tensors)), is_grads_batched=False
        )
        _engine_run_backward(
            tensors,
            grads_,
            create if retain is None else retain,
            create,
            tuple(inputs) if inputs is not None else (),
            allow_unreachable=True,
            accumulate_grad=True,
        )
    return None


def _dropout(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[torch.Tensor, float] | None:
    """The input and p of a dropout CUDA would fuse, else None."""
    names = ("input", "p", "training", "inplace")
    got = {"p": 0.5, "training": True, "inplace": False, **dict(zip(names, args, strict=False)), **kwargs}
    if "train" in kwargs:  # torch.dropout(input, p, train)
        got["training"] = kwargs["train"]
    x, p = got["input"], float(got["p"])
    if not isinstance(x, torch.Tensor) or got["inplace"] or not got["training"]:
        return None
    if not (0 < p < 1) or x.numel() == 0:
        return None
    return x, p


class CudaDispatch(TorchFunctionMode):
    """Routes the calls whose CPU and CUDA paths keep different tensors to CUDA's path."""

    def __init__(self, target: CudaTarget) -> None:
        super().__init__()
        self.target = target
        self.log = AttentionLog()
        self.fused_dropouts = 0
        self.fused_rms_norms = 0
        self.cudnn = CudnnStateLog()

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func not in _ROUTED and not cuda_autocast.casts(func):
            return func(*args, **kwargs)  # most calls (a tensor's attributes, every op): as they are
        if func in _BACKWARD:
            return _run_backward(self, func, args, kwargs)
        if func in _SDPA:
            return attention(self.log, self.target, args, kwargs)
        if func in _DROPOUT:
            found = _dropout(args, kwargs)
            if found is not None:
                self.fused_dropouts += 1
                return torch.ops.aten.native_dropout(found[0], found[1], True)[0]
        if func is F.batch_norm:
            self.cudnn.batch_norm(args, kwargs)
        elif func in _RNN:
            self.cudnn.rnn(_RNN[func], args)
        args, kwargs = cuda_autocast.cast(func, args, kwargs)
        if func in _RMS_NORM:
            out = fused_rms_norm(args, kwargs, self.target.torch_version, self.target.sms)
            if out is not None:
                self.fused_rms_norms += 1
                return out
        return func(*args, **kwargs)

    def notes(self) -> list[str]:
        out = self.log.notes(self.target)
        if self.fused_dropouts:
            out.append(
                f"dropout: {self.fused_dropouts} call(s) as CUDA's fused native_dropout (a 1-byte mask kept for "
                "backward, where the CPU keeps a noise tensor of the input's dtype)"
            )
        if self.fused_rms_norms:
            out.append(
                f"rms_norm: {self.fused_rms_norms} call(s) as CUDA's fused kernel (the input, the weight and a "
                "float32 rstd per row kept for backward, where the CPU's composite keeps the normalised input too)"
            )
        return out
