"""Whatever the order of set-up and model placement, the CUDA collectors never crash the process.

On a real GPU ``torch._C._cuda_isHistoryEnabled()`` before CUDA is initialised is a segmentation
fault (seen on an NVIDIA H200: exit 139 for ``MemProfiler`` with
``oom.enabled`` or ``cuda_allocator_history`` set up before the first CUDA tensor). Here the
same conditions are made on CPU: the real backend over a patched ``torch.cuda`` whose private
bindings raise :class:`SimulatedCrash` before init, and the fake backend started uninitialised,
driven in the orders users set up: a plain loop, Fabric, Lightning, and a machine without GPU.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.fabric import Fabric
from torch import nn

from _tiny_lightning import TinyModel
from fake_cuda import FakeCudaBackend, SimulatedCrash
from memprofiler import MemProfiler, MemProfilerCallback
from memprofiler.analysis.snapshot.calls import call_ranges
from memprofiler.collectors.cuda_backend import CudaBackend, CudaNotInitialized
from memprofiler.core.warn import MemProfilerWarning

MIB = 1 << 20
BINDINGS = (
    "_cuda_isHistoryEnabled",
    "_cuda_memorySnapshot",
    "_cuda_record_memory_history",
    "_cuda_attach_out_of_memory_observer",
    "_cuda_getAllocatorBackend",
)

#: Both CUDA collectors on, collecting `step`; no per-call CUDA statistics (they are not at issue).
CONFIG: dict[str, Any] = {
    "oom": {"enabled": True},
    "cuda_allocator_history": True,
    "enable_saved_tensors_hooks": False,
    "schedule": {"warmup": 0, "active": 2},
    "collect_funcs": {"default": [], "cuda_allocator_history": ["step"]},
}


class PatchedCuda:
    """``torch.cuda`` of a GPU machine, before and after init, for the real backend."""

    def __init__(self) -> None:
        self.initialized = False
        self.inits = 0
        self.calls: list[str] = []
        self.history_on = False

    def init(self) -> None:
        if not self.initialized:
            self.initialized = True
            self.inits += 1

    def binding(self, name: str) -> Any:
        def call(*args: Any) -> Any:
            if not self.initialized:
                raise SimulatedCrash(f"torch._C.{name}() before CUDA is initialised: segmentation fault")
            self.calls.append(name)
            if name == "_cuda_isHistoryEnabled":
                return self.history_on
            if name == "_cuda_record_memory_history":
                self.history_on = args[0] is not None
            if name == "_cuda_memorySnapshot":
                return {"segments": [], "device_traces": [[]]}
            if name == "_cuda_getAllocatorBackend":
                return "native"
            return None

        return call


@pytest.fixture
def gpu_machine(monkeypatch: pytest.MonkeyPatch) -> PatchedCuda:
    cuda = PatchedCuda()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: cuda.initialized)
    monkeypatch.setattr(torch.cuda, "init", cuda.init)
    for name in BINDINGS:
        monkeypatch.setattr(torch._C, name, cuda.binding(name), raising=False)
    return cuda


def _ours(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, MemProfilerWarning)]


# ------------------------------------------------------------ the real backend, patched torch
def test_real_backend_calls_no_private_binding_before_init(gpu_machine):
    # GIVEN a GPU machine where CUDA is not initialised yet
    backend = CudaBackend()
    # WHEN memprofiler asks whether history is on, or for a snapshot or a recording
    # THEN nothing reaches a binding: "cannot tell", or an exception the collector guard catches
    assert backend.is_history_enabled() is None
    with pytest.raises(CudaNotInitialized, match="_cuda_memorySnapshot"):
        backend.snapshot()
    with pytest.raises(CudaNotInitialized, match="_cuda_record_memory_history"):
        backend.record_memory_history("all", max_entries=10)
    assert backend.history_unsupported_reason() == "CUDA is not initialised"
    assert backend.allocator_backend() is None
    assert gpu_machine.calls == [] and gpu_machine.inits == 0
    # AND once initialised the same calls go through
    assert backend.ensure_initialized() is None
    assert backend.is_history_enabled() is False
    assert gpu_machine.inits == 1


@pytest.mark.parametrize("case", ["oom_setup", "history_setup"])
def test_segv_repro_cases_run_to_the_end_with_the_real_backend(tmp_path, gpu_machine, case):
    # GIVEN segv_repro.py's cases: set-up before any CUDA tensor, with the real backend
    cfg = dict(CONFIG)
    if case == "oom_setup":
        cfg["cuda_allocator_history"] = False
    else:
        cfg["oom"] = {"enabled": False}
    # WHEN the profiler is set up and a call collected
    with MemProfiler(cfg, save_dir=tmp_path, rank=0, cuda=CudaBackend()) as prof, prof.profile("step"):
        pass
    # THEN memprofiler initialised CUDA once, before its first binding call, and recorded
    assert gpu_machine.inits == 1
    assert gpu_machine.calls[0] == "_cuda_getAllocatorBackend"
    assert "_cuda_isHistoryEnabled" in gpu_machine.calls
    if case == "history_setup":
        # (the patched bindings keep no annotations: the recording is written, its calls in the index)
        assert {p.name for p in tmp_path.glob("cuda_alloc_*")} == {
            "cuda_alloc_rank_0.window_0.pickle",
            "cuda_alloc_rank_0.window_0.json",
        }
    else:
        assert "_cuda_attach_out_of_memory_observer" in gpu_machine.calls


def test_real_backend_names_a_failed_init(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)

    def init() -> None:
        raise RuntimeError("Cannot re-initialize CUDA in forked subprocess")

    monkeypatch.setattr(torch.cuda, "init", init)
    reason = CudaBackend().ensure_initialized()
    assert reason == "torch.cuda.init() failed: Cannot re-initialize CUDA in forked subprocess"


# ------------------------------------------------------------ the orders users set up in
def _marked_calls(save_dir: Path) -> list[tuple[str, int]]:
    """The calls marked in the one allocator recording of the run's window."""
    (path,) = save_dir.glob("cuda_alloc_rank_0.window_*.pickle")
    return [(r.fn, r.call) for r in call_ranges(pickle.loads(path.read_bytes()))]


