"""A model nobody edited, profiled from YAML alone: Lightning's BoringModel and demo Transformer.

The runs go through ``LightningCLI`` / ``MemProfilerCLI`` in-process with a YAML file and no
Python of their own: ``collect_funcs`` names the methods, the callback wraps them at set-up.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel, DemoModel
from lightning.pytorch.demos.transformer import LightningTransformer
from lightning.pytorch.strategies import SingleDeviceStrategy

from _env import subprocess_env
from conftest import TinyMLP, load_stats, make_trainer
from memprofiler import MemProfilerCallback
from memprofiler.lightning.cli import MemProfilerCLI

_TRAINER = {
    "accelerator": "cpu",
    "devices": 1,
    "max_epochs": 1,
    "limit_train_batches": 4,
    "limit_val_batches": 0,
    "num_sanity_val_steps": 0,
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}
_BORING = {
    "model": {"class_path": "lightning.pytorch.demos.boring_classes.BoringModel"},
    "data": {"class_path": "lightning.pytorch.demos.boring_classes.BoringDataModule"},
}


def _yaml(tmp_path: Path, cfg: dict[str, Any]) -> str:
    cfg = {
        **cfg,
        "trainer": {**_TRAINER, "default_root_dir": str(tmp_path / "run"), **cfg.get("trainer", {})},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def test_boring_model_under_lightning_cli_with_the_callback_yaml(tmp_path):
    # GIVEN Lightning's own BoringModel and BoringDataModule, and the README's callback YAML
    out = tmp_path / "out"
    callback = {
        "class_path": "memprofiler.MemProfilerCallback",
        "init_args": {
            "config": {"schedule": {"warmup": 1, "active": 2}, "track_module_mem": True, "save_dir": str(out)}
        },
    }
    original = BoringModel.__dict__["training_step"]
    # WHEN a plain LightningCLI trains from that file
    LightningCLI(
        args=["fit", "--config", _yaml(tmp_path, {**_BORING, "trainer": {"callbacks": [callback]}})],
        trainer_defaults={"accelerator": "cpu"},
    )
    # THEN calls 2 and 3 of the unedited training_step were collected
    stats = load_stats(out)
    assert list(stats) == [f"0.training_step.{c}.{p}" for c in (2, 3) for p in ("start", "end")]
    end = stats["0.training_step.2.end"]
    # AND the figures are the model's: Linear(32, 2) holds 66 float32 parameters, and as many gradients
    assert end["module_mem.peak.parameter"] == _param_bytes(BoringModel()) == 66 * 4
    assert end["module_mem.peak.gradient"] == 66 * 4
    # AND the Linear saved its input (a batch of one 32-float row); mse_loss its two (1, 2) operands
    assert end["saved_tensors.by_module"] == {"layer": 32 * 4, "(outside forward)": 2 * 2 * 4}
    # AND the class is as it was after the run
    assert BoringModel.__dict__["training_step"] is original


def test_demo_transformer_under_memprofiler_cli_with_a_memprofiler_group(tmp_path, monkeypatch):
    # GIVEN Lightning's demo Transformer on its own WikiText2 dataset, read from ./data offline
    text = "the cat sat on the mat\nthe dog ate the bone\n" * 40
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "wikitext-2.txt").write_text(text)
    vocab = len(set(text.split())) + 1  # and <eos>
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    cfg = {
        "model": {
            "class_path": "lightning.pytorch.demos.transformer.LightningTransformer",
            "init_args": {"vocab_size": vocab},
        },
        "memprofiler": {
            "schedule": {"warmup": 1, "active": 1},
            "track_module_mem": True,
            "save_dir": str(out),
        },
    }
    # WHEN MemProfilerCLI trains it from a YAML file
    MemProfilerCLI(args=["fit", "--config", _yaml(tmp_path, cfg)], trainer_defaults={"accelerator": "cpu"})
    # THEN call 2 of training_step was collected with the model's parameter bytes
    stats = load_stats(out)
    assert list(stats) == ["0.training_step.2.start", "0.training_step.2.end"]
    end = stats["0.training_step.2.end"]
    expected = _param_bytes(LightningTransformer(vocab_size=vocab))
    assert end["module_mem.peak.parameter"] == expected
    # AND SGD without momentum keeps one gradient per parameter and no optimizer state
    assert end["module_mem.peak.gradient"] == expected
    assert end["module_mem.peak.optstate"] == 0
    assert end["saved_tensors.unique_bytes"] > 0


@pytest.mark.slow
def test_a_typo_is_one_line_at_set_up_naming_the_classes_and_the_close_match(tmp_path):
    # GIVEN collect_funcs with a typo and Lightning's BoringModel, in a YAML file only
    cfg = {
        **_BORING,
        "memprofiler": {"collect_funcs": {"default": ["trainig_step"]}, "save_dir": str(tmp_path / "o")},
    }
    # WHEN `python -m memprofiler.lightning fit` trains it
    proc = subprocess.run(
        [sys.executable, "-m", "memprofiler.lightning", "fit", "--config", _yaml(tmp_path, cfg)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    # THEN one line, once, names the key, the three classes searched and the method meant
    line = (
        "memprofiler: `collect_funcs.default` names `trainig_step`, which is not a method of `BoringModel` "
        "(the LightningModule), `BoringDataModule` (the DataModule) or `SingleDeviceStrategy` (the strategy); "
        'nothing collects it unless your code runs `profiler.profile("trainig_step")`; '
        "did you mean `training_step` or `post_training_step`?"
    )
    # (no source line under `python -m`: the user has no line of their own)
    assert [ln for ln in proc.stderr.splitlines() if "trainig_step" in ln] == [
        f"memprofiler:0: MemProfilerWarning: {line}"
    ]
    # AND it came at set-up, before training ended
    assert proc.stderr.index(line) < proc.stderr.index("`Trainer.fit` stopped")
    # AND the run's note says the same
    notes = yaml.safe_load((tmp_path / "o" / "memprofiler_run.yaml").read_text())["notes"]
    assert notes == [line.removeprefix("memprofiler: ")]


def test_a_strategy_and_a_datamodule_method_are_collected_too(tmp_path):
    # GIVEN names of a strategy method and of a DataModule hook every LightningModule also inherits
    cb = MemProfilerCallback(
        {
            "schedule": {"warmup": 0, "active": 1},
            "collect_funcs": {"default": ["batch_to_device"], "cpu": ["train_dataloader"]},
            "save_dir": str(tmp_path / "o"),
        }
    )
    # WHEN DemoModel (no dataloader hooks of its own) trains on BoringDataModule
    make_trainer(tmp_path, [cb], limit_train_batches=3).fit(DemoModel(), datamodule=BoringDataModule())
    # THEN the strategy's method was counted once per batch, and the DataModule's own train_dataloader
    # (not the LightningModule's default hook) was the one collected
    assert cb.profiler is not None
    assert cb.profiler.call_counts() == {"batch_to_device": 3, "train_dataloader": 1}
    assert "0.train_dataloader.1.end" in cb.profiler.snapshots
    # AND both classes are restored
    assert "batch_to_device" not in SingleDeviceStrategy.__dict__
    assert not hasattr(BoringDataModule.__dict__["train_dataloader"], "__memprofilable__")


def test_the_decorator_wins_under_the_callback(tmp_path):
    # GIVEN a model whose training_step carries @memprofilable, named in collect_funcs too
    decorated = TinyMLP.__dict__["training_step"]
    cb = MemProfilerCallback({"schedule": {"warmup": 0, "active": 2}, "save_dir": str(tmp_path / "o")})
    # WHEN it trains 6 batches
    make_trainer(tmp_path, [cb]).fit(TinyMLP())
    # THEN each call was counted once (not wrapped twice) and the class kept its function
    assert cb.profiler is not None and cb.profiler.call_counts() == {"training_step": 6}
    assert TinyMLP.__dict__["training_step"] is decorated


class _Failing(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch_idx == 2:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_the_class_is_restored_when_training_raises(tmp_path):
    # GIVEN an unedited training_step that raises at its third call
    original = _Failing.__dict__["training_step"]
    cb = MemProfilerCallback({"schedule": {"warmup": 0, "active": 5}, "save_dir": str(tmp_path / "o")})
    # WHEN it trains
    with pytest.raises(RuntimeError, match="boom"):
        make_trainer(tmp_path, [cb]).fit(_Failing(), datamodule=BoringDataModule())
    # THEN the failed call is on disk, and the class is as it was
    stats = load_stats(tmp_path / "o")
    assert stats["0.training_step.3.end"]["failed"] is True
    assert _Failing.__dict__["training_step"] is original
