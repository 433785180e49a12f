"""Values no run writes: a metric that is not a finite number, a byte count below zero.

An edited or corrupted stats file can hold them. Read as figures they would make a budget gate
pass (``-1`` is under every limit) or a diff's medians lie, so the readers that compare
(``check``, ``diff``) name each one, by file and metric, and leave it out of the figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memprofiler.analysis.files.fs import as_given
from memprofiler.units import format_value, looks_like_bytes

NOT_FINITE = "not a finite number"
NEGATIVE = "a negative byte count"


def why_impossible(metric: str, value: float) -> str | None:
    """Why no run writes ``value`` for ``metric``, or ``None`` when one could.

    Example:
        >>> why_impossible("rss_peak", -4096), why_impossible("rss_peak", 4096)
        ('a negative byte count', None)
    """
    if not math.isfinite(value):
        return NOT_FINITE
    if value < 0 and looks_like_bytes(metric):
        return NEGATIVE
    return None


def possible(metric: str, value: float) -> bool:
    """:func:`why_impossible` is ``None``, decided at once for the common value (an int >= 0)."""
    return (type(value) is int and value >= 0) or why_impossible(metric, value) is None


@dataclass
class Impossible:
    """The impossible values of one metric in one stats file, for one reason."""

    file: str
    metric: str
    why: str
    where: str
    """The first snapshot key it was found at (or the keys' pattern, ``0.training_step.*.end``)."""
    value: float
    count: int = 1

    def line(self, outcome: str) -> str:
        """One line naming the file, the metric, the value and the reason, then ``outcome``."""
        more = f" (and {self.count - 1:,} more)" if self.count > 1 else ""
        return (
            f"{as_given(self.file)}: {self.metric} = {format_value(self.metric, self.value)} at "
            f"{self.where}{more} is {self.why}, which no run writes (an edited or corrupted file?); "
            f"{outcome}"
        )


class ImpossibleValues:
    """What a comparison found impossible, one entry per file, metric and reason, in the order found."""

    def __init__(self) -> None:
        self.found: dict[tuple[str, str, str], Impossible] = {}

    def __bool__(self) -> bool:
        return bool(self.found)

    def add(self, file: str, where: str, metric: str, value: float, count: int = 1) -> None:
        """Note ``count`` impossible values of ``metric`` in ``file`` (``value`` the first, at ``where``)."""
        why = why_impossible(metric, value) or NOT_FINITE
        entry = self.found.get((file, metric, why))
        if entry is None:
            self.found[(file, metric, why)] = Impossible(file, metric, why, where, value, count)
        else:
            entry.count += count

    def lines(self, outcome: str) -> list[str]:
        return [entry.line(outcome) for entry in self.found.values()]

    @property
    def count(self) -> int:
        """How many values were left out."""
        return sum(entry.count for entry in self.found.values())
