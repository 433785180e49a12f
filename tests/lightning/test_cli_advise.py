"""``MemProfilerCLI advise``: the fit config's step and each change estimated, the answer as YAML keys."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from memprofiler import advise, estimate_memory
from memprofiler.lightning.cli import MemProfilerCLI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from demo import Block

D, T = 64, 32


class Blocks(pl.LightningModule):
    def __init__(self, batch_size: int = 8) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.blocks = nn.ModuleList([Block(D, 4) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return x

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.randn(64, T, D)), batch_size=self.batch_size)


def _cli(*args: str) -> None:
    MemProfilerCLI(Blocks, args=["advise", "--trainer.accelerator", "cpu", *args], save_config_callback=None)


def _python(budget: int, names: list[str]) -> Any:
    with torch.device("meta"):
        model = Blocks()
    x = torch.randn(8, T, D)
    return advise(
        model,
        (x,),
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        loss_fn=lambda m, b: m.training_step(b, 0),
        budget=budget,
        candidates=names,
        progress=False,
    )


def test_advise_prints_the_figures_python_gives_and_the_yaml_to_change(capsys):
    # GIVEN a budget the fit config's step does not fit
    with torch.device("meta"):
        model = Blocks()
    base = estimate_memory(
        model,
        (torch.randn(8, T, D),),
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
        loss_fn=lambda m, b: m.training_step(b, 0),
    )
    budget = int(base.reserved_peak_bytes * 0.95)
    names = ["bf16-mixed", "micro-batch"]
    # WHEN advise runs from the config
    _cli("--advise.budget", str(budget), "--advise.candidates", '["bf16-mixed", "micro-batch"]')
    out = capsys.readouterr().out
    # THEN its table holds the rows Python gives, and the answer is printed as YAML keys
    advice = _python(budget, names)
    assert f"advise: budget {budget / 2**20:.2f} MiB per rank" in out
    for row in advice.rows:
        assert row.change.split(" (")[0] in out
    assert advice.best is not None
    assert f"make it fit: {advice.best.change}" in " ".join(out.split())
    for line in advice.best.yaml:
        assert line in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "`advise.budget`: set the memory one device may take"),
        (["--advise.budget", "0"], "`advise.budget`: got '0'; use the memory one device may take"),
        (
            ["--advise.budget", "1GiB", "--advise.candidates", '["nope"]'],
            "`advise.candidates`: unknown candidate 'nope'",
        ),
    ],
)
def test_bad_options_are_one_line_and_exit_2(capsys, args, message):
    with pytest.raises(SystemExit) as stop:
        _cli(*args)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in err


class Configured(Blocks):
    """Its head is made in ``configure_model``, as Lightning's large-model recipe has it."""

    def configure_model(self) -> None:
        if not hasattr(self, "head"):
            self.head = nn.Linear(D, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(super().forward(x))


def test_configure_model_is_run_on_each_copy(capsys):
    from memprofiler.estimate import EstimatePlan, estimate_plan
    from memprofiler.lightning.estimate import _configure_model

    # GIVEN a model whose configure_model adds a layer
    with torch.device("meta"):
        model = Configured()
    x = (torch.randn(8, T, D),)
    by_hand = estimate_plan(
        model,
        x,
        EstimatePlan(
            optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
            loss_fn=lambda m, b: m.training_step(b, 0),
            parallelize=_configure_model,
        ),
    )
    # WHEN advise runs from the config
    MemProfilerCLI(
        Configured,
        args=[
            "advise",
            "--trainer.accelerator",
            "cpu",
            "--advise.budget",
            "1GiB",
            "--advise.candidates",
            '["bf16-mixed"]',
        ],
        save_config_callback=None,
    )
    out = capsys.readouterr().out
    # THEN the plan as given is the estimate with that layer made
    row = next(line for line in out.splitlines() if line.startswith("│ the plan as given"))
    assert f"{by_hand.reserved_peak_bytes / 2**20:.2f} MiB" in row
