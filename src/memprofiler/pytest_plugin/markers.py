"""The ``memory_budget`` and ``memory_leak`` markers' arguments, parsed and checked at collection.

Torch-free: a typo in a budget is a usage error before any test runs, at the cost of a
string parse per marked test.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from memprofiler import metrics
from memprofiler.analysis.budget import Limit
from memprofiler.analysis.growth import Growth, is_growth, parse_growth
from memprofiler.errors import ConfigError
from memprofiler.units import CUDA_MEMORY_STATS, parse_size

BUDGET_MARKER = "memory_budget"
LEAK_MARKER = "memory_leak"

#: Short keyword names for the three budgets most tests want; any other keyword is a metric name.
ALIASES: dict[str, str] = {
    metrics.RSS_PEAK: metrics.RSS_PEAK,
    "saved_tensors": metrics.SAVED_UNIQUE,
    "cuda_peak": metrics.CUDA_ALLOCATED_PEAK,
}
HOST_METRICS = (metrics.RSS, metrics.VMS, metrics.RSS_PEAK)
SAVED_METRICS = (metrics.SAVED_UNIQUE, metrics.SAVED_PACKED, metrics.SAVED_COUNT)
BY_MODULE = "saved_tensors.by_module."
#: The flat ``torch.cuda.memory_stats()`` names: known without a device, so a CUDA budget is
#: checked for typos on a CPU-only machine too.
CUDA_METRICS: tuple[str, ...] = CUDA_MEMORY_STATS
_KNOWN = (*HOST_METRICS, *SAVED_METRICS, BY_MODULE + "<module>", *CUDA_METRICS)


@dataclass(frozen=True)
class Budget:
    """One limit of a ``memory_budget`` marker."""

    limit: Limit
    """Metric name or shell pattern, and the budget in bytes (or a count)."""
    cuda: bool
    """Whether the metric is a CUDA allocator figure (not checkable without a GPU)."""


@dataclass(frozen=True)
class GrowthBudget:
    """A relative limit of a ``memory_budget`` marker (``rss_peak="+5%"``): how far the test's
    figure may rise over the same test's in ``--memprofiler-baseline``."""

    growth: Growth
    """Metric name or shell pattern and the allowed rise."""
    cuda: bool
    """Whether the metric is a CUDA allocator figure (not checkable without a GPU)."""


@dataclass(frozen=True)
class LeakBudget:
    """A ``memory_leak`` marker: how much may still be held after the test body."""

    cuda: float
    """CUDA bytes still allocated (``allocated_bytes.all.current`` over its start value)."""
    cuda_asked: bool
    """Whether ``cuda=`` was given: only an explicit CUDA budget is reported as unchecked on CPU."""
    saved_tensors: float
    """Bytes saved for backward during the test whose graphs are still alive."""


@dataclass(frozen=True)
class MarkerBudgets:
    """Everything the markers of one test ask for."""

    budgets: tuple[Budget, ...] = ()
    leak: LeakBudget | None = None
    growth: tuple[GrowthBudget, ...] = ()


def _metric_error(marker: str, written: str, metric: str) -> ConfigError:
    return ConfigError(
        f"{marker}({written})",
        f"unknown metric {metric!r}; use rss_peak, saved_tensors, cuda_peak, or a name "
        "`memprofiler check --max` takes: rss, vms, saved_tensors.packed_bytes, saved_tensors.count, "
        "saved_tensors.by_module.<module>, allocated_bytes.all.peak, reserved_bytes.all.peak, ...",
    )


def _budget(marker: str, metric: str, value: Any, written: str) -> Budget | GrowthBudget:
    metric = ALIASES.get(metric, metric)
    if not metric.startswith(BY_MODULE) and not fnmatch.filter(_KNOWN, metric):
        raise _metric_error(marker, written, metric)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(
            f"{marker}({written})", f"got {value!r}; expected a size such as '300MiB' or a number"
        )
    matched = fnmatch.filter(_KNOWN, metric)
    cuda = bool(matched) and all(m in CUDA_METRICS for m in matched)
    if isinstance(value, str) and is_growth(value):
        try:
            return GrowthBudget(parse_growth(f"{metric}={value}", marker), cuda)
        except ConfigError as err:
            raise ConfigError(f"{marker}({written})", err.rule) from None
    size = parse_size(str(value), key=f"{marker}({written})")
    return Budget(Limit(metric, size), cuda)


