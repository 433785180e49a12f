"""What a change costs, in words and numbers, and the order ``advise`` ranks changes by."""

from __future__ import annotations

from dataclasses import dataclass

from memprofiler.units import format_bytes

#: Cost tiers, cheapest first: what a user gives up.
FREE, THROUGHPUT, WORK, TRAINING = 0, 1, 2, 3
TIER_WORDS = {
    FREE: "free",
    THROUGHPUT: "throughput or numerics",
    WORK: "more compute or communication",
    TRAINING: "changes training",
}


@dataclass(frozen=True)
class Cost:
    """A change's cost: ``tier`` first, then ``share`` (its extra work as a share of the step)."""

    words: str
    tier: int = FREE
    share: float = 0.0
    """Recomputed FLOPs over the step's FLOPs, or extra communication over the step's own."""
    recompute_flops: int = 0
    """FLOPs run again in backward per step (activation checkpointing)."""
    recompute_share: float = 0.0
    """``recompute_flops`` over the step's FLOPs (forward plus a backward of twice the forward)."""
    comm_bytes: int = 0
    """Extra bytes each rank sends per step (sharding, offload)."""
    effective_batch: int | None = None
    """Samples per optimizer step over all ranks (micro-batch x accumulation x ranks)."""

    @property
    def score(self) -> float:
        """The ranking key: the tier, then the extra work (capped below the next tier)."""
        return self.tier + min(max(self.share, 0.0), 0.99)

    def numbers(self) -> str:
        parts = []
        if self.recompute_flops:
            parts.append(f"{flops(self.recompute_flops)} recomputed ({self.recompute_share:.0%} of the step)")
        if self.comm_bytes > 0:
            parts.append(f"+{format_bytes(self.comm_bytes)} sent per rank per step")
        elif self.comm_bytes < 0:
            parts.append(f"{format_bytes(-self.comm_bytes)} less sent per rank per step")
        if self.effective_batch is not None:
            parts.append(f"effective batch {self.effective_batch:,}")
        return "; ".join(parts)


def flops(n: int) -> str:
    """``1.23 TFLOP``: FLOPs in the largest decimal unit below the number."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:,} FLOP"


def combined(costs: list[Cost]) -> Cost:
    """The cost of several changes together: their words, summed work, the largest tier."""
    batch = next((c.effective_batch for c in costs if c.effective_batch is not None), None)
    return Cost(
        words="; ".join(c.words for c in costs),
        tier=max((c.tier for c in costs), default=FREE),
        share=sum(c.share for c in costs),
        recompute_flops=sum(c.recompute_flops for c in costs),
        recompute_share=sum(c.recompute_share for c in costs),
        comm_bytes=sum(c.comm_bytes for c in costs),
        effective_batch=batch,
    )


def ring_share(world_size: int) -> float:
    """Bytes a rank sends per byte of the tensor in a ring all-gather or reduce-scatter."""
    return (world_size - 1) / world_size
