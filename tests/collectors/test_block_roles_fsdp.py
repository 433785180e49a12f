"""Blocks named by role under FSDP2, for real on CPU: gloo process groups of 1 and 2 ranks.

Every expected byte count is worked out by hand from the layer shapes. FSDP2 pads dim 0 to
``ceil(rows / world)`` rows per rank: the local shard's storage is that padded chunk on
every rank (the last rank's view may be shorter), the optimizer's state follows the view
(unpadded), a parameter group's gradients are reduce-scattered into one buffer (the padded
chunks of the group, back to back), and an unsharded parameter is ``world`` padded chunks.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from conftest import make_trainer
from fake_cuda import FakeCudaBackend
from memprofiler import MemProfilerCallback, memprofilable
from memprofiler.analysis.snapshot.replay import StackTable, replay
from memprofiler.analysis.snapshot.roles import role_index
from memprofiler.analysis.snapshot.summary import analyze
from memprofiler.collectors.block_roles import role_map

F32 = 4
KIB = 1024
#: (rows, bytes per row) of each parameter: Linear(10, 33) inside a block, then Linear(33, 7).
SHAPES = {"0.0.weight": (33, 10 * F32), "0.0.bias": (33, F32), "2.weight": (7, 33 * F32), "2.bias": (7, F32)}
GROUPS = (("0.0.weight", "0.0.bias"), ("2.weight", "2.bias"))


class _Probe(nn.Module):
    """Inside the sharded block's forward (its parameters gathered), takes the role map."""

    def __init__(self) -> None:
        super().__init__()
        self.look: Callable[[], Any] | None = None
        self.seen: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.look is not None and self.seen is None:
            self.seen = self.look()
        return x


def _sharded(mesh: Any, reshard: bool) -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Sequential(nn.Linear(10, 33), _Probe()), nn.ReLU(), nn.Linear(33, 7))
    for layer in (net[0], net[2]):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(net, mesh=mesh, reshard_after_forward=reshard)
    return net


def scenario(mesh: Any, reshard: bool) -> dict[str, list[dict[str, Any]]]:
    """One AdamW step, then the role maps: inside the first block's forward (step 1), after
    the step, after the next forward (before its backward), and after a backward without
    gradient sync."""
    net = _sharded(mesh, reshard)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.randn(4, 10)
    probe = net[0][1]
    probe.look = lambda: role_map(net, [opt])
    net(x).pow(2).mean().backward()
    opt.step()
    after_step = role_map(net, [opt])
    loss = net(x).pow(2).mean()
    after_forward = role_map(net, [opt])
    loss.backward()
    net.set_requires_gradient_sync(False)  # accumulation without reduce-scatter
    net(x).pow(2).mean().backward()
    no_sync = role_map(net, [opt])
    return {
        "inside_forward": probe.seen,
        "after_step": after_step,
        "after_forward": after_forward,
        "no_sync": no_sync,
    }


# ----------------------------------------------------------------------------- analytic truth
def _chunk(rows: int, world: int) -> int:
    return math.ceil(rows / world)


def _shard_bytes(name: str, world: int) -> int:
    rows, per_row = SHAPES[name]
    return _chunk(rows, world) * per_row


def _local_bytes(name: str, world: int, rank: int) -> int:
    rows, per_row = SHAPES[name]
    chunk = _chunk(rows, world)
    return max(0, min(chunk, rows - rank * chunk)) * per_row


