"""``memprofiler snapshot`` on hand-built allocator snapshots with known answers."""

from __future__ import annotations

import pickle

import pytest

from memprofiler.__main__ import main
from snapshot_fixtures import known_snapshot, rounded_snapshot


@pytest.fixture
def snap_file(tmp_path):
    p = tmp_path / "cuda_alloc_rank_0.training_step.2.end.pickle"
    p.write_bytes(pickle.dumps(known_snapshot(), protocol=4))
    return p


def test_prints_peaks_stacks_fragmentation_and_oom(snap_file, capsys):
    assert main(["snapshot", str(snap_file)]) == 0
    out = capsys.readouterr().out
    assert (
        "now: 3 segments, reserved 4.00 MiB, allocated 1.75 MiB in rounded blocks, 1.75 MiB requested" in out
    )
    assert (
        "device 0: 12 trace entries; peak active 2.25 MiB requested (entry 5, t=0.000140s); "
        "peak reserved 6.00 MiB (entry 10, t=0.000180s)"
    ) in out
    # The trace ends in an OOM (entry 9): the table is what was live then, not at the peak
    # (entry 5): S1's 1 MiB block, the pre-trace 512 KiB (INIT) and 256 KiB (no stack) blocks.
    assert "live at the OOM (entry 9, 1.75 MiB active) by stack (3 blocks)" in " ".join(out.split())
    assert "live at the active peak" not in out
    stack_lines = [ln for ln in out.splitlines() if "linear_forward (linear_forward.py:10)" in ln]
    assert len(stack_lines) == 1 and "1.00 MiB" in stack_lines[0]
    assert "OOM device 0 entry 9 t=0.000170s: 8.00 GiB requested, 1000 B free" in out
    assert "33.3%" in out


def test_the_gc_is_paused_from_the_load_to_the_page_and_resumes_after(snap_file, tmp_path, monkeypatch):
    # GIVEN the cyclic GC on, and the load, the analysis and the page watched
    import gc

    from memprofiler.analysis.snapshot import summary
    from memprofiler.reporters.explorer import page

    seen = []

    def watched(f):
        def run(*args, **kwargs):
            seen.append((f.__name__, gc.isenabled()))
            return f(*args, **kwargs)

        return run

    for module, name in ((summary, "load_snapshot"), (summary, "analyze_columns"), (page, "start_explorer")):
        monkeypatch.setattr(module, name, watched(getattr(module, name)))
    assert gc.isenabled()
    # WHEN the snapshot command writes the explorer
    assert main(["snapshot", str(snap_file), "--html", str(tmp_path / "p.html")]) == 0
    # THEN each ran with the GC off (a collection would rescan every loaded entry), and it is on again
    assert seen == [("load_snapshot", False), ("analyze_columns", False), ("start_explorer", False)]
    assert gc.isenabled()


