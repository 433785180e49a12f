"""Compare two runs metric by metric: A, B, the change and the percentage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memprofiler.analysis.artifacts import RunArtifacts, flat_snapshots, match_any


@dataclass(frozen=True)
class DiffRow:
    """One metric of one snapshot key in both runs; a side is ``None`` where it is missing."""

    key: str
    metric: str
    a: float | None
    b: float | None

    @property
    def change(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def percent(self) -> float | None:
        """Change relative to A; ``None`` when A is 0 or missing."""
        if self.change is None or not self.a:
            return None
        return 100.0 * self.change / abs(self.a)


def diff_runs(
    a: RunArtifacts,
    b: RunArtifacts,
    metrics: Sequence[str] = (),
    keys: Sequence[str] = (),
    min_change: float = 0.0,
    include_unchanged: bool = False,
    include_missing: bool = True,
) -> list[DiffRow]:
    """Every (key, metric) in either run, largest absolute change first, then one-sided rows.

    Args:
        a: the baseline run.
        b: the run compared with it.
        metrics: shell-style patterns on metric names (``rss*``, ``saved_tensors.*``); empty is all.
        keys: patterns on snapshot keys (``0.training_step.*.end``); empty is all.
        min_change: drop rows whose absolute change is smaller.
        include_unchanged: keep rows with no change.
        include_missing: keep rows present in only one run.

    Example:
        >>> rows = diff_runs(load_run("run_a"), load_run("run_b"), metrics=["rss_peak"])  # doctest: +SKIP
    """
    fa, fb = flat_snapshots(a), flat_snapshots(b)
    rows: list[DiffRow] = []
    for key in sorted(set(fa) | set(fb)):
        if not match_any(key, keys):
            continue
        ma, mb = fa.get(key, {}), fb.get(key, {})
        for metric in sorted(set(ma) | set(mb)):
            if not match_any(metric, metrics):
                continue
            row = DiffRow(key, metric, ma.get(metric), mb.get(metric))
            change = row.change
            if change is None:
                if include_missing:
                    rows.append(row)
            elif (change != 0 or include_unchanged) and abs(change) >= min_change:
                rows.append(row)
    rows.sort(key=lambda r: (r.change is None, -abs(r.change or 0), r.key, r.metric))
    return rows
