"""The per-call figures of a report, each declared once: where it is read from and where it is shown.

Adding a figure to the report is one :class:`Figure` in :data:`CALL_FIGURES`. From it the call
table gets a column, :class:`~memprofiler.reporters.model.call_table.CallRow` an attribute, the
snapshot reader the key to read, and the terminal and HTML reports a column in their call
tables, a band in the per-function tables and, if titled, a chart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Literal

from memprofiler import metrics

#: CUDA ``memory_stats()`` keys shown per call (the ``end`` snapshot's peaks belong to that call).
CUDA_ALLOCATED_PEAK = metrics.CUDA_ALLOCATED_PEAK
CUDA_RESERVED_PEAK = metrics.CUDA_RESERVED_PEAK


@dataclass(frozen=True)
class Figure:
    """One per-call figure: a byte count per collected call."""

    attr: str
    """The :class:`~memprofiler.reporters.model.call_table.CallRow` attribute that holds it."""
    name: str
    """Its column header, and the name the report model takes (``top_calls(n, "rss peak")``)."""
    metric: str | None = None
    """The snapshot key it is read from; ``None`` for a figure computed by :attr:`minus`."""
    phase: Literal["start", "end"] = "end"
    """Which of the call's two snapshots holds :attr:`metric`."""
    minus: tuple[str, str] | None = None
    """A computed figure: the first attribute minus the second (missing where either is)."""
    band: int | None = None
    """Its place in the per-function tables (min / median / max over calls); ``None``: not there."""
    band_in_terminal: bool = True
    """Whether the terminal's per-function table shows it too (the HTML one shows every band)."""
    shown_if: str | None = None
    """Shown in the call tables only where some call has this attribute (the CUDA columns)."""
    chart: str | None = None
    """Title of its per-call chart in the HTML report; ``None``: no chart."""
    across: str | None = None
    """Title of its line across calls in the HTML report; ``None``: no line."""
    in_tables: bool = True
    """Whether the call tables show it; ``False`` for a figure only a chart reads."""

    def __post_init__(self) -> None:
        if (self.metric is None) == (self.minus is None):
            raise ValueError(f"figure {self.name!r}: give exactly one of `metric` and `minus`")


#: Every per-call figure, in the order of the call tables' columns.
CALL_FIGURES: tuple[Figure, ...] = (
    Figure("rss_start", "rss start", metric=metrics.RSS, phase="start"),
    Figure("rss_end", "rss end", metric=metrics.RSS, band=2, band_in_terminal=False),
    Figure(
        "rss_peak", "rss peak", metric=metrics.RSS_PEAK, band=0, chart="host RSS peak", across="host RSS peak"
    ),
    Figure(
        "rss_peak_delta",
        "peak - start",
        minus=("rss_peak", "rss_start"),
        band=1,
        chart="host RSS peak above call start",
    ),
    Figure(
        "cuda_allocated_peak",
        "cuda alloc peak",
        metric=CUDA_ALLOCATED_PEAK,
        band=3,
        shown_if="cuda_allocated_peak",
        chart="CUDA allocated peak",
        across="CUDA allocated peak",
    ),
    Figure(
        "cuda_reserved_peak",
        "cuda reserved peak",
        metric=CUDA_RESERVED_PEAK,
        band=4,
        shown_if="cuda_allocated_peak",
        chart="CUDA reserved peak",
        across="CUDA reserved peak",
    ),
    Figure(
        "saved_unique",
        "saved unique",
        metric=metrics.SAVED_UNIQUE,
        band=5,
        chart="saved-tensor bytes (unique)",
    ),
    Figure("saved_packed", "saved packed", metric=metrics.SAVED_PACKED),
    # What the device held when the call began: "where memory goes" splits the call's CUDA peak
    # into this and what the call added (reporters/model/memory_split.py).
    Figure(
        "cuda_allocated_start",
        "cuda alloc start",
        metric=metrics.CUDA_ALLOCATED,
        phase="start",
        in_tables=False,
    ),
)

#: The figures read from snapshots, in declaration order: one column each in a call table.
STORED: tuple[Figure, ...] = tuple(f for f in CALL_FIGURES if f.minus is None)
#: Each figure by :attr:`Figure.name`.
BY_NAME: dict[str, Figure] = {f.name: f for f in CALL_FIGURES}
#: The figures with per-function bands, in their :attr:`Figure.band` order.
BANDED: tuple[Figure, ...] = tuple(
    sorted((f for f in CALL_FIGURES if f.band is not None), key=lambda f: f.band or 0)
)
#: The banded figures by name, and how to read each from a call.
FIGURES: list[tuple[str, Callable[[Any], int | None]]] = [(f.name, attrgetter(f.attr)) for f in BANDED]


def table_figures(calls: Sequence[Any]) -> list[Figure]:
    """The figures a call table of ``calls`` shows: all, less those :attr:`Figure.shown_if` leaves out."""
    present: dict[str, bool] = {}
    out = []
    for f in CALL_FIGURES:
        if not f.in_tables:
            continue
        if f.shown_if is not None:
            if f.shown_if not in present:
                present[f.shown_if] = any(getattr(c, f.shown_if) is not None for c in calls)
            if not present[f.shown_if]:
                continue
        out.append(f)
    return out
