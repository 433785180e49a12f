"""``MemProfilerCLI estimate``'s output directory: a bucket works as a local directory does, and
an almost-right URL fails before estimating, naming the key."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from memprofiler import layout
from memprofiler.lightning.cli import MemProfilerCLI

D, H, O = 32, 64, 4
PARAM_BYTES = 4 * (D * H + H + H * O + O)


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, O))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.randn(16, D)), batch_size=8)


def _estimate(save_dir: str) -> None:
    MemProfilerCLI(
        Tiny,
        args=["estimate", "--trainer.accelerator", "cpu", "--estimate.save_dir", save_dir],
        save_config_callback=None,
    )


def test_a_bucket_receives_the_estimate(s3_bucket, capsys, tmp_path, monkeypatch):
    # GIVEN the estimate's output directory in a bucket on a real S3-compatible server
    import s3fs

    monkeypatch.chdir(tmp_path)
    url = f"{s3_bucket}/est"
    # WHEN the estimate runs
    _estimate(url)
    # THEN memory_estimate.yaml is an object there, with the exact parameter bytes, and not local
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    data = yaml.safe_load(fs.cat_file(f"{url.removeprefix('s3://')}/{layout.MEMORY_ESTIMATE_YAML}"))
    assert data["estimates"][0]["resident"]["parameters"] == PARAM_BYTES
    assert f"written: {url}/{layout.MEMORY_ESTIMATE_YAML}" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_an_almost_right_url_fails_before_estimating(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        _estimate("s3:/bucket/est")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error: `estimate.save_dir`: 's3:/bucket/est' is not a valid s3 URL" in err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []
