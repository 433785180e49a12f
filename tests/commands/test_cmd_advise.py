"""``memprofiler advise RUN``: the blocks that saved the most, and what each takes off the peak."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from memprofiler.__main__ import main

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_demo_run"
MiB = 1 << 20


def _call_figures() -> tuple[int, dict[str, int]]:
    """The highest-peak training call's allocated peak and per-module saved bytes, read from the file."""
    best: tuple[int, dict[str, int]] = (0, {})
    for line in (RUN / "rank_0_memory_stats.yaml").read_text().splitlines():
        if ".training_step." in line and line.split(":", 1)[0].endswith(".end"):
            m = json.loads(line.split(": ", 1)[1])
            if m["allocated_bytes.all.peak"] > best[0]:
                best = (m["allocated_bytes.all.peak"], m["saved_tensors.by_module"])
    return best


def test_blocks_are_proposed_by_saved_bytes_with_their_saving_at_the_peak(capsys):
    # GIVEN a recorded GPU run of a four-block model
    peak, by_module = _call_figures()
    block = sum(n for m, n in by_module.items() if m == "model.blocks.0" or m.startswith("model.blocks.0."))
    # WHEN advise reads it with a budget two blocks below the peak
    assert main(["advise", str(RUN), "--budget", f"{peak - 2 * block + 1}B"]) == 0
    out = capsys.readouterr().out
    # THEN each block is proposed with its own and its submodules' saved bytes, cumulated off the peak
    lines = [line.split() for line in out.splitlines() if line.strip().startswith("model.blocks.")]
    assert [line[0] for line in lines] == [f"model.blocks.{i}" for i in range(4)]
    assert f"{block / MiB:.2f}" == lines[0][1]
    assert f"{(peak - 2 * block) / MiB:.2f}" == lines[1][-2]
    assert "checkpoint at least the first 2" in out
    # AND the lines that checkpoint those two, on the module profiled
    wraps = [line.split()[0] for line in out.splitlines() if "= checkpoint_wrapper(" in line]
    assert wraps == ["root.model.blocks[0]", "root.model.blocks[1]"]


def test_it_estimates_nothing_so_a_terminal_gets_no_status_line(monkeypatch, capsys):
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["advise", str(RUN)]) == 0
    assert err.getvalue() == "" and "model.blocks.0" in capsys.readouterr().out


def test_a_run_without_saved_tensors_per_module_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    text = (RUN / "rank_0_memory_stats.yaml").read_text().replace('"saved_tensors.by_module"', '"other"')
    (run / "rank_0_memory_stats.yaml").write_text(text)
    for f in RUN.iterdir():
        if f.is_file() and f.name != "rank_0_memory_stats.yaml":
            (run / f.name).write_bytes(f.read_bytes())
    assert main(["advise", str(run)]) == 2
    err = capsys.readouterr().err
    assert "no call has saved-tensor bytes per module" in err


@pytest.mark.parametrize("budget", ["0", "lots"])
def test_a_bad_budget_is_one_line(budget, capsys):
    assert main(["advise", str(RUN), "--budget", budget]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "--budget" in err[-1]
