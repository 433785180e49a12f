"""Blocks named by role: the parameters, gradients, optimizer state and buffers alive when a
window's recording begins carry their names, through a Lightning run over the fake allocator."""

from __future__ import annotations

import json
import pickle

import lightning.pytorch as pl
import torch
from torch import nn

from conftest import step_trainer
from fake_cuda import FakeCudaBackend
from memprofiler import MemProfilerCallback, memprofilable
from memprofiler.analysis.snapshot.replay import StackTable, replay
from memprofiler.analysis.snapshot.roles import ROLE_FILE, RoleIndex, role_index
from memprofiler.analysis.snapshot.summary import analyze
from memprofiler.collectors.block_roles import role_map

KIB = 1024


class _Net(pl.LightningModule):
    """A linear layer and a batch norm (buffers), Adam (exp_avg, exp_avg_sq, step)."""

    def __init__(self, fake: FakeCudaBackend) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1))
        self.fake = fake

    @memprofilable
    def training_step(self, batch, batch_idx):
        self.fake.free(self.fake.alloc((batch_idx + 1) * KIB))
        return self.body(batch[0]).pow(2).mean()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 8)), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class _AdoptModelMemory(pl.Callback):
    """After step 1, tell the fake device that the model's storages are its blocks, allocated
    before any recording: what a GPU run has when the window opens."""

    def __init__(self, fake: FakeCudaBackend) -> None:
        self.fake = fake

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 0:
            for entry in role_map(pl_module, trainer.optimizers):
                self.fake.adopt(entry["addr"], entry["bytes"])


def _nbytes(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def test_blocks_alive_before_the_window_carry_their_role_and_name(tmp_path):
    # GIVEN a Lightning run on CPU over the fake allocator; the window opens at step 2 (warmup)
    fake = FakeCudaBackend()
    cfg = {"schedule": {"wait": 1, "warmup": 1, "active": 1}, "cuda_allocator_history": True}
    cb = MemProfilerCallback({**cfg, "save_dir": str(tmp_path / "mp")}, cuda=fake)
    model = _Net(fake)
    # WHEN it trains 4 steps
    step_trainer(tmp_path, [cb, _AdoptModelMemory(fake)], 4).fit(model)
    save_dir = tmp_path / "mp"
    index = json.loads((save_dir / "cuda_alloc_rank_0.window_0.json").read_text())
    recording = pickle.loads((save_dir / "cuda_alloc_rank_0.window_0.pickle").read_bytes())
    # THEN the role map beside the recording names every parameter, gradient, Adam state and buffer
    by_role: dict[str, set[str]] = {}
    for e in index["roles"]:
        by_role.setdefault(e["role"] if e["role"] != "optimizer state" else e["detail"], set()).add(e["name"])
    params = {n for n, _ in model.named_parameters()}
    assert by_role["parameter"] == by_role["gradient"] == params
    assert by_role["exp_avg"] == by_role["exp_avg_sq"] == params
    assert by_role["buffer"] == {"body.1.running_mean", "body.1.running_var", "body.1.num_batches_tracked"}
    # AND memory_viz's pickle is untouched by it (plain snapshot keys only)
    assert set(recording) == {"segments", "device_traces", "allocator_settings", "external_annotations"}
    # AND the analysis groups the blocks older than the recording by role, with the exact bytes
    roles = role_index(index)
    assert roles is not None
    (dev,) = analyze(recording, roles=roles, top=50).devices
    groups = {g.frames: g for g in dev.top_stacks}
    weights = [p for p in model.parameters()]
    assert (
        groups[("parameter",)].bytes == _nbytes(weights) and groups[("parameter",)].count == len(weights) == 6
    )
    assert groups[("gradient",)].bytes == _nbytes(p.grad for p in weights if p.grad is not None)
    opt_state = model.trainer.optimizers[0].state
    assert groups[("optimizer state (exp_avg)",)].bytes == _nbytes(opt_state[p]["exp_avg"] for p in weights)
    assert groups[("buffer",)].bytes == _nbytes(model.buffers())
    assert ("(no stack recorded)",) not in groups
    # AND the explorer's replay labels each block by its category, with the tensor's name below
    table = StackTable()
    (rep,) = replay(recording, table, roles)
    strings = table.strings
    labels = {strings[table.frames[table.labels[s]][0]] for s in rep.stack[rep.start < 0].tolist()}
    assert labels >= {"parameter", "gradient", "optimizer state (exp_avg)", "buffer"}
    named = {
        strings[table.frames[table.stacks[s][1]][0]]
        for s in rep.stack[rep.start < 0].tolist()
        if len(table.stacks[s]) > 1
    }
    assert "parameter `body.0.weight`" in named
    assert "optimizer state (exp_avg_sq) of `body.2.bias`" in named
    assert "gradient of `body.0.bias`" in named


def test_role_index_matches_exact_addresses_only():
    idx = RoleIndex([{"addr": 4096, "bytes": 512, "role": "buffer", "name": "bn.running_mean"}])
    assert idx.frames(4096) == [
        {"name": "buffer", "filename": ROLE_FILE, "line": 0},
        {"name": "buffer `bn.running_mean`", "filename": ROLE_FILE, "line": 0},
    ]
    assert idx.frames(4097) is None and idx.frames(None) is None
    assert role_index({"roles": []}) is None and role_index(None) is None


def test_role_map_skips_meta_tensors_and_names_tied_storage_once():
    lin = nn.Linear(3, 3)
    tied = nn.Module()
    tied.a, tied.b = lin, nn.Linear(3, 3)
    tied.b.weight = lin.weight  # tied
    names = [(e["role"], e["name"]) for e in role_map(tied)]
    assert names.count(("parameter", "a.weight")) == 1 and ("parameter", "b.weight") not in names
    with torch.device("meta"):
        meta = nn.Linear(3, 3)
    assert role_map(meta) == []


def test_a_block_holding_several_tensors_is_labelled_with_every_name():
    # GIVEN FSDP2's gradient buffer of a group: one block, two parameters' gradients
    entry = {"addr": 4096, "bytes": 1452, "role": "gradient", "name": "0.weight", "others": ["0.bias"]}
    # THEN the label names both, in order
    assert RoleIndex([entry]).frames(4096)[1]["name"] == "gradient of `0.weight`, `0.bias`"
    # AND FSDP2's unsharded gradient (kept without gradient sync) says so, under the same category
    kept = {"addr": 8192, "bytes": 1320, "role": "gradient", "name": "0.weight", "detail": "unsharded"}
    assert [f["name"] for f in RoleIndex([kept]).frames(8192)] == [
        "gradient",
        "gradient (unsharded) of `0.weight`",
    ]
