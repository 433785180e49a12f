"""cuDNN's reserve spaces (batch norm, recurrent layers) get stated margins for a CUDA target; a
checkpointed block's recomputation dispatches as CUDA would, like its forward."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from memprofiler.estimate import estimate_memory
from memprofiler.estimate.cuda import stats as cuda_stats
from memprofiler.estimate.cuda.cudnn_state import batch_norm_on_cudnn
from memprofiler.estimate.parallel import strategies

SGD = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731


def _sum(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    out = model(batch)
    return (out[0] if isinstance(out, tuple) else out).sum()


def _margins(est) -> list[str]:
    return [n for n in est.notes if n.startswith("margin")]


def test_batch_norm_margin_is_one_bit_per_input_element_of_each_cudnn_call(monkeypatch):
    from memprofiler.estimate.cuda import workspaces

    # (the convolution's own workspace margin is tests/estimate/test_conv_workspaces.py's: off here)
    monkeypatch.setattr(workspaces, "conv_workspace_envelope", lambda func, args, out: 0)
    # GIVEN two float32 BatchNorm2d layers on a 4 x 8 x 16 x 16 input (cuDNN on CUDA), two steps
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.BatchNorm2d(8))
    est = estimate_memory(model, torch.zeros(4, 3, 16, 16), optimizer=SGD, loss_fn=_sum, gpu="H200", steps=2)
    # THEN the margin is one step's allowance: 2 calls x 2,048 elements / 8 bits
    elements = 4 * 8 * 16 * 16
    assert est.margin_bytes == 2 * math.ceil(elements / 8) == 2048
    assert any(
        "cuDNN batch norm keeps a reserve space" in n and "2 call(s) a step" in n for n in _margins(est)
    )
    # AND a CPU estimate (no CUDA target) has none
    cpu = estimate_memory(model, torch.zeros(4, 3, 16, 16), optimizer=SGD, loss_fn=_sum, device="cpu")
    assert cpu.margin_bytes == 0


@pytest.mark.parametrize(
    ("dtype", "weight", "bias", "eps", "rows", "expected"),
    [
        (torch.float32, torch.float32, True, 1e-5, 8, True),
        (torch.bfloat16, torch.bfloat16, True, 1e-5, 8, False),  # bfloat16: torch's native CUDA kernel
        (torch.float16, torch.float16, True, 1e-5, 8, False),  # half needs a float32 weight
        (torch.float16, torch.float32, True, 1e-5, 8, True),
        (torch.float32, torch.float32, False, 1e-5, 8, False),  # affine=False: no weight/bias
        (torch.float32, torch.float32, True, 1e-6, 8, False),  # eps below cuDNN's minimum
        (torch.float32, torch.float32, True, 1e-5, 880_802, False),  # too many rows for cuDNN
    ],
)
def test_cudnn_batch_norm_follows_batch_norm_impl_index(dtype, weight, bias, eps, rows, expected):
    x = torch.empty(rows, 4, 2, dtype=dtype, device="meta")
    w = torch.empty(4, dtype=weight, device="meta") if bias else None
    b = torch.empty(4, dtype=weight, device="meta") if bias else None
    stats = torch.empty(4, device="meta")
    assert batch_norm_on_cudnn(x, w, b, stats, stats, True, eps) is expected


def test_lstm_margin_is_every_gate_per_step_layer_and_direction():
    # GIVEN a 2-layer bidirectional LSTM (hidden 16) over 5 steps of a batch of 3, float32
    model = nn.LSTM(8, 16, num_layers=2, bidirectional=True)
    est = estimate_memory(model, torch.zeros(5, 3, 8), optimizer=SGD, loss_fn=_sum, gpu="H200", steps=1)
    # THEN the allowance is 2 layers x 2 directions x 5 steps x 3 x (4 gates x 16) x 4 bytes
    assert est.margin_bytes == 2 * 2 * 5 * 3 * 4 * 16 * 4 == 15_360
    assert any("cuDNN lstm keeps a reserve space" in n for n in _margins(est))


class Checkpointed(nn.Module):
    """Grouped-query attention inside a non-reentrant checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(64, 64)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x).view(2, 16, 4, 16).transpose(1, 2)
        kv = q[:, :2]
        return F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.attend, x, use_reentrant=False)


