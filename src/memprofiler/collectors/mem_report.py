"""Reports of the module-wise memory trackers (``FSDPMemTracker``, ``MemTracker``).

One report per collected call, in two forms that hold the same numbers:

* a plain mapping (written as ``.yaml``, always in bytes)::

      tracker: FSDPMemTracker
      rank: 0
      fn: training_step
      call: 2
      window: ...
      peak: {cpu: {Sharded Param: 1292, ..., Total: 9200}}
      final: {cpu: {...}}          # what is still alive when the window closes
      modules:
        DemoGPT.model:
          Before Pre-Forward: [{cpu: {...}}]

* a human-readable ``.log``: the peak snapshot, the snapshot at the end of the window, then
  the module-wise snapshots down to the chosen depth, in the chosen units (values rounded to 2 decimals,
  bytes unrounded), one
  ``category: value unit`` line each, or as tables.

Nothing here imports Lightning.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from memprofiler.config import MEM_UNITS

#: A tracker snapshot as plain data: device -> category -> bytes (``Total`` included).
Snapshot = dict[str, dict[str, int]]

TOTAL = "Total"


def plain_snapshot(snap: Mapping[Any, Mapping[Any, int]]) -> Snapshot:
    """Turn a tracker snapshot (``torch.device`` and enum keys) into plain strings and ints."""
    return {str(dev): {_label(cat): int(v) for cat, v in cats.items()} for dev, cats in snap.items()}


def _label(cat: Any) -> str:
    value = getattr(cat, "value", cat)
    return str(value)


def slug(label: str) -> str:
    """``"Sharded Param"`` -> ``"sharded_param"``, for flat snapshot keys."""
    return re.sub(r"[^0-9a-z]+", "_", label.lower()).strip("_")


def module_depth(fqn: str) -> int:
    """Depth of a tracker module name: the root (``"DemoGPT"``) is 1."""
    return fqn.count(".") + 1


def _natural_key(s: str) -> list[int | str]:
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", s)]


def wrapper_chains(fqns: Iterable[str]) -> dict[str, str]:
    """Each top-level name whose modules begin with a chain of wrappers, and the chain's end.

    A wrapper holds one module and nothing else that ran (a LightningModule around
    ``self.model``, a Hugging Face model around its base model): the names below it all go
    through that one child. The chain ends at the first name with more than one child, the
    model whose parts the depth is about.

    Example:
        >>> wrapper_chains(["Lit", "Lit.model", "Lit.model.embed", "Lit.model.encoder", "Loss"])
        {'Lit': 'Lit.model'}
    """
    children: dict[str, set[str]] = {}
    tops: list[str] = []
    for fqn in fqns:
        parts = fqn.split(".")
        if parts[0] not in tops:
            tops.append(parts[0])
        for i in range(1, len(parts)):
            children.setdefault(".".join(parts[:i]), set()).add(".".join(parts[: i + 1]))
    out: dict[str, str] = {}
    for top in tops:
        end = top
        while len(kids := children.get(end, ())) == 1:
            end = next(iter(kids))
        if end != top:
            out[top] = end
    return out


def modulewise(memory_tracking: Mapping[Any, Any], depth: int) -> dict[str, dict[str, list[Snapshot]]]:
    """Module name -> state -> snapshots, for modules no deeper than ``depth``, naturally sorted.

    Levels are counted from the end of a chain of wrappers (:func:`wrapper_chains`), so the
    default depth shows the parts of the model a LightningModule wraps, not two rows of the
    same figures.

    Args:
        memory_tracking: the tracker's ``memory_tracking`` (module -> stats with ``mod_fqn``
            and ``snapshots``).
        depth: deepest module level kept below the wrappers; the root is level 1.
    """
    out: dict[str, dict[str, list[Snapshot]]] = {}
    stats = sorted(memory_tracking.values(), key=lambda m: _natural_key(m.mod_fqn))
    chains = wrapper_chains(m.mod_fqn for m in stats)
    for mod_stats in stats:
        fqn = mod_stats.mod_fqn
        end = chains.get(fqn.split(".")[0])
        below = module_depth(end) - 1 if end is not None else 0
        if depth < 1 or module_depth(fqn) - below > depth:
            continue
        out[mod_stats.mod_fqn] = {
            _label(state): [plain_snapshot(s) for s in snaps] for state, snaps in mod_stats.snapshots.items()
        }
    return out


def main_device(peak: Snapshot, training: str | None = None) -> str | None:
    """The device the flat keys are read from: the one training uses.

    That is ``training`` (the device of the tracked module's parameters, ``cuda:0`` once
    Lightning or Fabric moved them) when the report has it; else the accelerator with the
    largest peak total; CPU only when no other device was seen. Never CPU over an
    accelerator by size: a large host tensor inside a GPU step (a CPU buffer, a mask built
    on the host) would otherwise hide the GPU's figures, and its parameters (0 on the CPU).
    """
    if not peak:
        return None
    if training is not None and training in peak:
        return training
    accelerators = [dev for dev in peak if not dev.startswith("cpu")]
    return max(accelerators or peak, key=lambda dev: peak[dev].get(TOTAL, 0))


def peak_metrics(peak: Snapshot, prefix: str, training: str | None = None) -> dict[str, Any]:
    """Flat snapshot keys ``{prefix}.peak.{category}`` (bytes) for the device training uses
    (see :func:`main_device`).

    Other devices (e.g. CPU scalars of a CUDA run) stay in the ``.yaml`` report.
    """
    dev = main_device(peak, training)
    if dev is None:
        return {f"{prefix}.peak.total": 0}
    out: dict[str, Any] = {f"{prefix}.peak.{slug(cat)}": v for cat, v in peak[dev].items()}
    out[f"{prefix}.peak_device"] = dev
    return out


def fmt_value(value: int, units: str) -> str:
    """Bytes in ``units``, rounded to 2 decimals like the tracker's own display."""
    divisor = MEM_UNITS[units]
    shown: float | int = value if divisor == 1 else round(value / divisor, 2)
    return f"{shown} {units}"


