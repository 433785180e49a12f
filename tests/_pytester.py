"""pytester helpers for the pytest-plugin tests: inner sessions that load this checkout's plugin.

A plugin module (``pytest_plugins = ["pytester", "_pytester"]``), not a conftest: a second
``conftest`` module would shadow ``tests/conftest.py`` for ``from conftest import ...``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
TESTS = Path(__file__).resolve().parent

#: An inner test module's head: a model whose saved-for-backward bytes are known exactly.
#: Batch B x 256 float32 is B KiB per activation; Linear saves its input, ReLU its output,
#: and the second Linear's input is the first ReLU's output (one storage, counted once).
MODEL = """
import pytest
import torch

class MLP(torch.nn.Module):
    def __init__(self, width=256):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, 256), torch.nn.ReLU()
        )

    def forward(self, x):
        return self.net(x)

def step(batch=64, width=256):
    MLP(width)(torch.randn(batch, 256)).sum().backward()
"""


class Inner:
    """An inner pytest session over test files written with :meth:`write`."""

    def __init__(self, pytester: pytest.Pytester) -> None:
        self.pytester = pytester
        self.path = pytester.path

    def write(self, name: str, body: str, model: bool = True) -> None:
        self.pytester.makepyfile(**{name: (MODEL if model else "import pytest\n") + body})

    def run(self, *args: str, subprocess: bool = False, load: bool = True) -> pytest.RunResult:
        """In-process by default (fast); ``subprocess`` for what needs a fresh interpreter.

        ``load`` passes ``-p memprofiler.pytest_plugin``: an install made before the entry point
        existed does not load the plugin, and the entry point is named after the module, so
        with it this is no second registration.
        """
        full = [*(["-p", "memprofiler.pytest_plugin"] if load else []), "-p", "no:cacheprovider", *args]
        if subprocess:
            return self.pytester.runpytest_subprocess(*full)
        return self.pytester.runpytest_inprocess(*full)


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Inner:
    """Inner sessions that import this checkout's ``src`` and ``tests/fake_cuda``."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SRC), str(TESTS)]))
    return Inner(pytester)
