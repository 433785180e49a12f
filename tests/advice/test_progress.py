"""Progress while ``advise`` estimates: a status line where stderr is a terminal, from Python and
from the Lightning subcommand; quiet where it is not (a log, a pipe)."""

from __future__ import annotations

import io
import re
import sys
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from memprofiler import advise
from memprofiler.lightning.cli import MemProfilerCLI

X = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _net() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))


def _sgd(ps: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(ps, lr=0.1)


def _advise(**kw: Any) -> Any:
    return advise(_net(), X, optimizer=_sgd, budget="1GiB", candidates=["bf16-mixed"], **kw)


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def test_a_terminal_gets_the_status_line(monkeypatch, capsys):
    # GIVEN stderr is a terminal
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    # WHEN advise runs with the default
    _advise()
    # THEN the status line named the change estimated and counted the estimates; stdout stayed clean
    shown = _plain(err.getvalue())
    assert "advise 0 estimated the plan as given" in shown
    assert "precision bf16-mixed" in shown and "advise 2 estimated" in shown
    assert capsys.readouterr().out == ""


def test_no_terminal_no_status_line(capsys):
    # GIVEN stderr is captured (no terminal) WHEN advise runs with the default THEN nothing is written
    _advise()
    assert capsys.readouterr().err == ""


def test_asked_for_without_a_terminal_it_is_one_line_per_estimate(capsys):
    _advise(progress=True)
    lines = capsys.readouterr().err.splitlines()
    assert [re.sub(r" \(\d+ s\)", "", line) for line in lines] == [
        "advise: 1 estimated: the plan as given",
        "advise: 2 estimated: precision bf16-mixed (autocast; fp32 weights and optimizer state)",
    ]


def test_progress_false_is_quiet_on_a_terminal(monkeypatch):
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    _advise(progress=False)
    assert err.getvalue() == ""


class Mlp(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return _sgd(self.parameters())

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(X), batch_size=32)


@pytest.mark.parametrize(
    ("terminal", "args", "shown"),
    [(True, [], True), (False, [], False), (True, ["--advise.progress", "false"], False)],
)
def test_the_lightning_subcommand_shows_it_on_a_terminal_only(monkeypatch, capsys, terminal, args, shown):
    err = Terminal()
    if terminal:
        monkeypatch.setattr(sys, "stderr", err)
    MemProfilerCLI(
        Mlp,
        args=[
            "advise",
            "--trainer.accelerator",
            "cpu",
            "--advise.budget",
            "1GiB",
            "--advise.candidates",
            '["bf16-mixed"]',
            *args,
        ],
        save_config_callback=None,
    )
    written = _plain(err.getvalue()) + capsys.readouterr().err
    assert ("advise 2 estimated" in written) is shown
    assert "estimated (" not in written  # never the plain lines unasked
