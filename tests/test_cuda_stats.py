"""CUDA allocator statistics through the fake seam; no-CUDA behaviour with the real one."""

from __future__ import annotations

import warnings

import torch

from fake_cuda_stats import ScriptedCuda
from memprofiler import MemProfiler
from memprofiler._warn import MemProfilerWarning

MiB = 2**20


def test_peaks_belong_to_the_call(tmp_path):
    # GIVEN an allocator whose earlier peak (100 MiB) predates the collected call
    cuda = ScriptedCuda()
    cuda.alloc(100 * MiB)
    cuda.free(90 * MiB)
    prof = MemProfiler({"schedule": {"warmup": 0, "active": 2}}, save_dir=tmp_path, rank=0, cuda=cuda).setup()
    # WHEN a call allocates 30 MiB, frees 20 MiB
    with prof.profile("training_step"):
        cuda.alloc(30 * MiB)
        cuda.free(20 * MiB)
    start, end = prof.snapshots["0.training_step.1.start"], prof.snapshots["0.training_step.1.end"]
    # THEN peak stats were reset at start, so the end peak is this call's: 10 + 30 MiB
    assert start["allocated_bytes.all.peak"] == 10 * MiB
    assert end["allocated_bytes.all.peak"] == 40 * MiB
    assert end["allocated_bytes.all.current"] == 20 * MiB
    assert end["num_ooms"] == 0
    assert cuda.resets == 1


def test_cuda_collection_only_for_its_functions(tmp_path):
    cuda = ScriptedCuda()
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


def test_without_cuda_one_warning_then_off(tmp_path):
    assert not torch.cuda.is_available()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from memprofiler import _warn

        _warn._seen.clear()
        prof = MemProfiler({"schedule": {"warmup": 0, "active": 3}}, save_dir=tmp_path, rank=0).setup()
        for _ in range(3):
            with prof.profile("training_step"):
                pass
    ours = [w for w in caught if issubclass(w.category, MemProfilerWarning)]
    assert len(ours) == 1 and "CUDA is not available" in str(ours[0].message)
    assert not any(k.startswith("allocated_bytes") for m in prof.snapshots.values() for k in m)


def test_no_warning_on_other_ranks(tmp_path):
    from memprofiler import _warn

    _warn._seen.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MemProfiler({}, save_dir=tmp_path, rank=1).setup()
    assert not [w for w in caught if issubclass(w.category, MemProfilerWarning)]