def _by(entries: list[dict[str, Any]], role: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in entries:
        if e["role"] == role and e.get("detail") != "unsharded":
            assert e["name"] not in out, e
            out[e["name"]] = e["bytes"]
    return out


def _check(maps: dict[str, list[dict[str, Any]]], world: int, rank: int, reshard: bool) -> None:
    shards = {n: _shard_bytes(n, world) for n in SHAPES}
    unsharded = {n: world * _shard_bytes(n, world) for n in SHAPES}
    state = {(n, d): _local_bytes(n, world, rank) for n in SHAPES for d in ("exp_avg", "exp_avg_sq")}
    state |= {(n, "step"): F32 for n in SHAPES}  # AdamW's step: a float32 scalar tensor per parameter
    for when, entries in maps.items():
        # every storage once: no address is named twice
        assert len({e["addr"] for e in entries}) == len(entries), when
        # THEN every parameter's local shard is named by its FQN, with the padded chunk's bytes
        assert _by(entries, "parameter") == shards, when
        # AND the optimizer state is named after the parameter it belongs to, unpadded
        opt = {(e["name"], e["detail"]): e["bytes"] for e in entries if e["role"] == "optimizer state"}
        assert opt == (state if when != "inside_forward" else {}), when
    after = maps["after_step"]
    # AND each group's gradients are one reduce-scatter buffer: one block, both names, their shards' bytes
    grads = sorted((e["name"], e.get("others"), e["bytes"]) for e in after if e["role"] == "gradient")
    assert grads == sorted((w, [b], shards[w] + shards[b]) for w, b in GROUPS)
    # AND after the step no parameter is gathered
    assert _by(after, "parameter (unsharded)") == {}
    # AND inside the first block's forward its parameters are gathered: world padded chunks each
    inside = _by(maps["inside_forward"], "parameter (unsharded)")
    assert {n: inside[n] for n in GROUPS[0]} == {n: unsharded[n] for n in GROUPS[0]}
    # AND after a forward they stay gathered until backward only with reshard_after_forward=False
    expect = unsharded if not reshard else {}
    assert _by(maps["after_forward"], "parameter (unsharded)") == expect
    # AND without gradient sync each parameter's unsharded gradient stays: unpadded, whole
    kept = {e["name"]: e["bytes"] for e in maps["no_sync"] if e.get("detail") == "unsharded"}
    assert kept == {n: rows * per_row for n, (rows, per_row) in SHAPES.items()}


# ----------------------------------------------------------------------------- one rank
@pytest.fixture
def world1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


@pytest.mark.parametrize("reshard", [True, False], ids=["reshard", "no-reshard"])
def test_fsdp2_one_rank_names_shards_gradients_state_and_unsharded_params(world1, reshard):
    # GIVEN FSDP2 over a 1-rank gloo group, one AdamW step WHEN role maps are taken
    maps = scenario(world1, reshard)
    # THEN (1 rank: a shard is the whole parameter) the bytes are 1320, 132, 924, 28
    assert _by(maps["after_step"], "parameter") == {
        "0.0.weight": 1320,
        "0.0.bias": 132,
        "2.weight": 924,
        "2.bias": 28,
    }
    _check(maps, world=1, rank=0, reshard=reshard)


def test_fsdp2_tied_weights_are_named_once(world1):
    # GIVEN two layers sharing one weight, sharded as one group, after an AdamW step
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6))
    net[1].weight = net[0].weight
    fully_shard(net, mesh=world1)
    opt = torch.optim.AdamW(net.parameters())
    net(torch.randn(2, 6)).sum().backward()
    opt.step()
    entries = role_map(net, [opt])
    # THEN the shared weight is one parameter, one exp_avg, one exp_avg_sq (6 x 6 x 4 B each)
    assert _by(entries, "parameter") == {"0.weight": 144, "0.bias": 24, "1.bias": 24}
    exp_avg = {e["name"]: e["bytes"] for e in entries if e.get("detail") == "exp_avg"}
    assert exp_avg == {"0.weight": 144, "0.bias": 24, "1.bias": 24}
    # AND the group's gradients are one buffer of the three shards
    (grad,) = [e for e in entries if e["role"] == "gradient"]
    assert (grad["name"], grad["others"], grad["bytes"]) == ("0.weight", ["0.bias", "1.bias"], 192)
    assert len({e["addr"] for e in entries}) == len(entries)


# ----------------------------------------------------------------------------- Lightning, end to end
class _ShardedLM(pl.LightningModule):
    """Two sharded layers under ModelParallelStrategy, Adam, a 1 KiB block per step on the fake device."""

    def __init__(self, fake: FakeCudaBackend) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.fake = fake

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        fully_shard(self.model[0], mesh=mesh)
        fully_shard(self.model[2], mesh=mesh)
        fully_shard(self.model, mesh=mesh)

    @memprofilable
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.fake.free(self.fake.alloc(KIB))
        return self.model(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(torch.randn(16, 8), batch_size=4)


class _AdoptModelMemory(pl.Callback):
    """After step 1 the model's storages become blocks of the fake device allocated before any
    recording, as on a GPU when the window opens."""

    def __init__(self, fake: FakeCudaBackend) -> None:
        self.fake = fake

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, i: int
    ) -> None:
        if i == 0:
            for entry in role_map(pl_module, trainer.optimizers):
                self.fake.adopt(entry["addr"], entry["bytes"])


