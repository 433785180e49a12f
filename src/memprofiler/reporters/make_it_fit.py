"""The run report's "make it fit" section, beside "where memory goes": the blocks to checkpoint
first, what each takes off the peak at most, and the lines that checkpoint them
(see :mod:`~memprofiler.reporters.run_advice` for how the figures are made)."""

from __future__ import annotations

from html import escape

from memprofiler.reporters.model.report import ReportModel
from memprofiler.reporters.parts.cells import b, bytes_cell, table
from memprofiler.reporters.run_advice import RunAdvice, advise_run


def advice_html(model: ReportModel, top: int = 8) -> str:
    """The section, or an empty string when no call has saved-tensor bytes per module."""
    advice = advise_run(model, top=top)
    if advice is None or not advice.proposals:
        return ""
    return section_html(advice)


def section_html(advice: RunAdvice) -> str:
    what = "blocks" if advice.blocks else "modules"
    body = [
        [escape(p.module), bytes_cell(p.saved), bytes_cell(p.at_peak), bytes_cell(p.peak_after)]
        for p in advice.proposals
    ]
    patch = "\n".join(advice.patch())
    if advice.rise is None:
        held = f"of it {b(advice.activations)} saved for backward"
        bound = "the activations held at the peak"
    else:  # a host peak: the saved bytes are a figure apart from it (reporters/model/memory_split.py)
        held = (
            f"of it {b(advice.rise)} the RSS rise during the call; {b(advice.activations)} saved for "
            "backward in the call, a figure apart"
        )
        bound = "the call's RSS rise"
    return "\n".join(
        [
            "<h2 id='advice'>Make it fit</h2>",
            f"<p><b>{escape(advice.call)}</b> peaked highest: <b>{b(advice.peak)}</b> "
            f"({escape(advice.peak_name)}), {held}. "
            f"Checkpointing the {what} that saved the most, in this order (each row with the ones "
            "above it), takes off the peak at most:</p>",
            table([what[:-1], "saved", "off the peak (at most)", "peak after (at least)"], body),
            "<p>The change, as Python: keep the first <i>k</i> lines for row <i>k</i>.</p>",
            f"<pre class='mp-patch'>{escape(patch)}</pre>",
            "<p class='muted'>A checkpointed block keeps its input and recomputes the rest in backward, "
            "so each saving is an upper bound: never more than the block saved, nor than "
            f"{bound}. For estimated figures, and other changes (precision, "
            "sharding, the optimizer, the micro-batch): <code>memprofiler.advise</code> on the model, "
            "or the <code>advise</code> subcommand of a LightningCLI script.</p>",
        ]
    )
