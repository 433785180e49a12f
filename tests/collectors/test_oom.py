"""The OOM flight recorder, through the fake CUDA seam (and a real OOM on a GPU)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import yaml

from fake_cuda import GIB, FakeCudaBackend, memory_stats_keys
from memprofiler import MemProfiler
from memprofiler.collectors import oom as oom_module
from memprofiler.config import MemProfilerConfig
from memprofiler.core.warn import MemProfilerWarning
from memprofiler.errors import ConfigError

MIB = 1 << 20


def _profiler(tmp_path: Path, fake: FakeCudaBackend, **oom) -> MemProfiler:
    cfg = {
        "oom": {"enabled": True, **oom},
        "enable_saved_tensors_hooks": False,
        "schedule": {"warmup": 0, "active": 2},
        "collect_funcs": {"default": ["train_step"]},
    }
    prof = MemProfiler(cfg, save_dir=tmp_path, rank=0, cuda=fake)
    prof.step_fn = lambda: 41
    return prof.setup()


def _oom(fake: FakeCudaBackend, size: int, limit: int | None = None) -> BaseException:
    with pytest.raises(torch.OutOfMemoryError) as info:
        fake.oom(size, limit=limit)
    return info.value


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _pickle(path: Path) -> dict:
    data = path.read_bytes()
    assert data[:2] == b"\x80\x04"
    return pickle.loads(data)


def test_config_defaults_and_errors():
    cfg = MemProfilerConfig().oom
    assert (cfg.enabled, cfg.max_entries, cfg.stacks, cfg.max_dumps) == (False, 100_000, "python", 5)
    with pytest.raises(ConfigError, match=r"`oom.max_dumps`: got 0; must be >= 1"):
        MemProfilerConfig.from_any({"oom": {"max_dumps": 0}})
    with pytest.raises(ConfigError, match=r"`oom.stacks`: got 'py'"):
        MemProfilerConfig.from_any({"oom": {"stacks": "py"}})


def test_off_by_default_records_nothing(tmp_path):
    fake = FakeCudaBackend()
    with MemProfiler({}, save_dir=tmp_path, rank=0, cuda=fake):
        _oom(fake, GIB)
    assert fake.history_calls == [] and fake.raw_observers == []
    assert list(tmp_path.glob("oom_rank_*")) == []


def test_oom_record_holds_stats_failed_size_step_and_snapshots(tmp_path):
    # GIVEN the recorder on, after two collected calls that allocated 3 MiB and kept it
    fake = FakeCudaBackend()
    prof = _profiler(tmp_path, fake)
    for _ in range(2):
        with prof.profile("train_step"):
            fake.alloc(3 * MIB)
    # WHEN an allocation of 5 GiB fails
    _oom(fake, 5 * GIB)
    # THEN a record numbered 0 exists, with the failed size and the device's free and total
    rec = _yaml(tmp_path / "oom_rank_0_0.yaml")
    assert rec["reason"] == "cuda_oom"
    assert rec["failed_alloc_bytes"] == 5 * GIB
    assert rec["requested_bytes"] == 5 * GIB
    assert rec["device_total_bytes"] == 80 * GIB
    assert rec["device_free_bytes"] == 80 * GIB - fake.allocated
    assert (rec["rank"], rec["n"], rec["step"]) == (0, 0, 41)
    assert rec["calls"] == {"train_step": 2}
    # AND every allocator stat, and the consolidated snapshots collected so far
    assert set(rec["memory_stats"]) == set(memory_stats_keys())
    assert rec["memory_stats"]["allocated_bytes.all.current"] == fake.allocated
    assert set(rec["snapshots"]) == {f"0.train_step.{n}.{p}" for n in (1, 2) for p in ("start", "end")}
    assert rec["snapshots"] == yaml.safe_load(yaml.safe_dump(prof.snapshots))
    # AND the memory_viz pickle holds the whole run's history, ending in the OOM
    snap = _pickle(tmp_path / rec["pickle"])
    trace = snap["device_traces"][0]
    assert [e["action"] for e in trace] == ["alloc", "alloc", "oom"]
    assert trace[2]["size"] == 5 * GIB and trace[2]["device_free"] == rec["device_free_bytes"]
    assert rec["trace_entries"] == 3
    prof.teardown()


def test_a_memory_fraction_limit_is_kept_apart_from_the_device_total(tmp_path):
    # GIVEN the recorder on and an allocator capped at 10 GiB of an 80 GiB device
    # (torch.cuda.set_per_process_memory_fraction(0.125)), which the observer is handed
    fake = FakeCudaBackend()
    prof = _profiler(tmp_path, fake)
    # WHEN an allocation fails
    _oom(fake, 12 * GIB, limit=10 * GIB)
    # THEN the record names both: the cap the allocator enforced and the device's real total
    rec = _yaml(tmp_path / "oom_rank_0_0.yaml")
    assert rec["allocator_limit_bytes"] == 10 * GIB
    assert rec["device_total_bytes"] == 80 * GIB
    assert rec["failed_alloc_bytes"] == 12 * GIB
    prof.teardown()


def test_a_small_failed_request_is_told_apart_from_the_cudamalloc_that_failed(tmp_path):
    # GIVEN the recorder on
    fake = FakeCudaBackend()
    prof = _profiler(tmp_path, fake)
    fake.devices_asked.clear()
    # WHEN a 300,001-byte tensor cannot be placed on device 1
    with pytest.raises(torch.OutOfMemoryError):
        fake.oom(300_001, device=1)
    rec = _yaml(tmp_path / "oom_rank_0_0.yaml")
    # THEN the record has the allocator's 2 MiB small-pool cudaMalloc as the failed allocation
    # and the tensor's block, rounded up to 512 B, as the request
    assert rec["failed_alloc_bytes"] == 2 * MIB
    assert rec["device"] == 1
    # (the fake keeps one history; device 1 has none in it, so no request size is claimed)
    assert rec["requested_bytes"] is None
    # AND the statistics and free/total figures are those of device 1
    assert set(fake.devices_asked) == {1}
    # WHEN the same request fails on device 0, whose history the fake keeps
    with pytest.raises(torch.OutOfMemoryError):
        fake.oom(300_001)
    rec = _yaml(tmp_path / "oom_rank_0_1.yaml")
    # THEN the request is the block the allocator rounded it to, apart from the 2 MiB cudaMalloc
    assert (rec["requested_bytes"], rec["failed_alloc_bytes"]) == (300_032, 2 * MIB)
    # AND the crash record that follows carries the same figures
    prof.record_crash(torch.OutOfMemoryError("CUDA out of memory"))
    rec = _yaml(tmp_path / "oom_rank_0_2.yaml")
    assert (rec["reason"], rec["requested_bytes"], rec["failed_alloc_bytes"]) == (
        "exception",
        300_032,
        2 * MIB,
    )
    prof.teardown()


def test_records_count_up_and_never_overwrite(tmp_path):
    # GIVEN a record left by an earlier run in the same directory
    (tmp_path / "oom_rank_0_0.yaml").write_text("earlier: true\n")
    fake = FakeCudaBackend()
    prof = _profiler(tmp_path, fake)
    # WHEN three OOMs happen
    for size in (1 * GIB, 2 * GIB, 3 * GIB):
        _oom(fake, size)
    prof.teardown()
    # THEN they are numbered 1, 2, 3 and the earlier record is untouched
    assert _yaml(tmp_path / "oom_rank_0_0.yaml") == {"earlier": True}
    assert [_yaml(tmp_path / f"oom_rank_0_{n}.yaml")["failed_alloc_bytes"] for n in (1, 2, 3)] == [
        1 * GIB,
        2 * GIB,
        3 * GIB,
    ]
    assert sorted(p.name for p in tmp_path.glob("oom_rank_0_*.pickle")) == [
        f"oom_rank_0_{n}.pickle" for n in (1, 2, 3)
    ]


def test_ring_is_bounded_for_the_whole_run(tmp_path):
    # GIVEN a ring of 8 entries kept from set-up on
    fake = FakeCudaBackend()
    prof = _profiler(tmp_path, fake, max_entries=8, stacks="all", context="alloc")
    assert fake.history_calls == [("all", {"context": "alloc", "stacks": "all", "max_entries": 8})]
    # WHEN 100 allocations happen outside any collected call, then an OOM
    for i in range(100):
        fake.free(fake.alloc((i + 1) * 512))
    _oom(fake, GIB)
    # THEN the pickle keeps the newest 8 events only, the last one being the OOM
    trace = _pickle(tmp_path / "oom_rank_0_0.pickle")["device_traces"][0]
    assert len(trace) == 8
    assert trace[-1]["action"] == "oom"
    assert [e["size"] for e in trace[-4:-1]] == [100 * 512] * 3
    prof.teardown()
    assert fake.ring is None


def test_max_dumps_caps_the_records(tmp_path):
    fake = FakeCudaBackend()
    prof = _profiler(tmp_path, fake, max_dumps=2)
    with pytest.warns(MemProfilerWarning, match=r"2 OOM records written \(`oom.max_dumps`\)"):
        for _ in range(4):
            _oom(fake, GIB)
    assert len(list(tmp_path.glob("oom_rank_0_*.yaml"))) == 2
    prof.teardown()


def test_snapshot_failure_in_the_observer_keeps_the_oom_and_the_stats(tmp_path):
    # GIVEN an allocator whose snapshot fails during the OOM
    fake = FakeCudaBackend()
    prof = _profiler(tmp_path, fake)
    fake.fail_snapshot = RuntimeError("snapshot failed")
    # WHEN an allocation fails
    err = _oom(fake, 7 * GIB)
    # THEN the error is still the OOM, and the YAML still has the stats and why there is no pickle
    assert isinstance(err, torch.OutOfMemoryError)
    rec = _yaml(tmp_path / "oom_rank_0_0.yaml")
    assert rec["pickle"] is None and "snapshot failed" in rec["pickle_error"]
    assert rec["failed_alloc_bytes"] == 7 * GIB and len(rec["memory_stats"]) == len(memory_stats_keys())
    prof.teardown()


def test_write_failure_in_the_observer_is_reported_and_the_oom_unchanged(tmp_path, monkeypatch):
    # GIVEN writing the record fails
    fake = FakeCudaBackend()
    prof = _profiler(tmp_path, fake)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(oom_module, "write_yaml", broken)
    # WHEN an allocation fails
    with pytest.warns(MemProfilerWarning, match="could not write the OOM record.*No space left"):
        err = _oom(fake, GIB)
    # THEN the user's error is the OOM, with the allocator's message
    assert type(err) is torch.OutOfMemoryError and "Tried to allocate" in str(err)
    # AND the recorder keeps working once the disk is back
    monkeypatch.undo()
    _oom(fake, 2 * GIB)
    assert _yaml(tmp_path / "oom_rank_0_1.yaml")["failed_alloc_bytes"] == 2 * GIB
    prof.teardown()


def test_a_raising_observer_never_reaches_the_allocator(tmp_path):
    # GIVEN a foreign observer that raises, attached next to the recorder
    fake = FakeCudaBackend()
    prof = _profiler(tmp_path, fake)
    fake.add_oom_observer(lambda *args: 1 / 0)
    # WHEN an allocation fails THEN it is still the OOM, and our record is written
    _oom(fake, GIB)
    assert _yaml(tmp_path / "oom_rank_0_0.yaml")["failed_alloc_bytes"] == GIB
    prof.teardown()


def test_crash_after_an_oom_writes_a_second_record_and_stops_the_ring(tmp_path):
    # GIVEN an OOM that propagates and ends training
    fake = FakeCudaBackend()
    prof = _profiler(tmp_path, fake)
    err = _oom(fake, 9 * GIB)
    # WHEN the exception handler records the crash
    prof.record_crash(err)
    # THEN record 1 follows the observer's record 0, carrying the exception and the failed size
    first, second = _yaml(tmp_path / "oom_rank_0_0.yaml"), _yaml(tmp_path / "oom_rank_0_1.yaml")
    assert (first["reason"], second["reason"]) == ("cuda_oom", "exception")
    assert second["exception"].startswith("OutOfMemoryError: CUDA out of memory")
    assert second["failed_alloc_bytes"] == 9 * GIB
    # AND recording stopped and the observer is gone: a later OOM writes nothing
    assert fake.ring is None
    _oom(fake, GIB)
    assert len(list(tmp_path.glob("oom_rank_0_*.yaml"))) == 2
    prof.teardown()


def test_without_the_observer_binding_crashes_are_still_recorded(tmp_path):
    # GIVEN a torch build without the OOM observer binding
    fake = FakeCudaBackend(has_oom_observer=False)
    with pytest.warns(MemProfilerWarning, match="no CUDA out-of-memory observer"):
        prof = _profiler(tmp_path, fake)
    # WHEN training raises
    prof.record_crash(RuntimeError("loss is nan"))
    # THEN the crash record is there, without a failed allocation
    rec = _yaml(tmp_path / "oom_rank_0_0.yaml")
    assert rec["exception"] == "RuntimeError: loss is nan" and rec["failed_alloc_bytes"] is None
    assert rec["device_total_bytes"] == 80 * GIB
    prof.teardown()


def test_without_history_binding_records_have_stats_only(tmp_path):
    fake = FakeCudaBackend(has_history=False)
    with pytest.warns(MemProfilerWarning, match="allocator history cannot be recorded here"):
        prof = _profiler(tmp_path, fake)
    _oom(fake, GIB)
    rec = _yaml(tmp_path / "oom_rank_0_0.yaml")
    assert rec["trace_entries"] == 0 and rec["failed_alloc_bytes"] == GIB
    prof.teardown()


def test_the_cuda_malloc_async_allocator_is_named_and_left_alone(tmp_path):
    # GIVEN PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, whose history and observer
    # bindings exist but raise "does not yet support"
    fake = FakeCudaBackend()
    fake.allocator = "cudaMallocAsync"
    # WHEN the recorder sets up
    with pytest.warns(MemProfilerWarning) as caught:
        prof = _profiler(tmp_path, fake)
    # THEN each missing capability is reported once, naming the allocator, and neither is called
    messages = [str(w.message) for w in caught]
    assert sum("`cudaMallocAsync`" in m for m in messages) == 2
    assert fake.history_calls == [] and fake.raw_observers == []
    # AND an exception still leaves a record with the allocator statistics
    prof.record_crash(torch.OutOfMemoryError("CUDA out of memory"))
    rec = _yaml(tmp_path / "oom_rank_0_0.yaml")
    assert rec["reason"] == "exception" and "memory_stats" in rec
    prof.teardown()


# ----------------------------------------------------------------------------- GPU
@pytest.mark.cuda
def test_gpu_real_oom_is_recorded(tmp_path):
    # GIVEN the recorder on a real device
    prof = MemProfiler({"oom": {"enabled": True}}, save_dir=tmp_path, rank=0).setup()
    _, total = torch.cuda.mem_get_info()
    # WHEN an allocation larger than the device fails
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(total + GIB, dtype=torch.uint8, device="cuda")
    prof.teardown()
    # THEN the pickle has the oom action and the YAML every memory_stats key
    snap = _pickle(tmp_path / "oom_rank_0_0.pickle")
    ooms = [e for trace in snap["device_traces"] for e in trace if e["action"] == "oom"]
    assert ooms and ooms[-1]["size"] >= total
    rec = _yaml(tmp_path / "oom_rank_0_0.yaml")
    assert set(rec["memory_stats"]) == set(torch.cuda.memory_stats())
    assert rec["failed_alloc_bytes"] >= total and rec["device_total_bytes"] == total
    assert rec["requested_bytes"] >= total + GIB


def test_each_rank_writes_its_own_records(tmp_path):
    # GIVEN two ranks sharing one output directory
    fakes = {rank: FakeCudaBackend() for rank in (0, 1)}
    profs = {}
    for rank, fake in fakes.items():
        profs[rank] = MemProfiler({"oom": {"enabled": True}}, save_dir=tmp_path, rank=rank, cuda=fake).setup()
    # WHEN rank 1 runs out of memory twice and rank 0 once
    _oom(fakes[1], 1 * GIB)
    _oom(fakes[0], 2 * GIB)
    _oom(fakes[1], 3 * GIB)
    for prof in profs.values():
        prof.teardown()
    # THEN each rank numbers its own records from 0
    assert _yaml(tmp_path / "oom_rank_0_0.yaml")["failed_alloc_bytes"] == 2 * GIB
    assert [_yaml(tmp_path / f"oom_rank_1_{n}.yaml")["failed_alloc_bytes"] for n in (0, 1)] == [GIB, 3 * GIB]
    assert _yaml(tmp_path / "oom_rank_1_1.yaml")["rank"] == 1
