"""A full disk keeps what was written before it filled: every file stays valid up to its last
complete record, with one warning, and memprofiler's own report reads it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from fake_cuda import FakeCudaBackend, no_gpu
from memprofiler import MemProfiler
from memprofiler.__main__ import main
from memprofiler.output.stats_file import StatsFile
from memprofiler.output.timeline import MemoryTimeline


def _snapshot(n: int) -> dict[str, int]:
    return {"rss": 1000 + n, "vms": 2000 + n, "saved_tensors.unique_bytes": 4096 * n}


def test_stats_yaml_keeps_every_snapshot_that_fitted(tmp_path, disk):
    # GIVEN a stats file with 3 snapshots on disk, and room for about 1.5 more
    stats = StatsFile(tmp_path / "rank_0_memory_stats.yaml", run_id="abc")
    snaps = {f"0.training_step.{n}.end": _snapshot(n) for n in range(1, 4)}
    stats.flush(snaps, list(snaps))
    entry = len(f"0.training_step.9.end: {json.dumps(_snapshot(9))}\n") + 12
    disk.left = entry * 3 // 2
    # WHEN two flushes of 2 new snapshots each hit the full disk
    for n in (4, 6):
        for k in (n, n + 1):
            snaps[f"0.training_step.{k}.end"] = _snapshot(k)
        with pytest.raises(OSError, match="No space left"):
            stats.flush(snaps, [f"0.training_step.{k}.end" for k in (n, n + 1)])
    # THEN the file is the 3 snapshots written before it filled and the one that fitted alone
    # after them (entry by entry once a batch does not fit), valid, with its end line
    on_disk = yaml.safe_load(stats.path.read_text())
    assert on_disk == {k: v for k, v in snaps.items() if int(k.split(".")[2]) <= 4}
    assert stats.path.read_text().rstrip().endswith("4")
    assert stats.written == {f"0.training_step.{n}.end" for n in (1, 2, 3, 4)}
    # AND once there is room again the unwritten ones go out
    disk.left = 1 << 30
    stats.flush(snaps, [k for k in snaps if k not in stats.written])
    assert yaml.safe_load(stats.path.read_text()) == snaps


def test_memory_trace_is_never_cut_mid_string(tmp_path, disk):
    # GIVEN a memory trace on disk, then a disk with 100 bytes left
    timeline = MemoryTimeline(rank=0, run_id="abc")
    prof_events = _events(timeline, 3)
    timeline.dump(tmp_path)
    before = json.loads((tmp_path / "memory_trace_rank_0.json").read_text())
    disk.left = 100
    # WHEN more snapshots are dumped
    _events(timeline, 6, start=prof_events)
    with pytest.raises(OSError, match="No space left"):
        timeline.dump(tmp_path)
    # THEN the file is still the whole document it was (valid JSON, same events)
    assert json.loads((tmp_path / "memory_trace_rank_0.json").read_text()) == before
    # AND with room again the next dump adds the new events
    disk.left = 1 << 30
    timeline.dump(tmp_path)
    after = json.loads((tmp_path / "memory_trace_rank_0.json").read_text())
    assert len(after["traceEvents"]) > len(before["traceEvents"])


def _events(timeline: MemoryTimeline, n: int, start: int = 0) -> int:
    from memprofiler.output.events import SnapshotEvent

    t = 1_700_000_000_000_000_000
    for call in range(start + 1, start + n + 1):
        for phase in ("start", "end"):
            timeline.on_snapshot(
                SnapshotEvent(
                    key=f"0.training_step.{call}.{phase}",
                    rank=0,
                    fn_name="training_step",
                    call=call,
                    phase=phase,
                    t_ns=t + call * 1_000_000 + (500_000 if phase == "end" else 0),
                    metrics=_snapshot(call),
                )
            )
    return start + n


def _run(save_dir: Path, calls: int, cuda: Any = None) -> list[str]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the same snapshots on every machine (a GPU machine adds CUDA statistics to each)
        prof = MemProfiler(
            {"schedule": {"warmup": 0, "active": 100_000}, "flush_every_calls": 5},
            save_dir=save_dir,
            rank=0,
            cuda=cuda or no_gpu(),
        )
        with prof:
            prof.setup(model)
            for _ in range(calls):
                with prof.profile("training_step", module=model):
                    model(x).sum().backward()
    return [str(w.message) for w in caught]


def _check_run(save_dir: Path, messages: list[str]) -> int:
    full = [m for m in messages if "is full" in m or "could not write" in m]
    assert len(full) == 1 and "\n" not in full[0], full
    stats = yaml.safe_load((save_dir / "rank_0_memory_stats.yaml").read_text())
    trace = json.loads((save_dir / "memory_trace_rank_0.json").read_text())
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert len(stats) >= 10 and len(spans) >= 5
    # every snapshot that fitted is a whole one: a start and end per call, in order
    calls = sorted({int(k.split(".")[2]) for k in stats})
    assert calls == list(range(1, len(calls) + 1))
    assert main(["report", str(save_dir), "--no-html"]) == 0
    return len(stats)


def _fill_after_setup(monkeypatch: pytest.MonkeyPatch, disk: Any, left: int) -> None:
    """The disk has ``left`` bytes once the profiler has set its run directory up."""
    real = MemProfiler.setup

    def setup_then_fill(self: MemProfiler, *args: object, **kwargs: object) -> object:
        out = real(self, *args, **kwargs)
        disk.left = left
        return out

    monkeypatch.setattr(MemProfiler, "setup", setup_then_fill)


def test_a_run_on_a_filling_disk_keeps_what_fitted_with_one_warning(tmp_path, disk, monkeypatch):
    # GIVEN a disk with 12 KiB left once the run directory is set up
    _fill_after_setup(monkeypatch, disk, 12 << 10)
    # WHEN 200 calls are collected
    messages = _run(tmp_path, 200)
    # THEN one warning, and stats YAML and memory trace hold what fitted, valid
    assert _check_run(tmp_path, messages) < 400


def test_a_first_flush_larger_than_the_room_left_keeps_the_snapshots_that_fitted(tmp_path, disk, monkeypatch):
    # GIVEN a GPU machine's snapshots (each with the ~125 CUDA allocator statistics, several KiB):
    # on the H200 the first flush of 5 calls did not fit 12 KiB and no stats file or memory
    # trace was left at all
    _fill_after_setup(monkeypatch, disk, 12 << 10)
    # WHEN 200 calls are collected
    messages = _run(tmp_path, 200, cuda=FakeCudaBackend())
    # THEN one warning, and both files are there, valid, with the whole snapshots that fitted
    full = [m for m in messages if "is full" in m]
    assert len(full) == 1
    stats = yaml.safe_load((tmp_path / "rank_0_memory_stats.yaml").read_text())
    keys = list(stats)
    assert keys and keys == [
        f"0.training_step.{k // 2 + 1}.{('start', 'end')[k % 2]}" for k in range(len(keys))
    ]
    assert all(len(v) > 100 for v in stats.values())  # the CUDA statistics are in each
    trace = json.loads((tmp_path / "memory_trace_rank_0.json").read_text())
    assert trace["traceEvents"] and trace["otherData"]["memprofiler_rank"] == 0
    assert main(["report", str(tmp_path), "--no-html"]) == 0


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB tmpfs, where the machine lets this process mount one (root in a container
    with CAP_SYS_ADMIN); skipped elsewhere."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / f"tiny-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_run_on_a_real_64_kib_filesystem_keeps_what_fitted(tiny_tmpfs):
    messages = _run(tiny_tmpfs, 250)
    assert _check_run(tiny_tmpfs, messages) < 500


def test_a_full_disk_keeps_memory_bounded_and_writes_the_newest_at_the_end(tmp_path, disk):
    # GIVEN at most 20 snapshots in memory and a disk that fills after about 10 calls
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    x = torch.randn(8, 16)
    config = {
        "schedule": {"warmup": 0, "active": 100_000},
        "flush_every_calls": 5,
        "max_snapshots_in_memory": 20,
    }
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        prof = MemProfiler(config, save_dir=tmp_path, rank=0)
        with prof:
            prof.setup(model)
            disk.left = 6 << 10
            for _ in range(150):
                with prof.profile("training_step", module=model):
                    model(x).sum().backward()
                # THEN memory stays bounded while the disk is full (no retry of every pending one)
                assert len(prof._files.snapshots) <= 20 + 2 * 5  # + those of the calls since the last flush
            disk.left = 1 << 30  # room again before the run ends
    # AND the end of the run wrote the newest snapshots, after the ones that fitted before
    stats = yaml.safe_load((tmp_path / "rank_0_memory_stats.yaml").read_text())
    calls = sorted({int(k.split(".")[2]) for k in stats})
    assert calls[-1] == 150 and "0.training_step.150.end" in stats
    assert prof._files.lost_to_full_disk == 300 - len(stats)
    json.loads((tmp_path / "memory_trace_rank_0.json").read_text())
