"""Cross-rank statistics as a reduction: per-rank vectors combined by min/max/sum.

A rank's snapshots flatten to one vector of numeric metrics in a fixed order
(:class:`RankMetrics`). Every statistic of ``memory_summary.yaml`` follows from five
element-wise reductions over ranks, so ranks never ship their snapshots to one place:

* ``max`` and ``neg_min`` (the max of ``-value``), ``not_int`` (any rank had a float): MAX;
* ``sum`` and ``count`` (ranks that reported the metric): SUM;
* ``argmax`` (the lowest rank holding the max; needs the max first): MIN.

:class:`Accumulator` applies these reductions one rank at a time (the after-exception path on
rank 0, and :func:`memprofiler.core.summary.summarize`); the collective path applies them
with ``all_reduce``/``reduce``. Both end in :func:`summary_from_partial`. Rank 0 holds
O(metrics) numbers, whatever the world size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from memprofiler import layout

#: (snapshot key without the rank, e.g. ``"training_step.2.end"``; flattened metric name).
MetricKey = tuple[str, str]

Snapshots = Mapping[str, Mapping[str, Any]]

_NEG_INF = float("-inf")
_INF = float("inf")


def _numeric_leaves(metrics: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    for name, value in metrics.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping):
            yield from _numeric_leaves(value, f"{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield key, value


@dataclass(frozen=True)
class RankMetrics:
    """One rank's numeric metrics as parallel sequences, in its snapshots' order."""

    keys: list[MetricKey]
    values: torch.Tensor  #: float64, one per key
    not_int: torch.Tensor  #: float64, 1.0 where the value was a float

    @classmethod
    def from_snapshots(cls, snapshots: Snapshots) -> RankMetrics:
        """Flatten ``{rank}.{fn}.{call}.{phase}`` snapshots; nested mappings join with dots.

        Booleans and strings are not metrics. Integers up to 2**53 (9 PB) stay exact.
        """
        keys: list[MetricKey] = []
        values: list[float] = []
        not_int: list[float] = []
        for key, metrics in snapshots.items():
            _, fn, call, phase = layout.parse_snapshot_key(key)
            skey = f"{fn}.{call}.{phase}"
            for name, value in _numeric_leaves(metrics):
                keys.append((skey, name))
                values.append(float(value))
                not_int.append(0.0 if isinstance(value, int) else 1.0)
        return cls(
            keys,
            torch.tensor(values, dtype=torch.float64),
            torch.tensor(not_int, dtype=torch.float64),
        )

    def digest(self) -> int:
        """A signed 64-bit hash of the ordered key list: equal digests, same vector layout."""
        return key_digest(self.keys)


def key_digest(keys: Sequence[MetricKey]) -> int:
    """Signed 64-bit BLAKE2b of ``keys`` in order (fits an int64 tensor)."""
    h = hashlib.blake2b(digest_size=8)
    for skey, name in keys:
        h.update(skey.encode())
        h.update(b"\x1e")
        h.update(name.encode())
        h.update(b"\x1f")
    return int.from_bytes(h.digest(), "little", signed=True)


@dataclass
class Partial:
    """The reduced figures over some ranks, one float64 entry per key of ``keys``."""

    keys: list[MetricKey]
    max: torch.Tensor
    neg_min: torch.Tensor
    sum: torch.Tensor
    count: torch.Tensor
    argmax: torch.Tensor  #: lowest rank holding ``max``; +inf where no rank reported
    not_int: torch.Tensor

    @classmethod
    def empty(cls, keys: list[MetricKey]) -> Partial:
        n = len(keys)

        def full(fill: float) -> torch.Tensor:
            return torch.full((n,), fill, dtype=torch.float64)

        return cls(keys, full(_NEG_INF), full(_NEG_INF), full(0.0), full(0.0), full(_INF), full(0.0))

    def extend(self, more: list[MetricKey]) -> None:
        """Append keys no rank has reported yet."""
        grown = Partial.empty(more)
        self.keys = self.keys + more
        for field in ("max", "neg_min", "sum", "count", "argmax", "not_int"):
            setattr(self, field, torch.cat([getattr(self, field), getattr(grown, field)]))


class Accumulator:
    """Folds ranks' metrics in one at a time, in any rank order; holds O(union of keys).

    Example:
        >>> acc = Accumulator()
        >>> acc.add(1, RankMetrics.from_snapshots({"1.f.1.end": {"rss": 30}}))
        >>> acc.add(0, RankMetrics.from_snapshots({"0.f.1.end": {"rss": 10}}))
        >>> summary_from_partial(acc.partial)["f.1.end"]["rss"]["imbalance"]
        1.5
    """

    def __init__(self) -> None:
        self.partial = Partial.empty([])
        self._slot: dict[MetricKey, int] = {}
        # Ranks with the same key list (almost always all of them) share one index tensor.
        self._index: dict[int, torch.Tensor] = {}

    def knows(self, digest: int) -> bool:
        """Whether a key list with this digest was folded in already."""
        return digest in self._index

    def index_of(self, keys: list[MetricKey], digest: int) -> torch.Tensor:
        """Slots of ``keys`` in the union, adding the keys not seen yet.

        ``keys`` may be empty when :meth:`knows` ``digest``: the cached slots are returned.
        """
        idx = self._index.get(digest)
        if idx is None:
            new = [k for k in dict.fromkeys(keys) if k not in self._slot]
            for k in new:
                self._slot[k] = len(self._slot)
            if new:
                self.partial.extend(new)
            idx = torch.tensor([self._slot[k] for k in keys], dtype=torch.long)
            self._index[digest] = idx
        return idx

    def add(self, rank: int, metrics: RankMetrics, digest: int | None = None) -> None:
        """Fold in ``rank``'s metrics (``digest``: :meth:`RankMetrics.digest`, if known)."""
        d = metrics.digest() if digest is None else digest
        self.add_values(rank, self.index_of(metrics.keys, d), metrics.values, metrics.not_int)

    def add_values(self, rank: int, idx: torch.Tensor, values: torch.Tensor, not_int: torch.Tensor) -> None:
        """Fold in one rank's ``values`` at slots ``idx`` (unique within a rank)."""
        p = self.partial
        cur = p.max[idx]
        held = p.argmax[idx]
        r = torch.full_like(values, float(rank))
        p.argmax[idx] = torch.where(values > cur, r, torch.where(values == cur, torch.minimum(held, r), held))
        p.max[idx] = torch.maximum(cur, values)
        p.neg_min[idx] = torch.maximum(p.neg_min[idx], -values)
        p.sum[idx] += values
        p.count[idx] += 1.0
        p.not_int[idx] = torch.maximum(p.not_int[idx], not_int)


def _number(value: float, as_float: bool) -> float | int:
    return value if as_float else int(value)


def summary_from_partial(partial: Partial) -> dict[str, dict[str, dict[str, Any]]]:
    """``{"{fn}.{call}.{phase}": {metric: {min, max, mean, argmax_rank, imbalance, n_ranks}}}``.

    ``min``/``max`` are integers where every rank reported an integer; ``imbalance`` is
    ``max / mean``, null when the mean is not positive.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    cols = zip(
        partial.keys,
        partial.max.tolist(),
        partial.neg_min.tolist(),
        partial.sum.tolist(),
        partial.count.tolist(),
        partial.argmax.tolist(),
        partial.not_int.tolist(),
        strict=True,
    )
    for (skey, name), hi, neg_lo, total, count, arg, not_int in cols:
        if count <= 0:
            continue
        mean = total / count
        as_float = not_int > 0
        out.setdefault(skey, {})[name] = {
            "min": _number(-neg_lo + 0.0, as_float),  # + 0.0: no "-0.0",
            "max": _number(hi, as_float),
            "mean": mean,
            "argmax_rank": int(arg),
            "imbalance": (hi / mean) if mean > 0 else None,
            "n_ranks": int(count),
        }
    return out
