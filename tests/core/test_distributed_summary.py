"""The cross-rank summary: pure statistics, the two transports, and failure handling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
import yaml
from torch import nn

from memprofiler import MemProfilerCallback, layout, memprofilable
from memprofiler.core import summary as distributed
from memprofiler.core.summary import gather_collective, gather_via_store, summarize, write_summary

PER_RANK = {
    0: {
        "0.training_step.2.start": {"rss": 100, "flag": True, "dev": "cpu"},
        "0.training_step.2.end": {"rss": 120, "fsdp.peak.total": 10, "saved_tensors.by_module": {"net.0": 4}},
    },
    1: {
        "1.training_step.2.start": {"rss": 300},
        "1.training_step.2.end": {"rss": 120, "fsdp.peak.total": 30, "saved_tensors.by_module": {"net.0": 8}},
    },
    2: {
        "2.training_step.2.start": {"rss": 200},
        "2.training_step.2.end": {"rss": 90, "fsdp.peak.total": 20, "only_here": 0},
    },
}


def test_min_max_mean_argmax_and_imbalance_per_metric():
    # GIVEN three ranks' snapshots WHEN summarized
    s = summarize(PER_RANK)
    # THEN keys drop the rank, and each numeric metric has exact cross-rank statistics
    assert s["world_size"] == 3
    assert s["ranks"] == [0, 1, 2]
    assert set(s["snapshots"]) == {"training_step.2.start", "training_step.2.end"}
    assert s["snapshots"]["training_step.2.start"]["rss"] == {
        "min": 100,
        "max": 300,
        "mean": 200.0,
        "argmax_rank": 1,
        "imbalance": 1.5,
        "n_ranks": 3,
    }
    peak = s["snapshots"]["training_step.2.end"]["fsdp.peak.total"]
    assert (peak["min"], peak["max"], peak["mean"], peak["argmax_rank"]) == (10, 30, 20.0, 1)
    assert peak["imbalance"] == pytest.approx(1.5)


def test_ties_nested_partial_and_non_numeric_metrics():
    end = summarize(PER_RANK)["snapshots"]["training_step.2.end"]
    # a tie for the max goes to the lowest rank
    assert end["rss"]["argmax_rank"] == 0
    assert end["rss"]["imbalance"] == pytest.approx(120 / 110)
    # nested mappings are flattened with dots; a metric some ranks lack counts the others
    assert end["saved_tensors.by_module.net.0"] == {
        "min": 4,
        "max": 8,
        "mean": 6.0,
        "argmax_rank": 1,
        "imbalance": pytest.approx(8 / 6),
        "n_ranks": 2,
    }
    # a zero mean has no imbalance; booleans and strings are not metrics
    assert end["only_here"]["imbalance"] is None
    start = summarize(PER_RANK)["snapshots"]["training_step.2.start"]
    assert "flag" not in start and "dev" not in start


def test_write_summary_lists_missing_ranks_and_is_plain_yaml(tmp_path):
    path = write_summary(tmp_path, {0: PER_RANK[0], 2: PER_RANK[2]}, world_size=3)
    assert path == tmp_path / layout.MEMORY_SUMMARY_YAML
    data = yaml.safe_load(path.read_text())
    assert data["missing_ranks"] == [1]
    assert data["snapshots"]["training_step.2.start"]["rss"]["max"] == 200


@pytest.fixture
def world1(tmp_path: Path) -> Any:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_transports_round_trip_the_snapshots(world1):
    snaps = PER_RANK[0]
    assert gather_collective(snaps) == {0: snaps}
    got = gather_via_store(snaps, generation=1, timeout_s=1.0)
    assert got == {0: snaps}


def test_store_exchange_waits_a_bounded_time_for_absent_ranks(world1, monkeypatch, tmp_path):
    # GIVEN a world of 2 where rank 1 never posts (it is stuck elsewhere)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    # WHEN rank 0 collects after an exception THEN it returns what it has, after the timeout
    got = gather_via_store(PER_RANK[0], generation=7, timeout_s=0.2)
    assert got == {0: PER_RANK[0]}
    data = yaml.safe_load(write_summary(tmp_path, got, world_size=2).read_text())
    assert data["missing_ranks"] == [1]


def test_no_process_group_means_no_summary(tmp_path):
    assert not distributed.dist_ready()
    assert distributed.gather_and_write_summary(PER_RANK[0], tmp_path) is None
    assert not (tmp_path / layout.MEMORY_SUMMARY_YAML).exists()
    with pytest.raises(RuntimeError, match="not initialized"):
        gather_collective(PER_RANK[0])


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @memprofilable
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.lin(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.randn(12, 4), batch_size=4)


def _fit(save_dir: Path) -> None:
    pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[MemProfilerCallback({"save_dir": str(save_dir)})],
    ).fit(Tiny())


def test_gather_failure_warns_and_keeps_the_rank_files(world1, tmp_path, monkeypatch):
    # GIVEN a process group whose gather fails
    def broken(snapshots: Any) -> Any:
        raise RuntimeError("connection reset by peer")

    monkeypatch.setattr(distributed, "gather_collective", broken)
    # WHEN fit ends THEN a warning says why, and this rank's own file is complete
    with pytest.warns(
        UserWarning, match="could not gather snapshots across ranks .*connection reset by peer"
    ):
        _fit(tmp_path)
    assert not (tmp_path / layout.MEMORY_SUMMARY_YAML).exists()
    stats = yaml.safe_load((tmp_path / layout.MEMORY_STATS_YAML.format(rank=0)).read_text())
    assert set(stats) == {"0.training_step.2.start", "0.training_step.2.end"}


def test_one_rank_group_writes_a_summary_equal_to_its_file(world1, tmp_path):
    _fit(tmp_path)
    stats = yaml.safe_load((tmp_path / layout.MEMORY_STATS_YAML.format(rank=0)).read_text())
    summary = yaml.safe_load((tmp_path / layout.MEMORY_SUMMARY_YAML).read_text())
    rss = stats["0.training_step.2.end"]["rss"]
    assert summary["snapshots"]["training_step.2.end"]["rss"] == {
        "min": rss,
        "max": rss,
        "mean": float(rss),
        "argmax_rank": 0,
        "imbalance": 1.0,
        "n_ranks": 1,
    }
