"""``memprofiler merge-traces``: every rank's memory trace in one file, pid = rank."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _env import subprocess_env
from memprofiler.__main__ import main

REPO = Path(__file__).resolve().parents[2]

DDP_SCRIPT = textwrap.dedent(
    """
    import sys
    import lightning.pytorch as pl
    from _tiny_lightning import TinyModel
    from memprofiler import ExtendedPyTorchProfiler, MemProfilerCallback

    if __name__ == "__main__":
        out = sys.argv[1]
        trainer = pl.Trainer(
            accelerator="cpu", devices=2, strategy="ddp", max_steps=5, default_root_dir=out,
            logger=False, enable_checkpointing=False, enable_model_summary=False,
            enable_progress_bar=False,
            profiler=ExtendedPyTorchProfiler(schedule_cfg={"wait": 1, "warmup": 1, "active": 2}),
            callbacks=[MemProfilerCallback({"schedule": {"follow_profiler": True}})],
        )
        trainer.fit(TinyModel())
    """
)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-process gloo DDP run with memprofiler and the extended profiler."""
    out = tmp_path_factory.mktemp("ddp")
    script = out / "train_ddp.py"
    script.write_text(DDP_SCRIPT)
    env = subprocess_env(REPO / "src", REPO / "tests")
    proc = subprocess.run(
        [sys.executable, str(script), str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_two_rank_run_merges_into_one_trace_with_both_pids(ddp_run, capsys):
    # GIVEN each rank wrote its own memory trace and its own profiler trace
    save_dir = ddp_run / "memprofiler"
    assert sorted(p.name for p in save_dir.glob("memory_trace_rank_*.json")) == [
        "memory_trace_rank_0.json",
        "memory_trace_rank_1.json",
    ]
    assert sorted(p.name for p in save_dir.glob("*.pt.trace.json")) == [
        "fit_rank_0.1.pt.trace.json",
        "fit_rank_1.1.pt.trace.json",
    ]
    # WHEN merged
    out = ddp_run / "merged.json"
    assert main(["merge-traces", str(ddp_run), "-o", str(out)]) == 0
    assert "merged 2 rank(s)" in capsys.readouterr().out
    # THEN one valid trace, pid = rank, each rank's spans and named processes
    merged = json.loads(out.read_text())
    events = merged["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    for rank in (0, 1):
        spans = sorted(
            e["name"] for e in events if e["pid"] == rank and e["ph"] == "X" and e.get("cat") == "memprofiler"
        )
        assert spans == ["training_step.3", "training_step.4"]
        names = [e["args"]["name"] for e in events if e["pid"] == rank and e.get("name") == "process_name"]
        assert names == [f"rank {rank}"]
        counters = {e["name"] for e in events if e["pid"] == rank and e["ph"] == "C"}
        assert {"rss", "rss_peak", "saved_tensors.unique_bytes"} <= counters
    # AND the ranks share one clock: their call-3 spans overlap in time (DDP syncs each step)
    s0, s1 = (next(e for e in events if e["pid"] == r and e.get("name") == "training_step.3") for r in (0, 1))
    assert abs(s0["ts"] - s1["ts"]) < 5e6  # within 5 s, on the microsecond scale
    # AND each rank's profiler trace carries its own memory spans
    for rank in (0, 1):
        trace = json.loads((save_dir / f"fit_rank_{rank}.1.pt.trace.json").read_text())
        assert sorted(
            e["name"] for e in trace["traceEvents"] if e.get("cat") == "memprofiler" and e["ph"] == "X"
        ) == [
            "training_step.3",
            "training_step.4",
        ]


@pytest.mark.slow
def test_with_profiler_folds_kernels_in_on_one_clock(ddp_run):
    # WHEN the profiler traces are folded in as well
    out = ddp_run / "merged_full.json"
    assert main(["merge-traces", str(ddp_run), "--with-profiler", "-o", str(out)]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    # THEN every event is under its rank, and each rank has its profiler steps
    assert {e["pid"] for e in events} == {0, 1}
    for rank in (0, 1):
        mine = [e for e in events if e["pid"] == rank]
        steps = {e["name"]: e for e in mine if str(e.get("name", "")).startswith("ProfilerStep#")}
        assert sorted(steps) == ["ProfilerStep#2", "ProfilerStep#3"]
        # AND the memory events appear once (the profiler trace's copies are dropped) ...
        spans = {e["name"]: e for e in mine if e.get("cat") == "memprofiler" and e["ph"] == "X"}
        assert sorted(e["name"] for e in mine if e.get("cat") == "memprofiler" and e["ph"] == "X") == sorted(
            spans
        )
        # ... and, moved from the memory file's base onto Kineto's, still inside their steps
        for n in (3, 4):
            step, span = steps[f"ProfilerStep#{n - 1}"], spans[f"training_step.{n}"]
            assert step["ts"] <= span["ts"] and span["ts"] + span["dur"] <= step["ts"] + step["dur"]
        names = [e["args"]["name"] for e in mine if e.get("ph") == "M" and e.get("name") == "process_name"]
        assert names == [f"rank {rank}"]
    flows = [e for e in events if e.get("ph") in ("s", "f")]
    # flow ids stay numbers (Perfetto drops "0:17"-style string ids) and carry the rank
    assert flows and all(isinstance(e["id"], int) and e["id"] >> 40 == e["pid"] for e in flows)


def test_merge_aligns_ranks_on_the_earliest_base(tmp_path):
    # GIVEN two rank files whose bases differ by one second
    for rank, base in ((0, 5_000_000_000), (1, 6_000_000_000)):
        trace = {
            "baseTimeNanoseconds": base,
            "traceEvents": [{"ph": "C", "name": "rss", "pid": rank, "ts": 10.0, "args": {"bytes": rank}}],
        }
        (tmp_path / f"memory_trace_rank_{rank}.json").write_text(json.dumps(trace))
    # WHEN merged with the default output name
    assert main(["merge-traces", str(tmp_path)]) == 0
    merged = json.loads((tmp_path / "memory_trace_merged.json").read_text())
    # THEN rank 1's event moved by one second onto rank 0's base
    counters = {e["pid"]: e["ts"] for e in merged["traceEvents"] if e["ph"] == "C"}
    assert merged["baseTimeNanoseconds"] == 5_000_000_000
    assert counters == {0: 10.0, 1: 1_000_010.0}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no memory_trace_rank_*.json"),
        ("{not json", "is not a readable JSON trace"),
        ('{"events": []}', "no `traceEvents` list"),
        ('{"traceEvents": ' + "[" * 60_000 + "]" * 60_000 + "}", "nested too deep for a Chrome trace"),
    ],
)
def test_bad_input_is_one_line_and_exit_two(tmp_path, capsys, content, message):
    if content is not None:
        (tmp_path / "memory_trace_rank_0.json").write_text(content)
    assert main(["merge-traces", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_one_rank_twice_is_an_error(tmp_path, capsys):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "memory_trace_rank_0.json").write_text('{"traceEvents": []}')
    assert main(["merge-traces", str(tmp_path)]) == 2
    assert "rank 0 has two traces" in capsys.readouterr().err


def test_missing_directory_is_an_error(tmp_path, capsys):
    assert main(["merge-traces", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_flow_ids_stay_numeric_and_unique_per_rank(tmp_path):
    # GIVEN two ranks whose flows use the same ids (17 as a number, "0x1f" as a string)
    for rank in (0, 1):
        events = [
            {"ph": "s", "id": 17, "name": "f", "cat": "ac2g", "pid": 9, "tid": 1, "ts": 1.0},
            {"ph": "f", "id": 17, "name": "f", "cat": "ac2g", "pid": 9, "tid": 1, "ts": 2.0, "bp": "e"},
            {"ph": "s", "id": "0x1f", "name": "g", "cat": "ac2g", "pid": 9, "tid": 1, "ts": 3.0},
        ]
        trace = {"baseTimeNanoseconds": 0, "traceEvents": events}
        (tmp_path / f"memory_trace_rank_{rank}.json").write_text(json.dumps(trace))
    # WHEN merged
    assert main(["merge-traces", str(tmp_path), "-o", str(tmp_path / "m.json")]) == 0
    flows = [e for e in json.loads((tmp_path / "m.json").read_text())["traceEvents"] if e["ph"] in "sf"]
    # THEN each id is the number (rank << 40) | id, so Perfetto keeps the arrows, start and
    # finish still pair up within a rank, and the ranks no longer collide
    assert [(e["pid"], e["ph"], e["id"]) for e in flows] == [
        (0, "s", 17),
        (0, "f", 17),
        (0, "s", 0x1F),
        (1, "s", (1 << 40) | 17),
        (1, "f", (1 << 40) | 17),
        (1, "s", (1 << 40) | 0x1F),
    ]


def test_unwritable_output_is_one_line_exit_2(tmp_path, capsys):
    # GIVEN an output path that is an existing directory
    (tmp_path / "memory_trace_rank_0.json").write_text('{"traceEvents": []}')
    out = tmp_path / "out"
    out.mkdir()
    # THEN exit 2 with one line naming it, no traceback
    assert main(["merge-traces", str(tmp_path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"memprofiler merge-traces: error: {out}: cannot write the merged trace (")
    assert err.count("\n") == 1


def test_a_gzip_that_expands_past_the_limit_is_one_line(tmp_path, capsys, monkeypatch):
    import gzip

    from memprofiler.analysis.traces import merge as trace_merge

    # GIVEN a 1 MiB limit and a small gzip'd trace that expands past it
    monkeypatch.setattr(trace_merge, "MAX_FILE_BYTES", 2**20)
    events = [
        {"ph": "C", "name": "m", "pid": 0, "tid": 0, "ts": float(k), "args": {"v": k}} for k in range(40_000)
    ]
    path = tmp_path / "memory_trace_rank_0.json"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    assert path.stat().st_size < 2**20
    # THEN merge-traces refuses it in one line naming the limit, having read no more than it
    assert main(["merge-traces", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        "longer than 1,048,576 bytes decompressed" in err and "MAX_FILE_BYTES" in err and err.count("\n") == 1
    )
