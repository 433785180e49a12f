"""``memprofiler advise RUN``: from a collected run, the blocks to checkpoint first and what each
would take off the peak.

The call with the highest peak is split as "where memory goes" splits it; its saved-tensor bytes
per module are summed over each module's submodules. The blocks (items of a container, a name
ending in an index: ``model.layers.3``) that saved the most come first. Checkpointing the first
``k`` of them takes at most their saved bytes off the peak, and never more than the activations
held at the peak (on a host RSS peak, never more than the call's RSS rise: the peak cannot fall
below the process before the call): a checkpointed block still keeps its input, so each figure is
an upper bound.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from memprofiler.reporters.model.call_table import CallRow
from memprofiler.reporters.model.memory_split import split_call, top_calls
from memprofiler.reporters.model.report import ReportModel
from memprofiler.units import format_bytes

#: A block: an item of a container (``model.layers.3``, ``encoder.block.11``).
BLOCK = re.compile(r"\.\d+$")


@dataclass(frozen=True)
class Proposal:
    """Checkpoint ``module`` (after the proposals before it)."""

    module: str
    saved: int
    """Bytes the module and its submodules saved for backward in the call."""
    at_peak: int
    """At most this much off the call's peak, with every proposal up to this one checkpointed."""
    peak_after: int


@dataclass(frozen=True)
class RunAdvice:
    call: str
    peak: int
    peak_name: str
    activations: int
    """Saved-tensor bytes at the peak, as the split counts them; on a host RSS peak the call's
    bytes saved for backward, which are no part of it (:attr:`rise` bounds the saving there)."""
    proposals: list[Proposal]
    blocks: bool
    """Whether the proposals are blocks (else the modules that saved the most, at any depth)."""
    rise: int | None = None
    """On a host RSS peak: the RSS rise during the call (the peak above the process before it)."""

    def enough(self, budget: int) -> int | None:
        """How many proposals bring the peak under ``budget`` (0: it is under already; None: all
        of them do not)."""
        if self.peak <= budget:
            return 0
        return next((i + 1 for i, p in enumerate(self.proposals) if p.peak_after <= budget), None)

    def patch(self, count: int | None = None) -> list[str]:
        """The Python lines that checkpoint the first ``count`` proposals (all by default), on the
        module that was profiled (``root``; in a LightningModule's ``configure_model``, ``self``).
        Each line says the peak it leads to at best, so the first ``k`` lines are row ``k``."""
        chosen = self.proposals if count is None else self.proposals[:count]
        if not chosen:
            return []
        lines = [
            "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper",
            "# root: the module profiled (in a LightningModule's configure_model: self)",
        ]
        for p in chosen:
            ref = reference("root", p.module)
            lines.append(f"{ref} = checkpoint_wrapper({ref})  # peak at least {format_bytes(p.peak_after)}")
        return lines


def reference(root: str, module: str) -> str:
    """Python that names submodule ``module`` of ``root`` and can be assigned to
    (``root.model.blocks[3]``; ``root.get_submodule('a-b')[0]`` where a name is no identifier).

    Example:
        >>> reference("root", "model.blocks.3")
        'root.model.blocks[3]'
    """
    parts = module.split(".")
    container, last = parts[:-1], parts[-1]
    if all(p.isidentifier() for p in container):
        base = ".".join([root, *container])
    else:
        base = f"{root}.get_submodule({'.'.join(container)!r})"
    if last.isdigit():
        return f"{base}[{last}]"
    if last.isidentifier():
        return f"{base}.{last}"
    return f"{base}._modules[{last!r}]"


def inclusive(by_module: Mapping[str, int]) -> dict[str, int]:
    """Each module's saved bytes with its submodules' (``by_module`` holds each one's own share)."""
    out: dict[str, int] = {}
    for name, n in by_module.items():
        if name.startswith("("):  # "(outside forward)": no module to checkpoint
            continue
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            key = ".".join(parts[:i])
            out[key] = out.get(key, 0) + n
    return out


def _outermost_blocks(saved: Mapping[str, int]) -> dict[str, int]:
    blocks = {m: n for m, n in saved.items() if BLOCK.search(m)}
    return {m: n for m, n in blocks.items() if not any(m.startswith(o + ".") for o in blocks)}


def advise_run(model: ReportModel, top: int = 8) -> RunAdvice | None:
    """The advice for the run's highest-peak call that saved tensors; ``None`` when none did."""
    rows, _ = top_calls(model.calls, len(model.calls))
    best: tuple[int, CallRow] | None = None
    for i in rows:
        row = model.calls[i]
        split = split_call(row)
        if split is not None and row.by_module and (best is None or split.peak > best[0]):
            best = (split.peak, row)
    if best is None:
        return None
    row = best[1]
    split = split_call(row)
    assert split is not None
    parts = dict(split.parts)
    activations = parts.get("activations", 0)
    rise = None
    if split.saved_apart:  # a host peak: the saved bytes beside it, the saving at most its rise
        activations = split.saved_apart
        rise = split.peak - parts.get("process", 0)
    bound = activations if rise is None else min(activations, rise)
    saved = inclusive(row.by_module)
    blocks = _outermost_blocks(saved)
    pool = blocks or {m: n for m, n in row.by_module.items() if not m.startswith("(")}
    ranked = sorted(pool.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    out, total = [], 0
    for name, n in ranked:
        total += n
        at_peak = min(total, bound)
        out.append(Proposal(name, n, at_peak, split.peak - at_peak))
    return RunAdvice(row.label, split.peak, split.peak_name, activations, out, bool(blocks), rise)


def render_lines(advice: RunAdvice, budget: int | None = None) -> list[str]:
    """The advice as lines of text (a table and the answer for ``budget``)."""
    what = "blocks" if advice.blocks else "modules"
    head = (
        f"{advice.call}: {advice.peak_name} {format_bytes(advice.peak)}, of it "
        f"{format_bytes(advice.activations)} saved for backward (activations)"
    )
    if advice.rise is not None:
        head = (
            f"{advice.call}: {advice.peak_name} {format_bytes(advice.peak)}, of it "
            f"{format_bytes(advice.rise)} the RSS rise during the call; "
            f"{format_bytes(advice.activations)} saved for backward in the call (a figure apart: the "
            "process may hold them in memory it had before the call)"
        )
    lines = [
        head,
        f"checkpoint the {what} that saved the most, in this order (each row: with the ones above):",
        f"  {'module':<40} {'saved':>12} {'off the peak (at most)':>24} {'peak after (at least)':>23}",
    ]
    for p in advice.proposals:
        lines.append(
            f"  {p.module:<40} {format_bytes(p.saved):>12} {format_bytes(p.at_peak):>24} "
            f"{format_bytes(p.peak_after):>23}"
        )
    if budget is not None:
        enough = advice.enough(budget)
        if enough == 0:
            lines.append(f"the peak is within {format_bytes(budget)} already")
        elif enough is None:
            lines.append(
                f"checkpointing these cannot bring the peak under {format_bytes(budget)}: see `advise` "
                "from Python or the Lightning config"
            )
        else:
            lines.append(f"under {format_bytes(budget)}: checkpoint at least the first {enough}")
            lines += ["  " + line for line in advice.patch(enough)]
    lines.append(
        "figures are upper bounds: a checkpointed block keeps its input; estimate the change with "
        "`advise` for exact ones"
    )
    return lines
