"""``memprofiler report`` on real CPU runs (plus hand-built allocator pickles)."""

from __future__ import annotations

import pickle
import re
import shutil
from pathlib import Path

import pytest

from memprofiler import layout
from memprofiler.__main__ import main
from memprofiler.units import format_bytes
from run_fixtures import REAL_FSDP_REPORT_YAML, expected_saved_bytes


def _save_dir(root: Path) -> Path:
    return next(root.rglob("rank_0_memory_stats.yaml")).parent


def test_terminal_summary_shows_calls_peaks_and_saved_modules(full_run, tmp_path, capsys):
    # GIVEN a run tree (save_dir three levels down) WHEN reported
    rc = main(["report", str(full_run), "-o", str(tmp_path / "r.html")])
    out = capsys.readouterr().out
    # THEN every rank's calls are listed with the analytic saved-tensor bytes
    assert rc == 0
    saved = format_bytes(expected_saved_bytes(256))
    assert saved == "12.25 KiB"
    call_lines = [
        ln for ln in out.splitlines() if re.match(r"│\s+[01] │ training_step │\s+\d │\s+[\d.]+ [MG]iB", ln)
    ]
    assert len(call_lines) == 4  # 2 ranks x calls 2 and 3
    assert all(saved in ln for ln in call_lines)
    # the ReLU output (8 x 256 float32) is the biggest saved module
    assert re.search(r"enc\.1\s+│\s+8\.00 KiB", out)
    # rank 1 peaks 64 MiB higher: the summary names it, with max/mean a little above 1
    assert "Across ranks" in out
    assert re.search(r"training_step\.2\.end\s+│ rss_peak\s+│.*│\s+1 │\s+1\.0\d\d │", out)
    assert "peak active 2.25 MiB requested (entry 5" in out
    [fsdp_row] = [ln for ln in out.splitlines() if re.match(r"│\s+0 │ training_step │\s+2 │\s+4\.00 KiB", ln)]
    assert "64.00 KiB" in fsdp_row
    assert "8.00 GiB requested" in out
    assert f"HTML report: {tmp_path / 'r.html'}" in out


def test_html_report_is_self_contained_and_holds_the_figures(full_run, tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["report", str(full_run), "-o", str(out)]) == 0
    html = out.read_text()
    # self-contained: no external script, style, image, font or fetch
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", html)
    assert "@import" not in html and "url(" not in html and "fetch(" not in html
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) <= {"http://www.w3.org/2000/svg"}
    # every section is there
    for section in (
        "id='calls'",
        "id='across'",
        "id='saved'",
        "id='summary'",
        "id='modules'",
        "id='snapshots'",
        "id='oom'",
    ):
        assert section in html
    assert html.count("<svg") >= 6
    # the figures
    assert "Peak active <span title='2,359,296 bytes'>2.25 MiB</span> requested" in html
    assert "peak reserved <span title='6,291,456 bytes'>6.00 MiB</span>" in html
    assert "12.25 KiB saved for backward" in html
    assert "<span title='65,536 bytes'>64.00 KiB</span>" in html  # FSDP activation peak
    assert "33.3%" in html  # fragmented segment C


