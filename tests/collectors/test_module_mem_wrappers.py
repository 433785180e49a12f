"""A LightningModule around a Hugging Face model: the module-wise report's default depth shows the
model's parts, and the wrapper and the model it holds are one row, not two of the same figures."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import yaml

from conftest import make_trainer
from memprofiler import MemProfilerCallback, memprofilable
from memprofiler.collectors.mem_report import render_log, wrapper_chains
from memprofiler.reporters.model.yaml_tables import CHAIN, fold_wrappers, module_deltas

transformers = pytest.importorskip("transformers")

BATCH, SEQ, VOCAB = 4, 16, 64


class Wrapped(pl.LightningModule):
    """Holds the model and nothing else that runs: its forward returns the model's output whole."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        cfg = transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=SEQ,
        )
        self.model = transformers.BertModel(cfg)

    def forward(self, ids: torch.Tensor) -> Any:
        return self.model(input_ids=ids)

    @memprofilable
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self(batch).last_hidden_state.pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        ids = torch.randint(0, VOCAB, (3 * BATCH, SEQ), generator=torch.Generator().manual_seed(0))
        return torch.utils.data.DataLoader(ids, batch_size=BATCH)


def test_the_default_depth_shows_the_wrapped_models_parts_and_one_row_for_the_wrapper(tmp_path):
    # GIVEN a LightningModule whose forward is its Hugging Face model's, tracked at the default depth
    cb = MemProfilerCallback({"track_module_mem": True, "save_dir": str(tmp_path), "schedule": {"warmup": 1}})
    model = Wrapped()
    make_trainer(tmp_path, [cb], limit_train_batches=2).fit(model)
    report = yaml.safe_load((tmp_path / "module_mem_rank_0_training_step_2.yaml").read_text())
    # THEN the depth counts from the model the wrapper holds: its parts are there
    assert report["module_depth"] == 2 and report["module_depth_from"] == ["Wrapped.model"]
    assert list(report["modules"]) == [
        "Wrapped",
        "Wrapped.model",
        "Wrapped.model.embeddings",
        "Wrapped.model.encoder",
        "Wrapped.model.pooler",
    ]
    # AND the snapshots are the tracker's own: every parameter is registered when the model starts
    pb = sum(p.numel() * p.element_size() for p in model.parameters())
    assert report["modules"]["Wrapped.model.embeddings"]["Pre-Forward"][0]["cpu"]["Parameter"] == pb
    # AND the .log says where the depth counts from
    log = (tmp_path / "module_mem_rank_0_training_step_2.log").read_text()
    assert "Module-wise snapshots (depth <= 2 counted from Wrapped.model, which its wrappers hold)" in log
    # AND the table of what each module added has one row for the wrapper and its model, whose
    # figures are the wrapper's own differences of the tracker's totals, then the model's parts
    deltas = module_deltas(report)
    assert deltas is not None
    names = [r[0] for r in deltas.rows]
    assert names == [
        f"Wrapped{CHAIN}model",
        "Wrapped.model.embeddings",
        "Wrapped.model.encoder",
        "Wrapped.model.pooler",
    ]
    mods = report["modules"]
    total = {
        ph: mods["Wrapped"][ph][0]["cpu"]["Total"] for ph in ("Pre-Forward", "Post-Forward", "Peak-Forward")
    }
    assert deltas.rows[0][1:4] == [
        "cpu",
        total["Post-Forward"] - total["Pre-Forward"],
        total["Peak-Forward"] - total["Pre-Forward"],
    ]


def test_a_wrapper_that_adds_its_own_figures_keeps_its_row():
    # GIVEN a wrapper whose forward made 100 bytes more than the model it holds, over a model of two parts
    rows = {"Lit": [["cpu", 600]], "Lit.model": [["cpu", 500]], "Lit.model.a": [["cpu", 200]],
            "Lit.model.b": [["cpu", 300]]}  # fmt: skip
    # THEN nothing folds: the two rows differ
    assert [n for n, _ in fold_wrappers(rows)] == list(rows)
    # AND a chain of three identical wrappers is one row named by the whole chain
    same = {"A": [[1]], "A.b": [[1]], "A.b.c": [[1]], "A.b.c.x": [[0]], "A.b.c.y": [[1]]}
    assert fold_wrappers(same) == [(f"A{CHAIN}b{CHAIN}c", [[1]]), ("A.b.c.x", [[0]]), ("A.b.c.y", [[1]])]


def test_a_chain_ends_at_the_first_module_with_two_children():
    assert wrapper_chains(["Lit.net", "Lit.net.0", "Lit.net.1"]) == {"Lit": "Lit.net"}  # an untracked wrapper
    assert wrapper_chains(["Net", "Net.a", "Net.b"]) == {}
    assert wrapper_chains(["Lit", "Lit.model", "Loss"]) == {"Lit": "Lit.model"}
    # a report written without a chain keeps its old line
    report = {"tracker": "MemTracker", "rank": 0, "fn": "f", "call": 1, "window": "W", "module_depth": 2,
              "peak": {}, "modules": {}}  # fmt: skip
    assert "Module-wise snapshots (depth <= 2)" in render_log(report)
