"""The run directory: claimed once, never shared by two runs, files readable like Lightning's."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
import yaml

from memprofiler import MemProfiler
from memprofiler.errors import ArtifactError
from memprofiler.output import run_dir


def _run(save_dir: Path, calls: int = 2) -> MemProfiler:
    with MemProfiler({"schedule": {"warmup": 0, "active": calls}}, save_dir=save_dir, rank=0) as prof:
        for _ in range(calls):
            with prof.profile("training_step"):
                pass
    return prof


def test_a_second_run_into_the_same_save_dir_writes_into_version_1(tmp_path):
    # GIVEN a finished run in save_dir
    first = _run(tmp_path / "mem", calls=2)
    before = (tmp_path / "mem" / "rank_0_memory_stats.yaml").read_bytes()
    # WHEN a second run is pointed at the same directory
    with pytest.warns(UserWarning, match=r"already holds a run; this run writes to .*version_1"):
        second = _run(tmp_path / "mem", calls=3)
    # THEN the first run's files are untouched and the second's sit in version_1
    assert first.save_dir == tmp_path / "mem"
    assert second.save_dir == tmp_path / "mem" / "version_1"
    assert (tmp_path / "mem" / "rank_0_memory_stats.yaml").read_bytes() == before
    stats = yaml.safe_load((second.save_dir / "rank_0_memory_stats.yaml").read_text())
    assert sorted(stats) == [f"0.training_step.{c}.{p}" for c in (1, 2, 3) for p in ("end", "start")]
    # AND a third run takes version_2
    with pytest.warns(UserWarning, match="version_2"):
        assert _run(tmp_path / "mem").save_dir == tmp_path / "mem" / "version_2"


def test_the_manifest_says_how_the_run_ended(tmp_path):
    prof = _run(tmp_path)
    manifest = yaml.safe_load((tmp_path / "memprofiler_run.yaml").read_text())
    assert manifest["status"] == "finished" and manifest["finished"] is not None
    assert manifest["pid"] == os.getpid() and manifest["world_size"] == 1
    assert manifest["save_dir"] == str(tmp_path) and manifest["notes"] == []
    assert prof.save_dir == tmp_path


def test_a_crashed_run_is_marked_crashed(tmp_path):
    prof = MemProfiler({"schedule": {"warmup": 0}}, save_dir=tmp_path, rank=0)
    with pytest.raises(RuntimeError), prof, prof.profile("training_step"):
        raise RuntimeError("boom")
    assert yaml.safe_load((tmp_path / "memprofiler_run.yaml").read_text())["status"] == "crashed"


def test_files_respect_the_umask(tmp_path):
    # GIVEN the usual umask 022 (what Lightning's own files get)
    old = os.umask(0o022)
    try:
        mode = run_dir.FILE_MODE
    finally:
        os.umask(old)
    assert mode == 0o666 & ~old
    # WHEN a run writes its files
    _run(tmp_path)
    # THEN they are readable by group and others, like files `open()` creates
    for name in ("rank_0_memory_stats.yaml", "memory_trace_rank_0.json", "memprofiler_run.yaml"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name


def test_a_full_disk_fails_the_set_up_check_with_one_line(tmp_path, monkeypatch):
    # GIVEN a filesystem where creating a file works but writing data does not (a full disk)
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    # WHEN a profiler sets up there
    with pytest.raises(ArtifactError) as err:
        MemProfiler(save_dir=tmp_path / "mem", rank=0).setup()
    # THEN one line names the key, the directory and the cause
    assert str(err.value) == (
        f"`save_dir` {str(tmp_path / 'mem')!r} is not writable (No space left on device); "
        "choose a writable directory with `save_dir: ...`"
    )
    assert not list((tmp_path / "mem").iterdir())  # the probe is gone


def test_two_claims_of_one_directory_never_share_it(tmp_path):
    # GIVEN two runs starting together under one parent (two jobs, same save_dir)
    a = run_dir.claim(tmp_path, run_dir.RunManifest.new(tmp_path, 1))
    b = run_dir.claim(tmp_path, run_dir.RunManifest.new(tmp_path, 1))
    # THEN each got its own directory
    assert a == tmp_path and b == tmp_path / "version_1"