def test_a_checkpointed_block_recomputes_with_cudas_kernels():
    # GIVEN attention in a non-reentrant checkpoint, estimated for an H200: the forward takes
    # CUDA's math path (grouped-query, float32); before, backward ran without the CUDA view, so
    # the recomputation took the CPU's kernel, saved other tensors and torch raised CheckpointError
    est = estimate_memory(
        Checkpointed(), torch.zeros(2, 16, 64), optimizer=SGD, loss_fn=_sum, gpu="H200", steps=1
    )
    # THEN the recomputation is dispatched as CUDA would too: two calls, both CUDA's math kernel
    assert any("2 call(s) as CUDA's math kernel" in n for n in est.notes)


def test_layer_norm_keeps_float32_statistics_for_half_inputs_on_cuda(monkeypatch):
    # GIVEN a LayerNorm over 4,096 rows of bfloat16 (bf16-true), estimated for an H200
    def run() -> object:
        with torch.device("meta"):
            model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
        return estimate_memory(
            model,
            torch.zeros(4096, 8, dtype=torch.bfloat16),
            optimizer=SGD,
            loss_fn=_sum,
            precision="bf16-true",
            gpu="H200",
            steps=1,
        )

    cuda = run()
    monkeypatch.setattr(cuda_stats.FloatStats, "after", lambda s, f, a, k, out: out)
    cpu_rules = run()
    # THEN mean and rstd (4,096 each) are saved in float32 as layer_norm_cuda keeps them, where the
    # CPU kernel keeps bfloat16: 2 x 4,096 x 2 B more saved for backward
    assert cuda.saved_bytes - cpu_rules.saved_bytes == 2 * 4096 * 2
    assert any("1 layer/batch norm call(s) on half-precision inputs keep float32" in n for n in cuda.notes)


@pytest.mark.parametrize(("precision", "size"), [("bf16-true", 2), ("16-true", 2), ("32-true", 4)])
def test_true_half_precision_estimates_hold_half_size_parameters(precision, size):
    # GIVEN a meta-built model estimated at a "-true" precision (bf16-true raised "Couldn't swap
    # Linear.weight": the cast ran on fake parameters fake mode holds weak references to)
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    est = estimate_memory(
        model, torch.zeros(16, 8), optimizer=SGD, loss_fn=lambda m, b: m(b.to(m[0].weight.dtype)).sum(),
        precision=precision, device="cpu", steps=1,
    )  # fmt: skip
    # THEN the parameters are (64 + 8 + 8 + 8) elements of the precision's size
    assert est.resident["parameters"] == (64 + 8 + 8 + 8) * size


@pytest.mark.parametrize("precision", ["bf16-true", "16-true"])
def test_a_true_half_precision_converts_the_batch_as_lightning_does(precision):
    # GIVEN a float32 batch (Lightning's convert_input turns its floats to the precision's dtype
    # on the host, before the batch reaches the device; a real step with a float32 input and
    # half weights would fail) and the same batch already in half precision
    def estimate(batch: torch.Tensor):
        with torch.device("meta"):
            model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))
        return estimate_memory(
            model, batch, optimizer=SGD, loss_fn=lambda m, b: m(b).float().pow(2).mean(),
            precision=precision, device="cpu", steps=1,
        )  # fmt: skip

    as_float = estimate(torch.randn(512, 256))
    as_half = estimate(torch.randn(512, 256).to(strategies.param_dtype(precision)))
    # THEN both count the same, the batch and the activations at 2 bytes per element: saved for
    # backward are the input and the ReLU output (which the second Linear saves too) in half
    # precision, and the loss's float32 copy of the output
    assert as_float.tensor_peak_bytes == as_half.tensor_peak_bytes
    assert as_float.saved_bytes == as_half.saved_bytes == 2 * 512 * (256 + 1024) + 4 * 512 * 256
