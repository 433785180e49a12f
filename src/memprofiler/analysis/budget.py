"""A memory budget for CI: every collected value matched by a limit must stay within it."""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memprofiler.analysis.impossible import ImpossibleValues, possible
from memprofiler.analysis.runs.artifacts import RunArtifacts, flatten_metrics, is_number, match_any
from memprofiler.analysis.unmatched import unmatched
from memprofiler.errors import ArtifactError, ConfigError
from memprofiler.units import format_value, looks_like_bytes, parse_size

_UNIT = re.compile(r"[A-Za-z]\s*$")


@dataclass(frozen=True)
class Limit:
    """``--max METRIC=VALUE``: ``metric`` is a metric name or shell-style pattern."""

    metric: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Limit:
        """Parse ``rss_peak=2GiB`` (units: B, KiB..TiB, KB..TB; bare numbers for counts).

        A byte metric's limit needs its unit (``700`` is refused, ``700B`` is 700 bytes) and
        a whole number of bytes (``1.5B`` is refused).

        Raises:
            ConfigError: no ``=``, an empty metric, a bad value, or a byte limit without a unit.

        Example:
            >>> Limit.parse("saved_tensors.unique_bytes=300MiB").value
            314572800.0
        """
        metric, sep, value = text.partition("=")
        metric = metric.strip()
        if not sep or not metric:
            raise ConfigError("--max", f"got {text!r}; expected METRIC=VALUE, e.g. rss_peak=2GiB")
        key = f"--max {metric}"
        size = parse_size(value, key=key)
        if looks_like_bytes(metric):
            # A byte budget says its unit: `rss_peak=1.5` (meant GiB) would be 1.5 bytes.
            if _UNIT.search(value) is None:
                v = value.strip()
                raise ConfigError(
                    key,
                    f"got {v!r} without a unit; {metric} is in bytes: write {v}GiB or {v}MiB"
                    + (f" ({v}B for {v} bytes)" if float(size).is_integer() else ""),
                )
            if not float(size).is_integer():
                raise ConfigError(
                    key, f"got {value.strip()!r} = {size:g} bytes; a byte limit is a whole number"
                )
        return cls(metric, size)


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
    run: RunArtifacts,
    limits: Sequence[Limit],
    keys: Sequence[str] = (),
    impossible: ImpossibleValues | None = None,
) -> tuple[list[Violation], int]:
    """Return the violations and how many values were checked.

    A value that is not a finite number (NaN, inf) is a violation: a gate must fail closed.
    With ``impossible``, such values and negative byte counts go there instead, named by file
    (:mod:`~memprofiler.analysis.impossible`), for the caller to fail on.

    Raises:
        ConfigError: a ``--key`` pattern or a limit matches nothing: a typo would otherwise
            pass CI silently.
    """
    # One pass over the snapshots, streamed (a block of a file at a time), for every limit:
    # a long run holds millions of values, and the same few dozen metric names, so each name
    # is matched against the limits once.
    limits_of: dict[str, list[int]] = {}
    matched = [0] * len(limits)
    found: list[tuple[int, str, Violation]] = []
    patterns = [lim.metric for lim in limits]
    descend: dict[str, bool] = {}  # nested metric -> whether a limit can match a name under it
    first_keys: list[str] = []  # the smallest keys, to show when --key matches none
    seen = checked_keys = 0
    for key, metrics in run.iter_snapshots():
        seen += 1
        if keys and not match_any(key, keys):
            if len(first_keys) < 4 or key < first_keys[-1]:
                bisect.insort(first_keys, key)
                del first_keys[4:]
            continue
        checked_keys += 1
        for metric, value in _flat_for(metrics, patterns, descend).items():
            which = limits_of.get(metric)
            if which is None:
                which = limits_of[metric] = [
                    i for i, lim in enumerate(limits) if match_any(metric, [lim.metric])
                ]
            noted = False
            for i in which:
                matched[i] += 1
                if 0 <= value <= limits[i].value:  # the common case: one comparison more
                    continue
                if impossible is not None and (noted or not possible(metric, value)):
                    if not noted:  # once, however many limits match it
                        impossible.add(run.stats_file(int(key.partition(".")[0])), key, metric, value)
                        noted = True
                    continue
                if not value <= limits[i].value:  # NaN compares false both ways: over budget
                    found.append((i, key, Violation(key, metric, value, limits[i])))
    if not seen and run.collected_nothing():
        raise ArtifactError(f"{run.root}: {run.nothing_collected()}; there is nothing to check")
    if keys and not checked_keys:
        raise ConfigError(
            "--key",
            f"{', '.join(repr(k) for k in keys)} matches no snapshot key in {run.root}; keys look like "
            + (", ".join(first_keys) + (" ..." if seen > 4 else "") if first_keys else "(none collected)"),
        )
    for i, limit in enumerate(limits):
        if not matched[i]:
            raise ConfigError(
                f"--max {limit.metric}",
                f"matches no collected value in {run.root}; {unmatched(limit.metric, limits_of)}",
            )
    found.sort(key=lambda ikv: (ikv[0], ikv[1]))  # by limit as given, then by key (stable within one)
    return [v for _, _, v in found], sum(matched)


def _may_match_under(prefix: str, patterns: Sequence[str]) -> bool:
    """Whether a shell pattern of ``patterns`` can match a name starting with ``prefix``.

    A name a pattern matches starts with the pattern's literal head (up to its first
    wildcard), so a head that is not a prefix of ``prefix`` nor the other way round rules it out.

    Example:
        >>> _may_match_under("saved_tensors.by_module.", ["rss_peak", "saved_*"])
        True
        >>> _may_match_under("saved_tensors.by_module.", ["rss_peak"])
        False
    """
    for pattern in patterns:
        head = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
        if head.startswith(prefix) or prefix.startswith(head):
            return True
    return False


def _flat_for(
    metrics: Mapping[str, Any], patterns: Sequence[str], descend: dict[str, bool]
) -> dict[str, float]:
    """:func:`flatten_metrics`, without the nested mappings no limit can reach (``rss_peak=``
    need not name the 20 modules of each call's ``saved_tensors.by_module``)."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        t = type(v)
        if t is int or t is float:
            out[k] = v
        elif isinstance(v, Mapping):
            ok = descend.get(k)
            if ok is None:
                ok = descend[k] = _may_match_under(f"{k}.", patterns)
            if ok:
                out.update(flatten_metrics(v, f"{k}."))
        elif is_number(v):
            out[k] = v
    return out
