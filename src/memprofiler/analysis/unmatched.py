"""What a run holds, said when a limit (``check --max``, ``--fail-on``) matches none of its metrics:
the names, each module's saved bytes as one entry, and why a CUDA limit finds nothing in a run
without a GPU. Torch-free."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from memprofiler import metrics
from memprofiler.units import CUDA_MEMORY_STATS

#: How many metric names the line lists.
SHOWN = 12

_BY_MODULE = metrics.SAVED_BY_MODULE + "."


def unmatched(pattern: str, names: Iterable[str]) -> str:
    r"""The end of the error line for ``pattern``, which matches none of ``names``.

    Example:
        >>> line = unmatched("saved_tensors.by_module.net", ["rss", "saved_tensors.by_module.net.0"])
        >>> print(*line.split("; "), sep="\n")
        `saved_tensors.by_module.net.*` limits each of its submodules
        metrics there: rss, saved_tensors.by_module.<module> (1 module)
        >>> print(*unmatched("allocated_bytes.all.peak", ["rss"]).split("; "), sep="\n")
        a CUDA figure, and no call there has one (no GPU in the run: leave CUDA limits out on a CPU runner)
        metrics there: rss
    """
    held = set(names)
    modules = {n for n in held if n.startswith(_BY_MODULE)}
    plain = sorted(held - modules)
    shown = plain[:SHOWN] + (["..."] if len(plain) > SHOWN else [])
    if modules:
        shown.append(f"{_BY_MODULE}<module> ({len(modules)} module{'s' if len(modules) > 1 else ''})")
    line = f"metrics there: {', '.join(shown) or '(none)'}"
    if any(m.startswith(pattern + ".") for m in modules):  # a block: its layers saved the bytes
        line = f"`{pattern}.*` limits each of its submodules; " + line
    if fnmatch.filter(CUDA_MEMORY_STATS, pattern) and not held.intersection(CUDA_MEMORY_STATS):
        line = (
            "a CUDA figure, and no call there has one (no GPU in the run: leave CUDA limits out on a CPU "
            "runner); " + line
        )
    return line