def render_log(report: Mapping[str, Any], units: str = "MiB", tabulate: bool = False) -> str:
    """Render a report mapping (see the module docstring) as the human-readable ``.log``."""
    lines = [
        f"{report['tracker']} report: rank {report['rank']}, `{report['fn']}` call {report['call']}",
        f"Window: {report['window']}",
        f"Units: {units}",
    ]
    lines += [f"Note: {n}" for n in report.get("notes", [])]
    lines += ["", "Peak snapshot"]
    lines += _render_snapshot(report["peak"], units, tabulate)
    if "final" in report:
        lines += ["", "Snapshot at the end of the window"]
        lines += _render_snapshot(report["final"], units, tabulate)
    below = ", ".join(report.get("module_depth_from", []))
    counted = f" counted from {below}, which its wrappers hold" if below else ""
    lines += ["", f"Module-wise snapshots (depth <= {report['module_depth']}{counted})"]
    for fqn, states in report["modules"].items():
        lines += ["", f"Module:  {fqn}"]
        if tabulate:
            lines += _render_states_table(states, units)
            continue
        for state, snaps in states.items():
            for i, snap in enumerate(snaps):
                lines.append(f"{state} # {i}:")
                lines += _render_snapshot(snap, units, False)
    return "\n".join(lines) + "\n"


def _render_snapshot(snap: Snapshot, units: str, tabulate: bool) -> list[str]:
    if not snap:
        return ["No memory tracked."]
    if tabulate:
        cats = list(next(iter(snap.values())))
        rows = [[dev, *(fmt_value(cats_v.get(c, 0), units) for c in cats)] for dev, cats_v in snap.items()]
        return _table(["Device", *cats], rows)
    lines: list[str] = []
    for dev, cats_v in snap.items():
        lines.append(f"Device: {dev}")
        lines += [f"\t{cat}: {fmt_value(v, units)}" for cat, v in cats_v.items()]
    return lines


def _render_states_table(states: Mapping[str, list[Snapshot]], units: str) -> list[str]:
    cats: list[str] = []
    rows: list[list[str]] = []
    for state, snaps in states.items():
        for i, snap in enumerate(snaps):
            for dev, cats_v in snap.items():
                for c in cats_v:
                    if c not in cats:
                        cats.append(c)
                rows.append([f"{state} # {i}", dev, *(fmt_value(cats_v.get(c, 0), units) for c in cats)])
    if not rows:
        return ["No memory tracked."]
    width = 2 + len(cats)
    return _table(["State", "Device", *cats], [r + [fmt_value(0, units)] * (width - len(r)) for r in rows])


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A reStructuredText simple table."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    rule = "  ".join("=" * w for w in widths)

    def line(cells: list[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=False)).rstrip()

    return [rule, line(headers), rule, *(line(r) for r in rows), rule]


def parse_log_values(text: str) -> list[tuple[str, float, str]]:
    """``(category, value, unit)`` of every ``\\tcategory: value unit`` line of a non-table log.

    Lets a reader (and the tests) check a ``.log`` against its ``.yaml``.
    """
    out = []
    for m in re.finditer(r"^\t([^:\n]+): (-?[0-9.]+) (B|KiB|MiB|GiB)$", text, flags=re.MULTILINE):
        out.append((m.group(1), float(m.group(2)), m.group(3)))
    return out
