"""The report's "make it fit" section: the blocks that saved the most, each with what it takes off
the peak at most, and the lines that checkpoint them; figures against a model whose saved bytes
per block are known exactly."""

from __future__ import annotations

import itertools
import re

import yaml
from fit_run import H, block_input, block_saved, collect, mlps

from memprofiler.__main__ import main
from memprofiler.analysis.runs.artifacts import load_run
from memprofiler.reporters.model.report import build_model
from memprofiler.reporters.run_advice import advise_run, reference
from memprofiler.units import format_bytes

#: Blocks by saved bytes, largest first: widths 512, 256, 128, 64.
ORDER = [2, 0, 3, 1]


def _call(run) -> dict:
    text = (run / "rank_0_memory_stats.yaml").read_text()
    return yaml.safe_load(text)


def test_proposals_are_the_blocks_by_their_exact_saved_bytes_each_bounded_at_the_peak(tmp_path):
    # GIVEN a collected step of four MLP blocks whose saved bytes are known
    collect(mlps(), tmp_path / "run")
    stats = _call(tmp_path / "run")
    start, end = stats["0.training_step.1.start"], stats["0.training_step.1.end"]
    # WHEN the run is advised
    advice = advise_run(build_model(load_run(tmp_path / "run")))
    # THEN the blocks come by saved bytes, each the analytic figure
    assert advice is not None and advice.blocks
    assert [(p.module, p.saved) for p in advice.proposals] == [(f"blocks.{i}", block_saved(i)) for i in ORDER]
    # AND what each row takes off the host peak is the blocks' saved bytes so far, never more than
    # the call's saved bytes nor its RSS rise (the peak cannot fall below the process before it)
    rise = end["rss_peak"] - start["rss"]
    assert (advice.peak, advice.rise) == (end["rss_peak"], rise)
    assert advice.activations == end["saved_tensors.unique_bytes"]
    bound = min(advice.activations, rise)
    cumulated = list(itertools.accumulate(block_saved(i) for i in ORDER))
    assert [p.at_peak for p in advice.proposals] == [min(c, bound) for c in cumulated]
    assert [p.peak_after for p in advice.proposals] == [advice.peak - p.at_peak for p in advice.proposals]


def test_the_patch_applied_saves_what_the_blocks_saved_less_the_inputs_they_keep(tmp_path):
    # GIVEN the advice of a collected step, and its patch for the first two rows
    before = collect(mlps(), tmp_path / "before")
    advice = advise_run(build_model(load_run(tmp_path / "before")))
    assert advice is not None
    lines = advice.patch(2)
    assert lines[2:] == [
        f"root.blocks[{i}] = checkpoint_wrapper(root.blocks[{i}])  # peak at least "
        f"{format_bytes(advice.proposals[k].peak_after)}"
        for k, i in enumerate(ORDER[:2])
    ]
    # WHEN the lines run on a fresh model and its step is collected again
    root = mlps()
    exec("\n".join(lines), {"root": root})
    after = collect(root, tmp_path / "after")
    # THEN the saved bytes fell by those blocks' hidden activations: each keeps only its input,
    # within the row's upper bound
    fell = before["saved_tensors.unique_bytes"] - after["saved_tensors.unique_bytes"]
    assert fell == sum(block_saved(i) - block_input() for i in ORDER[:2]) == 4 * 64 * (H[2] + H[0])
    assert fell <= sum(p.saved for p in advice.proposals[:2])


def test_the_report_shows_the_section_after_where_memory_goes(tmp_path, capsys):
    collect(mlps(), tmp_path / "run")
    html = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "run"), "-o", str(html)]) == 0
    out = capsys.readouterr().out
    # the terminal: one row per block, largest first, with its saved bytes
    fit = out.split("Make it fit")[1]
    rows = [line.split("│")[1:3] for line in fit.splitlines() if re.match(r"│ blocks\.\d ", line)]
    assert [(m.strip(), s.strip()) for m, s in rows] == [
        (f"blocks.{i}", format_bytes(block_saved(i))) for i in ORDER
    ]
    assert "    root.blocks[2] = checkpoint_wrapper(root.blocks[2])" in out
    # the page: the section follows "where memory goes", its exact bytes as tooltips
    page = html.read_text()
    ids = re.findall(r"<h2 id='(\w+)'>", page)
    assert ids[:2] == ["where", "advice"]
    section = page.split("<h2 id='advice'>")[1].split("<h2 ")[0]
    assert re.findall(r"<td>(blocks\.\d)</td><td class='n'><span title='([\d,]+) bytes'>", section) == [
        (f"blocks.{i}", f"{block_saved(i):,}") for i in ORDER
    ]


def test_reference_names_a_submodule_as_python_can_assign_it():
    assert reference("root", "model.layers.3") == "root.model.layers[3]"
    assert reference("root", "encoder.block.11") == "root.encoder.block[11]"
    assert reference("root", "net.mlp") == "root.net.mlp"
    assert reference("root", "my-net.0") == "root.get_submodule('my-net')[0]"
