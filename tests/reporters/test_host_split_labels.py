"""A host-only run names each figure of "where memory goes" for what it is: the RSS rise during a
call beside the bytes it saved for backward, never the one under the other's name."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path

from memprofiler.__main__ import main
from memprofiler.analysis.runs.artifacts import RunArtifacts, load_run
from memprofiler.reporters.make_it_fit import advice_html
from memprofiler.reporters.model.report import ReportModel, build_model, call_rows
from memprofiler.reporters.where import where_html
from memprofiler.units import format_bytes

MIB = 2**20


def _text(html: str) -> str:
    """The page's words, one space between them and none before a comma or inside a bracket."""
    words = unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))
    return re.sub(r"\( ", "(", re.sub(r" ([,.)])", r"\1", words))


def test_a_small_rise_beside_a_large_saved_figure_is_named_as_each_is():
    # GIVEN a CPU call whose RSS rose 4 KiB while it saved 34 MiB for backward (memory reused)
    end = {"rss": 448 * MIB, "rss_peak": 448 * MIB + 4096, "saved_tensors.unique_bytes": 34 * MIB}
    stats = {0: {"0.training_step.3.start": {"rss": 448 * MIB}, "0.training_step.3.end": end}}
    run = RunArtifacts(root=Path("."), stats=stats, summary=None)
    # WHEN "where memory goes" is rendered
    text = _text(where_html(ReportModel(run=run, calls=call_rows(run))))
    # THEN the 4 KiB is the RSS rise and the 34 MiB the bytes saved for backward, each by its name
    assert (
        "448.00 MiB the process before the call, 4.00 KiB RSS rise during the call. "
        "Saved for backward in the call: 34.00 MiB" in text
    )
    assert "4.00 KiB activations" not in text and "activations (saved for backward)" not in text
    assert "(34.00 MiB saved, 4.00 KiB RSS rise in training_step #3)" in text


def test_a_real_cpu_run_labels_its_rise_and_its_saved_bytes_with_their_true_values(real_runs, capsys):
    # GIVEN a real CPU run of the tiny MLP (hidden 256), whose saved bytes are known analytically
    from run_fixtures import expected_saved_bytes

    saved = expected_saved_bytes(256)
    model = build_model(load_run(real_runs["a"]))
    # WHEN the report's opening section is rendered
    text = _text(where_html(model))
    # THEN the headline call's RSS rise and its saved bytes are each given under their own name
    head = re.search(r"(training_step #\d+) \(rank 0\) peaked highest", text)
    assert head is not None
    call = next(c for c in model.calls if c.label == head.group(1))
    assert f"{format_bytes(call.rss_peak - call.rss_start)} RSS rise during the call" in text
    assert f"Saved for backward in the call: {format_bytes(saved)}" in text
    assert "activations (saved for backward)" not in text
    # AND the bars in numbers carry every call's saved bytes in a column of their own
    assert "saved for backward (not in the bar)" in text
    # AND "make it fit" gives the same two figures under the same names
    fit = _text(advice_html(model))
    rise = format_bytes(call.rss_peak - call.rss_start)
    assert f"of it {rise} the RSS rise during the call; {format_bytes(saved)} saved for backward" in fit
    # AND `memprofiler advise` says the same two figures under the same names
    assert main(["advise", str(real_runs["a"])]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "saved for backward (activations)" not in first
    assert f"the RSS rise during the call; {format_bytes(saved)} saved for backward in the call" in first
