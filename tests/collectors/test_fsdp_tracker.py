"""FSDP2 tracking (``track_fsdp_mem``) in one process: a world-size-1 gloo group on CPU.

The 2-rank numbers (shards == total / 2) are checked in ``test_multirank.py``; here: the
root-module errors, several collected calls in a row, a repeated root forward, every
optimizer, the table layout, and the same numbers through Lightning's ModelParallelStrategy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
import yaml
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from _env import subprocess_env
from conftest import make_trainer
from memprofiler import ConfigError, MemProfiler, MemProfilerCallback, layout, memprofilable
from memprofiler.collectors.fsdp import fsdp_module_paths, resolve_root


@pytest.fixture
def world1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def _sharded_mlp(mesh: Any) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    fully_shard(net[0], mesh=mesh)
    fully_shard(net[2], mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


def _param_bytes(m: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in m.parameters())


class Holder(nn.Module):
    """Stands in for a LightningModule: the FSDP model sits at ``.model``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


# ----------------------------------------------------------------------------- root errors
def test_missing_root_names_the_path_and_lists_fsdp_modules(world1):
    holder = Holder(_sharded_mlp(world1))
    with pytest.raises(ConfigError) as info:
        resolve_root(holder, "encoder")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("`fsdp_mem_tracker_root_module`: 'encoder' is not a submodule of Holder")
    assert msg.endswith("fully_shard-ed module paths: 'model', 'model.0', 'model.2'")


def test_unsharded_root_is_rejected(world1):
    holder = Holder(_sharded_mlp(world1))
    with pytest.raises(
        ConfigError, match=r"'model\.1' \(ReLU\) is not fully_shard-ed; fully_shard-ed module paths: 'model'"
    ):
        resolve_root(holder, "model.1")
    with pytest.raises(
        ConfigError, match=r'"" \(the profiled module itself\) \(Holder\) is not fully_shard-ed'
    ):
        resolve_root(holder, "")
    assert resolve_root(holder, "model") is holder.model
    assert fsdp_module_paths(holder.model) == ["", "0", "2"]


def test_no_fsdp_module_at_all_says_how_to_fix():
    with pytest.raises(
        ConfigError, match=r"no module is fully_shard-ed \(apply `fully_shard` in `configure_model`"
    ):
        resolve_root(Holder(nn.Linear(2, 2)), "model")


def test_bad_root_is_an_error_at_bind_not_a_warning(world1, tmp_path):
    # GIVEN a profiler whose root path does not exist
    holder = Holder(_sharded_mlp(world1))
    prof = MemProfiler({"track_fsdp_mem": True, "fsdp_mem_tracker_root_module": "nope"}, save_dir=tmp_path)
    prof.setup(holder)
    # WHEN it is bound to the sharded model THEN the user's mistake surfaces as ConfigError
    with pytest.raises(ConfigError, match="'nope' is not a submodule"):
        prof.bind(holder, [])


# ----------------------------------------------------------------------------- plain loop
def _plain_loop(
    prof: MemProfiler, holder: Holder, opts: list[torch.optim.Optimizer], steps: int, twice: bool = False
) -> list[int]:
    modes_inside = []
    x = torch.randn(4, 16)
    for _ in range(steps):
        with prof.profile("training_step", module=holder):
            modes_inside.append(len(_get_current_dispatch_mode_stack()))
            loss = holder.model(x).pow(2).mean()
            if twice:  # a second root forward in the same step
                loss = loss + holder.model(x).mean()
        loss.backward()
        for opt in opts:
            opt.step()
            opt.zero_grad()
        prof.step_end()
        modes_inside.append(len(_get_current_dispatch_mode_stack()))
    return modes_inside


