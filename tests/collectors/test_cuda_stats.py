"""CUDA allocator statistics through the fake seam; no-CUDA behaviour with the real one."""

from __future__ import annotations

import warnings

import torch

from fake_cuda import FakeCudaBackend
from memprofiler import MemProfiler
from memprofiler.core.warn import MemProfilerWarning

MiB = 2**20


def test_peaks_belong_to_the_call(tmp_path):
    # GIVEN an allocator holding `base` bytes whose earlier peak (base + 90 MiB) predates the call
    cuda = FakeCudaBackend()
    base = cuda.allocated
    cuda.alloc(10 * MiB)
    cuda.free(cuda.alloc(90 * MiB))
    prof = MemProfiler({"schedule": {"warmup": 0, "active": 2}}, save_dir=tmp_path, rank=0, cuda=cuda).setup()
    # WHEN a call allocates 10 and 20 MiB and frees the 10
    with prof.profile("training_step"):
        ten = cuda.alloc(10 * MiB)
        cuda.alloc(20 * MiB)
        cuda.free(ten)
    start, end = prof.snapshots["0.training_step.1.start"], prof.snapshots["0.training_step.1.end"]
    # THEN peak stats were reset at start, so the end peak is this call's: base + 10 + 30 MiB
    assert start["allocated_bytes.all.peak"] == base + 10 * MiB
    assert end["allocated_bytes.all.peak"] == base + 40 * MiB
    assert end["allocated_bytes.all.current"] == base + 30 * MiB
    assert end["num_ooms"] == 0
    assert cuda.resets == 1


def test_cuda_collection_only_for_its_functions(tmp_path):
    cuda = FakeCudaBackend()
    cfg = {
        "schedule": {"warmup": 0, "active": 1},
        "collect_funcs": {"default": [], "cpu": ["a"], "cuda": ["b"]},
    }
    prof = MemProfiler(cfg, save_dir=tmp_path, rank=0, cuda=cuda).setup()
    with prof.profile("a"):
        pass
    with prof.profile("b"):
        pass
    assert "allocated_bytes.all.peak" not in prof.snapshots["0.a.1.end"]
    assert "rss" in prof.snapshots["0.a.1.end"]
    assert "allocated_bytes.all.peak" in prof.snapshots["0.b.1.end"]
    assert "rss" not in prof.snapshots["0.b.1.end"]


def test_without_cuda_one_warning_then_off(tmp_path, monkeypatch):
    # the real backend on a machine without a GPU, whatever this machine has
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        prof = MemProfiler({"schedule": {"warmup": 0, "active": 3}}, save_dir=tmp_path, rank=0).setup()
        for _ in range(3):
            with prof.profile("training_step"):
                pass
    ours = [w for w in caught if issubclass(w.category, MemProfilerWarning)]
    assert len(ours) == 1 and "CUDA is not available" in str(ours[0].message)
    assert not any(k.startswith("allocated_bytes") for m in prof.snapshots.values() for k in m)


def test_no_warning_on_other_ranks(tmp_path):

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MemProfiler({}, save_dir=tmp_path, rank=1).setup()
    assert not [w for w in caught if issubclass(w.category, MemProfilerWarning)]


def test_cpu_training_on_a_gpu_machine_never_initialises_cuda(tmp_path):
    # GIVEN a GPU that training never touches (a CPU fit on a GPU node)
    cuda = FakeCudaBackend(initialized=False)
    prof = MemProfiler({"schedule": {"warmup": 0, "active": 2}}, save_dir=tmp_path, rank=0, cuda=cuda).setup()
    for _ in range(2):
        with prof.profile("training_step"):
            pass
    # THEN no CUDA context was made (it would add hundreds of MiB to rss) and no CUDA keys
    # were written: the snapshots are those of a machine without a GPU
    assert cuda.inits == 0 and cuda.resets == 0
    assert not any(k.startswith("allocated_bytes") for m in prof.snapshots.values() for k in m)


def test_cuda_first_used_inside_a_call_gives_that_calls_peak(tmp_path):
    # GIVEN a plain loop whose first CUDA tensor is made inside the first collected call
    cuda = FakeCudaBackend(initialized=False)
    cuda.allocated = cuda.peak = 0  # a fresh allocator
    prof = MemProfiler({"schedule": {"warmup": 0, "active": 2}}, save_dir=tmp_path, rank=0, cuda=cuda).setup()
    with prof.profile("training_step"):
        cuda.free(cuda.alloc(30 * MiB))
        cuda.alloc(10 * MiB)
    # THEN the start has no CUDA keys and the end holds the call's peak (counters start at init)
    assert not any(k.startswith("allocated_bytes") for k in prof.snapshots["0.training_step.1.start"])
    end = prof.snapshots["0.training_step.1.end"]
    assert end["allocated_bytes.all.peak"] == 30 * MiB
    assert end["allocated_bytes.all.current"] == 10 * MiB