def test_html_page(snap_file, tmp_path, capsys):
    out = tmp_path / "snap.html"
    assert main(["snapshot", str(snap_file), "--html", str(out), "--top", "2"]) == 0
    html = out.read_text()
    assert "Peak active <span title='2,359,296 bytes'>2.25 MiB</span> requested" in html
    assert html.count("<svg") == 1
    assert "(top 2)" in html


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        (b"", "file is empty"),
        (pickle.dumps(known_snapshot(), protocol=4)[:500], "truncated"),
        (b"PK\x03\x04 a zip file", "is a zip archive"),
        (b"hello: yaml\n", "not a pickle file"),
        (pickle.dumps({"a": 1}), "not a CUDA allocator snapshot"),
        (b"cposix\nsystem\n(S'true'\ntR.", "refused to load"),
    ],
)
def test_bad_files_are_one_line_exit_2(tmp_path, capsys, content, message):
    p = tmp_path / "x.pickle"
    if content is not None:
        p.write_bytes(content)
    assert main(["snapshot", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(p) in err


def test_rounded_blocks_are_labelled_and_counted_as_requested_bytes(tmp_path, capsys):
    # GIVEN a snapshot whose blocks are rounded above their requested sizes
    p = tmp_path / "round.pickle"
    p.write_bytes(pickle.dumps(rounded_snapshot(), protocol=4))
    # WHEN analysed
    assert main(["snapshot", str(p)]) == 0
    out = capsys.readouterr().out
    # THEN the figures are the requested ones (6004 / 3004), labelled so, and the end state
    # shows both the rounded and the requested bytes
    assert (
        "now: 1 segments, reserved 2.00 MiB, allocated 3.50 KiB in rounded blocks, 2.93 KiB requested" in out
    )
    assert "device 0: 8 trace entries; peak active 5.86 KiB requested (entry 4, t=0.000040s)" in out


def _trace(*entries):
    return {"segments": [], "device_traces": [list(entries)]}


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            {"segments": [{"device": "cuda:0", "total_size": 10, "blocks": []}], "device_traces": []},
            "malformed allocator snapshot (segments[0]: device must be an integer, got 'cuda:0')",
        ),
        (
            {"segments": [{"total_size": "1e9", "blocks": []}], "device_traces": []},
            "malformed allocator snapshot (segments[0]: total_size must be an integer, got '1e9')",
        ),
        (
            _trace({"action": "oom", "size": "big"}),
            "malformed allocator snapshot (device_traces[0][0] (oom): size must be an integer, got 'big')",
        ),
        (
            _trace({"action": "oom", "size": 5, "device_free": "x"}),
            "malformed allocator snapshot (device_traces[0][0] (oom): device_free must be an integer, got 'x')",
        ),
        (
            _trace({"action": "alloc", "addr": 1, "size": float("nan")}),
            "malformed allocator snapshot (device_traces[0][0] (alloc): size must be an integer, got nan)",
        ),
        (
            _trace({"action": "alloc", "addr": 1, "size": 10, "time_us": "abc"}),
            "malformed allocator snapshot (device_traces[0][0]: time_us must be an integer, got 'abc')",
        ),
    ],
)
def test_wrong_field_types_are_one_line_exit_2(tmp_path, capsys, payload, message):
    # GIVEN a snapshot with a field of the wrong type
    p = tmp_path / "bad.pickle"
    p.write_bytes(pickle.dumps(payload, protocol=4))
    # THEN one line naming the file and the field, exit 2 (no traceback)
    assert main(["snapshot", str(p)]) == 2
    assert capsys.readouterr().err == f"memprofiler snapshot: error: {p}: {message}\n"


def _segment(total: int, *blocks: tuple[int, str]) -> dict[str, object]:
    return {
        "device": 0,
        "address": 4096,
        "total_size": total,
        "blocks": [{"size": size, "requested_size": size, "state": state} for size, state in blocks],
    }


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            {"segments": [_segment(1024, (-512, "active_allocated"))], "device_traces": []},
            "malformed allocator snapshot (segments[0]: block size must be >= 0 bytes, got -512)",
        ),
        (
            {"segments": [_segment(-1024)], "device_traces": []},
            "malformed allocator snapshot (segments[0]: total_size must be >= 0 bytes, got -1024)",
        ),
        (
            {"segments": [_segment(1024, (2048, "inactive"))], "device_traces": []},
            "malformed allocator snapshot (segments[0]: its blocks hold 2048 bytes, more than its total_size 1024)",
        ),
        (
            _trace({"action": "alloc", "addr": 1, "size": -(1 << 30), "time_us": 1}),
            "malformed allocator snapshot (device_traces[0][0] (alloc): size must be >= 0 bytes, got -1073741824)",
        ),
        (
            _trace({"action": "segment_alloc", "addr": 1, "size": -5, "time_us": 1}),
            "malformed allocator snapshot (device_traces[0][0] (segment_alloc): size must be >= 0 bytes, got -5)",
        ),
    ],
)
def test_impossible_values_are_one_line_exit_2(tmp_path, capsys, payload, message):
    # GIVEN a snapshot with a negative size (or blocks larger than their segment)
    p = tmp_path / "bad.pickle"
    p.write_bytes(pickle.dumps(payload, protocol=4))
    # THEN one line naming the file, the field and its value, exit 2
    assert main(["snapshot", str(p)]) == 2
    assert capsys.readouterr().err == f"memprofiler snapshot: error: {p}: {message}\n"


