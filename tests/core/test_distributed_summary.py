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

from _ranks import launch
from _summary_ranks import WORLD4
from memprofiler import MemProfilerCallback, layout, memprofilable
from memprofiler.core import summary as distributed
from memprofiler.core.summary import (
    reduce_collective,
    summarize,
    write_cross_rank_summary,
    write_summary,
)
from memprofiler.core.summary_exchange import decode_values, encode_values, reduce_from_store
from memprofiler.core.summary_stats import RankMetrics, summary_from_partial

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


def test_collective_and_store_paths_agree_with_summarize_on_one_rank(world1, tmp_path):
    # GIVEN one rank's snapshots WHEN summarized through each transport
    via_collective = write_cross_rank_summary(PER_RANK[0], tmp_path / "c", rank=0, world_size=1)
    via_store = write_cross_rank_summary(
        PER_RANK[0], tmp_path / "s", rank=0, world_size=1, after_exception=True, timeout_s=1.0
    )
    # THEN both files hold exactly what the pure reduction gives
    expected = summarize({0: PER_RANK[0]})
    assert via_collective is not None and via_store is not None
    assert yaml.safe_load(via_collective.read_text()) == expected
    assert yaml.safe_load(via_store.read_text()) == expected


def test_rank_and_world_size_must_match_the_process_group(world1, tmp_path):
    with pytest.raises(RuntimeError, match="rank 1 of 2 given, but the process group says rank 0 of 1"):
        write_cross_rank_summary(PER_RANK[1], tmp_path, rank=1, world_size=2)


def test_store_exchange_waits_a_bounded_time_for_absent_ranks(world1, tmp_path):
    # GIVEN a world of 2 where rank 1 never posts (it is stuck elsewhere)
    store = dist.distributed_c10d._get_default_store()
    own = RankMetrics.from_snapshots(PER_RANK[0])
    # WHEN rank 0 collects after an exception THEN it returns what it has, after the timeout
    partial, ranks = reduce_from_store(store, own, world_size=2, generation=7, timeout_s=0.2)
    assert ranks == [0]
    assert summary_from_partial(partial) == summarize({0: PER_RANK[0]})["snapshots"]


def test_store_post_round_trips_values_and_integer_flags():
    metrics = RankMetrics.from_snapshots({"3.f.1.end": {"rss": 2**52 + 1, "frac": 0.25}})
    digest, values, not_int = decode_values(encode_values(metrics))
    assert digest == metrics.digest()
    assert values.tolist() == [2**52 + 1, 0.25]
    assert not_int.tolist() == [0.0, 1.0]


def test_integers_stay_integers_and_floats_stay_floats():
    s = summarize({0: {"0.f.1.end": {"n": 3, "x": 0.0}}, 1: {"1.f.1.end": {"n": 5, "x": 1.5}}})
    n, x = s["snapshots"]["f.1.end"]["n"], s["snapshots"]["f.1.end"]["x"]
    assert (type(n["min"]), type(n["max"]), n["mean"]) == (int, int, 4.0)
    assert (x["min"], x["max"], type(x["min"])) == (0.0, 1.5, float)


def test_no_process_group_means_no_summary(tmp_path):
    assert not distributed.dist_ready()
    assert distributed.gather_and_write_summary(PER_RANK[0], tmp_path) is None
    assert write_cross_rank_summary(PER_RANK[0], tmp_path, rank=0, world_size=1) is None
    assert not (tmp_path / layout.MEMORY_SUMMARY_YAML).exists()
    with pytest.raises(RuntimeError, match="not initialized"):
        reduce_collective(RankMetrics.from_snapshots(PER_RANK[0]))


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
    def broken(metrics: Any) -> Any:
        raise RuntimeError("connection reset by peer")

    monkeypatch.setattr(distributed, "reduce_collective", broken)
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


# ------------------------------------------------------------- 4 real gloo ranks on CPU


def _stats(lo: Any, hi: Any, mean: float, arg: int, n: int = WORLD4) -> dict[str, Any]:
    return {
        "min": lo,
        "max": hi,
        "mean": mean,
        "argmax_rank": arg,
        "imbalance": hi / mean if mean > 0 else None,
        "n_ranks": n,
    }


EXPECTED4 = {
    "training_step.1.start": {"rss": _stats(1000, 4000, 2500.0, 3), "vms": _stats(5000, 5000, 5000.0, 0)},
    "training_step.1.end": {
        "rss": _stats(1007, 4007, 2507.0, 3),
        "fsdp.peak.total": _stats(3, 9, 7.0, 1),
        "frac": _stats(0.0, 1.5, 0.75, 3),
        "saved_tensors.by_module.net.0": _stats(0, 3, 1.5, 3),
    },
}


def _launch4(out: Path, timeout: float = 240) -> list[str]:
    results = launch(lambda rank: ["-m", "_summary_ranks", str(rank), str(out)], WORLD4, timeout)
    for r in results:
        assert r.returncode == 0, r.stdout[-4000:]
        assert "worker finished" in r.stdout, r.stdout[-4000:]
    return [r.stdout for r in results]


@pytest.mark.slow
def test_four_gloo_ranks_reduce_exact_values(tmp_path):
    # GIVEN 4 gloo processes on CPU, each with known numbers
    _launch4(tmp_path)
    # WHEN they reduce through collectives with equal key sets
    same = yaml.safe_load((tmp_path / "same" / layout.MEMORY_SUMMARY_YAML).read_text())
    # THEN rank 0's file holds the exact statistics (strings are not metrics)
    assert same == {
        "world_size": 4,
        "ranks": [0, 1, 2, 3],
        "snapshots": EXPECTED4,
        "missing_ranks": [],
    }
    assert not (tmp_path / "same_rank1").exists()
    # WHEN key sets differ THEN the summary covers the union, counting only the reporting ranks
    odd = yaml.safe_load((tmp_path / "odd" / layout.MEMORY_SUMMARY_YAML).read_text())
    expected_odd = {
        **EXPECTED4,
        "training_step.1.end": {**EXPECTED4["training_step.1.end"], "only3": _stats(7, 7, 7.0, 3, n=1)},
        "training_step.2.end": {"rss": _stats(42, 42, 42.0, 2, n=1)},
    }
    assert odd["snapshots"] == expected_odd
    # WHEN rank 3 is stuck elsewhere after an exception and the others post to the store
    crashed = yaml.safe_load((tmp_path / "crashed" / layout.MEMORY_SUMMARY_YAML).read_text())
    # THEN rank 0 stopped waiting and summarized ranks 0-2, naming rank 3 as missing
    assert crashed["ranks"] == [0, 1, 2]
    assert crashed["missing_ranks"] == [3]
    assert crashed["world_size"] == 4
    assert crashed["snapshots"]["training_step.1.start"]["rss"] == _stats(1000, 3000, 2000.0, 2, n=3)
    assert crashed["snapshots"]["training_step.2.end"]["rss"] == _stats(42, 42, 42.0, 2, n=1)
    # AND the same exchange with every rank posting equals the collective one
    late = yaml.safe_load((tmp_path / "all_posted" / layout.MEMORY_SUMMARY_YAML).read_text())
    assert late["snapshots"] == expected_odd
    assert late["missing_ranks"] == []
