"""cuDNN's convolution workspace for a CUDA target: a measured envelope, added to the fits margin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from memprofiler import estimate_memory
from memprofiler.estimate.cuda import workspaces
from memprofiler.estimate.cuda.workspaces import CONV_ENVELOPE, conv_workspace_envelope

_aten = torch.ops.aten
FIXTURE = Path(__file__).parents[1] / "fixtures" / "gpu_h200" / "conv_workspaces_h200.json"


def _measured() -> list[dict]:
    return [r for r in json.loads(FIXTURE.read_text())["bench0"]["rows"] if "error" not in r]


def _meta(r: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dtype = getattr(torch, r["dtype"])
    x = torch.empty(r["x"], dtype=dtype, device="meta")
    w = torch.empty(r["w"], dtype=dtype, device="meta")
    dims = len(r["x"]) - 2
    stride, pad = [r["stride"]] * dims, [r["pad"]] * dims
    y = _aten.convolution(x, w, None, stride, pad, [1] * dims, False, [0] * dims, r["groups"])
    return x, w, y


def test_every_workspace_measured_on_the_h200_is_inside_the_envelope():
    # GIVEN 80 convolutions measured on an H200 (cuDNN 9.19, benchmark off): forward and backward
    rows = _measured()
    assert len(rows) >= 80
    most = {"forward": 0.0, "backward": 0.0}
    for r in rows:
        x, w, y = _meta(r)
        fwd = conv_workspace_envelope(_aten.convolution.default, (x, w), y)
        bwd = conv_workspace_envelope(_aten.convolution_backward.default, (y, x, w), None)
        # THEN the envelope covers what cuDNN took, at the first call of the shape and after
        assert max(r["fwd_first"], r["fwd_second"]) <= fwd, r
        assert max(r["bwd_first"], r["bwd_second"], r["dgrad_second"], r["wgrad_second"]) <= bwd, r
        largest = max(t.numel() for t in (x, w, y)) * 4
        most["forward"] = max(most["forward"], max(r["fwd_first"], r["fwd_second"]) / largest)
        most["backward"] = max(most["backward"], r["bwd_second"] / largest)
    # AND it is the measured maximum rounded up to a quarter, not a looser guess
    for kind, ratio in most.items():
        assert CONV_ENVELOPE[kind] - 0.25 < ratio <= CONV_ENVELOPE[kind]


def _conv_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).pow(2).mean()


def _conv() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1))


def test_the_fits_margin_is_how_far_the_peak_would_rise_were_a_convolution_to_take_its_envelope(monkeypatch):
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    x = torch.randn(4, 3, 32, 32)

    def estimate(envelope: int):
        monkeypatch.setattr(workspaces, "conv_workspace_envelope", lambda func, args, out: envelope)
        return estimate_memory(
            _conv(), x, optimizer=sgd, loss_fn=_conv_loss, gpu="H100", torch_version="2.11"
        )

    # GIVEN an envelope of 1 GiB at every convolution, far above the step's own memory, and of 0
    gib = 1 << 30
    big, none = estimate(gib), estimate(0)
    assert any(n.startswith("margin ") and "cuDNN convolution workspaces" in n for n in big.notes)
    # THEN the margin is how much more the caching allocator would reserve: a 1 GiB segment on top
    # of what was reserved at the first convolution, less what the step reserved after it (the
    # twin serves later requests from that segment); at most 1 GiB, at least 1 GiB less the
    # reserved peak (the other margins, cuDNN's reserve spaces, are the same)
    assert (big.peak_bytes, big.reserved_peak_bytes) == (none.peak_bytes, none.reserved_peak_bytes)
    assert gib - big.reserved_peak_bytes <= big.margin_bytes - none.margin_bytes <= gib
    # AND on CPU rules there is no cuDNN, so no such margin
    cpu = estimate_memory(_conv(), x, optimizer=sgd, loss_fn=_conv_loss, device="cpu")
    assert not any("cuDNN convolution workspaces" in n for n in cpu.notes)


@pytest.mark.parametrize("kind", ["forward", "backward"])
def test_the_envelope_counts_half_precision_operands_in_float32_bytes(kind):
    x = torch.empty(2, 8, 16, 16, dtype=torch.bfloat16, device="meta")
    w = torch.empty(8, 8, 3, 3, dtype=torch.bfloat16, device="meta")
    y = torch.empty(2, 8, 16, 16, dtype=torch.bfloat16, device="meta")
    func = _aten.convolution.default if kind == "forward" else _aten.convolution_backward.default
    args = (x, w) if kind == "forward" else (y, x, w)
    assert conv_workspace_envelope(func, args, y) == int(2 * 8 * 16 * 16 * 4 * CONV_ENVELOPE[kind])
