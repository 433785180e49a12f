"""Compare one test's figures with its budgets: one line per violation. Torch-free."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any, Protocol

from memprofiler import metrics
from memprofiler.analysis.growth import Growth
from memprofiler.analysis.runs.artifacts import flatten_metrics
from memprofiler.pytest_plugin.markers import BUDGET_MARKER, BY_MODULE, LEAK_MARKER, MarkerBudgets
from memprofiler.units import format_bytes, format_value

#: How many modules a violation line names.
TOP_MODULES = 3
#: Host figures are budgeted as growth over the test's start, so a budget does not depend on
#: what earlier tests left in the process: ``rss_peak`` over the start RSS, as ``memprofiler
#: report``'s "peak delta".
_GROWTH_BASE = {metrics.RSS_PEAK: metrics.RSS, metrics.RSS: metrics.RSS, metrics.VMS: metrics.VMS}


class LeakFigures(Protocol):
    cuda_bytes: int | None
    cuda_holders: list[str]
    saved_count: int
    saved_bytes: int
    saved_by_module: dict[str, int]
    saved_holders: list[str]


def _amount(metric: str, value: float) -> str:
    return f"{format_value(metric, value)} ({value:,.0f})"


def top_modules(by_module: Mapping[str, int], n: int = TOP_MODULES) -> str:
    """``net.0 2.00 MiB, net.2 1.00 MiB`` (largest first), or ``none``."""
    ranked = sorted(by_module.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return ", ".join(f"{mod} {format_bytes(b)}" for mod, b in ranked) or "none"


def with_submodules(flat: Mapping[str, float], metric: str) -> tuple[float, bool]:
    """The bytes module ``metric`` (an exact ``saved_tensors.by_module.NAME``) and its submodules
    saved: a block's figure, as the report's "by block" rows give it (a block's own share is often
    nothing, its layers saved the bytes); 0 where none of them saved anything. Also whether a
    submodule's bytes are in it. Patterns are left to match each module's own share.

    Example:
        >>> flat = {"saved_tensors.by_module.h.0.mlp": 3.0, "saved_tensors.by_module.h.0.attn": 2.0}
        >>> with_submodules(flat, "saved_tensors.by_module.h.0")
        (5.0, True)
    """
    below = [v for k, v in flat.items() if k.startswith(metric + ".")]
    return flat.get(metric, 0.0) + sum(below), bool(below)


def _exact_module(metric: str) -> bool:
    return metric.startswith(BY_MODULE) and not any(c in metric for c in "*?[")


def budget_values(start: Mapping[str, Any], end: Mapping[str, Any]) -> dict[str, float]:
    """The flat figures budgets are checked against (host ones as growth over the start)."""
    flat = flatten_metrics(end)
    for metric, base in _GROWTH_BASE.items():
        if metric in flat and base in start:
            flat[metric] = flat[metric] - start[base]
    return flat


def check(
    budgets: MarkerBudgets,
    start: Mapping[str, Any],
    end: Mapping[str, Any],
    leaks: LeakFigures | None,
    cuda: bool,
    baseline: Mapping[str, float] | None = None,
    no_baseline: str = "",
) -> tuple[list[str], list[str]]:
    """Return ``(violation lines, budgets not checked with the reason)``.

    Args:
        budgets: the test's markers.
        start: the start snapshot.
        end: the end snapshot.
        leaks: what the body left behind, for a ``memory_leak`` test.
        cuda: whether a CUDA device was measured.
        baseline: the same test's figures in ``--memprofiler-baseline`` (as
            :func:`budget_values` gives them), for the relative budgets.
        no_baseline: why ``baseline`` is ``None``, said when a relative budget is not checked.
    """
    values = budget_values(start, end)
    saved = end.get(metrics.SAVED_BY_MODULE) or {}
    tail = f"; top modules by saved bytes: {top_modules(saved)}"
    lines: list[str] = []
    unchecked: list[str] = []
    for b in budgets.budgets:
        metric, limit = b.limit.metric, b.limit.value
        if b.cuda and not cuda:
            unchecked.append(f"{BUDGET_MARKER}: {metric} not checked: no CUDA device in this run")
            continue
        names = sorted(fnmatch.filter(values, metric))
        seen, inclusive = values, False
        if _exact_module(metric):
            total, inclusive = with_submodules(values, metric)
            names, seen = [metric], {metric: total}
        elif not names and b.cuda:
            names, values[metric] = [metric], 0.0  # CUDA never used
        for name in names:
            value = seen[name]
            if value <= limit:
                continue
            where = ""
            if name in _GROWTH_BASE:
                base = _GROWTH_BASE[name]
                where = f" above the {format_bytes(start[base])} {base.upper()} at the test's start"
            if inclusive:
                where = " (the module with its submodules)"
            lines.append(
                f"{BUDGET_MARKER}: {name} = {_amount(name, value)}{where}, "
                f"over budget {_amount(name, limit)}{tail}"
            )
    for g in budgets.growth:
        lines += _growth_lines(g.growth, values, start, baseline, tail)
        if g.cuda and not cuda:
            unchecked.append(f"{BUDGET_MARKER}: {g.growth.metric} not checked: no CUDA device in this run")
        elif baseline is None:
            unchecked.append(f"{BUDGET_MARKER}: {g.growth.text} not checked: {no_baseline}")
    if leaks is not None and budgets.leak is not None:
        leak = budgets.leak
        if leaks.cuda_bytes is None:
            if leak.cuda_asked:
                unchecked.append(f"{LEAK_MARKER}: cuda not checked: no CUDA device in this run")
        elif leaks.cuda_bytes > leak.cuda:
            lines.append(
                f"{LEAK_MARKER}: cuda = {_amount('bytes', leaks.cuda_bytes)} still allocated after the test, "
                f"over budget {_amount('bytes', leak.cuda)}; held by: {_held(leaks.cuda_holders)}"
            )
        if leaks.saved_count and leaks.saved_bytes > leak.saved_tensors:
            lines.append(
                f"{LEAK_MARKER}: saved_tensors = {_amount('bytes', leaks.saved_bytes)} saved for backward "
                f"by graphs still alive after the test ({leaks.saved_count} tensors), over budget "
                f"{_amount('bytes', leak.saved_tensors)}; saved by: {top_modules(leaks.saved_by_module)}; "
                f"held by: {_held(leaks.saved_holders)}"
            )
    return lines, unchecked


def _growth_lines(
    growth: Growth,
    values: Mapping[str, float],
    start: Mapping[str, Any],
    baseline: Mapping[str, float] | None,
    tail: str,
) -> list[str]:
    """One line per figure that rose over the baseline's by more than ``growth`` allows.

    A module's saved bytes absent from the baseline count as 0 there (it saved nothing).
    """
    if baseline is None:
        return []
    if _exact_module(growth.metric):  # the module with its submodules, in both runs
        values = {growth.metric: with_submodules(values, growth.metric)[0]}
        baseline = {growth.metric: with_submodules(baseline, growth.metric)[0]}
    lines = []
    for name in sorted(fnmatch.filter(values, growth.metric)):
        a = baseline.get(name)
        if a is None and name.startswith(BY_MODULE):
            a = 0.0
        if a is None:
            continue
        value = values[name]
        if value - a <= growth.allowance(a):
            continue
        rise = value - a
        pct = f", {100.0 * rise / abs(a):+.1f}%" if a else ""
        where = ""
        if name in _GROWTH_BASE:
            base = _GROWTH_BASE[name]
            where = f" above the {format_bytes(start[base])} {base.upper()} at the test's start"
        lines.append(
            f"{BUDGET_MARKER}: {name} = {_amount(name, value)}{where}, baseline {_amount(name, a)}: "
            f"+{format_value(name, rise)}{pct}, over the allowed {growth.shown(a)}{tail}"
        )
    return lines


def _held(found: list[str]) -> str:
    return ", ".join(found) if found else "no Python reference found (held by C++ or another graph)"
