"""Nothing is lost on a crash: an exception or SIGTERM leaves valid files of what was collected."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from torch import nn

from _env import subprocess_env
from conftest import make_trainer, step_trainer
from fake_cuda import FakeCudaBackend
from memprofiler import MemProfiler, MemProfilerCallback, memprofilable
from memprofiler.analysis.snapshot.calls import call_ranges, call_view, find_call

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]

CONFIG = {
    "schedule": {"warmup": 0, "active": 10},
    "cuda_allocator_history": True,
    "oom": {"enabled": True},
}


class FailingModel(pl.LightningModule):
    """Each step allocates (step) MiB on the fake device; step ``fail_at`` raises or gets SIGTERM."""

    def __init__(self, fake: FakeCudaBackend, fail_at: int, how: str = "raise") -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.fake = fake
        self.fail_at = fail_at
        self.how = how

    @memprofilable
    def training_step(self, batch, batch_idx):
        step = batch_idx + 1
        self.fake.free(self.fake.alloc(step * MIB))
        if step == self.fail_at:
            if self.how == "raise":
                raise RuntimeError(f"injected failure in step {step}")
            os.kill(os.getpid(), 15)  # SIGTERM: Lightning raises SIGTERMException after this step
        return self.layer(batch[0]).sum()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _load_pickle(path: Path) -> dict:
    data = path.read_bytes()
    assert data[:2] == b"\x80\x04"
    return pickle.loads(data)


def assert_complete_record(save_dir: Path, done_steps: int, failed_step: int | None) -> None:
    """The files hold every finished step, exactly, and the crash record."""
    stats = yaml.safe_load((save_dir / "rank_0_memory_stats.yaml").read_text())
    expected = {f"0.training_step.{n}.{p}" for n in range(1, done_steps + 1) for p in ("start", "end")}
    if failed_step is not None:  # the failed call keeps its start and an end marked failed
        expected |= {f"0.training_step.{failed_step}.start", f"0.training_step.{failed_step}.end"}
    assert set(stats) == expected
    if failed_step is not None:
        assert stats[f"0.training_step.{failed_step}.end"]["failed"] is True
    # One recording for the window, each call marked in it: the view at the end of step n
    # holds the allocations of steps 1..n, and the failed step's its own up to the failure.
    recording = _load_pickle(save_dir / "cuda_alloc_rank_0.window_0.pickle")
    ranges = call_ranges(recording)
    for n in range(1, done_steps + 1):
        assert stats[f"0.training_step.{n}.end"]["allocator_history.window"] == 0
        assert stats[f"0.training_step.{n}.end"]["rss"] > 0
        end = call_view(recording, find_call(ranges, "training_step", n), "end")
        allocs = [e["size"] for e in end["device_traces"][0] if e["action"] == "alloc"]
        assert allocs == [k * MIB for k in range(1, n + 1)]
    if failed_step is not None:
        end = call_view(recording, find_call(ranges, "training_step", failed_step), "end")
        assert [e["size"] for e in end["device_traces"][0] if e["action"] == "alloc"][-1] == failed_step * MIB
    # The crash record carries the same snapshots and the whole history to the crash.
    crash = yaml.safe_load((save_dir / "oom_rank_0_0.yaml").read_text())
    assert crash["reason"] == "exception"
    assert crash["snapshots"] == stats
    last = failed_step or done_steps
    trace = _load_pickle(save_dir / crash["pickle"])["device_traces"][0]
    assert [e["size"] for e in trace if e["action"] == "alloc"] == [k * MIB for k in range(1, last + 1)]


def test_exception_mid_run_leaves_valid_files_of_the_earlier_steps(tmp_path):
    # GIVEN every step collected, history and the flight recorder on, step 5 raising
    fake = FakeCudaBackend()
    cb = MemProfilerCallback({**CONFIG, "save_dir": str(tmp_path / "mp")}, cuda=fake)
    # WHEN training runs into the failure
    with pytest.raises(RuntimeError, match="injected failure in step 5"):
        step_trainer(tmp_path, [cb], 8).fit(FailingModel(fake, fail_at=5))
    # THEN steps 1-4 are on disk in full, step 5's start too, and the crash record
    save_dir = tmp_path / "mp"
    assert_complete_record(save_dir, done_steps=4, failed_step=5)
    crash = yaml.safe_load((save_dir / "oom_rank_0_0.yaml").read_text())
    assert crash["exception"] == "RuntimeError: injected failure in step 5"
    assert crash["step"] == 4  # four optimizer steps completed
    # AND recording is off, the observer gone: nothing keeps running after the crash
    assert fake.ring is None
    assert fake._oom_observers == []


def test_plain_loop_exception_leaves_valid_files(tmp_path):
    # GIVEN a plain PyTorch loop using the context manager
    fake = FakeCudaBackend()
    # WHEN the loop raises in call 3
    with (
        pytest.raises(ValueError, match="bad batch"),
        MemProfiler(CONFIG, save_dir=tmp_path, rank=0, cuda=fake) as prof,
    ):
        for n in range(1, 6):
            with prof.profile("training_step"):
                fake.free(fake.alloc(n * MIB))
                if n == 3:
                    raise ValueError("bad batch")
    # THEN calls 1-2 are complete, call 3 started, and the crash record is there
    assert_complete_record(tmp_path, done_steps=2, failed_step=3)
    assert fake.ring is None


SIGTERM_SCRIPT = """
import sys
from pathlib import Path

