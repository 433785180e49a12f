"""The answer of ``advise``: rows of changes, each with its estimate, ranked (torch-free data)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from memprofiler.advice.costs import Cost


@dataclass
class Row:
    """One change (or set of changes) and the estimate of the step with it applied."""

    names: tuple[str, ...]
    """Candidate names applied, e.g. ``("bf16-mixed", "checkpoint-blocks")``."""
    change: str
    """What changes, in words (``checkpoint blocks 0-5 of 12``)."""
    peak_bytes: int
    reserved_bytes: int
    saved_bytes: int
    """Base reserved peak (or peak) minus this row's, as :meth:`MemoryEstimate.headroom` counts it."""
    fits: bool
    headroom_bytes: int
    cost: Cost
    patch: list[str] = field(default_factory=list)
    """The change as Python lines."""
    yaml: list[str] = field(default_factory=list)
    """The change as LightningCLI YAML keys (Python lines where a change has no key)."""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["names"] = list(self.names)
        out["cost"]["score"] = self.cost.score
        return out


@dataclass
class Advice:
    """Every change ``advise`` estimated, and the answer: the cheapest smallest fitting set.

    ``best`` is ``None`` when nothing fits; ``closest`` is then the row nearest the budget.
    """

    budget: int
    reserve: int
    base: Row
    rows: list[Row]
    """Single changes, fitting ones first by cost, then the rest by reserved peak."""
    combinations: list[Row] = field(default_factory=list)
    """Sets of changes estimated together (when no single change fits), fitting ones first."""
    best: Row | None = None
    closest: Row | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    """Candidates that do not apply to this model and plan, with the reason."""
    estimates: int = 0
    """Estimates run."""
    target: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "reserve": self.reserve,
            "target": self.target,
            "estimates": self.estimates,
            "base": self.base.to_dict(),
            "best": self.best.to_dict() if self.best is not None else None,
            "closest": self.closest.to_dict() if self.closest is not None else None,
            "rows": [r.to_dict() for r in self.rows],
            "combinations": [r.to_dict() for r in self.combinations],
            "skipped": dict(self.skipped),
        }