def test_lightning_fsdp2_blocks_alive_before_the_window_carry_their_role_and_name(world1, tmp_path):
    # GIVEN ModelParallelStrategy (FSDP2, 1 rank) on CPU over the fake allocator; the window opens at step 2
    fake = FakeCudaBackend()
    cfg = {"schedule": {"wait": 1, "warmup": 1, "active": 1}, "cuda_allocator_history": True}
    cb = MemProfilerCallback({**cfg, "save_dir": str(tmp_path / "mp")}, cuda=fake)
    strategy = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1)
    model = _ShardedLM(fake)
    # WHEN it trains 4 steps
    make_trainer(tmp_path, [cb, _AdoptModelMemory(fake)], strategy=strategy, limit_train_batches=4).fit(model)
    save_dir = tmp_path / "mp"
    index = json.loads((save_dir / "cuda_alloc_rank_0.window_0.json").read_text())
    recording = pickle.loads((save_dir / "cuda_alloc_rank_0.window_0.pickle").read_bytes())
    # THEN the role map names every local shard by its FQN from the LightningModule, with its bytes
    params = {"model.0.weight": 512, "model.0.bias": 64, "model.2.weight": 64, "model.2.bias": 4}
    assert _by(index["roles"], "parameter") == params
    exp_avg = {e["name"]: e["bytes"] for e in index["roles"] if e.get("detail") == "exp_avg"}
    assert exp_avg == params
    # AND each layer's gradients are one block named after both parameters
    grads = sorted((e["name"], e["others"], e["bytes"]) for e in index["roles"] if e["role"] == "gradient")
    assert grads == [("model.0.weight", ["model.0.bias"], 576), ("model.2.weight", ["model.2.bias"], 68)]
    # AND the analysis groups the blocks older than the recording by role, with those bytes
    roles = role_index(index)
    assert roles is not None
    (dev,) = analyze(recording, roles=roles, top=50).devices
    groups = {g.frames: (g.bytes, g.count) for g in dev.top_stacks}
    total = sum(params.values())  # 644 B
    assert groups[("parameter",)] == (total, 4)
    assert groups[("gradient",)] == (total, 2)
    assert groups[("optimizer state (exp_avg)",)] == groups[("optimizer state (exp_avg_sq)",)] == (total, 4)
    assert ("(no stack recorded)",) not in groups
    # AND the explorer's replay labels the gradient block with both names
    table = StackTable()
    (rep,) = replay(recording, table, roles)
    named = {
        table.strings[table.frames[table.stacks[s][1]][0]]
        for s in rep.stack[rep.start < 0].tolist()
        if len(table.stacks[s]) > 1
    }
    assert {"parameter `model.0.weight`", "gradient of `model.0.weight`, `model.0.bias`"} <= named


# ----------------------------------------------------------------------------- two ranks
@pytest.mark.slow
def test_fsdp2_two_ranks_name_padded_local_shards(tmp_path):
    from _ranks import launch

    # GIVEN FSDP2 over 2 gloo processes: 33 rows are 17 + 16, 7 rows are 4 + 3
    results = launch(lambda rank: [__file__, str(tmp_path)], 2, timeout=240)
    for r in results:
        assert r.returncode == 0 and "worker finished" in r.stdout, r.stdout[-4000:]
    for rank in range(2):
        for reshard in (True, False):
            maps = json.loads((tmp_path / f"rank{rank}_{reshard}.json").read_text())
            # THEN both ranks hold 17 and 4 padded rows (680, 68, 528, 16 B) ...
            assert _by(maps["after_step"], "parameter") == {
                "0.0.weight": 680,
                "0.0.bias": 68,
                "2.weight": 528,
                "2.bias": 16,
            }
            # ... AdamW's moments follow the local rows: 17 and 4 on rank 0, 16 and 3 on rank 1
            exp_avg = {e["name"]: e["bytes"] for e in maps["after_step"] if e.get("detail") == "exp_avg"}
            assert exp_avg == (
                {"0.0.weight": 680, "0.0.bias": 68, "2.weight": 528, "2.bias": 16}
                if rank == 0
                else {"0.0.weight": 640, "0.0.bias": 64, "2.weight": 396, "2.bias": 12}
            )
            _check(maps, world=2, rank=rank, reshard=reshard)


def _worker(out: str) -> None:  # pragma: no cover - runs in the subprocesses
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for reshard in (True, False):
        maps = scenario(mesh, reshard)
        Path(out, f"rank{dist.get_rank()}_{reshard}.json").write_text(json.dumps(maps))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1])
    # As in tests/scenarios/test_multirank.py: skip the interpreter's teardown (gloo's static
    # destructors abort now and then); everything the test checks is on disk.
    print("worker finished", flush=True)
    os._exit(0)
