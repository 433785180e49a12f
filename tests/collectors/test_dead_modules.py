"""A module made inside a forward and gone before backward: torch's trackers skip its backward
hooks with a ``UserWarning: Module is None`` per module and step; memprofiler's skip them quietly,
in the estimate and at run time, with the same figures."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn

from conftest import make_trainer
from memprofiler import MemProfilerCallback, memprofilable
from memprofiler.estimate import estimate_memory


class MadeInForward(nn.Module):
    """A head built in every forward (as some models build a bias or a projection on the fly)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.Linear(8, 8)(self.body(x)).sum()


def _dead_module_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "Module is None" in str(w.message)]


def test_the_estimate_skips_a_dead_modules_backward_hooks_without_a_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est = estimate_memory(
            MadeInForward(), torch.randn(4, 8), optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), device="cpu"
        )
    assert _dead_module_warnings(caught) == []
    # the step still counts the body's weights and gradients (8 x 8 + 8 float32 each)
    assert est.to_dict()["resident"]["parameters"] == (8 * 8 + 8) * 4


class Lit(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = MadeInForward()

    @memprofilable
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.net(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.randn(16, 8), batch_size=4)


def test_the_module_wise_collector_skips_them_too(tmp_path: Path):
    cb = MemProfilerCallback(
        {"track_module_mem": True, "save_dir": str(tmp_path), "schedule": {"warmup": 0, "active": 2}}
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tmp_path, [cb], limit_train_batches=3).fit(Lit())
    assert _dead_module_warnings(caught) == []
    assert list(tmp_path.rglob("module_mem_rank_0_training_step_*.yaml"))
