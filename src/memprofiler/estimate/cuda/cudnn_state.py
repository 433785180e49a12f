"""State cuDNN keeps between forward and backward that only cuDNN sizes: stated allowances.

On CUDA, torch hands batch norm and recurrent layers to cuDNN where its rules allow, and cuDNN
returns a *reserve space* that autograd saves for backward, sized by cuDNN at run time
(``cudnnGetBatchNormalizationTrainingExReserveSpaceSize``, ``cudnnGetRNNTempSpaceSizes``); the
fake step runs the native kernels, which keep no such buffer. The estimate cannot know those
sizes, so it says where they apply and adds a stated margin to the fits decision:

- batch norm (``_batch_norm_impl_index`` in ``aten/src/ATen/native/Normalization.cpp``: training
  or not, cuDNN when the input is on CUDA and neither it nor the weight is bfloat16, half only
  with a float32 weight, weight and bias given, running statistics given (or neither, in
  training), at most 880,801 rows in training (65,535 in eval), fewer than 2^31 elements, eps at
  least cuDNN's minimum 1e-5, cuDNN enabled): an allowance of one bit per input element of every
  such call in a step (the size of the activation bitmask cuDNN's fused batch-norm modes keep);
- recurrent layers (``_cudnn_rnn``, taken whenever cuDNN is enabled and the input is on CUDA):
  an allowance of one copy of every gate's activation per time step, layer and direction
  (LSTM 4, GRU 3, plain RNN 1 gates of ``hidden_size``), in the input's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

#: ``detail::getCUDAHooks().batchnormMinEpsilonCuDNN()`` (``CUDNN_BN_MIN_EPSILON``).
CUDNN_BN_MIN_EPS = 1e-5
MAX_ROWS_TRAINING = 880_801
MAX_ROWS_EVAL = 65_535
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def batch_norm_on_cudnn(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
    eps: float,
) -> bool:
    """Whether ``_batch_norm_impl_index`` would call ``cudnn_batch_norm`` for this input on CUDA."""
    if weight is None or bias is None or not torch.backends.cudnn.enabled:
        return False
    if x.dtype == torch.bfloat16 or weight.dtype == torch.bfloat16:
        return False
    if x.dtype == torch.float16 and weight.dtype != torch.float32:
        return False
    stats = running_mean is not None and running_var is not None
    if not (stats or (running_mean is None and running_var is None and training)):
        return False
    rows = int(x.shape[0]) if x.dim() else 0
    if rows > (MAX_ROWS_TRAINING if training else MAX_ROWS_EVAL):
        return False
    return eps >= CUDNN_BN_MIN_EPS and x.numel() < 2**31 - 1


@dataclass
class CudnnStateLog:
    """What the step handed to cuDNN that keeps a reserve space (every call, all steps)."""

    bn_calls: int = 0
    bn_bits: int = 0
    rnn_calls: int = 0
    rnn_bytes: int = 0
    kinds: set[str] = field(default_factory=set)

    def batch_norm(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """One ``F.batch_norm`` call, counted when cuDNN would run it in training."""
        names = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
        got = {"training": False, "eps": 1e-5, **dict(zip(names, args, strict=False)), **kwargs}
        x = got.get("input")
        if not isinstance(x, torch.Tensor) or not got["training"]:
            return
        if batch_norm_on_cudnn(
            x,
            got.get("weight"),
            got.get("bias"),
            got.get("running_mean"),
            got.get("running_var"),
            True,
            got["eps"],
        ):
            self.bn_calls += 1
            self.bn_bits += x.numel()

    def rnn(self, kind: str, args: tuple[Any, ...]) -> None:
        """One ``torch.lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu`` call (the dense, not packed, form)."""
        if not torch.backends.cudnn.enabled or len(args) < 9 or not isinstance(args[0], torch.Tensor):
            return
        x, hx, params = args[0], args[1], args[2]
        num_layers, bidirectional, batch_first = int(args[4]), bool(args[7]), bool(args[8])
        if not (torch.is_grad_enabled() and any(getattr(p, "requires_grad", False) for p in params)):
            return
        if x.dim() != 3:  # a packed sequence's data: sized by its batch sizes, taken as one step
            steps, batch = 1, int(x.shape[0])
        else:
            steps, batch = (
                (int(x.shape[1]), int(x.shape[0])) if batch_first else (int(x.shape[0]), int(x.shape[1]))
            )
        h0 = hx[0] if isinstance(hx, (tuple, list)) else hx
        hidden = int(h0.shape[-1])
        dirs = 2 if bidirectional else 1
        self.rnn_calls += 1
        self.kinds.add(kind)
        self.rnn_bytes += num_layers * dirs * steps * batch * GATES[kind] * hidden * x.element_size()

    def margins(self, steps: int) -> list[tuple[str, int]]:
        """(reason, bytes per step) for each allowance that applies."""
        out = []
        steps = max(steps, 1)
        if self.bn_calls:
            n = math.ceil(self.bn_bits / 8 / steps)
            out.append(
                (
                    f"cuDNN batch norm keeps a reserve space for backward, sized by cuDNN ({self.bn_calls // steps} "
                    "call(s) a step; allowance one bit per input element)",
                    n,
                )
            )
        if self.rnn_calls:
            kinds = "/".join(sorted(self.kinds))
            out.append(
                (
                    f"cuDNN {kinds} keeps a reserve space for backward, sized by cuDNN ({self.rnn_calls // steps} "
                    "call(s) a step; allowance one copy of every gate's activation per step, layer and direction)",
                    self.rnn_bytes // steps,
                )
            )
        return out
