"""A model that cannot run on fake tensors gets one line naming the op and the module."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memprofiler.errors import ConfigError
from memprofiler.estimate import estimate_memory

SGD = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
FIX = r"; estimate with real tensors on CPU \(`fake=False`, `--estimate.fake false`\)$"


@torch.library.custom_op("memprofiler_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


twice.register_autograd(lambda ctx, g: g * 2)


class Scaled(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.how == "item":
            return y * y.sum().item()
        if self.how == "nonzero":
            return y[y.nonzero()[:, 0]]
        return twice(y)


@pytest.mark.parametrize(
    "how,line",
    [
        ("item", "op `aten._local_scalar_dense.default` in module `head` needs tensor data"),
        ("nonzero", "op `aten.nonzero.default` in module `head` has a data-dependent output shape"),
        ("custom", "op `memprofiler_test::twice` in module `head` has no fake \\(meta\\) kernel"),
    ],
)
def test_fake_failure_names_op_and_module_and_real_tensors_work(how, line):
    # GIVEN a model whose `head` cannot run on fake tensors
    model = nn.Sequential()
    model.add_module("body", nn.Linear(4, 4))
    model.add_module("head", Scaled(how))
    x = torch.randn(2, 4)
    # WHEN estimated on fake tensors THEN one line names the op, the module and the fix
    with pytest.raises(ConfigError, match=rf"^`estimate.fake`: {line}.*{FIX}") as err:
        estimate_memory(model, x, optimizer=SGD)
    assert "\n" not in str(err.value)
    # AND on real CPU tensors the estimate runs, with the exact parameter bytes
    est = estimate_memory(model, x, optimizer=SGD, fake=False, device="cpu")
    assert est.resident["parameters"] == 2 * 4 * (16 + 4)
    assert est.fake is False
