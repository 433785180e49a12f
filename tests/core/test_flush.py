"""Files reach disk whatever the schedule, by appending: nothing is lost to SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from _env import subprocess_env
from memprofiler import MemProfiler, layout

SRC = Path(__file__).resolve().parents[2] / "src"


def _keys(path: Path) -> list[str]:
    return list(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize(
    "sched", [{"warmup": 0, "active": 1, "repeat": 0}, {"warmup": 1, "active": 1, "repeat": 0}]
)
def test_a_schedule_whose_window_never_closes_still_writes_every_n_calls(tmp_path, sched):
    # GIVEN a schedule with no idle call between windows and flushes every 10 collected calls
    prof = MemProfiler({"schedule": sched, "flush_every_calls": 10}, save_dir=tmp_path, rank=0).setup()
    # WHEN 25 calls are collected and nobody calls dump() or teardown() (as after SIGKILL)
    collected = 0
    while collected < 25:
        with prof.profile("training_step"):
            pass
        collected = sum(1 for k in prof.snapshots if k.endswith(".end"))
    # THEN the first 20 collected calls are on disk, in a file yaml.safe_load reads whole
    stats = tmp_path / "rank_0_memory_stats.yaml"
    ends = [k for k in _keys(stats) if k.endswith(".end")]
    assert len(ends) == 20
    # AND the file is one mapping grown by blocks, each closed by its block-end line
    lines = stats.read_text().splitlines()
    assert lines[0] == layout.YAML_HEADER
    assert [ln for ln in lines if ln.startswith("#memprofiler-end")] == [
        layout.YAML_BLOCK_END.format(n=20),
        layout.YAML_BLOCK_END.format(n=40),
    ]


def test_a_flush_appends_only_what_is_new(tmp_path):
    prof = MemProfiler(
        {"schedule": {"warmup": 0, "active": 1, "repeat": 0}}, save_dir=tmp_path, rank=0
    ).setup()
    stats = tmp_path / "rank_0_memory_stats.yaml"
    with prof.profile("training_step"):
        pass
    prof.dump()
    first = stats.read_bytes()
    with prof.profile("training_step"):
        pass
    prof.dump()
    # THEN the second dump left the first block byte for byte and added one block
    assert stats.read_bytes().startswith(first)
    assert _keys(stats) == [f"0.training_step.{c}.{p}" for c in (1, 2) for p in ("start", "end")]


def test_the_memory_trace_is_valid_json_after_every_append(tmp_path):
    prof = MemProfiler(
        {"schedule": {"warmup": 0, "active": 1, "repeat": 0}}, save_dir=tmp_path, rank=0
    ).setup()
    trace = tmp_path / "memory_trace_rank_0.json"
    for _ in range(3):
        with prof.profile("training_step"):
            pass
        prof.dump()
        assert prof.timeline is not None
        assert json.loads(trace.read_text()) == prof.timeline.to_trace()
    spans = [e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert spans == ["training_step.1", "training_step.2", "training_step.3"]


@pytest.mark.slow
def test_sigkill_after_many_collected_calls_leaves_them_on_disk(tmp_path):
    # GIVEN a plain loop collecting every call that is killed by SIGKILL after 120 calls
    script = textwrap.dedent(
        f"""
        import os, signal
        from memprofiler import MemProfiler
        prof = MemProfiler({{"schedule": {{"warmup": 0, "active": 1, "repeat": 0}}}},
                           save_dir={str(tmp_path)!r}, rank=0)
        with prof:
            for _ in range(120):
                with prof.profile("training_step"):
                    pass
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], env=subprocess_env(SRC), capture_output=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    # THEN the 100 calls of the last flush (every 50 by default) are on disk, file valid
    ends = [k for k in _keys(tmp_path / "rank_0_memory_stats.yaml") if k.endswith(".end")]
    assert len(ends) == 100
    assert yaml.safe_load((tmp_path / "memprofiler_run.yaml").read_text())["status"] == "running"
    json.loads((tmp_path / "memory_trace_rank_0.json").read_text())
    assert os.path.getsize(tmp_path / "memory_trace_rank_0.json") > 0


def test_a_name_never_called_is_said_at_teardown_and_in_the_manifest(tmp_path):
    # GIVEN collect_funcs naming `train_step` while the model's method is `training_step`
    prof = MemProfiler({"collect_funcs": {"default": ["train_step"]}}, save_dir=tmp_path, rank=0).setup()
    prof._calls["training_step"] = 6  # what @memprofilable counts for calls it does not collect
    prof._calls["validation_step"] = 3
    # WHEN the run ends
    with pytest.warns(UserWarning) as caught:
        prof.teardown()
    # THEN one line says what was configured and what was seen
    line = (
        "`train_step` (in `collect_funcs`) was never called; calls seen: training_step x6, validation_step x3"
    )
    assert [str(w.message) for w in caught] == [f"memprofiler: {line}"]
    assert yaml.safe_load((tmp_path / "memprofiler_run.yaml").read_text())["notes"] == [line]


def test_a_schedule_that_never_opens_a_window_says_so(tmp_path):
    prof = MemProfiler({"schedule": {"skip_first": 100}}, save_dir=tmp_path, rank=0).setup()
    for _ in range(50):
        with prof.profile("training_step"):
            pass
    with pytest.warns(
        UserWarning,
        match=r"`training_step` was called 50 time\(s\) but the schedule collects no call before call 102",
    ):
        prof.teardown()


def test_memory_stays_bounded_while_the_file_keeps_everything(tmp_path):
    # GIVEN at most 10 snapshots in memory and a flush every 5 collected calls
    cfg = {
        "schedule": {"warmup": 0, "active": 1, "repeat": 0},
        "flush_every_calls": 5,
        "max_snapshots_in_memory": 10,
    }
    with MemProfiler(cfg, save_dir=tmp_path, rank=0) as prof:
        # WHEN 40 calls are collected
        for _ in range(40):
            with prof.profile("training_step"):
                pass
            # THEN memory never holds more than the limit plus one flush's worth
            assert len(prof.snapshots) <= 10 + 2 * 5
        assert prof.timeline is not None and len(prof.timeline) <= 10 + 2 * 5
    # AND the files hold every call, the trace every span
    assert len(_keys(tmp_path / "rank_0_memory_stats.yaml")) == 80
    trace = json.loads((tmp_path / "memory_trace_rank_0.json").read_text())
    assert [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"] == [
        f"training_step.{c}" for c in range(1, 41)
    ]
    assert prof.evicted == 80 - len(prof.snapshots)