def test_a_trace_listed_many_times_is_refused_not_expanded(tmp_path, capsys):
    # GIVEN a small pickle naming one 1000-entry trace 2000 times (memo references)
    trace = [{"action": "alloc", "addr": i, "size": 8, "time_us": i, "frames": []} for i in range(1000)]
    p = tmp_path / "fanout.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace] * 2000}, protocol=4))
    assert p.stat().st_size < 40_000
    # THEN it is refused in one line (two million entries are never replayed)
    assert main(["snapshot", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{p}: refused: the snapshot repeats one trace, segment or block list" in err


def test_markup_in_a_path_is_printed_as_is(tmp_path, capsys):
    # GIVEN a file under a directory whose name looks like rich markup
    d = tmp_path / "sweep[/lr]" / "exp[red]"
    d.mkdir(parents=True)
    p = d / "snap.pickle"
    p.write_bytes(pickle.dumps(known_snapshot(), protocol=4))
    # THEN the command prints the path verbatim instead of failing or swallowing it
    assert main(["snapshot", str(p)]) == 0
    out = capsys.readouterr().out
    assert f"Allocator snapshot {p}" in out


@pytest.mark.slow
def test_reading_commands_never_import_torch(snap_file):
    # GIVEN a fresh interpreter: importing torch costs ~2 s and ~250 MB RSS, more than
    # analysing a 1M-entry snapshot, and none of the reading commands needs it
    import subprocess
    import sys
    from pathlib import Path

    from _env import subprocess_env

    src = Path(__file__).resolve().parents[2] / "src"
    code = (
        "import sys\n"
        "from memprofiler.__main__ import main, build_parser\n"
        "build_parser()\n"
        f"main(['snapshot', {str(snap_file)!r}])\n"
        "print(*[m in sys.modules for m in ('memprofiler.config', 'msgspec', 'torch')])\n"
    )
    # WHEN the parser is built (every command module is imported) and `snapshot` runs
    out = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env(src), capture_output=True, text=True
    )
    # THEN torch was never imported, nor the config or the trace reader (msgspec) it does not need
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False False False"


# ----------------------------------------------------------------------------- one recording per window
def _window_recording(tmp_path, active: int = 2):
    """A window of calls 2-3 (2 to ``active + 1``) recorded over the fake allocator, call n
    allocating n * 4 KiB."""
    import torch

    from fake_cuda import FakeCudaBackend
    from memprofiler import MemProfiler

    fake = FakeCudaBackend(track_blocks=True)
    lin = torch.nn.Linear(4, 4)
    for p in lin.parameters():  # the model's storages: blocks older than the recording
        fake.adopt(p.untyped_storage().data_ptr(), p.untyped_storage().nbytes())
    cfg = {
        "schedule": {"warmup": 1, "active": active},
        "cuda_allocator_history": True,
        "enable_saved_tensors_hooks": False,
        "collect_funcs": {"default": ["train_step"]},
    }
    with MemProfiler(cfg, save_dir=tmp_path, rank=0, cuda=fake, module=lin) as prof:
        for n in range(1, active + 3):
            with prof.profile("train_step"):
                fake.free(fake.alloc(n * 4096))
    return tmp_path / "cuda_alloc_rank_0.window_0.pickle"


def test_a_call_of_a_window_recording_and_its_explorer(tmp_path, capsys):
    import json

    path = _window_recording(tmp_path)
    # WHEN call 3 is asked for at its start and at its end
    assert main(["snapshot", str(path), "--call", "train_step:3", "--phase", "start"]) == 0
    start = capsys.readouterr().out
    out = tmp_path / "w.html"
    assert main(["snapshot", str(path), "--call", "train_step:3", "--html", str(out)]) == 0
    end = capsys.readouterr().out
    # THEN each shows the recording as it stood then: 7 entries before call 3 (calls 1-2 and the
    # snapshot that looked at the ring after call 2), 10 after
    assert "train_step:3 at its start" in start and "device 0: 7 trace entries" in start
    assert "train_step:3 at its end" in end and "device 0: 10 trace entries" in end
    # AND the calls marked in the recording are listed with their entries
    assert "calls marked in this recording (2): train_step:2 (entries 3-5), train_step:3 (entries 7-9)" in end
    # AND the blocks older than the recording are the model's parameters, by role
    assert "parameter" in end and "(no stack recorded)" not in end
    # AND the explorer carries the calls' entry ranges and opens on call 3
    meta = json.loads(out.read_text().split("id='mp-meta'>", 1)[1].split("</script>", 1)[0])
    assert meta["calls"] == [
        {"key": "train_step:2", "ranges": {"0": [3, 6]}},
        {"key": "train_step:3", "ranges": {"0": [7, 10]}},
    ]
    assert meta["select"] == "train_step:3"
    assert "parameter `weight`" in meta["strings"] and "parameter `bias`" in meta["strings"]


def test_a_call_not_in_the_recording_is_one_clear_line(tmp_path, capsys):
    path = _window_recording(tmp_path)
    assert main(["snapshot", str(path), "--call", "train_step:7"]) != 0
    err = capsys.readouterr().err
    assert "no call train_step:7 is marked in it (calls marked: train_step:2, train_step:3)" in err
    assert main(["snapshot", str(path), "--call", "seven"]) != 0
    assert "expected FUNCTION:CALL" in capsys.readouterr().err


def test_a_foreign_window_index_is_ignored_with_one_line(tmp_path, capsys):
    import json
    import shutil

    from memprofiler.analysis.snapshot.calls import checked_index

    # GIVEN this run's window (calls 2-3) and another run's (calls 2-6), whose index is
    # copied over this one's
    path = _window_recording(tmp_path / "mine")
    other = _window_recording(tmp_path / "other", active=5)
    mine = json.loads(path.with_suffix(".json").read_text())
    # (each index names its run and digests its recording)
    manifest = (tmp_path / "mine" / "memprofiler_run.yaml").read_text()
    assert mine["run_id"] and f"run_id: {mine['run_id']}" in manifest
    assert mine["trace_entries"] == 10 and len(mine["digest"]) == 32
    shutil.copy(other.with_suffix(".json"), path.with_suffix(".json"))
    # WHEN a call only the foreign index lists is asked for
    assert main(["snapshot", str(path), "--call", "train_step:6"]) == 2
    err = capsys.readouterr().err
    # THEN the index is ignored, in one line that says why; the call is not shown as a view of
    # this recording (it was before)
    warning, error = err.strip().splitlines()
    assert warning == (
        f"memprofiler snapshot: warning: {path.with_suffix('.json')}: not the index of the recording beside "
        "it (it lists 19 trace entries, the recording holds 10); ignored: the calls are read from the "
        "recording's own marks (re-copy both files of the window together)"
    )
    assert "no call train_step:6 is marked in it (calls marked: train_step:2, train_step:3)" in error
    # AND an index with the same entry count but another recording's digest is refused too
    forged = {**json.loads(other.with_suffix(".json").read_text()), "trace_entries": 10}
    path.with_suffix(".json").write_text(json.dumps(forged))
    _, note = checked_index(path, load_snapshot_for_test(path))
    assert note is not None and "its digest of the recording's first and last entries differs" in note
    # AND so is one whose digest was taken out (its format version writes one)
    path.with_suffix(".json").write_text(json.dumps({**forged, "digest": None, "trace_entries": None}))
    _, note = checked_index(path, load_snapshot_for_test(path))
    assert note is not None and "carries no digest of its recording" in note
    # AND the report names it before its other lines
    assert main(["report", str(tmp_path / "mine"), "--no-html"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("warning: ") and "not the index of the recording beside it" in first


def load_snapshot_for_test(path):
    from memprofiler.analysis.snapshot.summary import load_snapshot

    return load_snapshot(path)


def test_a_window_index_without_its_recording_is_named_by_the_report(tmp_path, capsys):
    # GIVEN a run whose window recording was lost, its index left
    path = _window_recording(tmp_path)
    path.unlink()
    # WHEN reported
    assert main(["report", str(tmp_path), "--no-html"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # THEN the missing recording is said (exit 0 and no word of it before)
    assert (
        "warning: cuda_alloc_rank_0.window_0.json: the recording of rank 0 window 0 "
        "(cuda_alloc_rank_0.window_0.pickle) is missing" in out
    )


def test_the_report_never_writes_pages_through_a_link_out_of_its_folder(tmp_path, capsys):
    import os

    # GIVEN a run with a window recording, whose explorer folder is a link to another folder
    run = tmp_path / "run"
    _window_recording(run)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, run / "allocator-explorer")
    # WHEN reported
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    # THEN nothing is written there (the pages were before, without a word), and one line says why
    assert list(elsewhere.iterdir()) == []
    (line,) = err.strip().splitlines()
    assert f"resolves to {elsewhere.resolve()}" in line and f"outside {run.resolve()}" in line
    assert "pass -o to write the report elsewhere" in line
    # AND with -o in a clean folder the report and its pages are written there
    out = tmp_path / "out" / "report.html"
    out.parent.mkdir()
    assert main(["report", str(run), "-o", str(out)]) == 0
    assert out.is_file() and len(list((out.parent / "allocator-explorer").iterdir())) == 1
