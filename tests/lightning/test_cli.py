"""MemProfilerCLI and the callback inside any LightningCLI YAML."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from conftest import load_stats
from memprofiler.cli import MemProfilerCLI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo import DemoGPT


def _config(tmp_path: Path, extra: dict) -> Path:
    cfg = {
        "trainer": {
            "max_epochs": 1,
            "limit_train_batches": 3,
            "limit_val_batches": 0,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": str(tmp_path / "run"),
        },
        "model": {"n_layers": 1, "d_model": 32, "num_samples": 48},
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_top_level_group_installs_the_callback(tmp_path):
    out = tmp_path / "out"
    path = _config(tmp_path, {"memprofiler": {"schedule": {"warmup": 0, "active": 2}, "save_dir": str(out)}})
    MemProfilerCLI(DemoGPT, args=["fit", "--config", str(path)])
    assert list(load_stats(out)) == [f"0.training_step.{c}.{p}" for c in (1, 2) for p in ("start", "end")]


def test_callback_in_trainer_callbacks(tmp_path):
    out = tmp_path / "out"
    cb = {
        "class_path": "memprofiler.MemProfilerCallback",
        "init_args": {"config": {"schedule": {"warmup": 1, "active": 1}, "save_dir": str(out)}},
    }
    path = _config(tmp_path, {"memprofiler": {"enabled": False}})
    raw = yaml.safe_load(path.read_text())
    raw["trainer"]["callbacks"] = [cb]
    path.write_text(yaml.safe_dump(raw))
    MemProfilerCLI(DemoGPT, args=["fit", "--config", str(path)])
    assert list(load_stats(out)) == ["0.training_step.2.start", "0.training_step.2.end"]


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        ({"schedule": {"activ": 2}}, "memprofiler.schedule.activ"),
        ({"schedule": {"active": 0}}, "`memprofiler.schedule.active`: got 0; must be >= 1"),
        ({"rss_peak_method": "x"}, "`memprofiler.rss_peak_method`: got 'x'"),
        ({"schedule": {"wait": "soon"}}, 'Parser key "memprofiler.schedule.wait"'),
    ],
)
def test_bad_group_exits_2_naming_the_key_before_training(tmp_path, capsys, group, expected):
    path = _config(tmp_path, {"memprofiler": {**group, "save_dir": str(tmp_path / "out")}})
    with pytest.raises(SystemExit) as info:
        MemProfilerCLI(DemoGPT, args=["fit", "--config", str(path)])
    assert info.value.code == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


def test_unwritable_save_dir_exits_2_before_training(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    path = _config(tmp_path, {"memprofiler": {"save_dir": str(blocker / "sub")}})
    with pytest.raises(SystemExit) as info:
        MemProfilerCLI(DemoGPT, args=["fit", "--config", str(path)])
    assert info.value.code == 2
    assert "`memprofiler.save_dir`" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
