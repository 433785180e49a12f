"""Shared tiny models and Trainer helpers for the CPU test-suite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from _cuda_gate import skip_cuda_tests
from memprofiler import memprofilable

B, D, H, O = 8, 32, 64, 4


class TinyMLP(pl.LightningModule):
    """Two Linears; ``training_step`` may call ``self(x)`` or the submodule directly."""

    def __init__(self, call_submodule: bool = False, fail_at: int | None = None, n: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, O))
        self.call_submodule = call_submodule
        self.fail_at = fail_at
        self.n = n
        self.steps_run = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    @memprofilable
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps_run += 1
        if self.fail_at is not None and self.steps_run == self.fail_at:
            raise RuntimeError(f"injected failure in step {self.steps_run}")
        (x,) = batch
        out = self.net(x) if self.call_submodule else self(x)
        return out.pow(2).mean()

    @memprofilable
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        (x,) = batch
        self.log("val", self(x).pow(2).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.randn(self.n, D)), batch_size=B)

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.randn(2 * B, D)), batch_size=B)


def make_trainer(root: Path, callbacks: list[pl.Callback], **kwargs: Any) -> pl.Trainer:
    opts: dict[str, Any] = dict(
        default_root_dir=root,
        max_epochs=1,
        limit_train_batches=6,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    opts.update(kwargs)
    return pl.Trainer(callbacks=callbacks, **opts)


def step_trainer(root: Path, callbacks: list[pl.Callback], max_steps: int) -> pl.Trainer:
    """A quiet CPU Trainer that stops after ``max_steps`` optimizer steps."""
    return pl.Trainer(
        default_root_dir=root,
        max_steps=max_steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )


def load_stats(save_dir: Path, rank: int = 0) -> dict[str, dict[str, Any]]:
    path = save_dir / f"rank_{rank}_memory_stats.yaml"
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The one CUDA gate: tests marked ``cuda`` run where a GPU is, and skip with a reason elsewhere."""
    skip_cuda_tests(items, torch.cuda.is_available())


@pytest.fixture
def save_dir(tmp_path: Path) -> Path:
    return tmp_path / "memprofiler"


@pytest.fixture(params=["compiled", "compiled, tensors through python", "python"])
def packer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test with the compiled saved-tensor pack hook reading tensors in C++, again with it
    reading them through Python, and again with the Python hook."""
    from memprofiler.collectors import saved_tensors

    if request.param == "python":
        monkeypatch.setattr(saved_tensors, "_CPacker", None)
    elif saved_tensors._CPacker is None:
        pytest.skip("memprofiler._packer is not built (no C compiler when installed)")
    elif request.param == "compiled" and saved_tensors.NO_TENSOR_FACTS:
        pytest.skip(saved_tensors.NO_TENSOR_FACTS)
    elif request.param != "compiled":
        saved_tensors.read_tensors_in_cpp(False)
        request.addfinalizer(lambda: saved_tensors.read_tensors_in_cpp(True))
    return str(request.param)


# A disk that fills: the writers' seam raising ENOSPC after N bytes (full-disk tests).
from _disk_budget import disk  # noqa: E402

# Session fixtures with real run directories, for the command and report tests.
from run_fixtures import full_run, real_runs  # noqa: E402
from s3_server import s3_bucket, s3_server  # noqa: E402

__all__ = ["disk", "full_run", "real_runs", "s3_bucket", "s3_server"]
