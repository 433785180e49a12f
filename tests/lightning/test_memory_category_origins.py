"""The memory categories file records what made each tensor; without torch's help it is still
written, with one warning."""

from __future__ import annotations

import json

import torch
from torch.profiler import ProfilerActivity, profile

from memprofiler.analysis.traces.memory_categories import read_category_file
from memprofiler.lightning import memory_categories as mc


def _profiled() -> profile:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        profile_memory=True,
        with_stack=True,
        with_modules=True,
    ) as p:
        for _ in range(2):
            model(torch.randn(8, 16)).sum().backward()
    return p


def test_each_tensor_says_its_operator_module_and_shape(tmp_path):
    p = _profiled()
    warned: list[str] = []
    out = tmp_path / "x.memory_categories.json"
    (path,) = mc.write_category_timeline(
        p, lambda b: out.write_bytes(b) and out, lambda m, **k: warned.append(m)
    )
    doc = json.loads(path.read_text())
    assert warned == []
    origins = doc["tensors"].values()
    # the first layer's forward output: made by aten::addmm (through aten::linear) in Linear_0, [8, 32]
    assert ["aten::addmm", "Linear_0", [8, 32], "float32"] in [o[:4] for o in origins]
    (cpu,) = read_category_file(path, 0.0)
    assert any(o.operator and o.shape for o in cpu.origins.values())


def test_without_torchs_tensor_tree_the_categories_are_written_with_one_warning(tmp_path, monkeypatch):
    def refuse(*_a, **_k):
        raise AttributeError("_op_tree")

    monkeypatch.setattr(mc, "tensor_origins", refuse)
    warned: list[str] = []
    out = tmp_path / "x.memory_categories.json"
    (path,) = mc.write_category_timeline(
        _profiled(), lambda b: out.write_bytes(b) and out, lambda m, **k: warned.append(m)
    )
    doc = json.loads(path.read_text())
    assert "tensors" not in doc and doc["devices"]
    assert len(warned) == 1 and "without the operator, module and shape of each tensor" in warned[0]
    (cpu,) = read_category_file(path, 0.0)
    assert cpu.peak_bytes > 0 and cpu.origins == {}