def test_several_collected_calls_in_a_row_and_every_optimizer(world1, tmp_path):
    # GIVEN FSDP2 on one rank, two Adam optimizers over different layers, calls 2-4 collected
    holder = Holder(_sharded_mlp(world1))
    net = holder.model
    opts = [torch.optim.Adam(net[0].parameters()), torch.optim.Adam(net[2].parameters())]
    cfg = {
        "track_fsdp_mem": True,
        "fsdp_mem_tracker_root_module": "model",
        "module_mem_depth": 3,  # Holder(1).model(2).0(3)
        "schedule": {"warmup": 1, "active": 3},
        "enable_saved_tensors_hooks": False,
    }
    prof = MemProfiler(cfg, save_dir=tmp_path)
    prof.setup(holder)
    prof.bind(holder, opts)
    # WHEN five steps run (reset_mod_stats between collected calls is ours to do)
    modes = _plain_loop(prof, holder, opts, steps=5)
    prof.teardown()
    # THEN the tracker was active inside calls 2-4 only and is gone after each step
    assert modes[0::2] == [0, 1, 1, 1, 0]
    assert modes[1::2] == [0, 0, 0, 0, 0]
    pb = _param_bytes(net)
    n_params = len(list(net.parameters()))
    for call in (2, 3, 4):
        end = prof.snapshots[f"0.training_step.{call}.end"]
        # AND with one rank the shard is the whole parameter
        assert end["fsdp.peak.sharded_param"] == pb
        # AND both optimizers' state is tracked: Adam keeps 2 moments + a 4-byte step per parameter
        report = yaml.safe_load((tmp_path / f"fsdp_mem_rank_0_training_step_{call}.yaml").read_text())
        start = report["modules"]["Holder.model.0"]["Before Pre-Forward"][0]["cpu"]
        assert start["OptState"] == 2 * pb + 4 * n_params
        assert start["Sharded Grad"] == 0  # zero_grad ran before the step
        # AND backward ran inside the window: the sharded gradients are in the peak
        assert report["peak"]["cpu"]["Sharded Grad"] == pb
    for call in (1, 5):
        assert not (tmp_path / f"fsdp_mem_rank_0_training_step_{call}.yaml").exists()


def test_repeated_root_forward_in_one_step_does_not_break_training(world1, tmp_path):
    # GIVEN a root that holds parameters itself: PyTorch's tracker raises NotImplementedError
    # on its second forward in one iteration
    torch.manual_seed(0)
    holder = Holder(fully_shard(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), mesh=world1))
    opt = torch.optim.Adam(holder.model.parameters())
    prof = MemProfiler(
        {
            "track_fsdp_mem": True,
            "fsdp_mem_tracker_root_module": "model",
            "enable_saved_tensors_hooks": False,
        },
        save_dir=tmp_path,
    )
    prof.setup(holder)
    prof.bind(holder, [opt])
    with pytest.warns(UserWarning, match="root module ran forward more than once"):
        _plain_loop(prof, holder, [opt], steps=3, twice=True)
    prof.teardown()
    report = yaml.safe_load((tmp_path / "fsdp_mem_rank_0_training_step_2.yaml").read_text())
    assert any("more than once" in n for n in report["notes"])
    assert prof.snapshots["0.training_step.2.end"]["fsdp.peak.sharded_param"] == _param_bytes(holder.model)


def test_tabulate_renders_tables_with_the_yaml_numbers(world1, tmp_path):
    holder = Holder(_sharded_mlp(world1))
    opt = torch.optim.SGD(holder.model.parameters(), lr=0.1)
    cfg = {
        "track_fsdp_mem": True,
        "fsdp_mem_tracker_root_module": "model",
        "module_mem_tabulate": True,
        "module_mem_units": "B",
        "enable_saved_tensors_hooks": False,
    }
    prof = MemProfiler(cfg, save_dir=tmp_path)
    prof.setup(holder)
    prof.bind(holder, [opt])
    _plain_loop(prof, holder, [opt], steps=2)
    prof.teardown()
    log = (tmp_path / "fsdp_mem_rank_0_training_step_2.log").read_text().splitlines()
    report = yaml.safe_load((tmp_path / "fsdp_mem_rank_0_training_step_2.yaml").read_text())
    peak = report["peak"]["cpu"]
    i = log.index("Peak snapshot")
    header = log[i + 2].split()
    row = log[i + 4]
    assert header[:3] == ["Device", "Sharded", "Param"]
    assert row.split()[0] == "cpu"
    # in bytes the row is the YAML's numbers, in the YAML's order
    assert [int(v) for v in row.split()[1::2]] == list(peak.values())


