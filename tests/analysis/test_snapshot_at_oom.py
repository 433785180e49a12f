"""What was live when an allocation failed, apart from what was live at the peak before it."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from memprofiler.__main__ import main
from memprofiler.analysis.runs.artifacts import load_run
from memprofiler.analysis.snapshot.summary import analyze, load_snapshot
from snapshot_fixtures import known_snapshot

KiB, MiB = 1024, 1024**2
OOM_RUN = Path(__file__).parents[1] / "fixtures" / "gpu_oom_run"


def test_live_at_the_oom_by_hand():
    # GIVEN the hand-built trace: peak at entry 5, an OOM at entry 9 after two frees
    d = analyze(known_snapshot(), "known").devices[0]
    assert (d.peak_allocated_index, [o.index for o in d.ooms]) == (5, [9])
    # THEN at the OOM: the 1 MiB block S1 allocated at entry 5 (its 256 KiB one was freed at 7,
    # S2's at 8), the pre-trace 512 KiB INIT block and 256 KiB block; the 128 KiB pre-trace
    # block was freed at entry 4, before it
    assert [(g.bytes, g.count) for g in d.oom_stacks] == [(MiB, 1), (512 * KiB, 1), (256 * KiB, 1)]
    assert (d.allocated_at_oom, d.live_blocks_at_oom) == (1792 * KiB, 3)
    # AND the peak's view is unchanged: 5 blocks, S1 with 1.25 MiB
    assert d.live_blocks_at_peak == 5 and d.top_stacks[0].bytes == 1280 * KiB


def test_the_recorded_gpu_oom_live_set_is_the_end_state():
    # GIVEN a real OOM record whose trace ends with the failed allocation (entry 261 of 262)
    snap = load_snapshot(OOM_RUN / "oom_rank_0_0.pickle")
    a = analyze(snap, "gpu")
    d = a.devices[0]
    assert d.ooms[-1].index == d.entries - 1 == 261
    # THEN what was live at the OOM is every block live in the segments at the end
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert d.live_blocks_at_oom == len(live) == 20
    assert d.allocated_at_oom == sum(b["requested_size"] for b in live) == a.total_requested
    assert d.live_blocks_at_peak == 26  # the peak (entry 95) held more, and other blocks


def _with_crash_record(tmp_path: Path) -> Path:
    """The recorded OOM run plus the record the exception handler writes after the observer's."""
    run = tmp_path / "run"
    shutil.copytree(OOM_RUN, run)
    rec = yaml.safe_load((run / "oom_rank_0_0.yaml").read_text())
    rec.update(
        n=1,
        reason="exception",
        exception="OutOfMemoryError: CUDA out of memory. Tried to allocate 400.00 GiB",
        pickle="oom_rank_0_1.pickle",
    )
    (run / "oom_rank_0_1.yaml").write_text(yaml.safe_dump(rec))
    shutil.copy(run / "oom_rank_0_0.pickle", run / "oom_rank_0_1.pickle")
    return run


def test_the_exception_handlers_record_of_the_same_oom_is_folded_into_it(tmp_path):
    run = load_run(_with_crash_record(tmp_path))
    assert [(o.n, o.repeated_by.n if o.repeated_by else None) for o in run.ooms] == [(0, 1)]


def test_report_prints_one_oom_once(tmp_path, capsys):
    run = _with_crash_record(tmp_path)
    assert main(["report", str(run), "--no-html"]) == 0
    out = capsys.readouterr().out
    assert out.count("OOM dump") == 1 and out.count("Allocator snapshot rank 0 OOM") == 1
    assert (
        "(record #1 is the exception handler's record of this OOM: OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 400.00 GiB)"
    ) in " ".join(out.split())
