"""A run that collected no call reads as that in `report`, `check` and `diff`, with the run's own note.

Its stats file ends ``#memprofiler-end entries=0`` after a ``{}`` line: complete, not cut.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from memprofiler import MemProfiler
from memprofiler.__main__ import main
from memprofiler.analysis.runs.artifacts import load_run

NOTE = "`train_step` (in `collect_funcs`) was never called; calls seen: training_step x4"


def _run(out: Path, config: dict, calls: int) -> Path:
    """A real run of ``calls`` profiled training steps under ``config``, torn down quietly."""
    prof = MemProfiler(config, save_dir=out, rank=0).setup()
    for _ in range(calls):
        with prof.profile("training_step"):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof.teardown()
    return out


@pytest.fixture
def empty_run(tmp_path: Path) -> Path:
    """A real run whose `collect_funcs` names a function the loop never profiles."""
    return _run(tmp_path / "empty", {"collect_funcs": {"default": ["train_step"]}}, 4)


@pytest.fixture
def full_run_dir(tmp_path: Path) -> Path:
    return _run(tmp_path / "full", {"schedule": {"warmup": 0, "active": 2}}, 2)


def test_the_stats_file_of_such_a_run_is_complete_and_reads_as_empty(empty_run):
    # GIVEN the file as the writer left it
    text = (empty_run / "rank_0_memory_stats.yaml").read_text()
    assert text.endswith("{}\n#memprofiler-end entries=0\n")
    # WHEN read THEN no snapshot, nothing reported cut, and the run knows it collected nothing
    run = load_run(empty_run)
    assert run.stats == {0: {}} and run.cuts == []
    assert run.collected_nothing()
    assert run.nothing_collected() == f"no call was collected: {NOTE}"


def test_report_says_no_call_was_collected_and_the_note(empty_run, capsys):
    # WHEN reported
    assert main(["report", str(empty_run), "-o", str(empty_run / "r.html")]) == 0
    out = capsys.readouterr()
    # THEN the note, then the line pointing to it; no "cut ... re-copy it" anywhere
    lines = out.out.splitlines()
    assert lines[1:3] == [f"note: {NOTE}", "no call was collected: see the note above"]
    assert "re-copy" not in out.out + out.err
    html = (empty_run / "r.html").read_text()
    assert f"note: {NOTE}" in html and "<p>No call was collected: see the note above.</p>" in html


def test_check_refuses_with_the_note_instead_of_naming_the_metric(empty_run, capsys):
    # WHEN a budget is checked on it THEN exit 2 and one line: nothing collected, and why
    assert main(["check", str(empty_run), "--max", "rss_peak=1GiB"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"memprofiler check: error: {empty_run}: no call was collected: {NOTE}; there is nothing to check"
    ]


def test_diff_names_the_run_that_collected_nothing_instead_of_no_differences(empty_run, full_run_dir, capsys):
    # WHEN diffed against a run that collected, and against itself
    assert main(["diff", str(full_run_dir), str(empty_run)]) == 2
    one = capsys.readouterr()
    assert main(["diff", str(empty_run), str(empty_run)]) == 2
    both = capsys.readouterr()
    # THEN one line names each empty run and its note; never "no differences"
    assert one.err.splitlines() == [
        f"memprofiler diff: error: {empty_run}: no call was collected: {NOTE}; there is nothing to compare"
    ]
    assert both.err.count("no call was collected") == 2
    assert "no differences" not in one.out + both.out


def test_a_run_killed_before_its_end_says_it_left_no_note(empty_run, capsys):
    # GIVEN the same run as a killed process leaves it: status running, no notes yet
    manifest = empty_run / "memprofiler_run.yaml"
    text = manifest.read_text()
    head = text[: text.index("finished:")]
    manifest.write_text(head + "status: running\n#memprofiler-end entries=8\n")
    # WHEN checked THEN the line says why there is no note
    assert main(["check", str(empty_run), "--max", "rss_peak=1GiB"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "no call was collected, and the run left no note why: its `memprofiler_run.yaml` says "
            "`status: running`: killed before it ended, or still running; there is nothing to check"
        )
    )


def test_diff_against_a_run_that_crashed_before_its_first_call_says_it_crashed(
    full_run_dir, tmp_path, capsys
):
    # GIVEN a real run that raised before the loop profiled any step
    out = tmp_path / "crashed"
    with warnings.catch_warnings(), pytest.raises(RuntimeError):
        warnings.simplefilter("ignore")
        with MemProfiler({}, save_dir=out, rank=0):
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB\nmore detail")
    # WHEN diffed against a run that collected
    assert main(["diff", str(full_run_dir), str(out)]) == 2
    # THEN the line says it crashed, and with what, before the note that the step never ran
    assert capsys.readouterr().err.splitlines() == [
        f"memprofiler diff: error: {out}: no call was collected: the run crashed (RuntimeError: CUDA out "
        "of memory. Tried to allocate 20.00 GiB) before any call was collected; `training_step` (in "
        "`collect_funcs`) was never called; calls seen: none; there is nothing to compare"
    ]


def test_diff_warns_that_a_run_crashed_after_collecting(full_run_dir, tmp_path, capsys):
    # GIVEN a real run that collected 2 calls, then raised
    out = tmp_path / "late"
    with warnings.catch_warnings(), pytest.raises(ValueError):
        warnings.simplefilter("ignore")
        with MemProfiler({"schedule": {"warmup": 0, "active": 2}}, save_dir=out, rank=0) as prof:
            for _ in range(2):
                with prof.profile("training_step"):
                    pass
            raise ValueError("bad batch")
    # WHEN diffed THEN a warning names the crash; the comparison goes on
    assert main(["diff", str(full_run_dir), str(out), "--metric", "rss"]) == 0
    assert (
        f"memprofiler diff: warning: {out} crashed (ValueError: bad batch); it holds the calls collected "
        "before the crash"
    ) in capsys.readouterr().err.splitlines()
