"""The advice as a terminal table (rich), and its patches as text."""

from __future__ import annotations

import io

from memprofiler.advice.result import Advice, Row
from memprofiler.units import format_bytes


def _fits(row: Row) -> str:
    if row.fits:
        return f"yes, {format_bytes(row.headroom_bytes)} free"
    return f"NO, {format_bytes(-row.headroom_bytes)} over"


def _table(title: str, rows: list[Row]) -> object:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for name, justify in (
        ("change", "left"),
        ("peak (allocated)", "right"),
        ("reserved", "right"),
        ("saved", "right"),
        ("fits", "right"),
        ("cost", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        numbers = row.cost.numbers()
        cost = row.cost.words + (f" ({numbers})" if numbers else "")
        table.add_row(
            row.change,
            format_bytes(row.peak_bytes),
            format_bytes(row.reserved_bytes),
            format_bytes(row.saved_bytes),
            _fits(row),
            cost,
        )
    return table


def render(advice: Advice, width: int = 200, yaml: bool = False) -> str:
    """The base, the single changes, the sets tried, the answer and its patch (the LightningCLI
    YAML keys with ``yaml``, else Python lines), as text."""
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO())
    budget = format_bytes(advice.budget)
    head = f"advise: budget {budget} per rank" + (
        f" (reserve {format_bytes(advice.reserve)})" if advice.reserve else ""
    )
    console.print(f"{head}; target {advice.target or 'cpu'}; {advice.estimates} estimates")
    console.print(_table("the plan as given", [advice.base]))
    if advice.rows:
        console.print(_table("single changes (fitting ones by cost, then nearest the budget)", advice.rows))
    if advice.combinations:
        console.print(_table("sets of changes, each estimated together", advice.combinations))
    for name, why in advice.skipped.items():
        console.print(f"not tried: {name}: {why}")
    if advice.best is not None and not advice.best.names:
        console.print(f"the plan fits as given: {_fits(advice.best)}")
    elif advice.best is not None:
        console.print(f"[bold]make it fit[/]: {advice.best.change} ({_fits(advice.best)})")
        for line in advice.best.yaml if yaml else advice.best.patch:
            console.print(f"    {line}", markup=False, highlight=False)
    elif advice.closest is not None:
        console.print(
            f"[bold]nothing tried fits[/]; closest: {advice.closest.change} ({_fits(advice.closest)})"
        )
    return console.export_text()