def parse_budget(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Budget | GrowthBudget, ...]:
    """Parse ``memory_budget("METRIC=VALUE", ..., rss_peak="1GiB", saved_tensors="+5%", ...)``.

    Args:
        args: ``"METRIC=VALUE"`` strings, exactly as ``memprofiler check --max`` takes them.
        kwargs: ``rss_peak``, ``saved_tensors``, ``cuda_peak`` or a metric name, to a size, or
            to a rise over ``--memprofiler-baseline`` (``"+5%"``, ``"+1MiB"``).

    Raises:
        ConfigError: no budget, an unknown metric, or a bad size; the key names the marker.

    Example:
        >>> parse_budget((), {"saved_tensors": "1MiB"})[0].limit
        Limit(metric='saved_tensors.unique_bytes', value=1048576.0)
    """
    out: list[Budget | GrowthBudget] = []
    for text in args:
        if not isinstance(text, str) or "=" not in text:
            raise ConfigError(
                f"{BUDGET_MARKER}({text!r})",
                "expected METRIC=VALUE, e.g. 'rss_peak=1GiB', or a keyword argument",
            )
        metric, _, value = text.partition("=")
        out.append(_budget(BUDGET_MARKER, metric.strip(), value, repr(text)))
    for name, value in kwargs.items():
        out.append(_budget(BUDGET_MARKER, name, value, f"{name}={value!r}"))
    if not out:
        raise ConfigError(BUDGET_MARKER, "no budget given; e.g. @pytest.mark.memory_budget(rss_peak='1GiB')")
    return tuple(out)


def parse_leak(args: tuple[Any, ...], kwargs: dict[str, Any]) -> LeakBudget:
    """Parse ``memory_leak(cuda="1MiB", saved_tensors="0B")`` (both optional, default 0 bytes).

    Raises:
        ConfigError: a positional argument, an unknown keyword or a bad size.
    """
    if args:
        raise ConfigError(LEAK_MARKER, f"got positional {args!r}; use cuda='1MiB' and/or saved_tensors='0B'")
    unknown = sorted(set(kwargs) - {"cuda", "saved_tensors"})
    if unknown:
        raise ConfigError(
            f"{LEAK_MARKER}({unknown[0]}=...)",
            f"unknown keyword {unknown[0]!r}; use cuda= and/or saved_tensors=",
        )
    sizes = {k: parse_size(str(v), key=f"{LEAK_MARKER}({k}={v!r})") for k, v in kwargs.items()}
    return LeakBudget(
        cuda=sizes.get("cuda", 0.0), cuda_asked="cuda" in sizes, saved_tensors=sizes.get("saved_tensors", 0.0)
    )


def budgets_of(item: Any) -> MarkerBudgets | None:
    """The budgets a test item's markers ask for, or ``None`` for an unmarked test.

    Raises:
        ConfigError: a marker's arguments are wrong.
    """
    budgets: list[Budget | GrowthBudget] = []
    leak: LeakBudget | None = None
    marked = False
    for mark in item.iter_markers(BUDGET_MARKER):
        marked = True
        budgets.extend(parse_budget(tuple(mark.args), dict(mark.kwargs)))
    for mark in item.iter_markers(LEAK_MARKER):
        marked = True
        leak = leak or parse_leak(tuple(mark.args), dict(mark.kwargs))
    if not marked:
        return None
    absolute = tuple(b for b in budgets if isinstance(b, Budget))
    return MarkerBudgets(absolute, leak, tuple(b for b in budgets if isinstance(b, GrowthBudget)))


def misspelt_marker(name: str) -> str | None:
    """One line when ``name`` (a marker pytest does not know) looks like a misspelt
    ``memory_budget`` or ``memory_leak``, else ``None``.

    Example:
        >>> misspelt_marker("memory_budjet")
        "`@pytest.mark.memory_budjet` is not a memprofiler marker: did you mean `memory_budget`? (as written, nothing is measured or checked)"
    """
    import difflib

    close = difflib.get_close_matches(name, (BUDGET_MARKER, LEAK_MARKER), n=1, cutoff=0.75)
    if not close:
        return None
    return (
        f"`@pytest.mark.{name}` is not a memprofiler marker: did you mean `{close[0]}`? "
        "(as written, nothing is measured or checked)"
    )