def test_default_output_goes_next_to_the_data(real_runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(real_runs["a"], run)
    assert main(["report", str(run)]) == 0
    assert (run / "report.html").is_file()
    assert main(["report", str(run), "--no-html"]) == 0


def _copy(real_runs: dict[str, Path], tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(real_runs["a"], run)
    return run


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("missing", "no such directory"),
        ("empty_dir", "no memprofiler files found"),
        ("empty_yaml", "file is empty"),
        ("truncated_yaml", "the file was cut before its first block was complete"),
        ("foreign_yaml", "expected a mapping"),
        ("bad_key", "is not a snapshot key"),
        ("truncated_pickle", "truncated"),
        ("malicious_pickle", "refused to load"),
    ],
)
def test_bad_input_is_one_line_exit_2(real_runs, tmp_path, capsys, breakage, message):
    run = _copy(real_runs, tmp_path)
    stats = run / "rank_0_memory_stats.yaml"
    if breakage == "missing":
        run = tmp_path / "nope"
    elif breakage == "empty_dir":
        run = tmp_path / "empty"
        run.mkdir()
    elif breakage == "empty_yaml":
        stats.write_text("")
    elif breakage == "truncated_yaml":
        stats.write_text(stats.read_text()[:25] + "\n  - [unclosed")
    elif breakage == "foreign_yaml":
        stats.write_text("- just\n- a list\n")
    elif breakage == "bad_key":
        stats.write_text("hello: {rss: 1}\n")
    elif breakage == "truncated_pickle":
        (run / "cuda_alloc_rank_0.training_step.2.end.pickle").write_bytes(
            pickle.dumps({"segments": [1] * 50})[:20]
        )
    elif breakage == "malicious_pickle":
        (run / "oom_rank_0_0.pickle").write_bytes(
            b"cos\nsystem\n(S'touch " + str(tmp_path / "pwn").encode() + b"'\ntR."
        )
    rc = main(["report", str(run), "-o", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "pwn").exists()


def _html_text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_real_fsdp_report_tables_format_only_categories_as_bytes(real_runs, tmp_path, capsys):
    # GIVEN a run with a real FSDPMemTracker report (scalars, peak/final, module-wise phases)
    run = _copy(real_runs, tmp_path)
    (run / "fsdp_mem_rank_0_training_step_2.yaml").write_text(REAL_FSDP_REPORT_YAML)
    # WHEN reported
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    section = html[html.index("<summary>FSDP tracker · rank 0 · training_step #2</summary>") :]
    # THEN the scalars are shown as written (not "0 B"), and `notes: []` has no table
    assert "<tr><td>rank</td><td>0</td></tr><tr><td>fn</td><td>training_step</td></tr>" in section
    assert "<tr><td>call</td><td>2</td></tr>" in section
    assert "<tr><td>module_depth</td><td>4</td></tr>" in section
    assert "notes" not in section
    # AND peak/final are one row per device, categories in bytes with the exact count
    peak = _html_text(section[section.index(">peak<") : section.index(">final<")])
    assert peak.startswith(
        ">peak device Sharded Param Unsharded Param Buffer Sharded Grad Unsharded Grad Activation Temp "
        "All Gather Reduce Scatter OptState Inputs Total cpu 1.65 MiB 1.04 MiB 0 B 1.65 MiB 0 B 16.57 MiB "
        "0 B 774.50 KiB 0 B 3.31 MiB 0 B 24.98 MiB"
    )
    assert "<span title='17,371,712 bytes'>16.57 MiB</span>" in section
    # AND the module-wise snapshots are rows (module, phase, device, categories), no dict reprs
    mods = _html_text(section[section.index(">modules<") : section.index("<script>")])
    assert mods.startswith(">modules module phase device Sharded Param")
    assert "DemoGPT.model Peak Forward cpu 1.65 MiB 1.04 MiB 0 B 1.65 MiB 0 B 16.57 MiB" in mods
    assert "DemoGPT.model Before Pre-Forward cpu 1.65 MiB 0 B 0 B 1.65 MiB 0 B 4.06 KiB" in mods
    assert "{" not in mods and "&#x27;cpu&#x27;" not in section
    # AND first what the module added: its forward's peak above the snapshot before it, 18.36 MiB
    # (the fixture holds no post-forward or backward snapshot: those cells are empty)
    added = _html_text(section[: section.index("the tracker's snapshots")])
    assert "DemoGPT.model cpu 18.36 MiB" in added


def test_non_finite_values_and_odd_keys_do_not_crash_the_report(real_runs, tmp_path, capsys):
    # GIVEN an edited stats file with rss_peak .inf and an OOM yaml with an integer key
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank_0_memory_stats.yaml").write_text(
        "0.training_step.2.start:\n  rss: 100\n0.training_step.2.end:\n  rss: 200\n  rss_peak: .inf\n"
    )
    (run / "oom_rank_0_0.yaml").write_text("5: 7\nsize: 2048\n")
    # WHEN reported THEN exit 0: the infinite peak shows as "-", the integer key as text
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out
    [row] = [ln for ln in out.splitlines() if "training_step" in ln and "│" in ln]
    assert re.search(r"│\s+0 │ training_step │\s+2 │\s+100 B │\s+200 B │\s+- │\s+- │", row), row
    assert out.startswith("warning: rank 0 training_step #2: impossible figures, left out (shown as -): "
                          "`rss_peak` at its end is inf")  # fmt: skip
    assert "OOM dump rank 0 #0: 5=7, size=2.00 KiB" in out
    html = (tmp_path / "r.html").read_text()
    assert "<tr><td>5</td><td class='n'>7</td></tr>" in html


