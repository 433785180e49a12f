"""Every config under configs/ builds with MemProfilerCLI: a shipped config that no longer parses fails here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from memprofiler import ExtendedPyTorchProfiler, MemProfilerCallback
from memprofiler.config import MemProfilerConfig
from memprofiler.lightning.cli import MemProfilerCLI

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
sys.path.insert(0, str(ROOT / "examples"))
from demo import DemoGPT  # noqa: E402


def _build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *configs: Path) -> MemProfilerCLI:
    # run=False parses, runs the CLI's checks (before_instantiate_classes) and builds the model,
    # the trainer and its callbacks/profiler, without training; relative run dirs land in tmp_path
    monkeypatch.chdir(tmp_path)
    args = [arg for path in configs for arg in ("--config", str(path))]
    return MemProfilerCLI(DemoGPT, run=False, args=args, trainer_defaults={"accelerator": "cpu"})


def test_there_are_shipped_configs() -> None:
    assert {p.name for p in CONFIGS} >= {"demo.yaml", "fsdp_cpu.yaml", "profiler.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_a_shipped_config_builds_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: Path
) -> None:
    # GIVEN a shipped config
    written = yaml.safe_load(path.read_text(encoding="utf-8"))
    # WHEN MemProfilerCLI builds it
    cli = _build(tmp_path, monkeypatch, path)
    # THEN its memprofiler group is what the file says, over the defaults
    group = written.get("memprofiler", {})
    built = MemProfilerConfig.from_any(cli.config["memprofiler"].as_dict())
    assert built == MemProfilerConfig.from_any(group)
    own = [cb for cb in cli.trainer.callbacks if isinstance(cb, MemProfilerCallback)]
    assert len(own) == (1 if built.enabled else 0)
    # and a profiler entry becomes that profiler
    profiler = written.get("trainer", {}).get("profiler")
    if profiler is not None:
        assert profiler["class_path"] == "memprofiler.ExtendedPyTorchProfiler"
        assert isinstance(cli.trainer.profiler, ExtendedPyTorchProfiler)


def test_the_demo_with_the_profiler_config_builds_as_the_header_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the two configs stacked as configs/profiler.yaml's header runs them
    cli = _build(tmp_path, monkeypatch, ROOT / "configs" / "demo.yaml", ROOT / "configs" / "profiler.yaml")
    # THEN one memprofiler callback follows the profiler's schedule and the profiler records memory
    own = [cb for cb in cli.trainer.callbacks if isinstance(cb, MemProfilerCallback)]
    assert len(own) == 1
    assert cli.config["memprofiler"].schedule.follow_profiler is True
    assert isinstance(cli.trainer.profiler, ExtendedPyTorchProfiler)
    assert cli.trainer.profiler._profiler_kwargs["profile_memory"] is True