from lightning.pytorch.utilities.exceptions import SIGTERMException

from conftest import step_trainer
from fake_cuda import FakeCudaBackend
from memprofiler import MemProfiler, MemProfilerCallback
from test_crash_capture import CONFIG, FailingModel

root = Path(sys.argv[1])
fake = FakeCudaBackend()
cb = MemProfilerCallback({**CONFIG, "save_dir": str(root / "mp")}, cuda=fake)
try:
    step_trainer(root, [cb], 8).fit(FailingModel(fake, fail_at=3, how="sigterm"))
except SIGTERMException:
    print("SIGTERMException; recording on:", fake.ring is not None)
    sys.exit(3)
print("no SIGTERMException")
"""


@pytest.mark.slow
def test_sigterm_mid_run_leaves_valid_files(tmp_path):
    # GIVEN a Trainer run in a subprocess that receives SIGTERM during step 3
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SIGTERM_SCRIPT))
    env = subprocess_env(ROOT / "src", Path(__file__).resolve().parent)
    # WHEN it runs
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=240
    )
    # THEN Lightning turned the signal into SIGTERMException after step 3, and we stopped recording
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "SIGTERMException; recording on: False" in proc.stdout
    # AND steps 1-3 are on disk in full, with the crash record
    assert_complete_record(tmp_path / "mp", done_steps=3, failed_step=None)


class _CudaOomModel(pl.LightningModule):
    """Trains a small MLP on CUDA; step 3 asks for more memory than the device has."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))

    @memprofilable
    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            _, total = torch.cuda.mem_get_info()
            torch.empty(total + (1 << 30), dtype=torch.uint8, device=self.device)
        return self.net(batch[0]).pow(2).mean()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 64)), batch_size=8)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.cuda
def test_gpu_real_oom_in_a_trainer_leaves_every_record(tmp_path):
    # GIVEN every step collected with history and the flight recorder, on a real GPU
    cb = MemProfilerCallback({**CONFIG, "save_dir": str(tmp_path / "mp")})
    trainer = make_trainer(tmp_path, [cb], max_steps=6, accelerator="cuda")
    # WHEN step 3 runs out of memory
    with pytest.raises(torch.OutOfMemoryError):
        trainer.fit(_CudaOomModel())
    save_dir = tmp_path / "mp"
    # THEN the observer's record (0) and the exception's record (1) are both there
    first = yaml.safe_load((save_dir / "oom_rank_0_0.yaml").read_text())
    second = yaml.safe_load((save_dir / "oom_rank_0_1.yaml").read_text())
    assert (first["reason"], second["reason"]) == ("cuda_oom", "exception")
    assert first["failed_alloc_bytes"] >= first["device_total_bytes"]
    assert any(
        e["action"] == "oom"
        for trace in _load_pickle(save_dir / first["pickle"])["device_traces"]
        for e in trace
    )
    # AND steps 1-2 are complete in the stats file; step 3 has its start and an end marked failed
    stats = yaml.safe_load((save_dir / "rank_0_memory_stats.yaml").read_text())
    assert {k for k in stats if k.endswith(".end")} == {f"0.training_step.{n}.end" for n in (1, 2, 3)}
    assert [stats[f"0.training_step.{n}.end"].get("failed", False) for n in (1, 2, 3)] == [False, False, True]
    assert "0.training_step.3.start" in stats and first["snapshots"].keys() <= stats.keys()
    # AND nothing keeps recording after the crash
    assert torch._C._cuda_isHistoryEnabled() is False
