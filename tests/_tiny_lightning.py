"""A tiny LightningModule shared by the extended-profiler, timeline and logger tests."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from memprofiler import memprofilable

#: Bytes of the tensor :class:`TinyModel` allocates inside every training step.
STEP_ALLOC_BYTES = 64 * 2**20


class TinyModel(pl.LightningModule):
    """Linear regression on random data; ``fail_at`` raises in that training call."""

    def __init__(self, fail_at: int | None = None, n_samples: int = 96) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.fail_at = fail_at
        self.n_samples = n_samples
        self.calls = 0
        #: Per training call: whether Lightning's module-name hooks were on the first layer.
        self.module_name_hooks: list[bool] = []

    @memprofilable
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.calls += 1
        hooks = self.net[0]._forward_pre_hooks.values()
        self.module_name_hooks.append(
            any(
                getattr(getattr(h, "func", None), "__name__", "") == "_start_recording_forward" for h in hooks
            )
        )
        if self.fail_at is not None and self.calls == self.fail_at:
            raise RuntimeError(f"injected failure in training call {self.calls}")
        # A known allocation inside the step, freed before it returns.
        scratch = torch.ones(STEP_ALLOC_BYTES // 4)
        del scratch
        x, y = batch
        loss = ((self.net(x) - y) ** 2).mean()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        gen = torch.Generator().manual_seed(0)
        data = TensorDataset(
            torch.randn(self.n_samples, 16, generator=gen), torch.randn(self.n_samples, 1, generator=gen)
        )
        return DataLoader(data, batch_size=8)


def quiet_trainer(root: Any, profiler: Any, steps: int, callbacks: list[Any] | None = None) -> pl.Trainer:
    """A CPU Trainer writing under ``root`` with no logger, checkpoints, summary or progress bar."""
    return pl.Trainer(
        default_root_dir=root,
        max_steps=steps,
        profiler=profiler,
        callbacks=callbacks or [],
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
