"""Reading runs from the command line: several runs, cut files, notes, long runs, --version."""

from __future__ import annotations

import os
import re

import pytest
import yaml

from memprofiler import __version__, layout
from memprofiler.__main__ import main
from v1_files import stats, v1_text, write_run


def _cut(run):
    """Append a block to the run's stats and cut it mid-number: 74880 -> 7488."""
    path = run / "rank_0_memory_stats.yaml"
    extra = yaml.safe_dump({"0.training_step.9.start": {"rss": 74880}})
    path.write_text(path.read_text() + extra[:-2])
    return path


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"memprofiler {__version__}\n"


@pytest.mark.parametrize("command", ["estimate", "fit"])
def test_a_subcommand_of_the_training_script_points_there_in_one_line(capsys, command):
    # WHEN a newcomer types `memprofiler estimate --config c.yaml` (not argparse's "invalid choice")
    assert main([command, "--config", "c.yaml"]) == 2
    # THEN one line says where it lives: the MemProfilerCLI module, or the user's own script
    assert capsys.readouterr().err.splitlines() == [
        f"memprofiler: `{command}` is a subcommand of the script that trains, not of `memprofiler`: run "
        f"`python -m memprofiler.lightning {command} --config config.yaml` (the model as `model.class_path`), "
        f"or `python train.py {command} ...` where train.py calls `MemProfilerCLI`"
    ]


@pytest.mark.parametrize("command", ["report", "check", "diff"])
def test_directory_with_two_runs_reads_the_newest_and_says_so(tmp_path, capsys, command):
    # GIVEN a second run written into version_1 of the first one's save_dir (as `make demo` twice)
    write_run(tmp_path, stats([1]), {"run_id": "a", "started": "2026-01-02T10:00:00Z"})
    write_run(tmp_path / "version_1", stats([1, 2]), {"run_id": "b", "started": "2026-01-02T11:00:00Z"})
    argv = {
        "report": ["report", str(tmp_path), "--no-html"],
        "check": ["check", str(tmp_path), "--max", "rss_peak=1GiB"],
        "diff": ["diff", str(tmp_path), str(tmp_path / "version_1")],
    }[command]
    # WHEN read THEN it works on the newest, with one line naming it and how to pick another
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0] == (
        f"memprofiler {command}: {tmp_path} holds 2 runs; reading the newest, {tmp_path / 'version_1'} "
        f"(started 2026-01-02 11:00:00 UTC); pass another's directory to read it: {tmp_path}"
    )


def test_report_prints_the_manifest_notes(tmp_path, capsys):
    note = "`train_step` was never called; calls seen: training_step x6"
    write_run(tmp_path, stats([1]), {"run_id": "a", "status": "finished", "notes": [note]})
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "r.html")]) == 0
    assert f"note: {note}" in capsys.readouterr().out.splitlines()
    assert f"<p class='oom'>note: {note}</p>" in (tmp_path / "r.html").read_text()


