"""What was alive at an OOM, by name: the role map written beside every OOM record, read back by
``memprofiler snapshot`` (tables and explorer) and the report, through the fake CUDA seam."""

from __future__ import annotations

import json
import re
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from conftest import step_trainer
from fake_cuda import GIB, FakeCudaBackend
from memprofiler import MemProfiler, MemProfilerCallback
from memprofiler.__main__ import main
from memprofiler.analysis.runs.artifacts import load_run
from memprofiler.analysis.snapshot.roles import ROLE_FILE, with_roles
from memprofiler.collectors import oom as oom_module
from memprofiler.collectors.block_roles import role_map
from memprofiler.reporters.model.snapshots import snapshot_entries
from memprofiler.units import format_bytes

MIB = 1 << 20
#: The recorder alone: no function is collected.
_NO_CALLS = {"collect_funcs": {"default": []}}


def _trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    """A linear layer, a batch norm (buffers) and another linear layer after one Adam step:
    parameters, gradients, exp_avg, exp_avg_sq and step all exist."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    return model, opt


def _storage_bytes(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def _record_an_oom(tmp_path: Path) -> tuple[nn.Module, torch.optim.Optimizer, FakeCudaBackend]:
    """GIVEN the recorder bound to a trained model whose parameters, gradients and exp_avg the
    ring saw allocated (moved to the device after recording began), exp_avg_sq and the buffers
    older than the ring, and 3 MiB of activations; WHEN an allocation of 5 GiB fails."""
    model, opt = _trained()
    fake = FakeCudaBackend()
    prof = MemProfiler(
        {"oom": {"enabled": True, "context": "alloc"}, **_NO_CALLS}, save_dir=tmp_path, rank=0, cuda=fake
    )
    prof.setup()
    prof.bind(model, [opt])
    for e in role_map(model, [opt]):
        if e["role"] in ("parameter", "gradient") or e.get("detail") == "exp_avg":
            fake.alloc_at(e["addr"], e["bytes"])
        else:
            fake.adopt(e["addr"], e["bytes"])
    fake.alloc(3 * MIB)
    with pytest.raises(torch.OutOfMemoryError):
        fake.oom(5 * GIB)
    prof.teardown()
    return model, opt, fake


def test_the_role_map_beside_an_oom_record_names_the_models_storages(tmp_path):
    model, opt, _ = _record_an_oom(tmp_path)
    # THEN beside the pickle and the YAML, the role map of that moment, in the window index's format
    rec = json.loads((tmp_path / "oom_rank_0_0.json").read_text())
    assert (rec["format"], rec["roles_at"], rec["pickle"], rec["oom"]) == (
        "memprofiler-allocator-window",
        "end",
        "oom_rank_0_0.pickle",
        0,
    )
    got = {(e["role"], e.get("detail"), e["name"]): e["bytes"] for e in rec["roles"]}
    params = dict(model.named_parameters())
    for name, p in params.items():
        assert got["parameter", None, name] == p.numel() * 4
        assert got["gradient", None, name] == p.grad.numel() * 4
        assert got["optimizer state", "exp_avg", name] == opt.state[p]["exp_avg"].numel() * 4
    assert {n for (r, _, n) in got if r == "buffer"} == {
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
    }
    # AND the YAML names the file
    assert "roles: oom_rank_0_0.json" in (tmp_path / "oom_rank_0_0.yaml").read_text()


def test_snapshot_tables_group_the_blocks_alive_at_the_oom_by_role(tmp_path, capsys):
    model, opt, _ = _record_an_oom(tmp_path)
    # WHEN the record's pickle is read
    assert main(["snapshot", str(tmp_path / "oom_rank_0_0.pickle")]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    # THEN what was alive at the OOM is grouped by role, with the model's own bytes and counts
    params = list(model.parameters())
    rows = {
        "parameter": (_storage_bytes(params), len(params)),
        "gradient": (_storage_bytes(p.grad for p in params), len(params)),
        "optimizer state (exp_avg)": (_storage_bytes(opt.state[p]["exp_avg"] for p in params), len(params)),
        "optimizer state (exp_avg_sq)": (
            _storage_bytes(opt.state[p]["exp_avg_sq"] for p in params),
            len(params),
        ),
        "buffer": (_storage_bytes(model.buffers()), 3),
    }
    for role, (nbytes, count) in rows.items():
        (line,) = [ln for ln in out.splitlines() if re.search(rf"│ {re.escape(role)}\s+│", ln)]
        assert re.search(rf"{re.escape(format_bytes(nbytes))}\s+│\s+{count}\s+│", line), line
    # AND the activations keep their stack; no storage is left under its allocating line or stackless
    (act,) = [
        ln for ln in out.splitlines() if ln.startswith("│") and "_record_an_oom (test_oom_roles.py:" in ln
    ]
    assert re.search(r"3\.00 MiB\s+│\s+1\s+│", act)
    assert "(no stack recorded)" not in out


def test_the_explorer_names_each_block_alive_at_the_oom(tmp_path):
    model, _, _ = _record_an_oom(tmp_path)
    page = tmp_path / "oom.html"
    # WHEN the explorer of the record is written
    assert main(["snapshot", str(tmp_path / "oom_rank_0_0.pickle"), "--html", str(page)]) == 0
    html = page.read_text()
    meta = json.loads(
        re.search(r"<script type='application/json' id='mp-meta'>(.*?)</script>", html).group(1)
    )
    strings = set(meta["strings"])
    # THEN every parameter, gradient and Adam state is named by role and tensor
    for name in dict(model.named_parameters()):
        assert f"parameter `{name}`" in strings
        assert f"gradient of `{name}`" in strings
        assert f"optimizer state (exp_avg) of `{name}`" in strings
        assert f"optimizer state (exp_avg_sq) of `{name}`" in strings
    assert "buffer `1.running_mean`" in strings


def test_the_report_reads_the_oom_record_with_its_role_map(tmp_path):
    model, _, _ = _record_an_oom(tmp_path)
    run = load_run(tmp_path)
    (entry,) = [e for e in snapshot_entries(run) if "OOM" in e.title]
    (dev,) = entry.analysis.devices
    groups = {g.frames: g for g in dev.oom_stacks}
    assert groups[("parameter",)].bytes == _storage_bytes(model.parameters())
    assert not [w for w in run.warnings if "oom_rank_0_0.json" in w]


@pytest.mark.parametrize("damage", ["missing", "unreadable", "foreign"])
def test_a_record_without_a_usable_role_map_reads_as_before(tmp_path, capsys, damage):
    # GIVEN a record whose role map is gone, garbled, or another record's
    _record_an_oom(tmp_path)
    roles = tmp_path / "oom_rank_0_0.json"
    if damage == "missing":
        roles.unlink()
    elif damage == "unreadable":
        roles.write_text("{not json")
    else:
        roles.write_text(json.dumps({**json.loads(roles.read_text()), "trace_entries": 1}))
    # WHEN it is read
    assert main(["snapshot", str(tmp_path / "oom_rank_0_0.pickle")]) == 0
    out, err = capsys.readouterr()
    # THEN one line says so, and the blocks are shown by their stacks as before
    (line,) = err.splitlines()
    assert "oom_rank_0_0.json" in line and "the blocks alive at the OOM are shown by stack only" in line
    assert "│ parameter " not in out and "optimizer state (exp_avg)" not in out
    # (the 18 storages the ring saw allocated under the test's own line, the rest with no stack)
    assert re.search(r"│\s+18 │ _record_an_oom \(test_oom_roles\.py:\d+\)", out)
    assert "(no stack recorded)" in out
    # AND the report says so once too
    run = load_run(tmp_path)
    snapshot_entries(run)
    assert len([w for w in run.warnings if "oom_rank_0_0.json" in w]) == 1


def test_a_fault_writing_the_role_map_leaves_the_record_and_the_oom(tmp_path, monkeypatch):
    # GIVEN a role map that cannot be taken
    def broken(*args, **kwargs):
        raise RuntimeError("storage gone")

    monkeypatch.setattr(oom_module, "role_map", broken)
    fake = FakeCudaBackend()
    prof = MemProfiler({"oom": {"enabled": True}, **_NO_CALLS}, save_dir=tmp_path, rank=0, cuda=fake).setup()
    prof.bind(nn.Linear(2, 2), [])
    # WHEN an allocation fails THEN it is still the OOM, and the record says why it has no roles
    with pytest.raises(torch.OutOfMemoryError):
        fake.oom(GIB)
    prof.teardown()
    rec = (tmp_path / "oom_rank_0_0.yaml").read_text()
    assert "roles: null" in rec and "storage gone" in rec
    assert (tmp_path / "oom_rank_0_0.pickle").is_file() and not (tmp_path / "oom_rank_0_0.json").exists()


def test_the_crash_record_takes_its_own_role_map(tmp_path):
    # GIVEN a model whose gradients are dropped between the OOM and the exception handler
    model, opt = _trained()
    fake = FakeCudaBackend()
    prof = MemProfiler({"oom": {"enabled": True}, **_NO_CALLS}, save_dir=tmp_path, rank=0, cuda=fake).setup()
    prof.bind(model, [opt])
    with pytest.raises(torch.OutOfMemoryError) as info:
        fake.oom(GIB)
    opt.zero_grad(set_to_none=True)
    prof.record_crash(info.value)
    prof.teardown()
    # THEN each record's map is of its own moment
    roles = [
        {e["role"] for e in json.loads((tmp_path / f"oom_rank_0_{n}.json").read_text())["roles"]}
        for n in (0, 1)
    ]
    assert "gradient" in roles[0] and "gradient" not in roles[1]


def test_only_the_allocation_alive_at_the_end_takes_the_role():
    # GIVEN a role map taken at the end, and a trace that reused the address before the storage
    index = {"roles_at": "end", "roles": [{"addr": 4096, "bytes": 512, "role": "parameter", "name": "w"}]}
    trace = [
        {"action": "alloc", "addr": 4096, "size": 512, "frames": []},
        {"action": "free_requested", "addr": 4096, "size": 512},
        {"action": "free_completed", "addr": 4096, "size": 512},
        {"action": "segment_alloc", "addr": 4096, "size": 2 * MIB},
        {
            "action": "alloc",
            "addr": 4096,
            "size": 512,
            "frames": [{"name": "f", "filename": "a.py", "line": 1}],
        },
        {"action": "alloc", "addr": 8192, "size": 512, "frames": []},
    ]
    data = {"segments": [], "device_traces": [trace]}
    named, roles = with_roles(data, index)
    assert roles is not None
    out = named["device_traces"][0]
    # THEN only the last allocation there is named, its own stack kept below the role's frames
    assert out[0] is trace[0] and out[5] is trace[5]
    assert [f["name"] for f in out[4]["frames"]] == ["parameter", "parameter `w`", "f"]
    assert out[4]["frames"][0]["filename"] == ROLE_FILE
    # AND the snapshot itself is untouched, and a window's map (taken at its start) names no trace entry
    assert trace[4]["frames"][0]["name"] == "f"
    assert with_roles(data, {**index, "roles_at": None})[0] is data


class _OomAtStep3(pl.LightningModule):
    """Adam over two linear layers; step 3 runs out of memory on the fake device."""

    def __init__(self, fake: FakeCudaBackend) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 1))
        self.fake = fake

    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            self.fake.oom(GIB)
        return self.body(batch[0]).pow(2).mean()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 8)), batch_size=4)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def test_a_trainer_that_runs_out_of_memory_names_its_module_in_both_records(tmp_path):
    # GIVEN the callback with the recorder on, over a Trainer on CPU
    fake = FakeCudaBackend()
    cb = MemProfilerCallback(
        {"oom": {"enabled": True}, **_NO_CALLS, "save_dir": str(tmp_path / "mp")}, cuda=fake
    )
    model = _OomAtStep3(fake)
    # WHEN step 3 runs out of memory and training ends in the error
    with pytest.raises(torch.OutOfMemoryError):
        step_trainer(tmp_path, [cb], 5).fit(model)
    # THEN the observer's record and the crash record each name the module's parameters and Adam state
    params = {n: p.numel() * 4 for n, p in model.named_parameters()}
    for n in (0, 1):
        roles = json.loads((tmp_path / "mp" / f"oom_rank_0_{n}.json").read_text())["roles"]
        assert {e["name"]: e["bytes"] for e in roles if e["role"] == "parameter"} == params
        assert {e["name"]: e["bytes"] for e in roles if e.get("detail") == "exp_avg"} == params
