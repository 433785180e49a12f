"""What an estimate cannot model gets one line and a stated margin in the fits decision."""

from __future__ import annotations

import torch
from torch import nn

from memprofiler.estimate import estimate_memory
from memprofiler.estimate.cuda.margins import COMPILE_FRACTION, CUSTOM_OP_FRACTION, margins
from memprofiler.estimate.result import MemoryEstimate

SGD = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731


def _net() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def test_a_plain_model_has_no_margin():
    est = estimate_memory(_net(), torch.randn(2, 16), optimizer=SGD, gpu="H100")
    assert est.margin_bytes == 0
    assert not any(n.startswith("margin") for n in est.notes)


def test_nccl_buffers_margin_for_a_distributed_strategy(monkeypatch):
    assert [m.nbytes for m in margins(_net(), 10**9, "ddp", 8, set(), {})] == [4 * 2**20 * 2 * 32 * 2]
    assert [m.nbytes for m in margins(_net(), 10**9, "fsdp", 2, set(), {"NCCL_BUFFSIZE": "1048576"})] == [
        2**20 * 2 * 32 * 2
    ]
    assert margins(_net(), 10**9, "ddp", 1, set(), {}) == []  # one rank: no communicator


def test_compiled_model_and_custom_ops_get_a_fraction_of_the_peak():
    net = _net()
    net[0].compile()  # a compiled submodule
    (compiled,) = margins(net, 1000, "single", 1, set(), {})
    assert compiled.nbytes == int(1000 * COMPILE_FRACTION) and "torch.compile" in compiled.reason
    (custom,) = margins(_net(), 1000, "single", 1, {"mylib.fused_norm.default"}, {})
    assert custom.nbytes == int(1000 * CUSTOM_OP_FRACTION) and "mylib.fused_norm" in custom.reason


def test_a_custom_op_seen_in_the_step_adds_its_margin():
    @torch.library.custom_op("memprofiler_test::double", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @double.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(double(x))

    with torch.device("meta"):
        net = Net()
    est = estimate_memory(net, torch.randn(2, 16), optimizer=SGD, gpu="H100")
    assert est.margin_bytes == int(est.peak_bytes * CUSTOM_OP_FRACTION)
    assert any("memprofiler_test.double" in n for n in est.notes if n.startswith("margin"))


def test_the_margin_counts_in_fits():
    est = MemoryEstimate(peak_bytes=1000, tensor_peak_bytes=1000, reserved_peak_bytes=2000, margin_bytes=500)
    assert est.headroom(3000) == 500
    assert not est.fits(2400)