def test_cut_file_is_read_in_part_with_one_warning_and_refused_by_check(tmp_path, capsys):
    # GIVEN a run whose stats file was cut in the middle of a number after its last block-end
    run = write_run(tmp_path / "run", stats([1, 2]))
    path = _cut(run)
    warning = (
        f"{path}: cut short (copied partially or its writer was killed); read the 4 verified entries, "
        "dropped 1 entry (2 lines) after the last `#memprofiler-end entries=4`"
    )
    # WHEN reported or diffed THEN one warning line, and the verified calls only
    assert main(["report", str(run), "--no-html"]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"memprofiler report: warning: {warning}\n"
    assert "7488" not in captured.out and "73.1" not in captured.out
    assert main(["diff", str(run), str(run)]) == 0
    assert capsys.readouterr().err == f"memprofiler diff: warning: {warning}\n" * 2
    # AND check refuses it with one line, exit 2
    assert main(["check", str(run), "--max", "rss_peak=1GiB"]) == 2
    assert capsys.readouterr().err == (
        f"memprofiler check: error: {warning}; a budget cannot be judged on partial data\n"
    )


def test_header_without_block_end_is_one_line_exit_2(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank_0_memory_stats.yaml").write_text(layout.YAML_HEADER + "\n" + yaml.safe_dump(stats([1])))
    assert main(["report", str(run), "--no-html"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has no matching `#memprofiler-end entries=<n>` line" in err


def _long_run(root, calls, rss_step=0, seed=0):
    """``calls`` training steps and a validation step every 5th, host figures and 3 modules."""
    entries = {}
    for c in range(1, calls + 1):
        for fn, k in (("training_step", c), ("validation_step", c // 5)):
            if fn == "validation_step" and (c % 5 or not k):
                continue
            rss = 1_000_000_000 + k * rss_step + ((k * 7919 + seed) % 13) * 1_000_000
            entries[f"0.{fn}.{k}.start"] = {"rss": rss, "vms": 3 * rss}
            end = {"rss": rss + 5, "vms": 3 * rss, "rss_peak": rss + 2_000_000}
            if fn == "training_step":
                end["saved_tensors.unique_bytes"] = 3000
                end["saved_tensors.by_module"] = {"enc.0": 1000, "enc.1": 1500, "head": 500}
            entries[f"0.{fn}.{k}.end"] = end
    root.mkdir(parents=True)
    (root / "rank_0_memory_stats.yaml").write_text(v1_text(entries, [len(entries)]))
    return root


def test_long_run_report_is_per_function_and_small(tmp_path, capsys):
    # GIVEN 1,000 training steps and 200 validation steps
    run = _long_run(tmp_path / "run", 1000)
    # WHEN reported
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out
    html = (tmp_path / "r.html").read_text()
    # THEN the terminal shows one row per function with its calls, then the top calls
    assert "1,200 collected calls per function: median (min - max)" in out
    assert re.search(r"│\s+0 │ training_step\s+│\s+1,000 │", out)
    assert re.search(r"│\s+0 │ validation_step\s+│\s+200 │", out)
    assert "Top 10 calls by rss peak" in out
    # AND the HTML is small: per-function bars, banded lines, the top 20 calls' rows
    assert len(html) < 200_000
    assert "host RSS peak, median per function" in html
    assert html.count("<polygon") >= 1
    top = html[html.index("<h3>Top 20 calls by host RSS peak</h3>") :]
    assert top[: top.index("</table>")].count("<tr>") == 21


def test_html_titles_series_and_notes(tmp_path):
    # GIVEN a CPU-only run with one file, training and validation calls
    run = _long_run(tmp_path / "run", 10)
    # WHEN reported
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    # THEN the titles say what is there, files are counted in English, each function is a line
    assert "<h2 id='across'>Host figures across calls</h2>" in html
    assert "CUDA" not in html[html.index("id='across'") : html.index("id='saved'")]
    assert "&middot; 1 file<" in html
    across = html[html.index("id='across'") : html.index("id='saved'")]
    assert across.count("<polyline") == 2  # training_step and validation_step, not one joined line
    assert ">training_step</text>" in across and ">validation_step</text>" in across
    assert "innermost module running when autograd saved it" in html


def test_diff_is_per_function_with_noise_and_unmatched_in_one_line(tmp_path, capsys):
    # GIVEN A with 40 steps and B with 50, B's RSS 1 MB higher (within the ~13 MB call-to-call spread)
    a = _long_run(tmp_path / "a", 40)
    b = _long_run(tmp_path / "b", 50, seed=0)
    path = b / "rank_0_memory_stats.yaml"
    data = yaml.safe_load(path.read_text())
    for m in data.values():
        m["rss"] += 1_000_000
    path.write_text(v1_text(data, [len(data)]))
    # WHEN diffed
    assert main(["diff", str(a), str(b), "--metric", "rss"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("│")]
    # THEN one row per function and phase, medians over the 40 + 8 calls both hold, marked as noise
    cells = [[c.strip() for c in ln.strip("│ ").split("│")] for ln in rows]
    assert [c[:3] for c in cells] == [
        ["0.training_step.end", "rss", "40"],
        ["0.training_step.start", "rss", "40"],
        ["0.validation_step.end", "rss", "8"],
        ["0.validation_step.start", "rss", "8"],
    ]
    assert all(c[5] == "+976.56 KiB" and c[7].endswith("(within)") for c in cells)
    assert "noise = the larger spread of the metric across the function's calls in either run" in out
    # AND the keys only B holds are one line
    assert (
        "not compared: snapshot keys 0 only in A, 24 only in B (0.training_step.end calls 41-50; "
        "0.training_step.start calls 41-50; 0.validation_step.end calls 9-10; ...); --per-call lists them"
    ) in out


def test_check_reads_the_newest_run_by_file_time_without_manifest(tmp_path, capsys):
    old = write_run(tmp_path / "lightning_logs" / "version_0" / "memprofiler", stats([1]))
    new = write_run(tmp_path / "lightning_logs" / "version_1" / "memprofiler", stats([1, 2, 3]))
    os.utime(old / "rank_0_memory_stats.yaml", (1e9, 1e9))
    os.utime(new / "rank_0_memory_stats.yaml", (1.5e9, 1.5e9))
    assert main(["check", str(tmp_path), "--max", "rss_peak=1GiB"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "memprofiler check: all 3 values within budget\n"
    assert f"reading the newest, {new} (started 2017-07-14 02:40:00 UTC)" in captured.err
