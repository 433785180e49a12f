"""A gate on growth over a baseline run: ``rss_peak=+5%``, ``saved_tensors.unique_bytes=+1MiB``.

Both runs are compared as ``memprofiler diff`` compares them: per function, phase and metric,
the medians over the calls both runs collected (:func:`memprofiler.analysis.diff.diff_functions`).
A median may grow by the allowance; for host metrics the run's own noise (the larger spread
of the metric across the function's calls in either run) is added to it, so a gate does not
fail on what the runs themselves show varies from call to call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memprofiler.analysis.runs.artifacts import match_any
from memprofiler.analysis.unmatched import unmatched
from memprofiler.errors import ConfigError
from memprofiler.units import format_value, parse_size

if TYPE_CHECKING:
    from memprofiler.analysis.diff import FunctionDiffRow

#: How a relative limit is written, for messages.
GROWTH_FORMS = "+5% (at most 5% above the baseline) or +64MiB (at most 64 MiB above it)"


@dataclass(frozen=True)
class Growth:
    """``METRIC=+5%`` or ``METRIC=+64MiB``: how far a median may rise over the baseline's."""

    metric: str
    """Metric name or shell-style pattern."""
    percent: float | None
    """Allowed rise in percent of the baseline's median, or ``None``."""
    amount: float | None
    """Allowed rise in the metric's unit (bytes or a count), or ``None``."""
    text: str
    """The limit as given, ``rss_peak=+5%``, for messages."""

    def allowance(self, baseline: float) -> float:
        """How much above ``baseline`` this limit allows (noise not included).

        Example:
            >>> Growth("rss_peak", 5.0, None, "rss_peak=+5%").allowance(2000.0)
            100.0
        """
        if self.percent is not None:
            return abs(baseline) * self.percent / 100.0
        return float(self.amount or 0.0)

    def shown(self, baseline: float) -> str:
        """``+5% (+100 B)`` or ``+64.00 MiB``."""
        if self.percent is not None:
            return f"+{self.percent:g}% ({_signed(self.metric, self.allowance(baseline))})"
        return _signed(self.metric, self.allowance(baseline))


def is_growth(value: str) -> bool:
    """Whether a limit's value is relative (``+5%``, ``+1MiB``) or a percentage at all (``105%``)."""
    v = value.strip()
    return v.startswith("+") or v.endswith("%")


def parse_growth(text: str, option: str) -> Growth:
    """Parse ``METRIC=+5%`` or ``METRIC=+64MiB``.

    Args:
        text: the limit as given.
        option: the option named in messages (``--max``, ``--fail-on``).

    Raises:
        ConfigError: no ``=``, an empty metric, a percentage without ``+`` (``105%``: it reads
            as 105% of the baseline and as a 105% rise), or a bad number.

    Example:
        >>> parse_growth("rss_peak=+5%", "--max").percent
        5.0
        >>> parse_growth("saved_tensors.unique_bytes=+1MiB", "--max").amount
        1048576.0
    """
    metric, sep, value = text.partition("=")
    metric, value = metric.strip(), value.strip()
    if not sep or not metric:
        raise ConfigError(option, f"got {text!r}; expected METRIC=VALUE, e.g. rss_peak=+5%")
    key = f"{option} {metric}"
    if not value.startswith("+"):
        raise ConfigError(key, f"got {value!r}; a limit over the baseline is a rise: write {GROWTH_FORMS}")
    body = value[1:].strip()
    if body.endswith("%"):
        try:
            percent = float(body[:-1])
        except ValueError:
            raise ConfigError(key, f"got {value!r}; write {GROWTH_FORMS}") from None
        if not math.isfinite(percent) or percent < 0:
            raise ConfigError(key, f"got {value!r}; the percentage must be a finite number >= 0")
        return Growth(metric, percent, None, f"{metric}={value}")
    return Growth(metric, None, parse_size(body, key=key), f"{metric}={value}")


@dataclass(frozen=True)
class GrowthViolation:
    """A function's median that rose more than its limit (plus the noise) allows."""

    row: FunctionDiffRow
    limit: Growth
    option: str

    def line(self) -> str:
        """``0.training_step.end saved_tensors.unique_bytes: 20.25 KiB, baseline 12.25 KiB: +8.00 KiB (+65.3%),
        over the allowed +5% (+627 B); set by --max saved_tensors.unique_bytes=+5%``."""
        r, m = self.row, self.row.metric
        pct = f" ({r.percent:+.1f}%)" if r.percent is not None else ""
        calls = f"median of {r.calls} calls, " if r.calls > 1 else ""
        noise = f" plus the noise {format_value(m, r.noise)}" if r.noise else ""
        if not math.isfinite(r.a) or not math.isfinite(r.b):
            return (
                f"{r.group} {m}: {format_value(m, r.b)}, baseline {format_value(m, r.a)}: not a finite "
                f"number (edited or corrupted file?); set by {self.option} {self.limit.text}"
            )
        return (
            f"{r.group} {m}: {calls}{format_value(m, r.b)} ({r.b:,.0f}), baseline {format_value(m, r.a)} "
            f"({r.a:,.0f}): {_signed(m, r.change)}{pct}, over the allowed {self.limit.shown(r.a)}{noise}; "
            f"set by {self.option} {self.limit.text}"
        )


def check_growth(
    rows: Sequence[FunctionDiffRow], limits: Sequence[Growth], option: str, where: str
) -> tuple[list[GrowthViolation], int]:
    """The rows over their limits, and how many (row, limit) pairs were compared.

    Args:
        rows: every compared row (unchanged ones included).
        limits: the relative limits.
        option: named in lines and errors.
        where: the runs compared, for the error when a limit matches nothing.

    A value that is not a finite number is a violation: a gate fails closed.

    Raises:
        ConfigError: a limit that matches no metric both runs hold (a typo would pass CI).
    """
    found: list[GrowthViolation] = []
    compared = 0
    for limit in limits:
        matched = [r for r in rows if match_any(r.metric, [limit.metric])]
        if not matched:
            raise ConfigError(
                f"{option} {limit.metric}",
                f"matches no metric both runs hold ({where}); {unmatched(limit.metric, (r.metric for r in rows))}",
            )
        for r in matched:
            compared += 1
            allowed = limit.allowance(r.a) + (r.noise or 0.0)
            if not r.change <= allowed:  # NaN compares false: over the limit
                found.append(GrowthViolation(r, limit, option))
    return found, compared


def _signed(metric: str, value: float) -> str:
    return ("+" if value >= 0 else "-") + format_value(metric, abs(value))
