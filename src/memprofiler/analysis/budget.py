"""A memory budget for CI: every collected value matched by a limit must stay within it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from memprofiler.analysis.artifacts import RunArtifacts, flat_snapshots, match_any
from memprofiler.errors import ConfigError
from memprofiler.units import format_value, parse_size


@dataclass(frozen=True)
class Limit:
    """``--max METRIC=VALUE``: ``metric`` is a metric name or shell-style pattern."""

    metric: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Limit:
        """Parse ``rss_peak=2GiB`` (units: B, KiB..TiB, KB..TB; bare numbers for counts).

        Raises:
            ConfigError: no ``=``, an empty metric, or a bad value.

        Example:
            >>> Limit.parse("saved_tensors.unique_bytes=300MiB").value
            314572800.0
        """
        metric, sep, value = text.partition("=")
        metric = metric.strip()
        if not sep or not metric:
            raise ConfigError("--max", f"got {text!r}; expected METRIC=VALUE, e.g. rss_peak=2GiB")
        return cls(metric, parse_size(value, key=f"--max {metric}"))


@dataclass(frozen=True)
class Violation:
    key: str
    metric: str
    value: float
    limit: Limit

    def line(self) -> str:
        """``0.training_step.2.end rss_peak = 2.31 GiB exceeds limit 2.00 GiB (rss_peak=...)``."""
        v, lim = format_value(self.metric, self.value), format_value(self.metric, self.limit.value)
        if not math.isfinite(self.value):
            return (
                f"{self.key} {self.metric} = {v} is not a finite number (edited or corrupted file?); "
                f"limit {lim} ({self.limit.value:,.0f}) set by --max {self.limit.metric}"
            )
        return (
            f"{self.key} {self.metric} = {v} ({self.value:,.0f}) exceeds limit {lim} "
            f"({self.limit.value:,.0f}) set by --max {self.limit.metric}"
        )


def check_budget(
    run: RunArtifacts, limits: Sequence[Limit], keys: Sequence[str] = ()
) -> tuple[list[Violation], int]:
    """Return the violations and how many values were checked.

    A value that is not a finite number (NaN, inf) is a violation: a gate must fail closed.

    Raises:
        ConfigError: a ``--key`` pattern or a limit matches nothing: a typo would otherwise
            pass CI silently.
    """
    every = flat_snapshots(run)
    snaps = {k: m for k, m in every.items() if match_any(k, keys)}
    if keys and not snaps:
        shown = sorted(every)[:4]
        raise ConfigError(
            "--key",
            f"{', '.join(repr(k) for k in keys)} matches no snapshot key in {run.root}; keys look like "
            + (", ".join(shown) + (" ..." if len(every) > 4 else "") if shown else "(none collected)"),
        )
    violations: list[Violation] = []
    checked = 0
    for limit in limits:
        matched = 0
        for key in sorted(snaps):
            for metric, value in snaps[key].items():
                if not match_any(metric, [limit.metric]):
                    continue
                matched += 1
                if not value <= limit.value:  # NaN compares false both ways: over budget
                    violations.append(Violation(key, metric, value, limit))
        if not matched:
            known = sorted({m for ms in snaps.values() for m in ms if "." not in m or m.count(".") < 3})
            raise ConfigError(
                f"--max {limit.metric}",
                f"matches no collected value in {run.root}; metrics there: {', '.join(known[:12])}"
                + (" ..." if len(known) > 12 else ""),
            )
        checked += matched
    return violations, checked