def test_plain_loop_set_up_before_any_cuda_tensor(tmp_path):
    # GIVEN a fresh process: CUDA not initialised, history and the OOM recorder asked for
    fake = FakeCudaBackend(initialized=False)
    # WHEN the profiler is set up first, then the model placed, then a step collected
    with MemProfiler(CONFIG, save_dir=tmp_path, rank=0, cuda=fake) as prof:
        assert fake.initialized and fake.inits == 1  # memprofiler initialised CUDA itself
        weights = fake.alloc(4 * MIB)
        with prof.profile("step"):
            fake.free(fake.alloc(MIB))
    # THEN the window's recording holds the step's allocation, and the OOM observer was attached
    end = pickle.loads((tmp_path / "cuda_alloc_rank_0.window_0.pickle").read_bytes())
    sizes = [e["size"] for e in end["device_traces"][0] if e["action"] == "alloc"]
    assert sizes == [4 * MIB, MIB]
    assert len(fake.raw_observers) == 1
    assert weights


def test_fabric_order_profiler_before_setup(tmp_path):
    # GIVEN Fabric built and the profiler set up before Fabric places the model
    fake = FakeCudaBackend(initialized=False)
    fabric = Fabric(accelerator="cpu", devices=1)
    prof = MemProfiler(CONFIG, save_dir=tmp_path, rank=fabric.global_rank, cuda=fake).setup()
    model = nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = fabric.setup(model, opt)
    fake.alloc(sum(p.numel() * p.element_size() for p in model.parameters()))  # the placement
    prof.bind(model, [opt])
    # WHEN two steps are collected
    for _ in range(2):
        with prof.profile("step", module=model):
            loss = model(torch.randn(2, 8)).sum()
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()
        prof.step_end()
    prof.teardown()
    # THEN both calls are marked in the window's recording, and CUDA was initialised by memprofiler, once
    assert _marked_calls(tmp_path) == [("step", 1), ("step", 2)]
    assert fake.inits == 1


@pytest.mark.parametrize("initialized", [True, False], ids=["model_on_gpu", "cpu_training_on_gpu_machine"])
def test_lightning_order(tmp_path, initialized):
    # GIVEN Lightning, where the accelerator sets the device up before the callback's set-up
    # (model_on_gpu), or a CPU fit on a machine that has a GPU (CUDA untouched until then)
    fake = FakeCudaBackend(initialized=initialized)
    cb = MemProfilerCallback({**CONFIG, "collect_funcs": {"default": ["training_step"]}}, cuda=fake)
    trainer = pl.Trainer(
        accelerator="cpu",
        default_root_dir=tmp_path,
        max_steps=2,
        callbacks=[cb],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(TinyModel())
    # THEN the fit ran, both calls are marked in the recording, and CUDA was initialised only if it was not
    assert cb.profiler is not None
    save_dir = Path(cb.profiler.save_dir)
    assert _marked_calls(save_dir) == [("training_step", 1), ("training_step", 2)]
    assert fake.inits == (0 if initialized else 1)


def test_gpu_absent_warns_once_each_and_calls_nothing(tmp_path):
    fake = FakeCudaBackend(initialized=False)
    fake.available = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with MemProfiler(CONFIG, save_dir=tmp_path, rank=0, cuda=fake) as prof, prof.profile("step"):
            pass
    messages = _ours(caught)
    assert any("`cuda_allocator_history` is off" in m for m in messages)
    assert any("`oom.enabled`) is off" in m for m in messages)
    assert fake.inits == 0 and fake.history_calls == [] and fake.raw_observers == []
    assert "0.step.1.end" in prof.snapshots


def test_failed_init_turns_both_collectors_off_in_one_line(tmp_path):
    # GIVEN a GPU whose initialisation fails (a child forked from an initialised parent)
    fake = FakeCudaBackend(initialized=False)
    fake.init_error = RuntimeError("Cannot re-initialize CUDA in forked subprocess")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with MemProfiler(CONFIG, save_dir=tmp_path, rank=0, cuda=fake) as prof, prof.profile("step"):
            pass
    # THEN one line says why and names both keys; no binding was called; the call was collected
    messages = [m for m in _ours(caught) if "initialised" in m]
    assert messages == [
        "memprofiler: CUDA could not be initialised (torch.cuda.init() failed: Cannot re-initialize "
        "CUDA in forked subprocess): `cuda_allocator_history` and `oom.enabled` are off; training continues"
    ]
    assert fake.history_calls == [] and fake.raw_observers == []
    assert "0.step.1.end" in prof.snapshots
