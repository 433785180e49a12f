"""The largest batch that fits, in few estimates: a step's memory grows almost linearly with
the batch, so two estimates predict the answer and one or two more confirm it.

Doubling then bisecting (what Lightning's ``BatchSizeFinder`` does, and this package's
LightningCLI ``auto`` too) takes about twice as many estimates: 9 where this takes 4 for a 7B
model's 19 rows. Each estimate is two full fake steps (about 15 s of CPU for a 7B model).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from memprofiler.estimate import workers
from memprofiler.estimate.result import MemoryEstimate

K = TypeVar("K")

#: The largest batch the search tries (an answer beyond it is refused, not guessed).
MAX_ROWS = 1 << 20


@dataclass
class BatchSearch:
    """The largest batch that fits and every estimate made on the way."""

    largest: int
    """Rows per rank of the largest batch that fits; 0 when not even one row fits."""
    tried: dict[int, MemoryEstimate] = field(default_factory=dict)
    """Batch size -> its estimate, in the order tried."""

    @property
    def estimate(self) -> MemoryEstimate | None:
        """The largest fitting batch's estimate."""
        return self.tried.get(self.largest)


def search(
    one: Callable[[int], MemoryEstimate],
    device_memory: int,
    reserve: int = 0,
    start: int = 1,
    jobs: int | None = None,
) -> BatchSearch:
    """Find the largest batch ``b`` whose estimate fits and whose ``b + 1`` does not.

    The headroom (device memory minus the modelled peak, margins and ``reserve``) of the two
    nearest batches predicts where it reaches zero (a secant step, kept inside the bracket of
    a batch that fits and one that does not); a prediction that does not narrow the bracket
    falls back to its midpoint. The answer is always confirmed by both neighbours' estimates.

    Args:
        one: estimate of a batch size.
        device_memory: bytes of one device.
        reserve: bytes kept back (the CUDA context, what is not modelled).
        start: the first batch size tried.
        jobs: estimates run at once (default: one per core, :mod:`memprofiler.estimate.workers`):
            with two or more, each batch tried is estimated together with the next one, the
            neighbour the search confirms an answer with (an estimate it may not need).

    Example:
        >>> def one(b):  # 10 + 3 bytes a row: 29 rows fit in 100 bytes
        ...     return MemoryEstimate(peak_bytes=10 + 3 * b, tensor_peak_bytes=10 + 3 * b)
        >>> found = search(one, 100)
        >>> found.largest, sorted(found.tried)
        (30, [1, 2, 30, 31])
    """
    return search_many({None: one}, device_memory, reserve, start, jobs)[None]


def search_many(
    ones: Mapping[K, Callable[[int], MemoryEstimate]],
    device_memory: int,
    reserve: int = 0,
    start: int = 1,
    jobs: int | None = None,
) -> dict[K, BatchSearch]:
    """:func:`search` for several variants of a step at once (with and without checkpointing),
    their estimates side by side: each round, every search still open names the batch it needs
    next, and the cores left over go to the neighbours those searches would confirm with.

    The same answers and estimates as one :func:`search` after another (a neighbour estimated
    ahead aside), in fewer rounds: with two cores, the two searches of ``--checkpointing both``
    share each round where one after the other would leave a core idle in their first."""
    jobs = workers.default_jobs() if jobs is None else jobs
    tried: dict[K, dict[int, MemoryEstimate]] = {k: {} for k in ones}
    runs = {k: _search(tried[k], device_memory, reserve, start) for k in ones}
    asks: dict[K, tuple[int, int | None]] = {}
    done: dict[K, BatchSearch] = {}

    def advance(k: K) -> None:
        try:
            asks[k] = next(runs[k])
        except StopIteration as stop:
            asks.pop(k, None)
            done[k] = BatchSearch(stop.value, tried[k])

    for k in ones:
        advance(k)
    while asks:
        wanted = [(k, b) for k, (b, _) in asks.items()]
        spare = jobs - len(wanted)
        for k, (_, ahead) in asks.items():
            if spare > 0 and ahead is not None:
                wanted.append((k, ahead))
                spare -= 1
        found = workers.prefetch([functools.partial(ones[k], b) for k, b in wanted], jobs)
        for (k, b), est in zip(wanted, found, strict=True):
            tried[k][b] = est if est is not None else ones[k](b)
        for k in list(asks):
            advance(k)
    return {k: done[k] for k in ones}


def _search(
    tried: dict[int, MemoryEstimate], device_memory: int, reserve: int, start: int
) -> Generator[tuple[int, int | None], None, int]:
    """One search, as the batches it needs: yields ``(b, neighbour)`` when ``b`` is not yet in
    ``tried`` (the caller estimates ``b``, and ``neighbour`` too when it has a core to spare) and
    returns the largest batch that fits."""

    def need(b: int) -> Iterator[tuple[int, int | None]]:
        if b not in tried:
            ahead = b + 1 if b + 1 <= MAX_ROWS and b + 1 not in tried else None
            yield b, ahead

    def room(b: int) -> int:
        return tried[b].headroom(device_memory, reserve)

    lo, hi = 0, None  # the largest batch known to fit, the smallest known not to
    a = start
    yield from need(a)
    if room(a) < 0:
        if a == 1:
            return 0
        hi, a = a, 1
        yield from need(1)
        if room(1) < 0:
            return 0
    lo = a
    b = a + 1
    while hi is None or hi - lo > 1:
        yield from need(b)
        for k in list(tried):  # b, and the neighbour estimated beside it
            if room(k) >= 0:
                lo = max(lo, k)
            else:
                hi = k if hi is None else min(hi, k)
        if hi is not None and hi - lo <= 1:
            break
        # the secant through the two nearest estimates; the bracket keeps it honest
        x0, x1 = sorted(tried, key=lambda k: (abs(k - (lo if hi is None else (lo + hi) / 2)), k))[:2]
        if hi is None:
            # beyond every estimate: on the tensors' peak, which grows with the batch in a
            # straight line, less the larger of the two allocator overheads (reserved over
            # allocated wanders with the batch, 6.5-9.9 GB for a 7B model's rows 1-15, and two
            # near rows' reserved peaks can point a row or two too far)
            r0, r1 = room(x0) + _overhead(tried[x0]), room(x1) + _overhead(tried[x1])
            over = max(_overhead(tried[x0]), _overhead(tried[x1]))
        else:
            # between a batch that fits and one that does not: the headroom's own line (the
            # overhead grows with the batch too, 4 MiB at 2 rows to 91 MiB at 132 for a small
            # model: the larger of the two would hold every guess at the bracket's floor)
            r0, r1, over = room(x0), room(x1), 0
        slope = (r1 - r0) / (x1 - x0) if x1 != x0 else 0.0
        guess = int(x0 - (r0 - over) / slope) if slope < 0 else (hi + lo) // 2 if hi is not None else lo * 2
        ceiling = hi - 1 if hi is not None else MAX_ROWS
        guess = min(max(guess, lo + 1), ceiling)
        if guess in tried:  # the prediction was an estimate already made: close in from it
            guess = guess + 1 if room(guess) >= 0 else guess - 1
            guess = min(max(guess, lo + 1), ceiling)
            if guess in tried:
                guess = (lo + (hi if hi is not None else lo * 2)) // 2
        if lo >= MAX_ROWS:
            break
        b = guess
    return lo


def _overhead(est: MemoryEstimate) -> int:
    """What the caching allocator holds beyond the tensors at the peak (0 where not modelled)."""
    return max(est.reserved_peak_bytes, est.peak_bytes) - est.peak_bytes