def test_yaml_aliases_are_refused(tmp_path, capsys):
    # GIVEN a 1 KB stats file whose aliases would expand to 10**8 entries (billion laughs)
    run = tmp_path / "run"
    run.mkdir()
    lines = ["0.training_step.2.end:", "  rss: 1", "  saved_tensors.by_module:", "    l0: &a0 {x: 1, y: 1}"]
    lines += [f"    l{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    (run / "rank_0_memory_stats.yaml").write_text("\n".join(lines) + "\n")
    # THEN one line naming the file and the line, exit 2, before anything expands
    assert main(["report", str(run), "--no-html"]) == 2
    assert capsys.readouterr().err == (
        f"memprofiler report: error: {run / 'rank_0_memory_stats.yaml'}: refused: YAML alias (*name) "
        "at line 5; memprofiler never writes aliases and they can expand a small file to gigabytes\n"
    )


def test_markup_in_the_run_path_is_printed_as_is(real_runs, tmp_path, capsys):
    # GIVEN a run directory whose name looks like rich markup
    run = tmp_path / "sweep[/lr]" / "exp[red]"
    shutil.copytree(real_runs["a"], run)
    # THEN the report prints it verbatim (no MarkupError, nothing swallowed)
    assert main(["report", str(run), "--no-html"]) == 0
    assert f"memprofiler run {run}  ranks: 0" in capsys.readouterr().out


def test_stats_yaml_is_read_and_a_broken_pickle_beside_it_ignored(real_runs, tmp_path, capsys):
    # GIVEN a good rank_0_memory_stats.yaml next to a truncated .pickle of the same data
    run = _copy(real_runs, tmp_path)
    (run / "rank_0_memory_stats.pickle").write_bytes(pickle.dumps({"x": list(range(100))}, protocol=4)[:30])
    # THEN the YAML is used and the report succeeds with the analytic saved bytes
    assert main(["report", str(run), "--no-html"]) == 0
    assert format_bytes(expected_saved_bytes(256)) in capsys.readouterr().out


@pytest.mark.parametrize(
    "value",
    [
        "[" * 60_000 + "]" * 60_000,  # JSON's decoder: RecursionError; libyaml's: a C stack overflow
        '{"b": ' * 60_000 + "1" + "}" * 60_000,
    ],
)
def test_nesting_no_writer_makes_is_refused_with_one_line(tmp_path, capsys, value):
    # GIVEN a stats file whose one entry nests 60,000 levels deep (once a crash, not an error)
    run = tmp_path / "run"
    run.mkdir()
    path = run / "rank_0_memory_stats.yaml"
    path.write_text(
        f'{layout.YAML_HEADER}\n0.training_step.2.end: {{"a": {value}}}\n#memprofiler-end entries=1\n'
    )
    # THEN exit 2 and one line naming the file, for every command that reads it
    for command in (["report", str(run), "--no-html"], ["check", str(run), "--max", "rss=1GiB"]):
        assert main(command) == 2
        assert capsys.readouterr().err == (
            f"memprofiler {command[0]}: error: {path}: refused: nested deeper than any file memprofiler "
            "writes (over 1000 levels, or indented 4000 columns); a YAML parser can crash on such a file\n"
        )


def test_a_run_killed_by_sigkill_is_said_on_the_first_line(tmp_path, capsys):
    import os
    import signal
    import subprocess
    import sys
    import textwrap

    import yaml

    from _env import subprocess_env

    # GIVEN a plain loop that collects 60 calls (50 flushed) and is killed by SIGKILL
    script = textwrap.dedent(
        f"""
        import os, signal
        from memprofiler import MemProfiler
        prof = MemProfiler({{"schedule": {{"warmup": 0, "active": 1, "repeat": 0}}}},
                           save_dir={str(tmp_path)!r}, rank=0)
        with prof:
            for _ in range(60):
                with prof.profile("training_step"):
                    pass
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    src = Path(__file__).resolve().parents[2] / "src"
    proc = subprocess.run(
        [sys.executable, "-c", script], env=subprocess_env(src), capture_output=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    manifest = yaml.safe_load((tmp_path / layout.RUN_MANIFEST).read_text())
    assert manifest["status"] == "running"
    # WHEN reported
    assert main(["report", str(tmp_path), "--no-html"]) == 0
    out = capsys.readouterr().out.splitlines()
    # THEN its first line says the run ended without finishing (no word of it before), and the
    # 50 flushed calls are shown
    assert out[0].startswith("warning: this run ended without finishing (started ")
    assert f"its process ({manifest['pid']}) is gone" in " ".join(out[:3])
    assert any("50 collected calls" in line or "training_step" in line for line in out)
    # AND a run whose process still holds it (this one's pid) gets no such line
    text = (
        (tmp_path / layout.RUN_MANIFEST).read_text().replace(f"pid: {manifest['pid']}", f"pid: {os.getpid()}")
    )
    (tmp_path / layout.RUN_MANIFEST).write_text(text)
    assert main(["report", str(tmp_path), "--no-html"]) == 0
    assert not capsys.readouterr().out.startswith("warning:")


@pytest.mark.parametrize("value", ["-5", ".nan", ".inf", "-1e30", "99999999999999999999999"])
def test_impossible_figures_open_the_report_and_name_the_call(tmp_path, capsys, value):
    import torch

    from memprofiler import MemProfiler

    # GIVEN a CPU run of three calls whose call 2 end rss_peak was edited to an impossible value
    with MemProfiler({"schedule": {"warmup": 0, "active": 3}}, save_dir=tmp_path, rank=0) as prof:
        for _ in range(3):
            with prof.profile("training_step"):
                torch.ones(256, 256).sum()
    stats = tmp_path / "rank_0_memory_stats.yaml"
    lines = stats.read_text().splitlines(keepends=True)
    k = next(i for i, line in enumerate(lines) if line.startswith("0.training_step.2.end:"))
    lines[k] = re.sub(r'"rss_peak": \d+', f'"rss_peak": {value}', lines[k])
    stats.write_text("".join(lines))
    # WHEN reported (ValueError "parts () do not add up to the peak -5" and no report before)
    out_html = tmp_path / "r.html"
    assert main(["report", str(tmp_path), "-o", str(out_html)]) == 0
    out = capsys.readouterr().out
    # THEN the report opens with one line naming the call and the figure, which is left out
    first = out.splitlines()[0]
    assert first.startswith("warning: rank 0 training_step #2: impossible figures, left out (shown as -): ")
    assert "`rss_peak` at its end is " in first
    html = out_html.read_text()
    assert "training_step #2: impossible figures" in html