# ----------------------------------------------------------------------------- Lightning
class ShardedLM(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        fully_shard(self.model[0], mesh=mesh)
        fully_shard(self.model[2], mesh=mesh)
        fully_shard(self.model, mesh=mesh)

    @memprofilable
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.model(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters())

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.randn(24, 16), batch_size=4)


def _fit(tmp_path: Path, **cfg: Any) -> tuple[MemProfilerCallback, ShardedLM]:
    cb = MemProfilerCallback({"track_fsdp_mem": True, "save_dir": str(tmp_path / "mp"), **cfg})
    strategy = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1)
    trainer = make_trainer(tmp_path, [cb], strategy=strategy, limit_train_batches=5)
    model = ShardedLM()
    trainer.fit(model)
    return cb, model


def test_lightning_bad_root_fails_at_fit_start_before_any_step(world1, tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"'model\.5' is not a submodule of ShardedLM; "
        r"fully_shard-ed module paths: 'model', 'model\.0', 'model\.2'",
    ):
        _fit(tmp_path, fsdp_mem_tracker_root_module="model.5")
    assert not list((tmp_path / "mp").glob("fsdp_mem_*"))


def test_lightning_model_parallel_window_covers_backward_and_optimizer_step(world1, tmp_path):
    # GIVEN Lightning's automatic optimization: backward and optimizer.step run after training_step
    _cb, model = _fit(
        tmp_path,
        fsdp_mem_tracker_root_module="model",
        module_mem_depth=3,
        schedule={"warmup": 1, "active": 3},
    )
    pb = _param_bytes(model.model)
    n_params = len(list(model.parameters()))
    save_dir = tmp_path / "mp"
    for call in (2, 3, 4):
        stem = layout.FSDP_MEM_REPORT.format(rank=0, fn="training_step", call=call)
        report = yaml.safe_load((save_dir / f"{stem}.yaml").read_text())
        first = report["modules"]["ShardedLM.model.0"]
        # THEN the window saw backward: post-backward snapshots and reduce-scattered grads
        assert first["After Post-Backward"][0]["cpu"]["Sharded Grad"] > 0
        assert report["peak"]["cpu"]["Sharded Param"] == pb
        # AND the Adam state (created at call 1) is OptState
        assert first["Before Pre-Forward"][0]["cpu"]["OptState"] == 2 * pb + 4 * n_params
        assert (
            (save_dir / f"{stem}.log")
            .read_text()
            .startswith(f"FSDPMemTracker report: rank 0, `training_step` call {call}")
        )
    assert os.path.exists(save_dir / "memory_summary.yaml")  # a (1-rank) process group exists


@pytest.mark.slow
def test_fsdp_cpu_config_parses_with_the_demo_cli():
    # GIVEN the shipped FSDP demo config WHEN the demo CLI parses it (no training)
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = subprocess_env(root / "src")
    out = subprocess.run(
        [sys.executable, "examples/demo.py", "fit", "--config", "configs/fsdp_cpu.yaml", "--print_config"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    cfg = yaml.safe_load(out.stdout)
    # THEN FSDP2 over 2 CPU processes is configured, with the tracker on the sharded GPT
    assert cfg["trainer"]["strategy"]["class_path"].endswith("ModelParallelStrategy")
    assert cfg["trainer"]["strategy"]["init_args"]["data_parallel_size"] == 2
    assert (cfg["trainer"]["accelerator"], cfg["trainer"]["devices"]) == ("cpu", 2)
    mp = cfg["memprofiler"]
    assert mp["track_fsdp_mem"] is True
    assert mp["fsdp_mem_tracker_root_module"] == "model"
