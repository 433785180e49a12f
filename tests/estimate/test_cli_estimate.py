"""``MemProfilerCLI estimate``: the fit config unchanged, a table, ``memory_estimate.yaml``."""

from __future__ import annotations

from pathlib import Path
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
    def __init__(self, batch_size: int = 8) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.net = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, O))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.randn(64, D)), batch_size=self.batch_size)


def run(tmp_path: Path, *args: str) -> dict[str, Any]:
    MemProfilerCLI(
        Tiny,
        args=["estimate", "--trainer.accelerator", "cpu", "--estimate.save_dir", str(tmp_path), *args],
        save_config_callback=None,
    )
    text = (tmp_path / layout.MEMORY_ESTIMATE_YAML).read_text()
    assert text.startswith(layout.YAML_HEADER + "\n")
    data = yaml.safe_load(text)
    assert text.rstrip().endswith(layout.YAML_BLOCK_END.format(n=len(data)))
    return data


def test_batch_sizes_give_one_row_each_with_exact_resident_bytes(tmp_path, capsys):
    # GIVEN the fit config of a tiny model and two batch sizes
    data = run(tmp_path, "--estimate.batch_size", "[8, 16]", "--estimate.device_memory", "1GiB")
    # THEN one estimate per batch size, parameters / gradients / AdamW state exact
    rows = data["estimates"]
    assert [r["batch_size"] for r in rows] == [8, 16]
    for r in rows:
        assert r["resident"]["parameters"] == PARAM_BYTES
        assert r["resident"]["gradients"] == PARAM_BYTES
        # the two moments; the 4 step counts stay on the host for the estimate's CUDA target
        assert r["resident"]["optimizer_state"] == 2 * PARAM_BYTES
        assert r["strategy"] == "single"
    # AND the larger batch saves more for backward: x, the ReLU output and the output per row
    assert rows[1]["saved_bytes"] - rows[0]["saved_bytes"] == 4 * 8 * (D + H + O)
    assert data["largest_fitting_batch_size"] == 16
    out = capsys.readouterr().out
    # the title names the CUDA target assumed (this machine's GPU, else the stated default)
    assert "memory estimate per rank: single, world_size 1, 32-true, " in out
    assert "(sm" in out and "torch 2." in out
    assert "yes, " in out and "not modelled: " in out


def test_auto_finds_the_largest_batch_that_fits(tmp_path):
    # GIVEN an H100 target, torch 2.13 (two 32 MiB cuBLAS workspaces, the Lt one shared) and a device
    # of 104 MiB less a 38 MiB reserve: 2 MiB left for the step beside the workspaces
    data = run(
        tmp_path,
        "--estimate.batch_size",
        "auto",
        "--estimate.device_memory",
        "104MiB",
        "--estimate.reserve",
        "38MiB",
        "--estimate.gpu",
        "H100",
        "--estimate.torch_version",
        "2.13",
    )
    best = data["largest_fitting_batch_size"]
    by_size = {r["batch_size"]: r for r in data["estimates"]}
    assert by_size[best]["workspace_bytes"] == {"cublas": 64 * 2**20}
    budget = 66 * 2**20
    # THEN the answer fits and one more row does not
    assert max(by_size[best]["reserved_peak_bytes"], by_size[best]["peak_bytes"]) <= budget
    assert best + 1 in by_size
    assert max(by_size[best + 1]["reserved_peak_bytes"], by_size[best + 1]["peak_bytes"]) > budget


def test_ddp_world_size_adds_buckets(tmp_path):
    data = run(tmp_path, "--trainer.strategy", "ddp", "--estimate.world_size", "8")
    (row,) = data["estimates"]
    assert (row["strategy"], row["world_size"]) == ("ddp", 8)
    assert row["by_category"]["ddp_buckets"] == PARAM_BYTES


def test_auto_without_device_memory_is_one_line_and_exit_code_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        run(tmp_path, "--estimate.batch_size", "auto")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "`estimate.batch_size`: `auto` needs `--estimate.device_memory` (e.g. 80GiB)" in err


class FrozenFirst(Tiny):
    """The fine-tuning set-up: the first layer frozen."""

    def __init__(self, batch_size: int = 8) -> None:
        super().__init__(batch_size)
        self.net[0].requires_grad_(False)


class ReturnsAClass(Tiny):
    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW


def test_a_frozen_layer_has_no_gradient_or_optimizer_state(tmp_path):
    # GIVEN the fit config of a model whose first layer is frozen
    MemProfilerCLI(
        FrozenFirst,
        args=[
            *(
                "estimate",
                "--trainer.accelerator",
                "cpu",
                "--trainer.strategy",
                "ddp",
                "--estimate.world_size",
                "2",
            ),
            "--estimate.save_dir",
            str(tmp_path),
        ],
        save_config_callback=None,
    )
    (row,) = yaml.safe_load((tmp_path / layout.MEMORY_ESTIMATE_YAML).read_text())["estimates"]
    trainable = 4 * (H * O + O)
    # THEN all parameters are held; gradients, buckets and AdamW state only for the head
    assert row["resident"] == {
        "parameters": PARAM_BYTES,
        "buffers": 0,
        "gradients": trainable,
        "optimizer_state": 2 * trainable,  # the step counts stay on the host
    }
    assert row["by_category"]["ddp_buckets"] == trainable


def test_configure_optimizers_returning_a_class_is_one_line_and_exit_code_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        MemProfilerCLI(
            ReturnsAClass,
            args=["estimate", "--trainer.accelerator", "cpu", "--estimate.save_dir", str(tmp_path)],
            save_config_callback=None,
        )
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        "`model.configure_optimizers`: returned the class `AdamW`, not an optimizer; estimate needs a "
        "torch.optim.Optimizer" in err
    )
    assert "Traceback" not in err
