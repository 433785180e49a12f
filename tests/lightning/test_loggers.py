"""Headline memory figures go to every Trainer logger, under memprofiler/, at the global step."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import yaml
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from _tiny_lightning import TinyModel
from memprofiler import MemProfilerCallback
from memprofiler.lightning.metrics_logger import headline_figures

TAGS = ("memprofiler/training_step/rss_peak", "memprofiler/training_step/saved_tensors.unique_bytes")


def _fit(tmp_path: Path, logger: Any, **config: Any) -> tuple[pl.Trainer, dict[str, Any]]:
    cb = MemProfilerCallback({"schedule": {"warmup": 1, "active": 2}, **config})
    trainer = pl.Trainer(
        default_root_dir=tmp_path,
        max_steps=5,
        accelerator="cpu",
        logger=logger,
        log_every_n_steps=1,
        callbacks=[cb],
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(TinyModel())
    assert cb.profiler is not None
    return trainer, yaml.safe_load((cb.profiler.save_dir / "rank_0_memory_stats.yaml").read_text())


def _scalars(log_dir: str | Path) -> EventAccumulator:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return acc


def test_tensorboard_event_file_has_memprofiler_scalars_at_the_global_step(tmp_path):
    # GIVEN calls 2 and 3 collected, with a TensorBoard logger
    trainer, stats = _fit(tmp_path, TensorBoardLogger(tmp_path))
    # WHEN the event file is read back with TensorBoard's own reader
    acc = _scalars(trainer.log_dir)
    # THEN each headline figure is a scalar at the global step of its call (call n -> step n-1),
    # the step at which Lightning logs that call's loss
    for tag in TAGS:
        assert [s.step for s in acc.Scalars(tag)] == [1, 2]
    assert {s.step for s in acc.Scalars("loss")} >= {1, 2}
    # AND the values are the snapshot's (float32 in the event file)
    for scalar, call in zip(acc.Scalars(TAGS[0]), (2, 3), strict=True):
        assert scalar.value == pytest.approx(stats[f"0.training_step.{call}.end"]["rss_peak"], rel=1e-6)
    for scalar, call in zip(acc.Scalars(TAGS[1]), (2, 3), strict=True):
        expected = stats[f"0.training_step.{call}.end"]["saved_tensors.unique_bytes"]
        # x (8x16), the ReLU output (8x32) and the residual squared in the loss (8x1), fp32
        assert scalar.value == expected == (8 * 16 + 8 * 32 + 8 * 1) * 4


def test_every_logger_gets_the_figures(tmp_path):
    # GIVEN a TensorBoard and a CSV logger
    tb = TensorBoardLogger(tmp_path, name="tb")
    csv_logger = CSVLogger(tmp_path, name="csv")
    _, stats = _fit(tmp_path, [tb, csv_logger])
    # THEN both hold the figures at steps 1 and 2
    assert [s.step for s in _scalars(tb.log_dir).Scalars(TAGS[0])] == [1, 2]
    with open(Path(csv_logger.log_dir) / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get(TAGS[0])]
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert [float(r[TAGS[0]]) for r in rows] == [
        stats[f"0.training_step.{n}.end"]["rss_peak"] for n in (2, 3)
    ]


def test_log_metrics_false_logs_nothing(tmp_path):
    trainer, stats = _fit(tmp_path, TensorBoardLogger(tmp_path), log_metrics=False)
    tags = _scalars(trainer.log_dir).Tags()["scalars"]
    assert "loss" in tags
    assert not [t for t in tags if t.startswith("memprofiler/")]
    assert "0.training_step.2.end" in stats


def test_no_logger_breaks_nothing(tmp_path):
    _, stats = _fit(tmp_path, False)
    assert sorted(stats) == [f"0.training_step.{n}.{p}" for n in (2, 3) for p in ("end", "start")]


def test_headline_figures_pick_peaks_only():
    metrics = {
        "rss": 1,
        "rss_peak": 2,
        "saved_tensors.unique_bytes": 3,
        "saved_tensors.by_module": {"a": 1},
        "allocated_bytes.all.peak": 4,
        "allocated_bytes.all.current": 5,
        "reserved_bytes.all.peak": 6,
        "fsdp.peak.Activation": 7,
        "fsdp.current.Parameter": 8,
    }
    assert headline_figures(metrics) == {
        "rss_peak": 2.0,
        "saved_tensors.unique_bytes": 3.0,
        "allocated_bytes.all.peak": 4.0,
        "reserved_bytes.all.peak": 6.0,
        "fsdp.peak.Activation": 7.0,
    }


def test_tracker_peaks_merged_at_step_end_are_logged_at_the_calls_step(tmp_path):
    # GIVEN module-wise tracking, whose peaks are merged after backward and the optimizer step
    trainer, stats = _fit(tmp_path, CSVLogger(tmp_path), track_module_mem=True)
    with open(Path(trainer.log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    tag = "memprofiler/training_step/module_mem.peak.parameter"
    logged = {int(r["step"]): float(r[tag]) for r in rows if r.get(tag)}
    # THEN they are logged at the same step as the call's rss_peak (call n -> step n-1)
    rss = {int(r["step"]) for r in rows if r.get(TAGS[0])}
    assert set(logged) == rss == {1, 2}
    # AND with the snapshot's value: the parameter bytes the tracker saw
    for step, call in ((1, 2), (2, 3)):
        assert logged[step] == stats[f"0.training_step.{call}.end"]["module_mem.peak.parameter"] > 0


class TwoOptimizerManual(TinyModel):
    """Manual optimization with two optimizers: global_step advances twice per batch."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:  # type: ignore[override]
        loss = super().training_step(batch, batch_idx)
        for opt in self.optimizers():
            opt.zero_grad()
        self.manual_backward(loss)
        for opt in self.optimizers():
            opt.step()

    def configure_optimizers(self) -> Any:
        return [
            torch.optim.SGD(self.net[0].parameters(), lr=0.01),
            torch.optim.SGD(self.net[2].parameters(), lr=0.01),
        ]


def test_manual_optimization_logs_at_the_losss_step_not_the_optimizer_step(tmp_path):
    # GIVEN two optimizers stepped inside training_step (global_step moves by 2 per batch)
    cb = MemProfilerCallback({"schedule": {"warmup": 1, "active": 2}})
    trainer = pl.Trainer(
        default_root_dir=tmp_path,
        max_epochs=1,
        limit_train_batches=4,
        accelerator="cpu",
        logger=CSVLogger(tmp_path),
        log_every_n_steps=1,
        callbacks=[cb],
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(TwoOptimizerManual())
    with open(Path(trainer.log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    # THEN calls 2 and 3 are logged at steps 1 and 2, the rows of their losses
    assert sorted(int(r["step"]) for r in rows if r.get(TAGS[0])) == [1, 2]
    assert {int(r["step"]) for r in rows if r.get("loss")} >= {1, 2}
