"""MemProfiler without Lightning: context-manager API, attach + decorator, dump on error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import load_stats
from memprofiler import MemProfiler, memprofilable

F32 = 4


class Trainer:
    """A hand-written loop whose step is @memprofilable."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @memprofilable
    def train_step(self, x: torch.Tensor) -> float:
        loss = self.model(x).pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return float(loss)


def test_context_manager_collects_and_dumps_on_exit(tmp_path):
    model = nn.Linear(16, 8)
    with MemProfiler(
        {
            "schedule": {"wait": 1, "warmup": 0, "active": 1, "repeat": 2},
            "collect_funcs": {"default": ["step"]},
        },
        save_dir=tmp_path,
        rank=3,
    ) as prof:
        for _ in range(5):
            with prof.profile("step", module=model):
                model(torch.randn(4, 16)).pow(2).mean()
    stats = load_stats(tmp_path, rank=3)
    assert list(stats) == [f"3.step.{c}.{p}" for c in (2, 4) for p in ("start", "end")]
    # Linear's input (4x16) and the output saved by pow (4x8)
    assert stats["3.step.4.end"]["saved_tensors.unique_bytes"] == F32 * (4 * 16 + 4 * 8)
    assert prof.call_count("step") == 5


def test_attach_makes_memprofilable_report(tmp_path):
    loop = Trainer(nn.Linear(16, 8))
    prof = MemProfiler(
        {"schedule": {"warmup": 0, "active": 2}, "collect_funcs": {"default": ["train_step"]}},
        save_dir=tmp_path,
        rank=0,
    ).setup(loop.model)
    prof.attach(loop)
    for _ in range(3):
        loop.train_step(torch.randn(4, 16))
    prof.teardown()
    assert list(load_stats(tmp_path)) == [f"0.train_step.{c}.{p}" for c in (1, 2) for p in ("start", "end")]


def test_without_a_profiler_the_decorator_just_calls():
    loop = Trainer(nn.Linear(4, 2))
    assert isinstance(loop.train_step(torch.randn(3, 4)), float)


def test_exception_inside_the_loop_still_dumps(tmp_path):
    with (
        pytest.raises(ValueError, match="boom"),
        MemProfiler({"schedule": {"warmup": 0, "active": 5}}, save_dir=tmp_path, rank=0) as prof,
    ):
        for i in range(4):
            with prof.profile("training_step"):
                if i == 2:
                    raise ValueError("boom")
    stats = load_stats(tmp_path)
    assert "0.training_step.2.end" in stats and "0.training_step.3.start" in stats
    assert stats["0.training_step.3.end"]["failed"] is True


def test_nested_collected_calls_are_counted_not_collected(tmp_path):
    prof = MemProfiler(
        {"schedule": {"warmup": 0, "active": 3}, "collect_funcs": {"default": ["outer", "inner"]}},
        save_dir=tmp_path,
        rank=0,
    ).setup()
    with (
        pytest.warns(UserWarning, match="nested calls are counted but not collected"),
        prof.profile("outer"),
        prof.profile("inner"),
    ):
        pass
    assert prof.call_count("inner") == 1
    assert "0.inner.1.start" not in prof.snapshots and "0.outer.1.end" in prof.snapshots


SIGTERM_LOOP = """
import os, signal, sys
from memprofiler import MemProfiler

with MemProfiler({"schedule": {"warmup": 0, "active": 10}}, save_dir=sys.argv[1], rank=0) as prof:
    for i in range(1, 10):
        with prof.profile("training_step"):
            if i == 4:
                os.kill(os.getpid(), signal.SIGTERM)
print("not reached")
"""


@pytest.mark.slow
def test_sigterm_in_a_plain_loop_writes_the_files_and_still_dies_by_sigterm(tmp_path):
    import signal
    import subprocess
    import sys

    from _env import subprocess_env

    # GIVEN a plain loop whose window (calls 1-10) is still open when SIGTERM arrives in call 4
    script = tmp_path / "loop.py"
    script.write_text(SIGTERM_LOOP)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")],
        env=subprocess_env(root / "src"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    # THEN the process ended by SIGTERM, as a scheduler expects, after writing calls 1-3
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    assert "not reached" not in proc.stdout
    stats = load_stats(tmp_path / "out")
    assert [k for k in stats if k.endswith(".end")] == [f"0.training_step.{c}.end" for c in (1, 2, 3)]
    assert "0.training_step.4.start" in stats


def test_memprofilable_on_a_slotted_class_just_runs():
    class Slotted:
        __slots__ = ("k",)

        def __init__(self) -> None:
            self.k = 2

        @memprofilable
        def step(self, x: int) -> int:
            return x * self.k

    assert Slotted().step(3) == 6
